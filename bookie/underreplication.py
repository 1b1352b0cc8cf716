"""AutoRecovery's tables and metrics: marks of under-replicated ledgers, claims, the cluster-wide switch.

    urm = await UnderReplicationManager.open(store)           # the tables (shell, tests)
    await urm.mark(ledger_id, {"127.0.0.1:3181"})
    for rec in await urm.list(): rec.ledger_id, rec.missing, rec.marked_ms
    await urm.set_enabled(False)                              # pauses every worker of the cluster
    await urm.set_lost_bookie_recovery_delay(60)              # overrides the conf default cluster-wide

Shared by the auditor (``bookie.auditor``) and the replication worker
(``bookie.replication_worker``); ``bookie.autorecovery`` runs both.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from bookie.metadata import ledger_record_key
from metastore import MetaStore, Value, Version
from metastore.api import MetastoreScannableTable, MetastoreTable, Versioned
from metastore.cas import update_record
from metastore.errors import BadVersionError, NoKeyError

log = logging.getLogger(__name__)

__all__ = ["AUDITOR_KEY", "AUTORECOVERY_TABLE", "LOCKS_TABLE", "POLL_INTERVAL", "UNDERREPLICATED_TABLE",
           "AutoRecoveryStats", "UnderReplicatedLedger", "UnderReplicationManager"]

UNDERREPLICATED_TABLE = "underreplicated_ledgers"
LOCKS_TABLE = "underreplicated_locks"
AUTORECOVERY_TABLE = "autorecovery"
AUDITOR_KEY = "auditor"
ENABLED_KEY = "enabled"
DELAY_KEY = "lost_bookie_recovery_delay"
AUDIT_REQUEST_KEY = "audit_requested"
_NOT_READ = b"\x00not read"
POLL_INTERVAL = 1.0
"""Seconds between auditor ticks, election attempts and idle worker polls."""
RETRY_AFTER = 5.0
"""Seconds a worker leaves a ledger it failed to re-replicate before trying it again."""


@dataclass(frozen=True)
class UnderReplicatedLedger:
    """One mark: the ledger, the bookies its copies are missing on, when it was first marked."""

    ledger_id: int
    missing: frozenset[str]
    marked_ms: int
    version: Version


def _decode(key: str, value: Value, version: Version) -> UnderReplicatedLedger:
    missing = (value.get("missing") or b"").decode()
    return UnderReplicatedLedger(int(key), frozenset(b for b in missing.split(",") if b),
                                 int(value.get("marked_ms") or b"0"), version)


class UnderReplicationManager:
    """The AutoRecovery tables: marks, claims, the cluster-wide switch and delay."""

    def __init__(self, marks: MetastoreScannableTable, locks: MetastoreTable, control: MetastoreTable) -> None:
        self.marks = marks
        self.locks = locks
        self.control = control

    @classmethod
    async def open(cls, store: MetaStore) -> UnderReplicationManager:
        return cls(await store.create_scannable_table(UNDERREPLICATED_TABLE), await store.create_table(LOCKS_TABLE),
                   await store.create_table(AUTORECOVERY_TABLE))

    async def mark(self, ledger_id: int, missing: set[str] | frozenset[str]) -> bool:
        """Add ``missing`` to the ledger's mark (created when absent); False when it already named them all."""
        changed = [False]

        def update(cur: Versioned | None) -> Value | None:
            changed[0] = False
            old: frozenset[str] = frozenset()
            if cur is not None:
                old = _decode(ledger_record_key(ledger_id), cur.value, cur.version).missing
                if set(missing) <= old:
                    return None
            changed[0] = True
            out = Value({"missing": ",".join(sorted(old | set(missing))).encode()})
            if cur is None:
                out["marked_ms"] = str(int(time.time() * 1000)).encode()
            return out

        await update_record(self.marks, ledger_record_key(ledger_id), update)
        if changed[0]:
            log.info("ledger %d marked under-replicated (missing %s)", ledger_id, ", ".join(sorted(missing)))
        return changed[0]

    async def get(self, ledger_id: int) -> UnderReplicatedLedger | None:
        key = ledger_record_key(ledger_id)
        try:
            got = await self.marks.get(key)
        except NoKeyError:
            return None
        return _decode(key, got.value, got.version)

    async def unmark(self, ledger_id: int, version: Version = Version.ANY) -> bool:
        """Remove the mark if it is still at ``version``; False when it changed meanwhile (kept)."""
        try:
            await self.marks.remove(ledger_record_key(ledger_id), version)
        except NoKeyError:
            return True
        except BadVersionError:
            return False
        return True

    async def list(self) -> list[UnderReplicatedLedger]:
        """Every mark, in ledger id order."""
        out: list[UnderReplicatedLedger] = []
        cur = await self.marks.open_cursor_range("", True, "", True)
        try:
            while cur.has_more():
                for key, got in await cur.read_entries(500):
                    if key.isdigit():
                        out.append(_decode(key, got.value, got.version))
        finally:
            await cur.close()
        return out

    async def _control(self, key: str) -> bytes | None:
        try:
            return (await self.control.get(key)).value.get("value")
        except NoKeyError:
            return None

    async def _set_control(self, key: str, value: bytes) -> None:
        await update_record(self.control, key, lambda _cur: Value({"value": value}))

    async def enabled(self) -> bool:
        """False while an operator has disabled AutoRecovery cluster-wide (``quire shell autorecovery disable``)."""
        return await self._control(ENABLED_KEY) != b"false"

    async def set_enabled(self, enabled: bool) -> None:
        await self._set_control(ENABLED_KEY, b"true" if enabled else b"false")

    async def lost_bookie_recovery_delay(self, default: float) -> float:
        """The cluster-wide delay (seconds) when an operator set one, else ``default``."""
        raw = await self._control(DELAY_KEY)
        try:
            return float(raw) if raw is not None else default
        except ValueError:
            log.warning("ignoring a malformed %s in the metastore: %r", DELAY_KEY, raw)
            return default

    async def lost_bookie_recovery_delay_override(self) -> float | None:
        raw = await self._control(DELAY_KEY)
        return float(raw) if raw is not None else None

    async def set_lost_bookie_recovery_delay(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("lost_bookie_recovery_delay must be >= 0 seconds")
        await self._set_control(DELAY_KEY, f"{seconds:g}".encode())

    async def request_audit(self) -> None:
        """Ask the auditor for a full audit at its next tick (``quire shell triggeraudit``; BookKeeper's
        ``triggeraudit``): what ``auditor_periodic_check_interval`` runs, now."""
        await self._set_control(AUDIT_REQUEST_KEY, str(time.time_ns()).encode())

    async def audit_request(self) -> bytes | None:
        """The last audit request (an opaque token; a new one means "audit now"), or None."""
        return await self._control(AUDIT_REQUEST_KEY)

    async def auditor(self) -> str | None:
        """Who the auditor is (its session id), or None while there is none."""
        try:
            got = await self.control.get(AUDITOR_KEY)
        except NoKeyError:
            return None
        return (got.value.get("owner") or b"").decode() or None

    async def lock_owner(self, ledger_id: int) -> str | None:
        try:
            got = await self.locks.get(ledger_record_key(ledger_id))
        except NoKeyError:
            return None
        return (got.value.get("owner") or b"").decode() or None


class AutoRecoveryStats:
    """AutoRecovery's metrics, in a bookie's registry (or the ``quire autorecovery`` process's own)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.underreplicated = Gauge("autorecovery_underreplicated_ledgers",
                                     "ledgers marked under-replicated (set by the auditor)", registry=registry)
        self.entries = Counter("autorecovery_rereplicated_entries", "entries copied by this process's worker",
                               registry=registry)
        self.ledgers = Counter("autorecovery_rereplicated_ledgers",
                               "ledgers this process's worker re-replicated and unmarked", registry=registry)
        self.failures = Counter("autorecovery_failures", "ledgers this process's worker failed to re-replicate",
                                registry=registry)
