"""A hub's housekeeping timers: load reports, retention, consumed ledgers, shedding, session health, stalls.

    class HubServer(HubHousekeeping): ...       # hub.server: the timers run as the server's tasks
    server.spawn(server._timers())              # one loop for the periodic work (started by HubServer.start)
    server.spawn(server._close_stalled_connections())
    await server.shed_load(); await server.delete_consumed_ledgers()   # one round now (tests call them)

Every ``tick`` the timer loop reports the number of owned topics when it
changed, samples publish rates, releases topics whose log gave up
(``hub.persistence``: a failed close or range write, a lost session) and topics idle past
``retention_secs`` (none attached), deletes consumed ledgers every
``messages_consumed_thread_run_interval``, sheds load every
``rebalance_interval_sec`` (``hub.shedding``) and, when the metastore
session was lost, releases every topic and registers again.

Failure: an error of one tick is logged and the loop goes on; only
cancellation (the server stopping) ends it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from hub.lifecycle import apply_ttl_and_retention
from hub.ownership import Ownership, same_hub
from hub.proto import pubsub_pb2 as pb
from hub.shedding import TopicLoadShedder
from hub.stats import HubStats

if TYPE_CHECKING:
    from hub.conf import HubConf
    from hub.connection import HubConnection
    from hub.metadata import HubRegistry
    from hub.policy_store import PolicyCache
    from hub.topic import Topic
    from metastore.api import MetaStore, Session

log = logging.getLogger("hub.server")   # these lines have always been the server's

__all__ = ["HubHousekeeping"]

_SCAN_SLICE = 256
"""Topics a scan over every owned topic handles before it lets the event loop run (issue 34)."""


class HubHousekeeping:
    """The periodic work of ``hub.server.HubServer`` (a mixin; see the module docstring)."""

    # the server's state this uses (set by HubServer)
    conf: HubConf
    topics: dict[bytes, Topic]
    connections: set[HubConnection]
    registry: HubRegistry
    info: pb.HubInfo
    session: Session | None
    store: MetaStore
    http_url: str
    ownership: Ownership | None
    shedder: TopicLoadShedder
    stats: HubStats
    policies: PolicyCache

    if TYPE_CHECKING:
        def track(self, task: asyncio.Task[Any]) -> None: ...

        async def release_topic(self, topic: bytes) -> None: ...

    async def _close_stalled_connections(self) -> None:
        """Close connections whose request frame stays incomplete past ``incomplete_frame_timeout``."""
        timeout = self.conf.incomplete_frame_timeout / 1000.0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = loop.time()
            for conn in list(self.connections):
                since = conn.partial_since
                if since is not None and now - since > timeout and conn.transport is not None:
                    log.warning("closing a client connection whose request frame stayed incomplete for %.1f s "
                                "(%d bytes held; incomplete_frame_timeout %d ms)", now - since, conn.machine.buffered,
                                self.conf.incomplete_frame_timeout)
                    self.stats.incr("connections_closed_incomplete_frame")
                    conn.machine.clear()
                    conn.transport.abort()

    # --- timers -----------------------------------------------------------------------------------
    async def _timers(self) -> None:
        """Load updates, retention, consumed-ledger deletion, session health; one loop."""
        consumed_every = self.conf.messages_consumed_thread_run_interval / 1000.0
        tick = min(1.0, consumed_every, max(0.1, self.conf.zk_timeout / 4000.0))
        next_consumed = time.monotonic() + consumed_every
        rebalance_every = float(self.conf.rebalance_interval_sec)
        next_rebalance = time.monotonic() + rebalance_every
        reported = -1
        while True:
            await asyncio.sleep(tick)
            try:
                if len(self.topics) != reported:
                    reported = len(self.topics)
                    await self.registry.update_load(self.info, reported)
                now = time.monotonic()
                for t in list(self.topics.values()):
                    t.sample_rate(now)
                for topic, t in list(self.topics.items()):
                    if t.log.closed:   # given up (hub.persistence: a failed close or range write): the next
                        await self.release_topic(topic)   # acquisition recovers it
                if self.conf.retention_secs:
                    for topic, t in list(self.topics.items()):
                        if now - t.last_active > self.conf.retention_secs and not t.subs.attached_count:
                            await self.release_topic(topic)
                if now >= next_consumed:
                    next_consumed = now + consumed_every
                    await self.delete_consumed_ledgers()
                if rebalance_every and now >= next_rebalance:
                    next_rebalance = now + rebalance_every
                    await self.shed_load()
                if self.session is not None and not self.session.alive:
                    self.stats.incr("sessions_lost")   # hub_events_total{event="sessions_lost"}
                    log.warning("metastore session lost: releasing every topic")
                    for topic in list(self.topics):
                        await self.release_topic(topic)
                    self.session = await self.store.session(timeout=self.conf.zk_timeout / 1000.0)
                    await self.registry.register(self.info, self.session, self.http_url)
                    if self.ownership is not None:
                        self.ownership.session = self.session
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("hub timer: %s", exc)

    async def shed_load(self) -> list[bytes]:
        """Release the topics this hub owns above the cluster's mean (``hub.shedding``); returns them."""
        if self.registry is None or self.ownership is None:
            return []
        others = [load.numTopics for info, load in await self.registry.live_hubs()
                  if not same_hub(info, self.info)]
        mine = {topic: t.last_active for topic, t in self.topics.items()}
        victims = self.shedder.choose(mine, others)
        if victims:
            log.info("shedding %d of %d topics (other hubs own %s)", len(victims), len(mine), others)
        mean = (len(mine) + sum(others)) / (len(others) + 1)
        for topic in victims:   # each release said with its reason: clients see only TOPIC_MOVED
            log.info("load shedding: releasing topic %r (this hub owns %d topics, the mean over %d live hubs is "
                     "%.1f, tolerance %g %%; the least recently published go first)", topic, len(mine),
                     len(others) + 1, mean, self.conf.rebalance_tolerance_percentage)
            await self.release_topic(topic)
        if victims:
            self.stats.incr("topics_shed", len(victims))
            await self.registry.update_load(self.info, len(self.topics))
        return victims

    async def delete_consumed_ledgers(self) -> int:
        """Delete ledgers every subscriber has consumed past (a bounded one: its bound), per owned topic; how many.

        Compaction's round comes first (``hub.compaction``: a half-written
        compacted ledger deleted, ``compaction_threshold_bytes``). The topic's
        lifecycle policy (``hub.policies``) applies next: message
        TTL acknowledges what expired, retention keeps consumed ledgers until
        both its limits let them go (``hub.lifecycle.apply_ttl_and_retention``).
        """
        n = 0
        now_ms = int(time.time() * 1000)
        for i, (topic, t) in enumerate(list(self.topics.items())):
            if i and not i % _SCAN_SLICE:
                await asyncio.sleep(0)   # thousands of idle topics: let the loop (the session heartbeat) run
            policy = self.policies.for_topic(topic)
            if t.compaction_due(policy.compaction_threshold_bytes):   # most topics never compact: no state built
                await t.compaction.housekeep(policy.compaction_threshold_bytes, self.track)   # hub.compaction
            n += len(await apply_ttl_and_retention(t.log, t.subs, policy, now_ms, self.track))
            if t.quota is not None:
                t.quota.wake()
        if n:
            self.stats.incr("ledgers_deleted", n)
        return n
