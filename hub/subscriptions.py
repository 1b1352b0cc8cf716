"""Subscriptions of one owned topic: create/attach, preferences, consume pointers, attachments.

    subs = TopicSubscriptions(topic, SubscriptionDataManager(store), conf, last_seq=lambda: log.last_seq)
    subs = TopicSubscriptions(topic, SubscriptionDataManager(store), conf, log=topic_log)   # its last_seq_now()
    await subs.load()                                   # every stored subscription of the topic
    prefs = await subs.subscribe(conn, sub_id, request) # CREATE / ATTACH / CREATE_OR_ATTACH
    subs.start_delivery(conn, sub_id, cache); subs.consume(conn, sub_id, seq)
    await subs.close(conn, sub_id); await subs.unsubscribe(conn, sub_id); await subs.detach_all(conn)
    await subs.reset(sub_id, consumed=2, cache=cache)   # the admin API: redeliver from seq id 3
    await subs.remove(sub_id)                           # the admin API: delete (attached: FORCED_CLOSED)

Pinned semantics (DESIGN.md section 6): CREATE on an existing subscription
raises ``ClientAlreadySubscribedError``; ATTACH, start delivery, consume or
unsubscribe on a missing one, ``ClientNotSubscribedError``. The preferences
given at subscribe replace the stored ones and come back in the response. A
new subscription starts after the topic's last message. A second attach of a
subscriber attached elsewhere closes the first (it gets a
SUBSCRIPTION_FORCED_CLOSED event) when ``forceAttach`` is set, else is
refused with ``TOPIC_BUSY``. An unsubscribe from another connection also
detaches the attached subscriber with SUBSCRIPTION_FORCED_CLOSED. Messages
a server filter skips count as consumed once the delivered ones before them
are (``Delivery.on_filtered``).
Consume pointers are persisted every
``consume_interval`` consumes (``persist_soon``) and whenever a subscription
is closed, unsubscribed or its connection drops (``persist``). A
subscription has at most one pointer write in flight: persists asked for
meanwhile coalesce into one write of the newest pointer once it is done,
and a write that finds the record changed (``BadVersionError``) reads it
again and never writes a pointer older than the stored one. The writes of
one subscription (pointer and preferences) never overlap.

Failure: metastore errors propagate as ``hub.errors`` classes; a bad
server filter raises ``InvalidMessageFilterError`` and nothing is stored.

Consumers (DESIGN.md section 6b, Pulsar's model): the subscription type is
stored in the preferences (``subscriptionType``; records from before it
read as EXCLUSIVE) and fixed at creation: attaching with another type raises
``SubscriptionTypeMismatchError``. A subscribe with a ``consumerId`` or a
type other than EXCLUSIVE attaches a consumer to the subscription's
dispatcher (``hub.dispatch``: SHARED, FAILOVER, KEY_SHARED, and EXCLUSIVE
through the consumer API, where a second consumer is refused as a second
Hedwig attach is). Its acks, redelivery requests and flow permits come as
``ConsumeRequest`` kinds (``ack``). The cursor's mark-delete point is the
consume pointer (``consumed``, which retention and the backlog use); the
acknowledged ranges after it are persisted with it at least every
``consume_interval`` acks and within ``ack_persist_interval_ms``
(``hub.cursor`` bounds them): a write follows the one before it at once
only when ``consume_interval`` more acks came meanwhile, else within that
interval. Server filters and ``messageBound`` apply to
Hedwig deliveries only.

Readers' temporary subscriptions (``SubscriptionPreferences.temporary``,
``hub.client_reader``): created from the request's ``startSeqId``, deleted
as soon as their last consumer closes or its connection drops
(``_drop_temporary``), and deleted by ``load`` when a (new) owner finds
them: the reader keeps its position and subscribes again from it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from hub import errors
from hub.conf import HubConf
from hub.delivery import Delivery
from hub.filters import ServerMessageFilter, load_server_filter, safe_uninitialize
from hub.message import SubscriptionPreferences
from hub.proto import pubsub_pb2 as pb
from hub.subscription_consumers import SubscriptionConsumers, type_name
from hub.subscription_persistence import SubscriptionPersistence
from hub.substate import Attachment, SubState
from metastore import Version
from metastore.idle import IDLE_DICT

if TYPE_CHECKING:
    from hub.metadata import SubscriptionDataManager
    from hub.readahead import ReadAheadCache

log = logging.getLogger(__name__)

__all__ = ["Attachment", "LogPosition", "SubState", "TopicSubscriptions", "bounded_consumed", "type_name"]


def bounded_consumed(consumed: int, message_bound: int, last_seq: int) -> int:
    """What a subscriber counts as having consumed for retention: ``max(pointer, last - bound)`` when bounded."""
    if message_bound:
        return max(consumed, last_seq - message_bound)
    return consumed


class LogPosition(Protocol):
    """What subscriptions read of their topic's log (``hub.persistence.TopicLog``)."""

    def last_seq_now(self) -> int:
        """The topic's last seq id."""

    def first_kept(self) -> int:
        """The oldest seq id still stored."""


class TopicSubscriptions(SubscriptionPersistence, SubscriptionConsumers):
    """See the module docstring; the consumer side is ``hub.subscription_consumers``, the metastore writes
    ``hub.subscription_persistence``.

    Slots, and the log itself rather than two bound methods of it: every
    owned topic has one (issue 34)."""

    __slots__ = ("_at_min", "_bounded", "_first_kept", "_last_seq", "_log", "_min", "_min_n", "_subscribing",
                 "cache", "conf", "mgr", "on_consumed", "subs", "topic", "track")

    def __init__(self, topic: bytes, manager: SubscriptionDataManager, conf: HubConf,
                 last_seq: Callable[[], int] | None = None,
                 on_consumed: Callable[[bytes], None] | None = None,
                 track: Callable[[asyncio.Task[Any]], None] | None = None,
                 first_kept: Callable[[], int] | None = None, cache: ReadAheadCache | None = None,
                 log: LogPosition | None = None) -> None:
        if last_seq is None and log is None:
            raise TypeError("TopicSubscriptions needs last_seq or log")
        self.topic = topic
        self.cache = cache                # what consumer dispatchers read through
        self._log = log                   # last_seq and first_kept when not given (``last_seq``, ``first_kept``)
        self._first_kept = first_kept
        self.track = track                # keeps the background pointer writes it starts (the server's)
        self.mgr = manager
        self.conf = conf
        self._last_seq = last_seq
        self.on_consumed = on_consumed
        self.subs: dict[bytes, SubState] = IDLE_DICT   # a dict of its own from the first subscription
        self._subscribing: dict[bytes, asyncio.Lock] = IDLE_DICT
        # retained_after's running minimum of the unbounded subscribers' pointers: ``_at_min`` of them are at
        # ``_min``; ``_bounded`` subscribers have a messageBound; ``_min_n`` is len(subs) when it was built
        # (-1 or another count: stale, rebuilt when next asked)
        self._min = 0
        self._at_min = 0
        self._bounded = 0
        self._min_n = -1

    @property
    def last_seq(self) -> Callable[[], int]:
        """The topic's last seq id, as a callable: the one given, else the log's ``last_seq_now``."""
        fn = self._last_seq
        if fn is None:
            assert self._log is not None   # __init__ checks that one of them is given
            return self._log.last_seq_now
        return fn

    @last_seq.setter
    def last_seq(self, fn: Callable[[], int]) -> None:
        self._last_seq = fn

    @property
    def first_kept(self) -> Callable[[], int] | None:
        """The log's oldest stored seq id, as a callable (a bounded delivery skips to it); None: unknown."""
        fn = self._first_kept
        if fn is None and self._log is not None:
            return self._log.first_kept
        return fn

    def _subscriber_lock(self, sub: bytes) -> asyncio.Lock:
        """The lock of ``sub``'s (un)subscriptions: kept, one per subscriber, as ``subs``."""
        locks = self._subscribing
        lock = locks.get(sub)
        if lock is None:
            if locks is IDLE_DICT:
                locks = self._subscribing = {}
            lock = locks[sub] = asyncio.Lock()
        return lock

    async def load(self) -> None:
        """Every stored subscription of the topic; readers' temporary ones left by a previous owner are deleted
        (a live reader subscribes again, at its own position)."""
        for sub, (data, version) in (await self.mgr.read_subscriptions(self.topic)).items():
            if data.preferences.temporary:
                try:
                    await self.mgr.delete_subscription_data(self.topic, sub, version)
                    log.info("temporary subscription %r/%r of a previous owner deleted", self.topic, sub)
                    continue
                except errors.PubSubError as exc:   # kept this time (it holds the ledgers as any subscription)
                    log.warning("could not delete temporary subscription %r/%r: %s", self.topic, sub, exc)
            if self.subs is IDLE_DICT:
                self.subs = {}
            self.subs[sub] = SubState(sub, data, version)
        self._min_stale()

    def min_consumed(self) -> int:
        """Every subscriber has consumed up to this seq id (the last seq id when there are none)."""
        if not self.subs:
            return int(self.last_seq())
        return min(s.consumed for s in self.subs.values())

    def retained_after(self) -> int:
        """Messages up to this seq id may be deleted (consumed-ledger deletion, cache pruning).

        Each subscriber counts as having consumed up to its pointer; one with a
        ``messageBound`` N up to at least ``last_seq - N`` too, since it is never
        delivered more than its newest N messages (Hedwig trims to the bound).
        So an idle bounded subscriber does not keep the topic's ledgers; its
        delivery skips what was deleted (``Delivery``). The last seq id when
        there are no subscribers.

        Called on every consume (cache pruning, the backlog quota's wake), so the
        unbounded subscribers' minimum is kept running: a forward move of a pointer
        at the minimum counts down the subscribers there, and only the last one
        to leave it (or a subscribe, unsubscribe, reset or preference change)
        makes the next call rebuild it, once per round of consumes rather than
        once per consume. Bounded subscribers, whose floor moves with
        ``last_seq``, are looked at on each call (they are few).
        """
        last = int(self.last_seq())
        subs = self.subs
        if not subs:
            return last
        if self._min_n != len(subs):
            self._recompute_min()
        low = self._min if self._at_min else last
        if self._bounded:          # bounded subscribers are few: each is looked at
            for s in subs.values():
                bound = s.prefs.messageBound
                if bound:
                    low = min(low, bounded_consumed(s.consumed, bound, last))
        return low

    def _recompute_min(self) -> None:
        """Rebuild ``retained_after``'s running minimum over the unbounded subscribers' pointers."""
        low = 0
        at = 0
        bounded = 0
        for s in self.subs.values():
            if s.prefs.messageBound:
                bounded += 1
                continue
            c = s.consumed
            if not at or c < low:
                low, at = c, 1
            elif c == low:
                at += 1
        self._min, self._at_min, self._bounded, self._min_n = low, at, bounded, len(self.subs)

    def _min_stale(self) -> None:
        """A subscription came or went, a pointer moved back or a bound changed: recompute on the next use."""
        self._min_n = -1

    def _pointer_moved(self, state: SubState, old: int) -> None:
        """``state.consumed`` moved forward from ``old``: keep the running minimum (O(1) but once a round)."""
        if old == self._min and self._at_min and not state.prefs.messageBound:
            self._at_min -= 1
            if not self._at_min:
                self._min_n = -1   # the last one at the minimum left it: recompute when next asked

    @property
    def attached_count(self) -> int:
        return sum(1 for s in self.subs.values() if s.attached)

    def _load_filter(self, sub: bytes, prefs: pb.SubscriptionPreferences) -> ServerMessageFilter | None:
        if not prefs.messageFilter:
            return None
        p = SubscriptionPreferences.from_proto(prefs)
        return load_server_filter(prefs.messageFilter, self.conf.filter_conf(), self.topic, sub, p,
                                  filter_class_path=self.conf.filter_class_path,
                                  allowlist=self.conf.server_filter_allowlist)

    async def subscribe(self, conn: Attachment, sub: bytes, req: pb.SubscribeRequest) -> pb.SubscriptionPreferences:
        """One subscribe at a time per subscriber, whatever connection it comes from: two consumers of a new
        SHARED subscription attaching at once must not both try to create it."""
        async with self._subscriber_lock(sub):   # kept: one per subscriber, as subs
            return await self._subscribe(conn, sub, req)

    async def _subscribe(self, conn: Attachment, sub: bytes, req: pb.SubscribeRequest) -> pb.SubscriptionPreferences:
        mode = req.createOrAttach
        state = self.subs.get(sub)
        stype, cid = req.preferences.subscriptionType, req.consumerId
        consumer = stype != pb.EXCLUSIVE or cid != 0
        if state is not None and mode == pb.SubscribeRequest.CREATE:
            raise errors.ClientAlreadySubscribedError(f"{sub!r} already subscribed to {self.topic!r}")
        if state is None and mode == pb.SubscribeRequest.ATTACH:
            raise errors.ClientNotSubscribedError(f"{sub!r} is not subscribed to {self.topic!r}")
        if state is not None and state.stype != stype:
            raise errors.SubscriptionTypeMismatchError(
                f"{sub!r} on {self.topic!r} is a {type_name(state.stype)} subscription, not {type_name(stype)}")
        if state is not None and stype == pb.EXCLUSIVE:
            hedwig = state.conn is not None and (state.conn is not conn or consumer)
            others = [s for s in (state.dispatcher.consumers if state.dispatcher is not None else [])
                      if not (consumer and s.conn is conn and s.consumer_id == cid)]
            if hedwig or others:
                if not req.forceAttach:
                    raise errors.PubSubError(f"{sub!r} is attached on another connection", status="TOPIC_BUSY")
                if hedwig:
                    old = state.conn
                    assert old is not None
                    await self._detach(state)
                    old.send_event(self.topic, sub, pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED)
                for slot in others:
                    self._remove_slot(state, slot)
                    slot.conn.send_event(self.topic, sub, pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED,
                                         slot.consumer_id)
        flt = self._load_filter(sub, req.preferences)   # InvalidMessageFilterError before anything is stored
        if state is None:
            data = pb.SubscriptionData()
            last = int(self.last_seq())
            data.state.msgId.localComponent = min(req.startSeqId - 1, last) if req.startSeqId else last
            data.preferences.CopyFrom(req.preferences)
            version = await self.mgr.create_subscription_data(self.topic, sub, data)
            state = SubState(sub, data, version)
            if self.subs is IDLE_DICT:
                self.subs = {}
            self.subs[sub] = state
            self._min_stale()
        else:
            if state.delivery is not None and not consumer:
                await state.delivery.stop()
                state.delivery = None
            data = pb.SubscriptionData()
            data.preferences.CopyFrom(req.preferences)
            state.version = await self._write(state, data)
            state.prefs = req.preferences
            self._min_stale()      # its messageBound may have changed
        if state.filter is not None and state.filter is not flt:
            safe_uninitialize(state.filter)
        state.filter = flt
        if consumer:
            self._dispatcher(state).add(conn, cid, req.receiverQueueSize, address=getattr(conn, "address", ""))
        else:
            state.conn = conn
        conn.attached(self.topic, sub, state)
        return state.prefs

    def attached(self, conn: Attachment, sub: bytes, consumer_id: int = 0) -> SubState:
        state = self.subs.get(sub)
        if state is not None and state.slot(conn, consumer_id) is not None:
            return state
        if state is None or state.conn is not conn:
            raise errors.ClientNotSubscribedError(f"{sub!r} is not subscribed to {self.topic!r} on this connection")
        return state

    def start_delivery(self, conn: Attachment, sub: bytes, cache: ReadAheadCache, batch: int | None = None,
                       consumer_id: int = 0) -> None:
        """Deliver to ``conn``, ``batch`` messages per delivery at most (``None``: as the last start said).

        A consumer delivers from its subscribe on, as its flow permits allow: nothing to start."""
        state = self.attached(conn, sub, consumer_id)
        if state.slot(conn, consumer_id) is not None:
            return
        if batch is not None:
            state.batch = batch
        if state.delivery is not None and state.delivery.running:
            return
        window = state.prefs.messageWindowSize or self.conf.default_message_window_size

        def failed(exc: Exception) -> None:
            if isinstance(exc, errors.InvalidMessageFilterError) and state.conn is conn:
                # closed as the client is told: detached here too, so it does not stay busy for others
                conn.send_event(self.topic, sub, pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED)
                task = asyncio.get_running_loop().create_task(self._detach_if(state, conn))
                if self.track is not None:
                    self.track(task)

        def filtered(seq: int) -> None:   # messages the filter skipped count as consumed
            if self.subs.get(sub) is state and self._advance(state, seq):
                task = self.persist_soon(sub)
                if task is not None and self.track is not None:
                    self.track(task)

        state.delivery = Delivery(self.topic, sub, state.consumed, cache=cache, last_seq=self.last_seq,
                                  send=conn.send_delivery, writable=conn.writable, window=window, batch=state.batch,
                                  message_bound=state.prefs.messageBound, server_filter=state.filter,
                                  on_error=failed, on_filtered=filtered, first_kept=self.first_kept)
        state.delivery.start()

    async def stop_delivery(self, conn: Attachment, sub: bytes, consumer_id: int = 0) -> None:
        state = self.attached(conn, sub, consumer_id)
        slot = state.slot(conn, consumer_id)
        if slot is not None:   # a consumer: no more messages until it gives permits again
            slot.permits = 0
            return
        if state.delivery is not None:
            await state.delivery.stop()
            state.delivery = None

    def consume(self, conn: Attachment, sub: bytes, seq: int) -> bool:
        """Move the pointer (synchronously, so later requests see it); True when it should be persisted."""
        state = self.subs.get(sub)
        if state is None:
            raise errors.ClientNotSubscribedError(f"{sub!r} is not subscribed to {self.topic!r}")
        if state.slot(conn, 0) is not None:   # a consumer 0 (not a Hedwig subscriber): a cumulative ack
            req = pb.ConsumeRequest(ackType=pb.ConsumeRequest.CUMULATIVE)
            req.msgId.localComponent = seq
            self.ack(conn, sub, req)
            return False
        return self._advance(state, min(seq, int(self.last_seq())))

    def _advance(self, state: SubState, seq: int) -> bool:
        if seq <= state.consumed:
            return False
        old, state.consumed = state.consumed, seq
        self._pointer_moved(state, old)
        if state.dispatcher is not None:   # the consumers' cursor follows the Hedwig pointer
            state.dispatcher.skip_to(seq)
        state.consumes_since_persist += 1
        if state.delivery is not None:
            state.delivery.consumed_up_to(seq)
        if self.on_consumed is not None:
            self.on_consumed(self.topic)
        return state.consumes_since_persist >= self.conf.consume_interval

    async def _detach(self, state: SubState) -> None:
        if state.delivery is not None:
            await state.delivery.stop()
            state.delivery = None
        conn, state.conn = state.conn, None
        if conn is not None:
            conn.attached(self.topic, state.subscriber, None)
        try:
            await self.persist(state.subscriber)
        except errors.PubSubError as exc:
            log.warning("could not persist consume pointer of %r/%r: %s", self.topic, state.subscriber, exc)

    async def _detach_if(self, state: SubState, conn: Attachment) -> None:
        if state.conn is conn and self.subs.get(state.subscriber) is state:
            await self._detach(state)

    async def close(self, conn: Attachment, sub: bytes, consumer_id: int = 0) -> None:
        state = self.attached(conn, sub, consumer_id)
        slot = state.slot(conn, consumer_id)
        if slot is None:
            await self._detach(state)
            return
        self._remove_slot(state, slot)
        if not await self._drop_temporary(state):
            await self._persist_quietly(state)

    async def _drop_temporary(self, state: SubState) -> bool:
        """Delete a reader's temporary subscription once nothing is attached to it; True when it is gone.

        Under the subscriber's subscribe lock, so a consumer attaching again meanwhile keeps it."""
        if not state.prefs.temporary or state.attached:
            return False
        sub = state.subscriber
        async with self._subscriber_lock(sub):
            if self.subs.get(sub) is not state:
                return True
            if state.attached:
                return False
            try:
                await self.unsubscribe(cast(Attachment, None), sub)
            except errors.PubSubError as exc:   # kept: the next owner's load deletes it
                log.warning("could not delete temporary subscription %r/%r: %s", self.topic, sub, exc)
                return False
        log.info("temporary subscription %r/%r deleted: its reader left", self.topic, sub)
        return True

    async def detach(self, sub: bytes, conn: Attachment | None = None) -> None:
        """Detach ``sub``'s attachments on ``conn`` (its connection dropped; None: wherever attached)."""
        state = self.subs.get(sub)
        if state is None:
            return
        slots = [s for s in state.dispatcher.consumers if conn is None or s.conn is conn] \
            if state.dispatcher is not None else []
        for slot in slots:
            self._remove_slot(state, slot)
        if conn is None or state.conn is conn:
            await self._detach(state)      # persists
        elif slots and not await self._drop_temporary(state):
            await self._persist_quietly(state)

    async def unsubscribe(self, conn: Attachment, sub: bytes) -> None:
        state = self.subs.get(sub)
        if state is None:
            raise errors.ClientNotSubscribedError(f"{sub!r} is not subscribed to {self.topic!r}")
        if state.delivery is not None:
            await state.delivery.stop()
            state.delivery = None
        await self._drop_consumers(state, pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED, but=conn)
        attached, state.conn = state.conn, None
        if attached is not None:
            attached.attached(self.topic, sub, None)
            if attached is not conn:   # another client removed it: tell the attached one (as Hedwig does)
                attached.send_event(self.topic, sub, pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED)
        if state.persisting is not None:   # let a pointer write in flight land before the record goes
            await asyncio.gather(state.persisting, return_exceptions=True)
        await self.mgr.delete_subscription_data(self.topic, sub, Version.ANY)
        self.subs.pop(sub, None)
        self._min_stale()
        if state.filter is not None:
            safe_uninitialize(state.filter)

    async def reset(self, sub: bytes, consumed: int, cache: ReadAheadCache) -> None:
        """Move ``sub``'s consume pointer to ``consumed`` (the admin API), older or newer, and store it.

        An attached subscriber gets a SUBSCRIPTION_RESET event, then (when it
        was delivering) messages from ``consumed + 1`` on. Raises
        ``ClientNotSubscribedError`` for an unknown subscriber, metastore
        errors as ``hub.errors`` classes.
        """
        state = self.subs.get(sub)
        if state is None:
            raise errors.ClientNotSubscribedError(f"{sub!r} is not subscribed to {self.topic!r}")
        delivering = state.delivery is not None
        if state.delivery is not None:
            await state.delivery.stop()
            state.delivery = None
        if state.persisting is not None:   # a pointer write in flight must not land after ours
            await asyncio.gather(state.persisting, return_exceptions=True)
        data = pb.SubscriptionData()
        data.state.msgId.localComponent = consumed
        async with state.writing:
            state.version = await self.mgr.update_subscription_data(self.topic, sub, data, Version.ANY)
        state.consumed = state.persisted = consumed
        self._min_stale()          # older or newer
        state.consumes_since_persist = 0
        state.ranges = []
        state.acks_dirty = False
        if state.dispatcher is not None:
            state.dispatcher.skip_to(consumed)
            for slot in state.dispatcher.consumers:
                slot.conn.send_event(self.topic, sub, pb.SubscriptionEvent.SUBSCRIPTION_RESET, slot.consumer_id)
        log.info("consume pointer of %r/%r reset to %d", self.topic, sub, consumed)
        conn = state.conn
        if conn is not None:
            conn.send_event(self.topic, sub, pb.SubscriptionEvent.SUBSCRIPTION_RESET)
            if delivering:
                self.start_delivery(conn, sub, cache)
        if self.on_consumed is not None:
            self.on_consumed(self.topic)

    async def remove(self, sub: bytes) -> None:
        """Delete ``sub`` (the admin API); an attached subscriber gets SUBSCRIPTION_FORCED_CLOSED.

        Raises ``ClientNotSubscribedError`` for an unknown subscriber.
        """
        state = self.subs.get(sub)
        if state is None:
            raise errors.ClientNotSubscribedError(f"{sub!r} is not subscribed to {self.topic!r}")
        conn = state.conn
        await self.unsubscribe(cast(Attachment, conn), sub)
        if conn is not None:
            conn.send_event(self.topic, sub, pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED)

    def delivering(self) -> bool:
        """Whether any subscription of the topic is delivering now."""
        return any(s.delivery is not None or (s.dispatcher is not None and s.dispatcher.consumers)
                   for s in self.subs.values())

    def wake_all(self) -> None:
        for s in self.subs.values():
            if s.delivery is not None:
                s.delivery.wake()
            if s.dispatcher is not None:
                s.dispatcher.wake()

    async def release(self) -> None:
        """The topic is moving: detach everyone (TOPIC_MOVED) and persist every pointer."""
        for state in list(self.subs.values()):
            await self._drop_consumers(state, pb.SubscriptionEvent.TOPIC_MOVED)
            conn = state.conn
            await self._detach(state)
            if conn is not None:
                conn.send_event(self.topic, state.subscriber, pb.SubscriptionEvent.TOPIC_MOVED)
            if state.filter is not None:
                safe_uninitialize(state.filter)

