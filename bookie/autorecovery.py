"""AutoRecovery: one auditor per cluster marks under-replicated ledgers; replication workers repair them.

    ar = AutoRecovery(store, conf, registry=stats.registry)   # conf: a BookieConf
    await ar.start()          # an auditor candidate and one replication worker
    ar.is_auditor             # True in the one process elected
    await ar.stop()

    urm = await UnderReplicationManager.open(store)           # the tables (shell, tests)
    await urm.mark(ledger_id, {"127.0.0.1:3181"})
    for rec in await urm.list(): rec.ledger_id, rec.missing, rec.marked_ms
    await urm.set_enabled(False)                              # pauses every worker of the cluster
    await urm.set_lost_bookie_recovery_delay(60)              # overrides the conf default cluster-wide

*Auditor.* Every AutoRecovery is a candidate; the one that creates the
ephemeral key ``auditor`` in the table ``autorecovery`` (through the
metastore's ``SessionCapability``: a ZooKeeper ephemeral node, a lease on
lmdb and hbase) is the auditor until its session ends; the others retry
every ``POLL_INTERVAL`` and take over once the key vanishes. The auditor
reads the ``bookies`` registrations each tick. A bookie that disappears, or
that ledgers name but that is not registered when the auditor is elected,
is *gone since* that moment; once it has been gone ``lost_bookie_recovery_delay``
seconds (the cluster-wide value in the metastore, else the conf's) every
ledger with a segment on it is marked in ``underreplicated_ledgers`` (key:
the 20-digit ledger id; fields ``missing`` = comma-separated bookies,
``marked_ms``). A bookie back within the delay is forgotten: nothing is
marked, nothing copied. Every ``auditor_periodic_check_interval`` seconds
(0: never) the auditor also reads the first and last entry of every fragment
of every closed ledger from its live bookie and marks the ledger when the
bookie says it has no such entry, and counts every bookie that ledgers
name but that is not registered as gone from then on (one that registered
and died between two ticks never showed in a comparison of registrations;
BookKeeper's periodic bookie check). ``quire shell triggeraudit``
(``UnderReplicationManager.request_audit``) makes the auditor run that check
at its next tick.

*Replication worker.* It takes the marked ledgers one at a time: it claims
one by creating an ephemeral key in ``underreplicated_locks`` (so two workers
never copy the same ledger at once, and the claim of a worker that dies
vanishes with its session), then, for each missing bookie, runs
``bookie.rereplication.BookieRecovery.recover_ledger``: an open ledger whose
last segment names a missing bookie is left to its writer for
``open_ledger_rereplication_grace_period`` seconds after it was marked, then
recovery-closed (its writer is taken as gone); one that names it only in
sealed segments stays open and just those are copied; each fragment is copied to a
bookie the placement policy chooses and the ensemble updated by CAS. Before
every metadata change the worker checks it still holds its session (else it
stops, leaving the mark for another worker). Done, it removes the mark by
CAS on the version it claimed (a mark the auditor extended meanwhile stays)
and releases the claim. Copies are throttled to ``rereplication_entries_per_second``.
While the key ``enabled`` of ``autorecovery`` says ``false`` no worker
claims anything (a ledger being copied when it is set is finished first).

Failure: a failed ledger (no readable replica, no spare bookie...) keeps its
mark and is retried at the next poll; metastore errors are logged and the
loops go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from bookie.conf import BookieConf
from bookie.errors import BKError, NoSuchEntryError, NoSuchLedgerError, NotEnoughBookiesError
from bookie.metadata import LedgerMetadata, ledger_record_key
from bookie.ops import BookieOps
from bookie.registration import list_bookies
from bookie.rereplication import BookieRecovery, EntryPacer, RecoveryError, fragments_of
from metastore import MetaStore, Session, Value, Version
from metastore.api import MetastoreScannableTable, MetastoreTable, Versioned
from metastore.cas import update_record
from metastore.errors import BadVersionError, KeyExistsError, MetastoreError, NoKeyError
from placement import NotEnoughBookiesError as PlacementNotEnoughBookiesError

log = logging.getLogger(__name__)

__all__ = [
    "AUDITOR_KEY",
    "AUTORECOVERY_TABLE",
    "LOCKS_TABLE",
    "POLL_INTERVAL",
    "UNDERREPLICATED_TABLE",
    "Auditor",
    "AutoRecovery",
    "AutoRecoveryStats",
    "ReplicationWorker",
    "UnderReplicatedLedger",
    "UnderReplicationManager",
]

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


class Auditor:
    """The elected auditor's duties; ``tick`` is called every ``POLL_INTERVAL`` (see the module docstring)."""

    def __init__(self, store: MetaStore, urm: UnderReplicationManager, ops: BookieOps, conf: BookieConf,
                 stats: AutoRecoveryStats, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._urm = urm
        self._ops = ops
        self._conf = conf
        self._stats = stats
        self._clock = clock
        self.gone_since: dict[str, float] = {}
        self._handled: set[str] = set()
        self._live: set[str] | None = None
        self._last_check = clock()
        self._audit_seen: bytes | None = _NOT_READ

    async def tick(self) -> None:
        now = self._clock()
        live = set(await list_bookies(self._store))
        full = await self._full_audit_due(now)
        if self._live is None or full:
            # just elected, or a full audit: ledgers may name bookies that died unseen (one that
            # registered and died between two ticks never showed in a comparison of registrations)
            await self.note_unregistered(live, now)
        if self._live is not None:
            for b in self._live - live:
                log.info("auditor: bookie %s is gone", b)
                self.gone_since.setdefault(b, now)
        for b in [b for b in self.gone_since if b in live]:
            log.info("auditor: bookie %s is back", b)
            del self.gone_since[b]
            self._handled.discard(b)
        self._live = live
        still_gone = self._handled & set(self.gone_since)
        delay = await self._urm.lost_bookie_recovery_delay(float(self._conf.lost_bookie_recovery_delay))
        due = {b for b, t in self.gone_since.items() if now - t >= delay} - self._handled
        if due:
            n = await self.mark_ledgers_on(due)
            log.info("auditor: %s gone over %gs: %d ledgers marked", ", ".join(sorted(due)), delay, n)
            self._handled |= due
        if full:
            if still_gone:  # a safety net: ledgers still naming a lost bookie are marked again
                await self.mark_ledgers_on(still_gone)
            await self.check_fragments(live)
        self._stats.underreplicated.set(len(await self._urm.list()))

    async def _full_audit_due(self, now: float) -> bool:
        """Whether this tick runs the full audit: ``auditor_periodic_check_interval`` passed, or an
        operator asked (``quire shell triggeraudit``) since the last tick."""
        requested = await self._urm.audit_request()
        if self._audit_seen == _NOT_READ:   # just elected: its own scan of the ledgers' bookies serves it
            self._audit_seen = requested
        interval = self._conf.auditor_periodic_check_interval
        if requested != self._audit_seen:
            self._audit_seen = requested
            log.info("auditor: a full audit was requested (quire shell triggeraudit)")
        elif not (interval > 0 and now - self._last_check >= interval):
            return False
        self._last_check = now
        return True

    async def note_unregistered(self, live: set[str], now: float) -> None:
        """Count every bookie that ledgers name but that is not registered as gone since ``now``
        (unless already counted)."""
        named: set[str] = set()
        async for _, md in self._ops.list_ledgers():
            named |= md.bookies()
        new = named - live - set(self.gone_since)
        for b in sorted(new):
            if self._live is not None:
                log.info("auditor: bookie %s is named by ledgers but not registered", b)
            self.gone_since[b] = now

    async def mark_ledgers_on(self, bookies: set[str]) -> int:
        """Mark every ledger with a segment on one of ``bookies``; returns how many were marked."""
        n = 0
        async for lid, md in self._ops.list_ledgers():
            missing = md.bookies() & bookies
            if missing:
                await self._urm.mark(lid, missing)
                n += 1
        return n

    async def check_fragments(self, live: set[str]) -> int:
        """Read each fragment's first and last entry from its live bookie; mark the ledgers missing some.

        Only closed ledgers are checked (an open one's last fragment has no known end). Returns how many
        ledgers were marked. A bookie that does not answer is skipped (it is not proven to miss anything).
        """
        n = 0
        async for lid, md in self._ops.list_ledgers():
            if not md.is_closed:
                continue
            missing = {b for b in md.bookies() & live if not await self._holds_fragments(lid, md, b)}
            if missing:
                await self._urm.mark(lid, missing)
                n += 1
        if n:
            log.info("auditor: periodic check marked %d ledgers", n)
        return n

    async def _holds_fragments(self, lid: int, md: LedgerMetadata, bookie: str) -> bool:
        for frag in fragments_of(lid, md, bookie):
            entries = frag.entries(md)
            for entry_id in {entries[0], entries[-1]} if entries else set():
                try:
                    await self._ops.read_payload(bookie, lid, entry_id)
                except (NoSuchEntryError, NoSuchLedgerError):
                    log.warning("auditor: %s lacks entry %d of ledger %d", bookie, entry_id, lid)
                    return False
                except BKError as exc:
                    log.info("auditor: cannot check ledger %d on %s: %s", lid, bookie, exc)
                    return True
        return True


class _LeaseLost(RecoveryError):
    """The worker's session ended while it held a ledger."""


class ReplicationWorker:
    """Claims marked ledgers one at a time and re-replicates them (see the module docstring).

    ``on_entry_copied(ledger_id)`` is a test hook, called after each entry copied.
    """

    def __init__(self, urm: UnderReplicationManager, ops: BookieOps, conf: BookieConf, stats: AutoRecoveryStats,
                 session: Callable[[], Session | None]) -> None:
        self._urm = urm
        self._ops = ops
        self._conf = conf
        self._stats = stats
        self._session = session
        self._pacer = EntryPacer(conf.rereplication_entries_per_second)
        self._passwords = [conf.bookie_recovery_password.encode()] if conf.bookie_recovery_password else []
        self.on_entry_copied: Callable[[int], object] | None = None
        self.current: int | None = None
        """The ledger being re-replicated now, if any."""
        self._retry_at: dict[int, float] = {}

    async def run_once(self) -> bool:
        """Re-replicate one marked ledger if any can be claimed; True when one was worked on."""
        if not await self._urm.enabled():
            return False
        session = self._session()
        if session is None or not session.alive:
            return False
        now = time.monotonic()
        for rec in await self._urm.list():
            if self._retry_at.get(rec.ledger_id, 0.0) > now or not await self._claim(session, rec.ledger_id):
                continue
            try:
                if await self._replicate(session, rec.ledger_id):
                    return True
            finally:
                await self._release(session, rec.ledger_id)
        return False

    async def _claim(self, session: Session, ledger_id: int) -> bool:
        try:
            await session.put_ephemeral(self._urm.locks, ledger_record_key(ledger_id),
                                        Value({"owner": session.session_id.encode()}))
        except KeyExistsError:
            return False
        return True

    async def _release(self, session: Session, ledger_id: int) -> None:
        key = ledger_record_key(ledger_id)
        try:
            got = await self._urm.locks.get(key)
            if got.value.get("owner") == session.session_id.encode():
                await self._urm.locks.remove(key, got.version)
        except (NoKeyError, BadVersionError):
            pass
        except MetastoreError as exc:
            log.warning("cannot release the claim on ledger %d: %s", ledger_id, exc)

    async def _replicate(self, session: Session, ledger_id: int) -> bool:
        """Work on one claimed ledger; False when it was left alone (an open ledger in its grace period)."""
        rec = await self._urm.get(ledger_id)
        if rec is None:
            return False
        try:
            md, _ = await self._ops.read_metadata(ledger_id)
        except NoSuchLedgerError:
            await self._urm.unmark(ledger_id, rec.version)
            log.info("ledger %d was deleted: mark removed", ledger_id)
            return True
        grace_ms = self._conf.open_ledger_rereplication_grace_period * 1000
        in_last_segment = bool(rec.missing & set(md.current_ensemble))
        if not md.is_closed and in_last_segment and time.time() * 1000 - rec.marked_ms < grace_ms:
            return False  # its writer, if alive, replaces the bookie by an ensemble change on its next add

        async def guard() -> None:
            if not session.alive:
                raise _LeaseLost(f"lost the claim on ledger {ledger_id} (session ended)")

        await self._ops.refresh_placement()  # the policy chooses among the bookies registered now
        if not md.is_closed and in_last_segment and not self._replaceable(md, rec.missing):
            self._stats.failures.inc()
            self._retry_at[ledger_id] = time.monotonic() + RETRY_AFTER
            log.warning("autorecovery: ledger %d is open and no bookie can replace %s: not fencing it", ledger_id,
                        ", ".join(sorted(rec.missing)))
            return True
        progress = _Progress(self)
        self.current = ledger_id
        try:
            for bookie in sorted(rec.missing):
                recovery = BookieRecovery(self._ops, bookie, None, self._passwords, keep_writers=True,
                                          pacer=self._pacer, guard=guard)
                outcome = await recovery.recover_ledger(ledger_id, progress)
                if outcome.status == "failed":
                    self._stats.failures.inc()
                    self._retry_at[ledger_id] = time.monotonic() + RETRY_AFTER
                    log.warning("autorecovery: ledger %d off %s failed: %s", ledger_id, bookie, outcome.error)
                    return True
                log.info("autorecovery: %s", outcome.line())
        finally:
            self.current = None
        await guard()
        self._retry_at.pop(ledger_id, None)
        if await self._urm.unmark(ledger_id, rec.version):
            self._stats.ledgers.inc()
            log.info("autorecovery: ledger %d re-replicated", ledger_id)
        return True


    def _replaceable(self, md: LedgerMetadata, missing: frozenset[str]) -> bool:
        """Whether the placement policy has a spare for every missing bookie of the last segment."""
        ensemble = list(md.current_ensemble)
        for bookie in sorted(missing & set(ensemble)):
            try:
                spare = self._ops.policy.replace_bookie(md.ensemble_size, md.write_quorum, md.ack_quorum, ensemble,
                                                        bookie, exclude=set(missing))
            except (PlacementNotEnoughBookiesError, NotEnoughBookiesError):
                return False
            ensemble[ensemble.index(bookie)] = spare
        return True


class _Progress:
    """Counts copied entries into the metrics and calls the worker's test hook."""

    def __init__(self, worker: ReplicationWorker) -> None:
        self._worker = worker

    def entries_copied(self, n: int) -> None:
        self._worker._stats.entries.inc(n)
        hook = self._worker.on_entry_copied
        if hook is not None and self._worker.current is not None:
            hook(self._worker.current)

    def ledger_done(self, line: str | None = None) -> None:
        pass


class AutoRecovery:
    """An auditor candidate and a replication worker over one metastore (see the module docstring).

    Raises nothing from its loops (errors are logged and retried); ``start``
    raises ``MetastoreError`` when the tables cannot be opened.
    """

    def __init__(self, store: MetaStore, conf: BookieConf, registry: CollectorRegistry | None = None) -> None:
        self.store = store
        self.conf = conf
        self.stats = AutoRecoveryStats(registry if registry is not None else CollectorRegistry())
        self._session: Session | None = None
        self._auditor: Auditor | None = None
        self._auditor_session: Session | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ops: BookieOps | None = None
        self.worker: ReplicationWorker | None = None
        self.urm: UnderReplicationManager | None = None

    @property
    def is_auditor(self) -> bool:
        return self._auditor is not None and self._auditor_session is not None and self._auditor_session.alive

    @property
    def session(self) -> Session | None:
        return self._session

    async def start(self) -> None:
        self.urm = await UnderReplicationManager.open(self.store)
        self._ops = await BookieOps.open(self.store)
        self.worker = ReplicationWorker(self.urm, self._ops, self.conf, self.stats, lambda: self._session)
        await self._renew_session()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._auditor_loop(), name="autorecovery-auditor"),
                       loop.create_task(self._worker_loop(), name="autorecovery-worker")]
        log.info("autorecovery started (session %s)", self._session.session_id if self._session else "-")

    async def stop(self) -> None:
        """Stop both loops, give up the auditor role and any claim (closing the session)."""
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        session, self._session = self._session, None
        self._auditor = None
        if session is not None:
            with contextlib.suppress(MetastoreError):
                await session.close()
        if self._ops is not None:
            await self._ops.close()
            self._ops = None

    async def _renew_session(self) -> Session:
        if self._session is None or not self._session.alive:
            old, self._session = self._session, None
            if old is not None:
                log.warning("autorecovery session %s ended; opening a new one", old.session_id)
                with contextlib.suppress(MetastoreError):
                    await old.close()
            self._session = await self.store.session(timeout=self.conf.session_timeout_s)
        return self._session

    async def _auditor_loop(self) -> None:
        assert self.urm is not None and self._ops is not None
        while True:
            try:
                session = await self._renew_session()
                if self._auditor is None or self._auditor_session is not session:
                    self._auditor = None
                    try:
                        await session.put_ephemeral(self.urm.control, AUDITOR_KEY,
                                                    Value({"owner": session.session_id.encode()}))
                    except KeyExistsError:
                        self.stats.underreplicated.set(0)
                    else:
                        log.info("elected auditor (session %s)", session.session_id)
                        self._auditor = Auditor(self.store, self.urm, self._ops, self.conf, self.stats)
                        self._auditor_session = session
                if self._auditor is not None:
                    await self._auditor.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep auditing through metastore and bookie hiccups
                log.warning("auditor tick failed: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
            await asyncio.sleep(POLL_INTERVAL)

    async def _worker_loop(self) -> None:
        assert self.worker is not None
        while True:
            worked = False
            try:
                await self._renew_session()
                worked = await self.worker.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed ledger keeps its mark; try again later
                log.warning("replication worker: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
            if not worked:
                await asyncio.sleep(POLL_INTERVAL)


class AutoRecoveryServer:
    """``quire autorecovery``: AutoRecovery as a process of its own (metastore, metrics endpoint).

    ``start`` raises ``MetastoreError`` or ``OSError`` (stats port in use).
    """

    def __init__(self, conf: BookieConf) -> None:
        self.conf = conf
        self.registry = CollectorRegistry()
        self.stats_url: str | None = None
        self.autorecovery: AutoRecovery | None = None
        self._store: MetaStore | None = None
        self._httpd: object | None = None

    async def start(self) -> None:
        from prometheus_client import start_http_server

        from metastore import open_metastore

        try:
            self._store = await open_metastore(self.conf.metastore)
            self.autorecovery = AutoRecovery(self._store, self.conf, registry=self.registry)
            await self.autorecovery.start()
            if self.conf.stats_http_port:
                httpd, _ = start_http_server(max(self.conf.stats_http_port, 0), addr=self.conf.stats_http_host,
                                             registry=self.registry)
                self._httpd = httpd
                self.stats_url = f"http://{self.conf.stats_http_host}:{httpd.server_port}/metrics"
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self.autorecovery is not None:
            await self.autorecovery.stop()
            self.autorecovery = None
        if self._store is not None:
            with contextlib.suppress(MetastoreError):
                await self._store.close()
            self._store = None
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            await asyncio.to_thread(httpd.shutdown)  # type: ignore[attr-defined]
            httpd.server_close()  # type: ignore[attr-defined]
