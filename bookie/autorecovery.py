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

from prometheus_client import CollectorRegistry

from bookie.auditor import Auditor
from bookie.conf import BookieConf
from bookie.ops import BookieOps
from bookie.replication_worker import ReplicationWorker
from bookie.underreplication import AUDIT_REQUEST_KEY as AUDIT_REQUEST_KEY
from bookie.underreplication import AUDITOR_KEY as AUDITOR_KEY
from bookie.underreplication import AUTORECOVERY_TABLE as AUTORECOVERY_TABLE
from bookie.underreplication import DELAY_KEY as DELAY_KEY
from bookie.underreplication import ENABLED_KEY as ENABLED_KEY
from bookie.underreplication import LOCKS_TABLE as LOCKS_TABLE
from bookie.underreplication import POLL_INTERVAL as POLL_INTERVAL
from bookie.underreplication import RETRY_AFTER as RETRY_AFTER
from bookie.underreplication import UNDERREPLICATED_TABLE as UNDERREPLICATED_TABLE
from bookie.underreplication import AutoRecoveryStats as AutoRecoveryStats
from bookie.underreplication import UnderReplicatedLedger as UnderReplicatedLedger
from bookie.underreplication import UnderReplicationManager as UnderReplicationManager
from metastore import MetaStore, Session, Value
from metastore.errors import KeyExistsError, MetastoreError

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
