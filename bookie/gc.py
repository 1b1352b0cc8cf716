"""Garbage collection of a bookie: delete the ledgers the metastore no longer lists.

    gc = GarbageCollector(storage, await LedgerMetadataManager.open(store))
    deleted = await gc.collect()          # ledger ids removed from this bookie's storage

The bookie's own ledger list is taken before the metastore is read, so a
ledger created meanwhile (metadata first, then adds) is never taken for
garbage. The metastore is read through ``LedgerMetadataManager`` (its key
format is that module's business). ``collect`` raises ``MetastoreError``
when the metastore cannot be read; nothing is deleted then.
"""

from __future__ import annotations

import logging

from bookie.metadata import LedgerMetadataManager
from bookie.storage import EntryStorage

log = logging.getLogger(__name__)

__all__ = ["GarbageCollector"]


class GarbageCollector:
    """See the module docstring."""

    def __init__(self, storage: EntryStorage, ledgers: LedgerMetadataManager) -> None:
        self.storage = storage
        self.ledgers = ledgers

    async def collect(self) -> list[int]:
        """Delete the ledgers this bookie stores that the metastore does not list; returns their ids."""
        local = self.storage.ledger_ids()
        if not local:
            return []
        live = await self.ledgers.ledger_ids()
        dead = sorted(local - live)
        if dead:
            await self.storage.delete_ledgers(dead)  # one checkpoint for all of them
        if dead:
            log.info("garbage collected %d ledger(s): %s", len(dead), dead[:20])
        return dead
