"""Topic load shedding: a hub above the cluster's mean topic count gives topics up (Hedwig 4.2's TopicBasedLoadShedder).

    shedder = TopicLoadShedder(tolerance_percentage=10, max_shed=50)
    victims = shedder.choose(mine={topic: last_published, ...}, others=[12, 9])   # topics to release

Every ``rebalance_interval_sec`` seconds (0 disables) the hub compares the
number of topics it owns with the mean over every live hub (its load
records in the ``hubs`` table, its own count fresh). When it owns more than
``mean * (1 + rebalance_tolerance_percentage / 100)`` it releases
``own - mean`` topics (rounded up, at most ``rebalance_max_shed``), least
recently published first, each gracefully (``HubServer.release_topic``:
attached subscribers get TOPIC_MOVED, pointers are persisted, the ledger is
closed, the owner record removed). A released topic stays unowned until its
next publish or subscribe, which is redirected to the least loaded hub
(``Ownership`` counts the topics it sent to each hub since that hub's load
record was read, so a burst of accesses spreads instead of all landing on
the hub that looked emptiest).

This module is the decision only (no I/O): the server's timer feeds it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["TopicLoadShedder"]


class TopicLoadShedder:
    """Chooses which topics an overloaded hub releases; see the module docstring."""

    def __init__(self, tolerance_percentage: float, max_shed: int) -> None:
        self.tolerance = max(tolerance_percentage, 0.0) / 100.0
        self.max_shed = max(max_shed, 0)

    def excess(self, own: int, others: Sequence[int]) -> int:
        """How many topics a hub owning ``own`` should release, given the other live hubs' counts."""
        if not others or own <= 0:
            return 0
        mean = (own + sum(others)) / (len(others) + 1)
        if own <= mean * (1.0 + self.tolerance):
            return 0
        return min(self.max_shed, math.ceil(own - mean))

    def choose(self, mine: Mapping[bytes, float], others: Sequence[int]) -> list[bytes]:
        """The topics to release: the least recently published of ``mine`` (topic -> last publish time)."""
        n = self.excess(len(mine), others)
        if n <= 0:
            return []
        return sorted(mine, key=lambda topic: (mine[topic], topic))[:n]
