"""The web console's pages (``aiohttp-jinja2``), rendered from the hub's own admin API.

=================================  ===================================================================
``GET /ui/``                       overview: hubs, bookies, topics, a banner of alerts
``GET /ui/topics/{topic}``         one topic: owner, ledgers, live publish rate, compaction status,
                                   subscriptions (with their delayed messages) and their actions (reset,
                                   delete), compact, release, delete
``GET /ui/bookies``                bookies: state, disk, ledgers, journal sync, the read-only switch
``GET /ui/autorecovery``           under-replicated ledgers, the auditor, "trigger audit"
``GET /ui/policies``               grants (add, revoke) and per-prefix policies where the hub has them
``GET /ui/static/...``             ``console.js`` and ``console.css`` (package data)
=================================  ===================================================================

Each page is filled from the admin API's JSON, asked over loopback from
this hub's own HTTP server (``GET`` needs no token), so the page and
``curl`` never disagree; the page's script then polls the same resources
every 2 s and updates the tables in place (``textContent`` only). A column
is described once (``Column``) for both the template and the script: the
``<th>`` carries the field and its format.

A topic that does not exist is a 404 page saying so; an admin API that
cannot answer is a page with its error, never a traceback. Pages carry a
Content-Security-Policy that lets only the hub's own script and style
sheet run (no inline script), behind the escaping.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import aiohttp_jinja2
import jinja2
from aiohttp import web

__all__ = ["COLUMNS", "Column", "ConsolePages", "PagesHost"]


class PagesHost(Protocol):
    """What ``ConsolePages`` uses of its hub (a ``hub.server.HubServer``): its own HTTP server's URL."""

    @property
    def http_url(self) -> str: ...

log = logging.getLogger(__name__)

API_TIMEOUT = 10.0
"""Seconds the page waits for its own admin API."""
POLICIES_PATH = "/admin/v1/policies"
SECURITY_HEADERS = {
    # only the hub's own script and style sheet run: a name that slipped past escaping could not execute
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


@dataclass(frozen=True)
class Column:
    """One table column: the JSON field, its heading, how it is shown (``fmt``), and a link kind."""

    field: str
    label: str
    fmt: str = "text"      # text int rate bytes pct ms time list count consumers bool json actions:KIND
    link: str = ""         # "topic": the value names a topic page


COLUMNS: dict[str, list[Column]] = {
    "hubs": [Column("address", "Hub"), Column("topics", "Owned topics", "int"),
             Column("publish_rate", "Publish rate", "rate"), Column("error", "Error")],
    "bookies": [Column("address", "Bookie"), Column("state", "State"), Column("rack", "Rack"),
                Column("used_fraction", "Disk used", "pct"), Column("disk_usage_threshold", "Threshold", "pct"),
                Column("free_disk", "Free", "bytes"), Column("ledgers", "Ledgers", "int"),
                Column("journal_sync_ms", "Journal sync", "ms"), Column("info_error", "Error")],
    "bookies_admin": [Column("address", "Bookie"), Column("state", "State"), Column("rack", "Rack"),
                      Column("used_fraction", "Disk used", "pct"),
                      Column("disk_usage_threshold", "Threshold", "pct"), Column("free_disk", "Free", "bytes"),
                      Column("total_disk", "Total", "bytes"), Column("ledgers", "Ledgers", "int"),
                      Column("journal_sync_ms", "Journal sync", "ms"), Column("info_error", "Error"),
                      Column("state", "Read-only switch", "actions:bookie")],
    "topics": [Column("topic", "Topic", link="topic"), Column("owner", "Owner"),
               Column("publish_rate", "Rate in", "rate"), Column("msg_rate_out", "Rate out", "rate"),
               Column("backlog", "Backlog", "int"), Column("subscriptions", "Subscriptions", "int"),
               Column("ledgers", "Ledgers", "int"), Column("messages", "Messages kept", "int"),
               Column("storage_bytes", "Storage", "bytes")],
    "ledgers": [Column("ledger_id", "Ledger", "int"), Column("start_seq_id", "First seq id", "int"),
                Column("end_seq_id", "Last seq id", "int")],
    "subscriptions": [Column("name", "Subscription"), Column("type", "Type"),
                      Column("consumed_seq_id", "Consumed seq id", "int"), Column("backlog", "Backlog", "int"),
                      Column("attached", "Attached", "bool"), Column("consumers", "Consumers", "consumers"),
                      Column("unacked", "Unacked", "count"), Column("delayed", "Delayed", "int"),
                      Column("msg_rate_out", "Rate out", "rate"), Column("name", "Actions", "actions:sub")],
    "under_replicated": [Column("ledger_id", "Ledger", "int"), Column("missing", "Missing on", "list"),
                         Column("marked_ms", "Marked at", "time")],
    "grants": [Column("role", "Role"), Column("prefix", "Topic prefix"), Column("actions", "Actions", "list"),
               Column("role", "", "actions:grant")],
}


def _format(value: Any, fmt: str) -> str:
    """The cell text of ``value`` (the script's ``format`` does the same)."""
    if value is None or value == "":
        return "—" if fmt != "text" else ""
    if fmt == "rate":
        return f"{float(value):.1f}/s"
    if fmt == "pct":
        return f"{float(value) * 100:.1f}%"
    if fmt == "ms":
        return f"{float(value):.2f} ms"
    if fmt == "bytes":
        n = float(value)
        for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
            if n < 1024 or unit == "TiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
            n /= 1024
    if fmt == "time":
        return datetime.fromtimestamp(int(value) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if fmt == "list":
        return ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)
    if fmt == "consumers" and isinstance(value, list):
        return f"{len(value)}" + (": " + ", ".join(
            f"{c.get('address') or '?'} ({c.get('unacked', 0)} unacked)" if isinstance(c, dict) else str(c)
            for c in value) if value else "")
    if fmt in ("count", "consumers"):
        return str(len(value)) if isinstance(value, list | dict) else str(value)
    if fmt == "bool":
        return "yes" if value else "no"
    if fmt == "json":
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))   # as JSON.stringify
    return str(value)


def rows_of(value: Any) -> list[dict[str, Any]]:
    """A JSON list of objects as is; an object of objects as rows with ``name`` (the script does the same)."""
    if isinstance(value, dict):
        return [{"name": k, **v} if isinstance(v, dict) else {"name": k, "value": v} for k, v in value.items()]
    return [v if isinstance(v, dict) else {"value": v} for v in (value or [])]


def row_key(row: dict[str, Any], key: str) -> str:
    """The key of a table row: the fields named in ``key`` (comma-separated), joined by ``|``."""
    return "|".join(str(row.get(k, "")) for k in key.split(","))


def auto_columns(rows: list[dict[str, Any]], actions: str = "") -> list[Column]:
    """Columns for rows of an unknown shape: every key, in first-seen order, values as JSON; then ``actions``."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    cols = [Column(k, k, "json") for k in keys]
    return [*cols, Column(next(iter(keys)), "", actions)] if actions and keys else cols


def _loopback(url: str) -> str:
    """``url`` with a wildcard listen address replaced by loopback (the hub asks itself)."""
    for wildcard in ("//0.0.0.0:", "//[::]:", "//:::"):
        url = url.replace(wildcard, "//127.0.0.1:")
    return url


class ConsolePages:
    """See the module docstring."""

    def __init__(self, server: PagesHost, base_path: str) -> None:
        self.server = server
        self.base = base_path

    def install(self, app: web.Application) -> None:
        env = aiohttp_jinja2.setup(app, loader=jinja2.PackageLoader("hub.ui", "templates"), autoescape=True,
                                   undefined=jinja2.StrictUndefined)
        env.filters["fmt"] = _format
        env.filters["q"] = lambda s: quote(str(s), safe="")
        static = Path(__file__).parent / "static"
        # in the script's and style sheet's addresses: a browser never runs an old script against a new hub
        version = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(static.iterdir()))).hexdigest()[:12]
        env.globals.update(base=self.base, columns=COLUMNS, auto_columns=auto_columns, rows_of=rows_of,
                           row_key=row_key, static_version=version)
        app.router.add_get("/ui", self._to_overview)
        app.router.add_get("/ui/", self.overview)
        app.router.add_get("/ui/topics/{topic}", self.topic)
        app.router.add_get("/ui/bookies", self.bookies)
        app.router.add_get("/ui/autorecovery", self.autorecovery)
        app.router.add_get("/ui/policies", self.policies)
        app.router.add_static("/ui/static/", static)   # package data

    async def _api(self, path: str) -> tuple[int, Any]:
        """``GET path`` on this hub's own admin API: (status, JSON), or (502, {"error"}) when it cannot answer."""
        base = _loopback(self.server.http_url)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=API_TIMEOUT)) as session:
                async with session.get(base + path) as resp:
                    return resp.status, await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("console: GET %s failed: %s", path, exc)
            return 502, {"error": f"the admin API did not answer: {exc or type(exc).__name__}"}

    def _render(self, request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
        context.setdefault("error", None)
        response = aiohttp_jinja2.render_template(template, request, context, status=status)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _page(self, request: web.Request, template: str, title: str, path: str) -> web.Response:
        status, data = await self._api(path)
        if status != 200:
            return self._render(request, "error.html", 502 if status >= 500 else status, title=title, page="error",
                                error=data.get("error") if isinstance(data, dict) else str(data))
        return self._render(request, template, title=title, page=template.removesuffix(".html"), data=data,
                            poll=path)

    async def _to_overview(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(f"{self.base}/ui/")

    async def overview(self, request: web.Request) -> web.Response:
        return await self._page(request, "overview.html", "Overview", "/admin/v1/cluster")

    async def bookies(self, request: web.Request) -> web.Response:
        return await self._page(request, "bookies.html", "Bookies", "/admin/v1/bookies")

    async def autorecovery(self, request: web.Request) -> web.Response:
        return await self._page(request, "autorecovery.html", "AutoRecovery", "/admin/v1/autorecovery")

    async def topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        path = f"/admin/v1/topics/{quote(name, safe='')}/stats"
        status, data = await self._api(path)
        if status == 404 or (status == 400 and isinstance(data, dict)):
            return self._render(request, "missing.html", 404, title=f"No such topic: {name}", page="missing",
                                topic=name, reason=data.get("error", "") if isinstance(data, dict) else "")
        if status != 200:
            return self._render(request, "error.html", 502, title=name, page="error",
                                error=data.get("error") if isinstance(data, dict) else str(data))
        return self._render(request, "topic.html", title=f"Topic {name}", page="topic", data=data, poll=path,
                            topic=name)

    async def policies(self, request: web.Request) -> web.Response:
        status, grants = await self._api("/admin/v1/permissions")
        if status != 200:
            return self._render(request, "error.html", 502, title="Policies and grants", page="error",
                                error=grants.get("error") if isinstance(grants, dict) else str(grants))
        p_status, policies = await self._api(POLICIES_PATH)
        if p_status == 200:
            policy_rows: list[dict[str, Any]] | None = [
                {"prefix": r.pop("name"), **r} if "prefix" not in r and "name" in r else r for r in rows_of(policies)]
            policy_note = ""
        else:
            policy_rows = None
            why = policies.get("error") if isinstance(policies, dict) else policies
            policy_note = (f"per-prefix policies are not available on this hub (it has no {POLICIES_PATH})"
                           if p_status in (404, 405) else f"policies could not be read: {why}")
        return self._render(request, "policies.html", title="Policies and grants", page="policies", data=grants,
                            poll="/admin/v1/permissions", policies=policy_rows, policy_note=policy_note,
                            policies_path=POLICIES_PATH)
