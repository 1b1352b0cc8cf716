"""Lifecycle policies applied to an owned topic: backlog quota on publish; TTL and retention on the timer.

    quota = BacklogQuota(topic_log, subs, policy_for=cache.for_topic, hold_timeout=25.0)
    topic_log.gate = quota                # every publish passes admit(); a batched one's at once while admits_all()
    quota.wake()                          # a pointer moved: held publishes that now fit go on
    quota.persisted()                     # an entry was stored: consumer_backlog_eviction acks the oldest
    quota.close()                         # the topic is released: held publishes fail (SERVICE_DOWN)
    n = await apply_ttl_and_retention(topic_log, subs, policy, now_ms)   # the consumed-ledger timer
    seq = await ttl_expired_seq(topic_log, policy, now_ms, floor=subs.min_consumed())   # 0: none expired

The decisions are ``hub.policies``'s; the sizes and times ``hub.log_usage``'s.

Backlog: the bytes of the messages after the slowest subscription's pointer
(its bounded pointer: ``TopicSubscriptions.retained_after``, so a
subscription with a ``messageBound`` holds no more than its bound), plus the
bodies of publishes queued and not yet sent. A topic without subscriptions
has no backlog. The backlog is *full* when a quota is set and the backlog
is at or over it:

* ``producer_exception``: a publish that finds it full fails at once with
  ``BacklogQuotaExceededError``; nothing is stored.
* ``producer_request_hold``: it is held (and every publish after it, so
  publish order stays seq-id order) until the backlog is no longer full,
  for at most ``backlog_quota_hold_timeout``; then it fails with
  ``BacklogQuotaExceededError``.
* ``consumer_backlog_eviction``: it is stored; then, while the backlog is
  full, the oldest backlog is acknowledged on behalf of the slowest
  subscriptions (their consume pointers advance; an attached subscriber is
  not sent what was acknowledged for it).

Message TTL acknowledges, on the same timer as consumed-ledger deletion and
for every subscription of every type, each message whose ``publish_time_ms``
is ``message_ttl_seconds`` or more before now (Pulsar expires by position
from the publish time). Publish times are the owner's clock, taken as
non-decreasing along the log, so what expired is a prefix of the log,
found without reading whole ledgers (``ttl_expired_seq``): every ledger last
written before the cutoff expires whole (ledger-level time,
``hub.log_usage``, no reads); in the one ledger after those, the last
expired message is binary-searched by its messages' publish times (a few
single-message reads; none when the ledger's recorded first publish time is
after the cutoff or every subscription is past it). Precision is therefore
the message, at the timer's period (``messages_consumed_thread_run_interval``).
Messages stored before messages carried a publish time (0) count as old.

What TTL (and eviction) acknowledges for a subscription with consumers
(``hub.dispatch.Dispatcher.ack_through``): its mark-delete point moves to the
expired seq id, and the individually acknowledged ranges after it are kept
(nothing acknowledged is delivered again). Expired messages a consumer holds
unacknowledged count as acknowledged, as Pulsar's expiry marks them deleted:
they are not redelivered, and the consumer's later ack or nack of them is
ignored (harmless). Expired messages waiting for redelivery, and delayed
ones not due yet (``hub.delayed``), are dropped.

Failure: nothing here raises into the publish path; a pointer that cannot
be persisted is logged and written again later (``persist_soon``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from hub import errors
from hub.cursor import AckCursor
from hub.policies import (
    CONSUMER_BACKLOG_EVICTION,
    PRODUCER_EXCEPTION,
    PRODUCER_REQUEST_HOLD,
    Policy,
    eviction_target,
    quota_exceeded,
    retention_deletes,
    ttl_expired_through,
)
from metastore.idle import IDLE

if TYPE_CHECKING:
    from hub.batcher import Done, Queued
    from hub.persistence import TopicLog
    from hub.subscriptions import TopicSubscriptions
    from hub.substate import Attachment

log = logging.getLogger(__name__)

__all__ = ["BacklogQuota", "ack_for_every_subscription", "apply_ttl_and_retention", "backlog_bytes",
           "ttl_expired_seq"]


def backlog_bytes(topic_log: TopicLog, subs: TopicSubscriptions) -> int:
    """Bytes stored after the slowest subscription's (bounded) pointer, plus queued publishes."""
    if not subs.subs:
        return 0
    return topic_log.bytes_after(subs.retained_after()) + topic_log._queued_bytes


def ack_for_every_subscription(subs: TopicSubscriptions, seq: int,
                               track: Callable[[asyncio.Task[Any]], None] | None = None) -> list[bytes]:
    """Move every subscription whose pointer is below ``seq`` up to it (TTL, eviction); the ones moved.

    The move is a cumulative consume on the subscription's behalf (persisted
    as consumes are); a delivery in progress goes on after ``seq``. A
    subscription with consumers keeps its acknowledged ranges after ``seq``
    and its consumers what they hold after it (``Dispatcher.ack_through``).
    """
    moved = []
    for sub, state in list(subs.subs.items()):
        if state.consumed >= seq:
            continue
        if state.dispatcher is not None:
            state.dispatcher.ack_through(seq)      # its on_acked moves state.consumed
        else:
            target = seq
            if state.ranges:                       # stored ranges, no consumer attached since the load
                cursor = AckCursor(seq, state.ranges)
                target, state.ranges = cursor.mark_delete, cursor.persisted_ranges()
                state.acks_dirty = True
            subs.consume(cast("Attachment", None), sub, target)
        task = subs.persist_soon(sub)
        if task is not None and track is not None:
            track(task)
        delivery = state.delivery
        if delivery is not None and getattr(delivery, "next_seq", seq + 1) <= seq:
            delivery.next_seq = seq + 1       # do not send what was acknowledged for it
        moved.append(sub)
    return moved


async def apply_ttl_and_retention(topic_log: TopicLog, subs: TopicSubscriptions, policy: Policy, now_ms: int,
                                  track: Callable[[asyncio.Task[Any]], None] | None = None) -> list[int]:
    """One round of the consumed-ledger timer for a topic: TTL, then delete what retention lets go; their ids."""
    if policy.message_ttl_seconds or policy.keeps_consumed:
        await topic_log.learn_usage()
    if policy.message_ttl_seconds and subs.subs:
        through = await ttl_expired_seq(topic_log, policy, now_ms, subs.min_consumed())
        if through:
            moved = ack_for_every_subscription(subs, through, track)
            if moved:
                log.info("topic %r: messages up to seq id %d expired (message_ttl_seconds %d) for %s",
                         topic_log.topic, through, policy.message_ttl_seconds, moved)
    consumed = subs.retained_after()
    if not policy.keeps_consumed:
        return await topic_log.delete_consumed(consumed)

    def retain(ids: list[int]) -> list[int]:
        usage = [u for u in topic_log.consumed_ledgers(consumed) if u.ledger_id in set(ids)]
        return retention_deletes(policy, usage, now_ms)

    return await topic_log.delete_consumed(consumed, retain)


async def ttl_expired_seq(topic_log: TopicLog, policy: Policy, now_ms: int, floor: int = 0) -> int:
    """The last seq id whose message is ``message_ttl_seconds`` or more old (0: none; see the module docstring).

    ``floor``: every subscription is at or past it, so the search does not
    look below it (the answer may then be at most ``floor``: nothing to do).
    A read failure is logged and leaves the ledger-level answer this round.
    """
    if policy.message_ttl_seconds <= 0:
        return 0
    last = int(topic_log.last_seq)
    through = min(ttl_expired_through(policy, topic_log.written_through(), now_ms), last)
    lo = max(through, floor)
    r = next((r for r in topic_log.ranges.ranges
              if (r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded") else last) > lo), None)
    if lo >= last or r is None:
        return through
    cutoff = now_ms - policy.message_ttl_seconds * 1000
    if r.firstPublishTimeMs > cutoff:
        return through                             # the ledger's first message is not expired: no reads
    first = max(lo + 1, int(r.startSeqIdIncluded))
    end = min(last, int(r.endSeqIdIncluded.localComponent) if r.HasField("endSeqIdIncluded") else last)

    async def expired(seq: int) -> bool:
        msgs = await topic_log.scan(seq, 1, 1 << 30)
        return bool(msgs) and msgs[0].publish_time_ms <= cutoff

    try:
        if first > end or not await expired(first):
            return through
        while first < end:                         # the last expired message of the ledger
            mid = (first + end + 1) // 2
            if await expired(mid):
                first = mid
            else:
                end = mid - 1
    except Exception as exc:   # a bookie failure: the whole expired ledgers this round, the rest at the next
        log.info("topic %r: cannot read publish times for message TTL: %s", topic_log.topic, exc)
        return through
    return first


class BacklogQuota:
    """A topic's backlog quota on publish (see the module docstring).

    Slots, and no queue of held publishes until one is held: every owned
    topic has one (issue 34)."""

    __slots__ = ("_passing", "_timer", "held", "hold_timeout", "log", "on_refused", "policy_for", "subs", "track")

    def __init__(self, topic_log: TopicLog, subs: TopicSubscriptions, policy_for: Callable[[bytes], Policy],
                 hold_timeout: float, track: Callable[[asyncio.Task[Any]], None] | None = None,
                 on_refused: Callable[[str], None] | None = None) -> None:
        self.log = topic_log
        self.subs = subs
        self.policy_for = policy_for      # the hub's, shared by its topics: asked with the log's topic
        self.hold_timeout = hold_timeout
        self.track = track
        self.on_refused = on_refused      # counts (the policy's name) for the hub's stats
        self.held: collections.deque[tuple[Queued, Done, float]] = IDLE   # a deque of its own once one is held
        self._timer: asyncio.TimerHandle | None = None
        self._passing = False             # a held publish going on into the log

    def policy(self) -> Policy:
        """The topic's lifecycle policy now (``hub.policies``)."""
        return self.policy_for(self.log.topic)

    def backlog_bytes(self) -> int:
        return backlog_bytes(self.log, self.subs)

    def _error(self, policy: Policy) -> errors.BacklogQuotaExceededError:
        return errors.BacklogQuotaExceededError(
            f"topic {self.log.topic.decode('utf-8', 'backslashreplace')!r}: backlog of {self.backlog_bytes()} "
            f"bytes is at or over its quota of {policy.backlog_quota_limit_bytes} "
            f"({policy.backlog_quota_policy}); nothing was stored")

    def admit(self, message: Queued, done: Done) -> bool:
        """The log's gate: True lets the publish be queued now; False when this took it (held or failed)."""
        if self._passing or self.log.closed:
            return True
        policy = self.policy_for(self.log.topic)   # policy()'s, without the call (once per publish)
        if self.held:
            if policy.backlog_quota_policy == PRODUCER_REQUEST_HOLD:
                self._hold(message, done)  # behind the held ones: publish order stays
                return False
            self.wake()                    # the policy changed: what is held goes on first
        if policy.backlog_quota_limit_bytes <= 0 or not quota_exceeded(policy, self.backlog_bytes()):
            return True
        which = policy.backlog_quota_policy
        if which == CONSUMER_BACKLOG_EVICTION:
            return True                    # stored; persisted() evicts
        if self.on_refused is not None:
            self.on_refused(which)
        if which == PRODUCER_EXCEPTION:
            done(0, self._error(policy))
            return False
        self._hold(message, done)
        return False

    def admits_all(self) -> bool:
        """Whether ``admit`` would let every publish through now, whatever it is (none held, no quota
        reached): the log then queues a batched publish's messages without asking for each."""
        if self._passing or self.log.closed:
            return True
        if self.held:
            return False
        policy = self.policy()
        return policy.backlog_quota_limit_bytes <= 0 or not quota_exceeded(policy, self.backlog_bytes())

    def _hold(self, message: Queued, done: Done) -> None:
        loop = asyncio.get_running_loop()
        if self.held is IDLE:
            self.held = collections.deque()
        self.held.append((message, done, loop.time() + self.hold_timeout))
        if self._timer is None:
            self._timer = loop.call_at(self.held[0][2], self._expire)

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        policy = self.policy()
        while self.held and self.held[0][2] <= now:
            _, done, _ = self.held.popleft()
            err: errors.PubSubError = (errors.ServiceDownError(f"topic {self.log.topic!r} is being released")
                                       if self.log.closed else self._error(policy))
            done(0, err)
        self.wake()
        if self.held and self._timer is None:
            self._timer = loop.call_at(self.held[0][2], self._expire)

    def wake(self) -> None:
        """Let held publishes go on, in order, while the backlog is not full (or the policy changed)."""
        if not self.held:
            return
        policy = self.policy()
        while self.held and (policy.backlog_quota_policy != PRODUCER_REQUEST_HOLD or self.log.closed
                             or not quota_exceeded(policy, self.backlog_bytes())):
            message, done, _ = self.held.popleft()
            self._passing = True
            try:
                self.log.submit(message, done)
            finally:
                self._passing = False
        if not self.held:
            self.held = IDLE
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def persisted(self) -> None:
        """After an entry was stored: with ``consumer_backlog_eviction``, ack the oldest backlog while full."""
        policy = self.policy()
        if (policy.backlog_quota_policy != CONSUMER_BACKLOG_EVICTION or policy.backlog_quota_limit_bytes <= 0
                or not self.subs.subs):
            return
        limit = policy.backlog_quota_limit_bytes
        if not quota_exceeded(policy, self.backlog_bytes()):
            return
        queued = self.log._queued_bytes
        target = eviction_target(limit, self.subs.retained_after(), int(self.log.last_seq),
                                 lambda seq: self.log.bytes_after(seq) + queued)
        if target:
            moved = ack_for_every_subscription(self.subs, target, self.track)
            if self.on_refused is not None:
                self.on_refused(CONSUMER_BACKLOG_EVICTION)
            log.info("topic %r: backlog over its quota of %d bytes: acknowledged up to seq id %d for %s",
                     self.log.topic, limit, target, moved)

    def close(self) -> None:
        """The topic is released: held publishes fail with ``ServiceDownError`` (the client retries)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self.held:
            _, done, _ = self.held.popleft()
            done(0, errors.ServiceDownError(f"topic {self.log.topic!r} is being released; retry"))
