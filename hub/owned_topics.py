"""The topics a hub owns: acquiring one (claim, log, subscriptions, quota), the log's callbacks, releasing it.

    class HubServer(OwnedTopics, HubHousekeeping): ...   # hub.server: the server's own state, declared below
    t = await server.topic(b"news", should_claim=True)   # owned here (acquired first), or Redirect
    await server.release_topic(b"news")                   # subscribers get TOPIC_MOVED, the record goes

Acquisitions run at most ``max_concurrent_topic_loads`` at once (the rest
wait their turn, FIFO); concurrent requests for one topic share one
acquisition. A topic being deleted (``hub.admin``) or released, or a hub
that is stopping, answers SERVICE_DOWN (the client retries).

Failure: an acquisition that fails releases the claim and raises
SERVICE_DOWN (a raced owner, a bookie or metastore failure); another hub
owning the topic raises ``Redirect``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from hub import errors
from hub.lifecycle import BacklogQuota
from hub.message import Message
from hub.persistence import TopicLog
from hub.subscriptions import TopicSubscriptions
from hub.topic import Topic

if TYPE_CHECKING:
    from bookie.client import BookKeeper
    from hub.batcher import Persisted, Queued
    from hub.conf import HubConf
    from hub.gcwatch import GcWatch
    from hub.metadata import SubscriptionDataManager, TopicDedupManager, TopicPersistenceManager
    from hub.ownership import Ownership
    from hub.policies import Policy
    from hub.policy_store import PolicyCache
    from hub.readahead import ReadAheadCache
    from hub.regions import RegionManager
    from hub.stats import HubStats
    from metastore.api import Session

log = logging.getLogger("hub.server")   # these lines have always been the server's

__all__ = ["OwnedTopics", "Redirect"]


class Redirect(Exception):
    """Raised by ``HubServer.topic`` when another hub owns the topic: the request is redirected to ``owner``."""

    def __init__(self, owner: str) -> None:
        super().__init__(owner)
        self.owner = owner


class _TopicCallbacks(NamedTuple):
    persisted: Persisted
    consumed: Callable[[bytes], None]
    track: Callable[[asyncio.Task[Any]], None]
    quota_refused: Callable[[str], None]
    compaction_done: Callable[[str], None]
    policy_for: Callable[[bytes], Policy]
    hold_timeout: float       # backlog_quota_hold_timeout in seconds: one float for every topic


class OwnedTopics:
    """The owned topics of ``hub.server.HubServer`` (a mixin; see the module docstring)."""

    # the server's state this uses (set by HubServer)
    conf: HubConf
    stats: HubStats
    topics: dict[bytes, Topic]
    deleting: set[bytes]
    releasing: set[bytes]
    stopping: bool
    loads_waiting: int
    gc_watch: GcWatch
    _alive_checks: dict[Any, Callable[[], bool]]
    _acquiring: dict[bytes, asyncio.Future[Topic]]
    _load_slots: asyncio.Semaphore
    _ledger_slots: asyncio.Semaphore
    ownership: Ownership | None
    regions: RegionManager | None
    bk: BookKeeper
    pm: TopicPersistenceManager
    sm: SubscriptionDataManager
    dedup_store: TopicDedupManager
    cache: ReadAheadCache
    policies: PolicyCache

    if TYPE_CHECKING:
        def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

        def track(self, task: asyncio.Task[Any]) -> None: ...

        def flush(self) -> None: ...

    async def topic(self, topic: bytes, should_claim: bool, for_publish: bool = False) -> Topic:
        """The owned topic (claiming and acquiring it first); ``Redirect`` when another hub owns it.

        ``for_publish``: a publish asks, so an acquisition starts the topic's new ledger itself
        (``TopicLog.acquire``'s ``start_ledger``)."""
        t = self.topics.get(topic)
        if t is not None:
            return t
        if topic in self.deleting:
            raise errors.ServiceDownError(f"topic {topic!r} is being deleted; retry")
        if topic in self.releasing:   # its owner record still names this hub: claiming now would keep it here
            raise errors.ServiceDownError(f"topic {topic!r} is being released; retry")
        if self.stopping:
            raise errors.ServiceDownError("this hub is stopping; retry")
        if self.ownership is None:
            # start-up: the port is open (its number goes into the registration) but the hub is not registered
            # yet; a client that connected this early retries (it was an AssertionError answered
            # UNEXPECTED_CONDITION, which a client does not retry)
            raise errors.ServiceDownError("this hub is starting; retry")
        fut = self._acquiring.get(topic)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = asyncio.get_running_loop().create_future()
        self._acquiring[topic] = fut
        try:
            t = await self._acquire_bounded(topic, should_claim, for_publish)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()    # retrieved: waiters re-raise it themselves
            raise
        else:
            fut.set_result(t)
            return t   # the acquiring request itself: no shield to wait through (one fewer future a topic)
        finally:
            self._acquiring.pop(topic, None)

    async def _acquire_bounded(self, topic: bytes, should_claim: bool, for_publish: bool = False) -> Topic:
        """``_acquire`` once one of the ``max_concurrent_topic_loads`` slots is free (FIFO, never failed).

        A failover or a burst of new topics makes hundreds of acquisitions at
        once; bounded, they keep the metastore and bookie queues short and the
        event loop responsive (the hub's own session heartbeat included: a
        hub that misses its lease loses every topic). The client waits (its
        own response timeout still applies).
        """
        with self.gc_watch.deferring():   # a takeover's thousands: no full collection meanwhile (hub.gcwatch)
            self.loads_waiting += 1
            try:
                await self._load_slots.acquire()
            finally:
                self.loads_waiting -= 1
            try:
                if self.stopping:
                    raise errors.ServiceDownError("this hub is stopping; retry")
                return await self._acquire(topic, should_claim, for_publish)
            finally:
                self._load_slots.release()

    async def _acquire(self, topic: bytes, should_claim: bool, for_publish: bool = False) -> Topic:
        assert self.ownership is not None   # topic() refused the request before the hub registered
        owner = await self.ownership.claim(topic, should_claim)
        if owner is not None:
            raise Redirect(owner)
        session = self.ownership.session   # the claim lives as long as this session (ephemeral or registration)
        owned = self._alive_check(session)
        cb = self._topic_callbacks
        tlog: TopicLog | None = None
        try:
            tlog = await TopicLog.acquire(topic, self.bk, self.pm, self.conf, cb.persisted, self.dedup_store,
                                          owned=owned, ledger_slots=self._ledger_slots, start_ledger=for_publish)
            subs = TopicSubscriptions(topic, self.sm, self.conf, on_consumed=cb.consumed, track=cb.track,
                                      cache=self.cache, log=tlog)
            await subs.load()
        except BaseException as exc:
            if tlog is not None and tlog.lh is not None:   # the ledger it started (start_ledger): closed
                await tlog.release()
            await self.ownership.release(topic)
            if isinstance(exc, Exception) and not isinstance(exc, errors.ServiceDownError):
                # a raced owner (BAD_VERSION), a bookie or metastore failure: the client may retry
                raise errors.ServiceDownError(f"cannot acquire topic {topic!r}: {exc}") from exc
            raise
        t = Topic(tlog, subs, on_compaction_done=cb.compaction_done)   # hub.compaction
        t.quota = tlog.gate = BacklogQuota(tlog, subs, cb.policy_for, cb.hold_timeout, track=cb.track,
                                           on_refused=cb.quota_refused)
        policy = self.policies.for_topic(topic)
        if policy.backlog_quota_limit_bytes or policy.keeps_consumed or policy.message_ttl_seconds:
            await tlog.learn_usage()   # the sizes of the ledgers a previous owner wrote: the quota holds at once
        if self.regions is not None:
            await self.regions.recover_vector(topic, tlog)
        self.topics[topic] = t
        if self.regions is not None and self.regions.enabled:   # no task a topic when there is no other region
            self.spawn(self.regions.topic_acquired(topic))
        self.ownership.num_topics = len(self.topics)
        self.stats.incr("topics_acquired")
        log.debug("acquired topic %r at seq %d", topic, tlog.last_seq)   # thousands at once: see topics_acquired
        return t

    @functools.cached_property
    def _topic_callbacks(self) -> _TopicCallbacks:
        """The hub's methods every topic is given, bound once (a bound method is 64 bytes a topic)."""
        return _TopicCallbacks(self._persisted, self._consumed, self.track, self._quota_refused,
                               self._compaction_done, self.policies.for_topic,
                               self.conf.backlog_quota_hold_timeout / 1000.0)

    def _alive_check(self, session: Session | None) -> Callable[[], bool] | None:
        """``session.alive`` as a callable, one for every topic claimed in that session (not one each)."""
        if session is None:
            return None
        check = self._alive_checks.get(session)
        if check is None:
            self._alive_checks = {session: lambda: bool(session.alive)}   # an older session's topics keep theirs
            check = self._alive_checks[session]
        return check

    def _compaction_done(self, outcome: str) -> None:
        self.stats.incr(f"compactions_{outcome}")

    def _quota_refused(self, which: str) -> None:
        self.stats.incr(f"backlog_quota_{which}")

    def _persisted(self, topic: bytes, first: int, msgs: list[Queued], wires: list[bytes]) -> None:
        t = self.topics.get(topic)
        if t is None or not t.subs.subs:
            return   # no subscription: nothing to evict (BacklogQuota.persisted's test) and no one to deliver to
        if t.quota is not None:
            t.quota.persisted()       # consumer_backlog_eviction (hub.lifecycle)
        if t.subs.delivering():
            self.flush()   # the publish answers of this batch leave before the deliveries are built
            # a hint for the cache: only worth building messages someone may read soon
            self.cache.on_published_many(topic, Message.persisted_run(msgs, first, wires))
            t.subs.wake_all()

    def _consumed(self, topic: bytes) -> None:
        t = self.topics.get(topic)
        if t is not None:
            self.cache.consumed_up_to(topic, t.subs.retained_after())
            if t.quota is not None:
                t.quota.wake()        # held publishes that now fit go on (hub.lifecycle)

    def _last_seq(self, topic: bytes) -> int:
        t = self.topics.get(topic)
        return t.log.last_seq if t is not None else 0

    async def _scan(self, topic: bytes, start: int, max_messages: int, max_bytes: int) -> list[Message]:
        t = self.topics.get(topic)
        if t is None:
            raise errors.ServiceDownError(f"topic {topic!r} is not owned here")
        return await t.log.scan(start, max_messages, max_bytes)

    async def release_topic(self, topic: bytes) -> None:
        """Give ``topic`` up: subscribers get TOPIC_MOVED, pointers persisted, ledger closed, record removed.

        Until the owner record is gone, requests for the topic get SERVICE_DOWN
        (clients retry), so a moved subscriber re-attaching at once does not
        claim it here again under the release.
        """
        t = self.topics.pop(topic, None)
        if t is None:
            return
        self.releasing.add(topic)
        try:
            if t.quota is not None:
                t.quota.close()
            await t.subs.release()
            await t.log.release()
            self.cache.release_topic(topic)
            if self.regions is not None:
                await self.regions.topic_released(topic)
            if self.ownership is not None:
                await self.ownership.release(topic)
                self.ownership.num_topics = len(self.topics)
        finally:
            t.detach()   # no reference cycle left behind (hub.gcwatch freezes what acquisitions built)
            self.releasing.discard(topic)
        log.info("released topic %r", topic)
