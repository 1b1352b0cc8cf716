"""An owned topic of a hub: its log, its subscriptions, its activity clock, its publish rate.

    t = Topic(TopicLog(...), TopicSubscriptions(...))   # made by HubServer when it acquires a topic
    t.last_active = time.monotonic()                    # each request touches it (retention_secs)
    t.sample_rate(now); t.publish_rate(now)             # the timer samples; the admin API reads

Failure: nothing here raises.
"""

from __future__ import annotations

import collections
import time
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

    def __init__(self, log_: TopicLog, subs: TopicSubscriptions) -> None:
        self.log = log_
        self.subs = subs
        self.quota: BacklogQuota | None = None     # set by the server (hub.lifecycle)
        self.compaction = TopicCompaction(log_)    # runs and reads of its compacted ledger (hub.compaction)
        self.last_active = time.monotonic()
        # (when, last seq id) sampled by the hub's timer loop: the rate costs nothing per publish
        self.rate_samples: collections.deque[tuple[float, int]] = collections.deque([(self.last_active,
                                                                                      log_.last_seq)])

    def sample_rate(self, now: float) -> None:
        self.rate_samples.append((now, self.log.last_seq))
        while len(self.rate_samples) > 2 and now - self.rate_samples[1][0] >= RATE_WINDOW:
            self.rate_samples.popleft()

    def publish_rate(self, now: float) -> float:
        """Messages per second published over the last ``RATE_WINDOW`` seconds (about)."""
        when, seq = self.rate_samples[0]
        elapsed = now - when
        return (self.log.last_seq - seq) / elapsed if elapsed > 0 else 0.0
