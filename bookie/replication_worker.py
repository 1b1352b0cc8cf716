"""AutoRecovery's replication worker: claims marked ledgers one at a time and repairs them (``bookie.autorecovery``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from bookie.conf import BookieConf
from bookie.errors import NoSuchLedgerError, NotEnoughBookiesError
from bookie.metadata import LedgerMetadata, ledger_record_key
from bookie.ops import BookieOps
from bookie.rereplication import BookieRecovery, EntryPacer, RecoveryError
from bookie.underreplication import (
    RETRY_AFTER,
    AutoRecoveryStats,
    UnderReplicationManager,
)
from metastore import Session, Value
from metastore.errors import BadVersionError, KeyExistsError, MetastoreError, NoKeyError
from placement import NotEnoughBookiesError as PlacementNotEnoughBookiesError

log = logging.getLogger(__name__)

__all__ = ["ReplicationWorker"]


class _LeaseLost(RecoveryError):
    """The worker's session ended while it held a ledger."""


class ReplicationWorker:
    """Claims marked ledgers one at a time and re-replicates them (see ``bookie.autorecovery``).

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
