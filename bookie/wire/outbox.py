"""Outgoing frames of one connection, written with one ``writelines`` per loop turn.

The one out-buffer of Quire: the bookie server's connections, the ledger
client's, the hub client's and the hub server's use it::

    outbox = Outbox(on_flush=state.flushed)     # on_flush: optional, called after each write
    outbox = Outbox(schedule=server.flush_soon, flush_bytes=64 * 1024)   # the hub server's connections
    outbox = Outbox(flush_bytes=64 * 1024, join_bytes=16 * 1024)   # the ledger client's: small writes joined
    outbox.attach(transport)                    # in connection_made
    outbox.put(frame)                           # queue; the caller flushes (end of data_received)
    outbox.put_all(frames, nbytes)              # the same for several frames (nbytes: their total)
    outbox.send(frame)                          # queue and flush at the end of this loop turn
    outbox.send_all(frames, nbytes)             # the same for several frames (nbytes: their total)
    outbox.send_pair(head, body)                # the same for one frame in two parts
    outbox.flush()                              # write what is queued now
    outbox.detach()                             # in connection_lost: queued frames are dropped

Frames queued while no transport is attached, or once it is closing, are
dropped at the next flush (the connection is gone; its requests fail by
other means). ``queued_bytes`` is what waits for the next flush.

With ``join_bytes`` set, a flush of several parts totalling no more than
that is written as one joined buffer (``writelines`` of one part): the
kernel's ``writev`` of many small parts costs more CPU than one copy of
them (a bookie frame of 40 adds is 81 parts), and uvloop writes one buffer
without a write context. Larger writes keep their parts (no copy of big
payloads).

``schedule(callback)`` replaces ``loop.call_soon`` for the end-of-turn
flush (a server that flushes all its connections from one callback); with
``flush_bytes`` set, ``send`` writes at once when that many bytes wait, so a
transport's ``pause_writing`` is seen promptly. No decision about what to
send is made here; the only I/O is the transport's ``writelines``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["Outbox"]


class _Transport(Protocol):
    def writelines(self, data: list[bytes]) -> None: ...

    def is_closing(self) -> bool: ...


class Outbox:
    """See the module docstring."""

    __slots__ = ("_frames", "_loop", "_on_flush", "_schedule", "_scheduled", "flush_bytes", "join_bytes",
                 "queued_bytes", "transport")

    def __init__(self, on_flush: Callable[[], None] | None = None, *,
                 schedule: Callable[[Callable[[], None]], object] | None = None, flush_bytes: int = 0,
                 join_bytes: int = 0) -> None:
        self._frames: list[bytes] = []
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_flush = on_flush
        self._schedule = schedule
        self.flush_bytes = flush_bytes
        self.join_bytes = join_bytes
        self.queued_bytes = 0
        self.transport: _Transport | None = None

    def attach(self, transport: _Transport) -> None:
        self.transport = transport

    def detach(self) -> None:
        """Forget the transport and drop what is queued."""
        self.transport = None
        self._frames.clear()
        self.queued_bytes = 0

    def put(self, frame: bytes) -> None:
        """Queue ``frame``; it leaves at the caller's next ``flush``."""
        self._frames.append(frame)
        self.queued_bytes += len(frame)

    def put_all(self, frames: list[bytes], nbytes: int) -> None:
        """``put`` of several frames (or parts of one) at once (``nbytes``: their total length)."""
        self._frames += frames
        self.queued_bytes += nbytes

    def send(self, frame: bytes) -> None:
        """Queue ``frame`` and make sure a flush runs at the end of this loop turn (now: past ``flush_bytes``)."""
        self._frames.append(frame)
        queued = self.queued_bytes = self.queued_bytes + len(frame)
        if not self._scheduled or queued >= self.flush_bytes > 0:  # else ``_flush_due`` would do nothing
            self._flush_due()

    def send_pair(self, head: bytes, body: bytes) -> None:
        """``send`` of one frame in two parts (a per-connection head, a body shared by several connections)."""
        frames = self._frames
        frames.append(head)
        frames.append(body)
        queued = self.queued_bytes = self.queued_bytes + len(head) + len(body)
        if not self._scheduled or queued >= self.flush_bytes > 0:  # else ``_flush_due`` would do nothing
            self._flush_due()

    def send_all(self, frames: list[bytes], nbytes: int) -> None:
        """``send`` of several frames at once (``nbytes``: their total length)."""
        self._frames += frames
        self.queued_bytes += nbytes
        self._flush_due()

    def _flush_due(self) -> None:
        """Flush now past ``flush_bytes``, else once at the end of this loop turn."""
        if self.flush_bytes and self.queued_bytes >= self.flush_bytes:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            if self._schedule is not None:
                self._schedule(self.flush)
                return
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write every queued frame in one ``writelines`` (or drop them when the transport is gone)."""
        self._scheduled = False
        frames = self._frames
        if not frames:
            return
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if self.queued_bytes <= self.join_bytes and len(frames) > 1:
                transport.writelines([b"".join(frames)])
            else:
                transport.writelines(frames)  # transports copy what they keep: the list is reused
        frames.clear()
        self.queued_bytes = 0
        if self._on_flush is not None:
            self._on_flush()

    def __len__(self) -> int:
        return len(self._frames)
