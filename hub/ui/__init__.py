"""The operator web console at ``/ui/`` of every hub's HTTP server (DESIGN section 7, "Web console").

    install(http_server.app, hub_server, admin, base_path=conf.http_ui_base_path)

* ``hub.ui.cluster`` adds the cluster-wide JSON resources the console reads
  to the admin API (``/admin/v1/cluster``, ``/admin/v1/bookies``,
  ``/admin/v1/autorecovery``, ...); they are plain admin API resources, usable
  with ``curl`` too, and mutating ones need the admin token like the rest.
* ``hub.ui.pages`` serves the pages (``aiohttp-jinja2`` templates shipped as
  package data, autoescaped) and ``/ui/static/`` (one script, one style
  sheet): no CDN, no JavaScript build. A page is rendered from the admin
  API's JSON (the hub asks its own API over loopback, so it shows exactly
  what ``curl`` would), and its script polls the same JSON every 2 s.

Behind a reverse proxy that serves the hub under a path prefix and strips
it (nginx ``location /quire/ { proxy_pass http://hub:PORT/; }``),
``http_ui_base_path=/quire`` makes every link and every call of the
pages' script carry the prefix. All addresses are relative to the host, so
the pages work over whatever scheme (TLS at the proxy) they were loaded by.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aiohttp import web

if TYPE_CHECKING:
    from hub.admin import HubAdmin
    from hub.ui.cluster import ClusterHost
    from hub.ui.pages import PagesHost

    class ConsoleHost(ClusterHost, PagesHost, Protocol):
        """What the console uses of its hub (a started ``hub.server.HubServer``)."""

__all__ = ["install", "normalize_base_path"]


def normalize_base_path(value: str) -> str:
    """``"quire/"`` -> ``"/quire"``; ``""`` and ``"/"`` -> ``""`` (no prefix)."""
    value = value.strip().strip("/")
    return f"/{value}" if value else ""


def install(app: web.Application, server: ConsoleHost, admin: HubAdmin, *, base_path: str = "") -> None:
    """Add the console's admin resources and pages to ``app`` (before it starts)."""
    from hub.ui.cluster import ClusterAdmin
    from hub.ui.pages import ConsolePages

    cluster = ClusterAdmin(server, admin)
    app.add_routes(cluster.routes())
    ConsolePages(server, normalize_base_path(base_path)).install(app)
