"""What the parts of one ledger client share: metadata manager, placement, watcher, conf, connections.

    ctx = ClientContext(ledgers, policy, watcher, conf, pool, failures)
    writer = LedgerWriter(ctx, ledger_id, metadata, version, password)
    reader = LedgerReader(ctx, ledger_id, password, lambda: writer.metadata)

``BookKeeper`` builds one per client; writers, readers and recovery take it
instead of the client itself, so none of them imports ``bookie.client``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bookie.add_timers import AddTimers, LacTimers
from bookie.client_conf import LedgerClientConf
from bookie.connection import BookieConnectionPool
from bookie.failures import FailureHistory
from bookie.metadata import LedgerMetadataManager
from bookie.watcher import BookieWatcher
from placement import EnsemblePlacementPolicy

__all__ = ["ClientContext"]


@dataclass(frozen=True)
class ClientContext:
    """See the module docstring."""

    ledgers: LedgerMetadataManager
    policy: EnsemblePlacementPolicy
    watcher: BookieWatcher
    conf: LedgerClientConf
    pool: BookieConnectionPool
    failures: FailureHistory
    add_timers: AddTimers = field(default_factory=AddTimers, compare=False, repr=False)
    """The writers' add timers (``bookie.add_timers``): one wheel for the client's writers."""
    lac_timers: LacTimers = field(default_factory=LacTimers, compare=False, repr=False)
    """The writers' explicit-LAC checks (``bookie.add_timers.LacTimers``)."""

    def quarantined(self) -> set[str]:
        """Bookies that failed an add or a read in the last ``bookie_quarantine_time_s`` seconds."""
        seconds = self.conf.bookie_quarantine_time_s
        return self.failures.recent(seconds) if seconds else set()
