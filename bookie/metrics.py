"""The one way Quire processes name their Prometheus metrics (and serve them without a server).

    from bookie.metrics import metric_name, serve_metrics
    metric_name("hub", "packets_received")     # "hub_packets_received"
    url, stop = serve_metrics(registry, "127.0.0.1", 0)   # "http://127.0.0.1:PORT/metrics"
    stop()                                      # shut the endpoint down

Bookie and hub processes serve their registries at ``/metrics`` of their one
HTTP server (``bookie.http``); ``serve_metrics`` (a thread of
``prometheus_client``) is for a process that has no event loop to serve from.

Naming scheme, shared by bookies and hubs: ``<role>_<subject>[_<unit>]``
with Prometheus' suffixes (``_total`` for counters, ``_seconds``/``_bytes``
for units), role ``bookie`` or ``hub``; operations are a label (``op``),
never part of the name. This module lives in ``bookie`` so that both roles
can use it (a hub may import bookie, never the reverse).

Failure: ``serve_metrics`` raises ``OSError`` when the port cannot be bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, start_http_server

__all__ = ["ROLES", "metric_name", "serve_metrics"]

log = logging.getLogger(__name__)

ROLES = ("bookie", "hub")


def metric_name(role: str, subject: str) -> str:
    """``<role>_<subject>``; ``ValueError`` for an unknown role."""
    if role not in ROLES:
        raise ValueError(f"unknown metrics role {role!r}: one of {', '.join(ROLES)}")
    return f"{role}_{subject}"


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[str, Callable[[], None]]:
    """Serve ``registry`` as Prometheus text on ``host:port`` (0 or -1: a free port).

    Returns the ``/metrics`` URL and a function that stops the endpoint.
    Raises ``OSError`` when the address cannot be bound.
    """
    httpd, thread = start_http_server(max(port, 0), addr=host, registry=registry)
    url = f"http://{host}:{httpd.server_port}/metrics"
    log.info("metrics at %s", url)

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)

    return url, stop
