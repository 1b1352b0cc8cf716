"""Cluster-wide admin API resources for the web console (served with ``hub.admin``).

=============================================================  ==============================================
``GET /admin/v1/hub``                                          this hub: ``address``, ``publish_rate`` and
                                                               ``topics`` (one summary per owned topic)
``GET /admin/v1/cluster``                                      ``hubs`` (each live hub's ``/admin/v1/hub``),
                                                               ``topics`` (owned ones summarised, unowned
                                                               ones by name; the first ``MAX_TOPICS`` by
                                                               name, ``topics_total`` and ``topics_note``
                                                               say so), ``bookies``, ``autorecovery`` and
                                                               ``alerts`` (one sentence each)
``GET /admin/v1/bookies``                                      every registered bookie: registration and its
                                                               ``/api/v1/bookie/info``
``PUT /admin/v1/bookies/{bookie}/readonly``                    ``{"readOnly": bool}``: passed to that
                                                               bookie's ``/api/v1/bookie/state/readonly``
``GET /admin/v1/autorecovery``                                 ``auditor``, ``enabled``, ``audit_requested``
                                                               (and ``audit_requested_ms``),
                                                               ``under_replicated`` ledgers
``POST /admin/v1/autorecovery/audit``                          ask the auditor for a full audit now
                                                               (``quire shell triggeraudit``)
=============================================================  ==============================================

A topic summary is what ``GET /admin/v1/topics/{topic}/stats`` says, cut
down: ``topic``, ``owner``, ``publish_rate``, ``msg_rate_out`` (the sum
over its subscriptions, when the stats have it), ``last_seq_id``,
``backlog`` (the sum over its subscriptions), ``backlog_bytes`` and
``storage_bytes`` (when the stats have them, else ``null``),
``subscriptions`` (a count), ``ledgers`` (a count) and ``messages`` (kept:
last seq id - first kept + 1). A bookie row
merges its registration (``state``, ``rack``, ``free_disk``,
``total_disk``) with what its HTTP server answers (``disk_usage_threshold``,
``ledgers``, ``journal_sync_ms``); ``info_error`` says why the latter is
missing (no HTTP server, unreachable). Other hubs and bookies are asked with
a short timeout (``PEER_TIMEOUT``), concurrently; one that does not answer
is listed with ``error`` and never fails the whole answer.

The read-only switch travels with the caller's ``Authorization`` header:
the bookie checks its own admin token (a cluster normally shares one) and
its refusal comes back unchanged (status and ``{"error": ...}``).

Failure: a metastore failure is 503; an unknown bookie 404; a bookie
without an HTTP server 409; one that cannot be reached 502.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from aiohttp import web

from bookie.autorecovery import UnderReplicationManager
from bookie.http import HttpError, RequestHandler, errors_as_statuses, json_body, json_response
from bookie.registration import READ_ONLY, list_bookies
from hub import errors
from hub.metadata import hub_address
from hub.ownership import same_hub
from metastore.errors import MetastoreError

if TYPE_CHECKING:

    from hub.admin import HubAdmin
    from hub.metadata import HubRegistry
    from hub.proto import pubsub_pb2 as pb
    from hub.topic import Topic
    from metastore.api import MetaStore

__all__ = ["MAX_TOPICS", "PEER_TIMEOUT", "ClusterAdmin", "ClusterHost", "topic_summary"]


class ClusterHost(Protocol):
    """What ``ClusterAdmin`` uses of its hub (a started ``hub.server.HubServer``)."""

    address: str
    info: pb.HubInfo
    topics: dict[bytes, Topic]
    registry: HubRegistry
    store: MetaStore

log = logging.getLogger(__name__)

MAX_TOPICS = 1000
"""Topics the overview lists at most (by name; ``topics_total`` counts them all)."""
PEER_TIMEOUT = 3.0
"""Seconds another hub or a bookie has to answer before it is listed with an ``error``."""


def topic_summary(stats: dict[str, Any]) -> dict[str, Any]:
    """The overview's row of a topic from its ``/admin/v1/topics/{topic}/stats`` document."""
    subs = stats.get("subscriptions") or {}
    ledgers = stats.get("ledgers") or []
    last = int(stats.get("last_seq_id") or 0)
    first = ledgers[0]["start_seq_id"] if ledgers else last + 1
    rates_out = [s["msg_rate_out"] for s in subs.values() if isinstance(s.get("msg_rate_out"), int | float)]
    return {"topic": stats["topic"], "owner": stats.get("owner"), "publish_rate": stats.get("publish_rate", 0.0),
            "msg_rate_out": round(sum(rates_out), 3) if rates_out else None,
            "last_seq_id": last, "backlog": sum(int(s.get("backlog") or 0) for s in subs.values()),
            "backlog_bytes": stats.get("backlog_bytes"), "storage_bytes": stats.get("storage_bytes"),
            "subscriptions": len(subs), "ledgers": len(ledgers), "messages": max(0, last - first + 1)}


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        body = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(body.get("error") if isinstance(body, dict) else f"HTTP {resp.status}")
        return body


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class ClusterAdmin:
    """See the module docstring."""

    def __init__(self, server: ClusterHost, admin: HubAdmin) -> None:
        self.server = server
        self.admin = admin

    def routes(self) -> list[web.RouteDef]:
        wrap = self._wrap
        return [
            web.get("/admin/v1/hub", wrap(self.hub)),
            web.get("/admin/v1/cluster", wrap(self.cluster)),
            web.get("/admin/v1/bookies", wrap(self.bookies)),
            web.put("/admin/v1/bookies/{bookie}/readonly", wrap(self.set_read_only)),
            web.get("/admin/v1/autorecovery", wrap(self.autorecovery)),
            web.post("/admin/v1/autorecovery/audit", wrap(self.trigger_audit)),
        ]

    @staticmethod
    def _wrap(handler: RequestHandler) -> RequestHandler:
        return errors_as_statuses(handler, (((MetastoreError, errors.PubSubError), 503),))

    # --- hubs and topics --------------------------------------------------------------------------
    def local_summary(self) -> dict[str, Any]:
        """This hub's ``/admin/v1/hub`` document (the same stats the topic endpoint serves)."""
        server = self.server
        topics = [topic_summary(self.admin._owned_stats(name, t)) for name, t in sorted(server.topics.items())]
        return {"address": server.address, "publish_rate": round(sum(t["publish_rate"] for t in topics), 3),
                "topics": topics}

    async def hub(self, request: web.Request) -> web.Response:
        return json_response(self.local_summary())

    async def _hubs(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        server = self.server

        async def one(info: Any) -> dict[str, Any]:
            address = f"{info.hostname}:{info.port}"
            if same_hub(info, server.info):
                return self.local_summary()
            try:
                url = await server.registry.http_url(hub_address(info))
                if not url:
                    return {"address": address, "error": "serves no HTTP (http_server_port=-1)", "topics": []}
                got = await _get_json(session, url + "/admin/v1/hub")
                return dict(got, address=address)
            except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError) as exc:
                return {"address": address, "error": f"cannot ask it: {_why(exc)}", "topics": []}

        return list(await asyncio.gather(*(one(info) for info, _ in await server.registry.live_hubs())))

    async def cluster(self, request: web.Request) -> web.Response:
        async with self._session() as session:
            hubs, bookies = await asyncio.gather(self._hubs(session), self._bookie_rows(session))
        recovery = await self._autorecovery()
        topics = [t for h in hubs for t in h.get("topics", [])]
        owned = {t["topic"] for t in topics}
        stored = await self.admin._stored_topics()
        topics += [{"topic": name, "owner": None} for name in sorted(stored - owned)]
        topics.sort(key=lambda t: t["topic"])
        total = len(topics)
        topics = topics[:MAX_TOPICS]
        hub_rows = [{k: v for k, v in h.items() if k != "topics"} | {"topics": len(h.get("topics", []))}
                    for h in hubs]
        note = f"showing the first {MAX_TOPICS} of {total} topics (by name)" if total > MAX_TOPICS else ""
        return json_response({"hub": self.server.address, "hubs": hub_rows, "topics": topics,
                              "topics_total": total, "topics_note": note, "bookies": bookies,
                              "autorecovery": recovery, "alerts": _alerts(hub_rows, bookies, recovery)})

    # --- bookies ----------------------------------------------------------------------------------
    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT))

    async def _bookie_rows(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        regs = await list_bookies(self.server.store)

        async def one(address: str, rec: Any) -> dict[str, Any]:
            row: dict[str, Any] = {
                "address": address, "state": "read_only" if rec.state == READ_ONLY else "writable",
                "rack": rec.network_location, "free_disk": rec.free_disk, "total_disk": rec.total_disk,
                "used_fraction": round(1 - rec.free_disk / rec.total_disk, 4) if rec.total_disk else None,
                "http_url": rec.http_url, "disk_usage_threshold": None, "ledgers": None, "journal_sync_ms": None,
                "operator_read_only": None, "info_error": None}
            if not rec.http_url:
                row["info_error"] = "serves no HTTP"
                return row
            try:
                info = await _get_json(session, rec.http_url + "/api/v1/bookie/info")
            except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError) as exc:
                row["info_error"] = f"cannot ask it: {_why(exc)}"
                return row
            for key in ("disk_usage_threshold", "ledgers", "journal_sync_ms", "operator_read_only"):
                row[key] = info.get(key)
            return row

        return list(await asyncio.gather(*(one(a, rec) for a, rec in sorted(regs.items()))))

    async def bookies(self, request: web.Request) -> web.Response:
        async with self._session() as session:
            return json_response(await self._bookie_rows(session))

    async def set_read_only(self, request: web.Request) -> web.Response:
        address = request.match_info["bookie"]
        body = await json_body(request)
        if not isinstance(body.get("readOnly"), bool):
            raise HttpError(400, 'expected {"readOnly": true|false}')
        rec = (await list_bookies(self.server.store)).get(address)
        if rec is None:
            raise HttpError(404, f"no registered bookie {address!r}")
        if not rec.http_url:
            raise HttpError(409, f"bookie {address} serves no HTTP (http_server_port=-1)")
        headers = {"Content-Type": "application/json"}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        try:
            async with self._session() as session:
                async with session.put(rec.http_url + "/api/v1/bookie/state/readonly", data=json.dumps(body),
                                       headers=headers) as resp:
                    answer = await resp.read()
                    status = resp.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise HttpError(502, f"cannot reach bookie {address} at {rec.http_url}: {_why(exc)}") from None
        if status == 200:
            log.warning("bookie %s switched %s through the admin API", address,
                        "read-only" if body["readOnly"] else "writable")
        return web.Response(body=answer, status=status, content_type="application/json")

    # --- AutoRecovery -----------------------------------------------------------------------------
    async def _autorecovery(self) -> dict[str, Any]:
        mgr = await UnderReplicationManager.open(self.server.store)
        marks = await mgr.list()
        requested = await mgr.audit_request()
        token = requested.decode() if requested else None
        return {"auditor": await mgr.auditor(), "enabled": await mgr.enabled(), "audit_requested": token,
                # the token is the request's time in ns (request_audit); shown as a time
                "audit_requested_ms": int(token) // 1_000_000 if token and token.isdigit() else None,
                "under_replicated": [{"ledger_id": m.ledger_id, "missing": sorted(m.missing),
                                      "marked_ms": m.marked_ms} for m in marks]}

    async def autorecovery(self, request: web.Request) -> web.Response:
        return json_response(await self._autorecovery())

    async def trigger_audit(self, request: web.Request) -> web.Response:
        mgr = await UnderReplicationManager.open(self.server.store)
        await mgr.request_audit()
        log.warning("audit requested through the admin API")
        requested = await mgr.audit_request()
        return json_response({"audit_requested": requested.decode() if requested else None})


def _alerts(hubs: list[dict[str, Any]], bookies: list[dict[str, Any]], recovery: dict[str, Any]) -> list[str]:
    """The overview's banner: one sentence per thing an operator should look at."""
    out: list[str] = []
    marks = recovery["under_replicated"]
    if marks:
        ids = ", ".join(str(m["ledger_id"]) for m in marks[:10]) + (" ..." if len(marks) > 10 else "")
        out.append(f"{len(marks)} ledger(s) under-replicated: {ids}")
    if not recovery["enabled"]:
        out.append("AutoRecovery is disabled cluster-wide")
    for b in bookies:
        if b["state"] == "read_only":
            out.append(f"bookie {b['address']} is read-only")
        elif b["used_fraction"] is not None and b["disk_usage_threshold"] is not None \
                and b["used_fraction"] >= b["disk_usage_threshold"]:
            out.append(f"bookie {b['address']} disk is over its threshold")
    out.extend(f"hub {h['address']}: {h['error']}" for h in hubs if h.get("error"))
    return out
