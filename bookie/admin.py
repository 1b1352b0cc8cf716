"""The bookie's HTTP admin API, after BookKeeper's HTTP service (served by ``bookie.http``).

    routes = bookie_routes(server)          # server: a started ``AdminTarget`` (``bookie.server.BookieServer``)
    HttpServer(server.stats.registry, ready=lambda: bookie_readiness(server), routes=routes)

=============================================================  ==========================================
``GET /api/v1/bookie/info``                                    ``address``, ``state`` (``writable`` or
                                                               ``read_only``), ``read_only``,
                                                               ``free_disk``/``total_disk`` (bytes; also
                                                               BookKeeper's ``freeSpace``/``totalSpace``),
                                                               ``disk_usage_threshold``, ``ledgers`` (held
                                                               here), ``journal_sync_ms`` (mean; ``null``
                                                               before the first sync),
                                                               ``lmdb_file_bytes`` and ``reclaimable_bytes``
                                                               (free pages in it, reused before it grows)
``GET /api/v1/bookie/list_bookies?type=rw|ro``                 ``{address: {state, rack, free_disk,
                                                               total_disk}}``; no ``type``: every bookie
``GET /api/v1/ledger/list``                                    ``{"ledgers": [id, ...]}`` of the cluster
                                                               (``?print_metadata=true``: ``metadata``
                                                               by id too)
``GET /api/v1/ledger/metadata?ledger_id=N``                    the ledger's metadata (``metadata_dict``)
``GET /api/v1/autorecovery/list_under_replicated_ledger``     ``[id, ...]`` from the table
                                                               ``underreplicated_ledgers`` (``[]`` without);
                                                               ``?printmissingreplica=true``: ``{id:
                                                               [missing bookie, ...]}``
``PUT /api/v1/bookie/state/readonly`` ``{"readOnly": bool}``   the operator's switch; answers the state
``GET /api/v1/bookie/state/readonly``                          ``{"readOnly": bool, "operator_read_only":
                                                               bool}``
=============================================================  ==========================================

The read-only switch is the operator's: it holds whatever the disk does (a
bookie switched read-only stays so when its disk has room; switched back,
it is writable only if its disk is not over the threshold), and the
registration is updated before the answer, so ``list_bookies`` and
``/readyz`` show the new state at once.

Failure: a missing or non-integer ``ledger_id`` or a bad ``type`` is 400,
an unknown ledger 404, a metastore that fails 503 (all as
``{"error": ...}``).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from aiohttp import web

from bookie.conf import BookieConf
from bookie.disk import DiskUsage
from bookie.errors import NoSuchLedgerError
from bookie.http import HttpError, json_body, json_response
from bookie.metadata import LedgerMetadataManager, metadata_dict
from bookie.registration import READ_ONLY, list_bookies
from bookie.stats import BookieStats
from bookie.storage import EntryStorage
from metastore import MetaStore
from metastore.errors import MetastoreError

__all__ = ["UNDER_REPLICATED_TABLE", "AdminTarget", "bookie_readiness", "bookie_routes"]

log = logging.getLogger(__name__)

UNDER_REPLICATED_TABLE = "underreplicated_ledgers"
"""The AutoRecovery table of ledgers missing a replica (key: ledger id)."""


class AdminTarget(Protocol):
    """What the admin API reads and switches on a bookie (``bookie.server.BookieServer`` is one)."""

    @property
    def address(self) -> str: ...
    @property
    def draining(self) -> bool: ...
    @property
    def registered(self) -> bool: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def operator_read_only(self) -> bool: ...
    @property
    def metastore(self) -> MetaStore | None: ...
    @property
    def conf(self) -> BookieConf: ...
    @property
    def storage(self) -> EntryStorage: ...
    @property
    def stats(self) -> BookieStats: ...

    def disk_usage(self) -> DiskUsage:
        """A fresh sample of the disk usage (``OSError`` when it cannot be measured)."""
        ...

    async def set_operator_read_only(self, read_only: bool) -> None:
        """The operator's switch; ``MetastoreError`` when the registration cannot be updated."""
        ...


async def bookie_readiness(server: AdminTarget) -> str | None:
    """``None`` when the bookie is registered and writable; else why not."""
    if server.draining:
        return "stopping"
    if not server.registered:
        return "not registered in the metastore"
    if server.read_only:
        return "read-only" + (" (operator)" if server.operator_read_only else " (disk)")
    return None


def _ledger_id(request: web.Request) -> int:
    raw = request.query.get("ledger_id")
    if raw is None:
        raise HttpError(400, "missing query parameter ledger_id")
    try:
        ledger_id = int(raw)
    except ValueError:
        raise HttpError(400, f"ledger_id must be an integer, not {raw!r}") from None
    if ledger_id < 0:
        raise HttpError(400, f"ledger_id must be >= 0, not {ledger_id}")
    return ledger_id


def _mean_ms(histogram: Any) -> float | None:
    """The mean of a seconds histogram (``bookie.stats``) in ms since start; ``None`` before any sample."""
    count = sum(histogram.counts)
    return round(histogram.total / count * 1000.0, 3) if count else None


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def bookie_routes(server: AdminTarget) -> list[web.RouteDef]:
    """The admin routes of ``server`` (see the module docstring)."""

    def metastore() -> Any:
        ms = server.metastore
        if ms is None:
            raise HttpError(503, "metastore not open")
        return ms

    async def info(request: web.Request) -> web.Response:
        usage = server.disk_usage()
        lmdb_file, reclaimable = server.storage.lmdb_usage()
        return json_response({
            "lmdb_file_bytes": lmdb_file, "reclaimable_bytes": reclaimable,
            "address": server.address, "state": "read_only" if server.read_only else "writable",
            "read_only": server.read_only, "operator_read_only": server.operator_read_only,
            "registered": server.registered, "free_disk": usage.free, "total_disk": usage.total,
            "freeSpace": usage.free, "totalSpace": usage.total,
            "disk_usage_threshold": server.conf.disk_usage_threshold,
            "ledgers": len(server.storage.ledger_ids()),
            "journal_sync_ms": _mean_ms(server.stats.journal_sync_seconds),
        })

    async def bookies(request: web.Request) -> web.Response:
        kind = request.query.get("type", "")
        if kind not in ("", "rw", "ro"):
            raise HttpError(400, f"type must be rw or ro, not {kind!r}")
        try:
            regs = await list_bookies(metastore())
        except MetastoreError as exc:
            raise HttpError(503, f"metastore: {exc}") from None
        out: dict[str, Any] = {}
        for address, rec in sorted(regs.items()):
            ro = rec.state == READ_ONLY
            if (kind == "rw" and ro) or (kind == "ro" and not ro):
                continue
            out[address] = {"state": "read_only" if ro else "writable", "rack": rec.network_location,
                            "free_disk": rec.free_disk, "total_disk": rec.total_disk}
        return json_response(out)

    async def ledgers(request: web.Request) -> web.Response:
        with_metadata = _true(request.query.get("print_metadata"))
        try:
            mgr = await LedgerMetadataManager.open(metastore())
            ids: list[int] = []
            metadata: dict[str, Any] = {}
            async for lid, md in mgr.list():
                ids.append(lid)
                if with_metadata:
                    metadata[str(lid)] = metadata_dict(lid, md)
        except MetastoreError as exc:
            raise HttpError(503, f"metastore: {exc}") from None
        body: dict[str, Any] = {"ledgers": ids}
        if with_metadata:
            body["metadata"] = metadata
        return json_response(body)

    async def ledger_metadata(request: web.Request) -> web.Response:
        ledger_id = _ledger_id(request)
        try:
            md, _ = await (await LedgerMetadataManager.open(metastore())).read(ledger_id)
        except NoSuchLedgerError:
            raise HttpError(404, f"no ledger {ledger_id}") from None
        except MetastoreError as exc:
            raise HttpError(503, f"metastore: {exc}") from None
        return json_response(metadata_dict(ledger_id, md))

    async def under_replicated(request: web.Request) -> web.Response:
        ids: list[int] = []
        missing: dict[str, list[str]] = {}
        try:
            table = await metastore().create_scannable_table(UNDER_REPLICATED_TABLE)
            cursor = await table.open_cursor()
            try:
                async for batch in cursor:
                    for key, got in batch:
                        try:
                            ledger_id = int(key)
                        except ValueError:
                            log.warning("ignoring %s key %r (not a ledger id)", UNDER_REPLICATED_TABLE, key)
                            continue
                        ids.append(ledger_id)
                        raw = (got.value.get("missing") or b"").decode("utf-8", "replace")
                        missing[str(ledger_id)] = sorted(b for b in raw.split(",") if b)
            finally:
                await cursor.close()
        except MetastoreError as exc:
            raise HttpError(503, f"metastore: {exc}") from None
        if _true(request.query.get("printmissingreplica")):
            return json_response(missing)
        return json_response(sorted(ids))

    def read_only_state() -> web.Response:
        return json_response({"readOnly": server.read_only, "operator_read_only": server.operator_read_only})

    async def get_read_only(request: web.Request) -> web.Response:
        return read_only_state()

    async def set_read_only(request: web.Request) -> web.Response:
        body = await json_body(request)
        value = body.get("readOnly")
        if not isinstance(value, bool):
            raise HttpError(400, 'expected {"readOnly": true|false}')
        try:
            await server.set_operator_read_only(value)
        except MetastoreError as exc:
            raise HttpError(503, f"state changed but the registration could not be updated: {exc}") from None
        return read_only_state()

    return [
        web.get("/api/v1/bookie/info", info),
        web.get("/api/v1/bookie/list_bookies", bookies),
        web.get("/api/v1/ledger/list", ledgers),
        web.get("/api/v1/ledger/metadata", ledger_metadata),
        web.get("/api/v1/autorecovery/list_under_replicated_ledger", under_replicated),
        web.get("/api/v1/bookie/state/readonly", get_read_only),
        web.put("/api/v1/bookie/state/readonly", set_read_only),
    ]
