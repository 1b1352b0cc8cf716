"""``set_tcp_liveness``: how a client connection notices a peer that vanished silently.

Keepalive probes find a dead path while nothing is sent; ``TCP_USER_TIMEOUT``
fails a connection whose sent data stays unacknowledged (a peer cut off while
requests are in flight). Both the ledger client (``bookie.connection``) and
the hub client (``hub.channel``) set them through this one function.
"""

from __future__ import annotations

import logging
import socket

__all__ = ["set_tcp_liveness"]

log = logging.getLogger(__name__)


def set_tcp_liveness(sock: socket.socket | None, *, idle: float, interval: float, probes: int,
                     user_timeout: float) -> bool:
    """Probes after ``idle`` s without traffic, ``probes`` of them ``interval`` s apart; ``TCP_USER_TIMEOUT``.

    ``idle`` 0 leaves keepalive off, ``user_timeout`` 0 leaves that off;
    seconds are rounded to whole ones (at least 1) as the kernel takes them.
    Options the platform lacks are skipped. False when there is no socket or
    it refused an option (logged at debug): the connection is usable anyway.
    """
    if sock is None:
        return False
    opts: list[tuple[int, int, int]] = []
    if idle > 0:
        opts.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
        for name, value in (("TCP_KEEPIDLE", max(1, round(idle))), ("TCP_KEEPINTVL", max(1, round(interval))),
                            ("TCP_KEEPCNT", probes)):
            if hasattr(socket, name):
                opts.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    if user_timeout > 0 and hasattr(socket, "TCP_USER_TIMEOUT"):
        opts.append((socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, round(user_timeout * 1000))))
    ok = True
    for level, opt, value in opts:
        try:
            sock.setsockopt(level, opt, value)
        except OSError as exc:
            log.debug("setsockopt(%d, %d, %d) failed: %s", level, opt, value, exc)
            ok = False
    return ok
