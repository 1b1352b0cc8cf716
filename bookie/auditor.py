"""AutoRecovery's auditor: the one elected per cluster marks the ledgers of gone bookies (``bookie.autorecovery``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from bookie.conf import BookieConf
from bookie.errors import BKError, NoSuchEntryError, NoSuchLedgerError
from bookie.metadata import LedgerMetadata
from bookie.ops import BookieOps
from bookie.registration import list_bookies
from bookie.rereplication import fragments_of
from bookie.underreplication import (
    _NOT_READ,
    AutoRecoveryStats,
    UnderReplicationManager,
)
from metastore import MetaStore

log = logging.getLogger(__name__)

__all__ = ["Auditor"]


class Auditor:
    """The elected auditor's duties; ``tick`` is called every ``POLL_INTERVAL`` (see ``bookie.autorecovery``)."""

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
