"""An owned topic of a hub: its log, its subscriptions, its activity clock, its publish rate.

    t = Topic(TopicLog(...), TopicSubscriptions(...))   # made by HubServer when it acquires a topic
    t.last_active = time.monotonic()                    # each request touches it (retention_secs)
    t.sample_rate(now); t.publish_rate(now)             # the hub's one scan samples; the admin API reads

An idle topic costs memory only (issue 34: no timer or task of its own):
the hub's housekeeping scan samples every topic's rate, and the rate is two
samples in slots, not a history. Its compaction state (``compaction``) is
built when first used: a run, its status, a read of the compacted ledger, a
threshold or a pending compacted ledger to delete (``compaction_due``).

Failure: nothing here raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from hub.compaction import TopicCompaction
from hub.persistence import TopicLog
from hub.subscriptions import TopicSubscriptions

if TYPE_CHECKING:
    from hub.lifecycle import BacklogQuota

__all__ = ["RATE_WINDOW", "Topic"]

RATE_WINDOW = 10.0
"""Seconds over which a topic's publish rate is measured (``Topic.publish_rate``)."""


class Topic:
    """An owned topic: its log, its subscriptions, its activity clock, its publish rate."""

    __slots__ = ("_compaction", "_mid_at", "_mid_seq", "_old_at", "_old_seq", "last_active", "log",
                 "on_compaction_done", "quota", "subs")

    def __init__(self, log_: TopicLog, subs: TopicSubscriptions,
                 on_compaction_done: Callable[[str], None] | None = None) -> None:
        self.log = log_
        self.subs = subs
        self.quota: BacklogQuota | None = None     # set by the server (hub.lifecycle)
        self._compaction: TopicCompaction | None = None   # built by the first use (``compaction``)
        self.on_compaction_done = on_compaction_done   # "succeeded" / "failed" per run (the hub's counters)
        self.last_active = time.monotonic()
        # two (when, last seq id) samples half a window apart, taken by the hub's scan: the rate costs
        # nothing per publish, and an idle topic holds no history
        self._old_at = self._mid_at = self.last_active
        self._old_seq = self._mid_seq = log_.last_seq

    @property
    def compaction(self) -> TopicCompaction:
        """Runs and reads of the topic's compacted ledger (``hub.compaction``), built when first asked for."""
        c = self._compaction
        if c is None:
            c = self._compaction = TopicCompaction(self.log)
            c.on_done = self.on_compaction_done
        return c

    def compaction_due(self, threshold: int) -> bool:
        """Whether the housekeeping round has anything for ``compaction`` to do: a threshold (> 0) to hold
        ledgers for or to compact at, compaction state built before (a run, a hold), or a compacted ledger
        a run cut short left pending. A topic that never compacts builds no state for this."""
        return (threshold > 0 or self._compaction is not None
                or bool(self.log.ranges.compaction.pendingLedgerId))

    def detach(self) -> None:
        """Break the references between the parts of a topic given up (released or deleted, its log released).

        The log holds the quota's gate and compaction's hold, which hold the
        log: without this a released topic is a reference cycle that only a
        full collection frees, and the objects of topics acquired in a burst
        are frozen (``hub.gcwatch``), out of every collection's reach.
        """
        self.log.gate = None
        self.log.hold = None

    def sample_rate(self, now: float) -> None:
        if now - self._mid_at >= RATE_WINDOW / 2:
            self._old_at, self._old_seq = self._mid_at, self._mid_seq
            self._mid_at, self._mid_seq = now, self.log.last_seq

    def publish_rate(self, now: float) -> float:
        """Messages per second published over the last ``RATE_WINDOW`` seconds (about: half to one window)."""
        elapsed = now - self._old_at
        return (self.log.last_seq - self._old_seq) / elapsed if elapsed > 0 else 0.0
