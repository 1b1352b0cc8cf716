"""The consumer side of a topic's subscriptions (DESIGN.md section 6b): a mixin of ``TopicSubscriptions``.

    subs.ack(conn, sub, consume_request)   # a consumer's ack, cumulative ack, redelivery request or permits
    subs.stats_of(sub)                     # the admin API's view (type, consumers, unacked, ...)

A subscription with consumers (a subscribe with a ``consumerId``, or of a
type other than EXCLUSIVE) gets a dispatcher (``hub.dispatch``) over an
``hub.cursor.AckCursor`` built from its stored pointer and acked ranges.
Acks move the cursor; ``SubState.consumed`` follows its mark-delete point
(retention and the backlog), and the ranges are persisted with the pointer
(``hub.subscription_persistence``) at least every ``consume_interval``
acks and within ``ack_persist_interval_ms``. The rules are in
``hub.subscriptions``' module docstring.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any, cast

from hub import errors
from hub.conf import HubConf
from hub.cursor import AckCursor
from hub.delayed import DelayIndex
from hub.dispatch import ConsumerLink, ConsumerSlot, Dispatcher
from hub.dispatch_failover import FailoverDispatcher
from hub.dispatch_key_shared import KeySharedDispatcher
from hub.dispatch_shared import SharedDispatcher
from hub.proto import pubsub_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Callable

    from hub.readahead import ReadAheadCache
    from hub.substate import Attachment, SubState

log = logging.getLogger("hub.subscriptions")

__all__ = ["SubscriptionConsumers", "type_name"]

_DISPATCHERS: dict[int, type[Dispatcher]] = {pb.EXCLUSIVE: SharedDispatcher, pb.SHARED: SharedDispatcher,
                                             pb.FAILOVER: FailoverDispatcher, pb.KEY_SHARED: KeySharedDispatcher}


def type_name(stype: int) -> str:
    """The name of a ``pb.SubscriptionType`` value ("EXCLUSIVE", "SHARED", ...)."""
    try:
        return pb.SubscriptionType.Name(stype)
    except ValueError:
        return f"TYPE_{stype}"


class SubscriptionConsumers:
    """Consumers of ``TopicSubscriptions`` (its ``topic``, ``subs``, ``conf``, ``cache``... are declared here)."""

    if not TYPE_CHECKING:    # the state is TopicSubscriptions' slots
        __slots__ = ()

    topic: bytes
    conf: HubConf
    subs: dict[bytes, SubState]
    cache: ReadAheadCache | None
    last_seq: Callable[[], int]
    on_consumed: Callable[[bytes], None] | None
    track: Callable[[asyncio.Task[Any]], None] | None

    if TYPE_CHECKING:
        def persist_soon(self, sub: bytes) -> asyncio.Task[None] | None: ...

        async def persist(self, sub: bytes) -> None: ...

        def _pointer_moved(self, state: SubState, old: int) -> None: ...

    def _dispatcher(self, state: SubState) -> Dispatcher:
        d = state.dispatcher
        if d is None:
            if self.cache is None:
                raise errors.PubSubError("this hub serves no consumers (no read-ahead cache)",
                                         status="UNEXPECTED_CONDITION")
            cursor = AckCursor(state.consumed, state.ranges)
            # delayed delivery is for SHARED and KEY_SHARED only, as in Pulsar (hub.delayed)
            delays = DelayIndex(self.conf.max_tracked_delayed_messages) \
                if state.stype in (pb.SHARED, pb.KEY_SHARED) else None
            d = _DISPATCHERS.get(state.stype, SharedDispatcher)(
                self.topic, state.subscriber, cursor, cache=self.cache, last_seq=self.last_seq,
                on_acked=functools.partial(self._on_acked, state), delays=delays)
            state.dispatcher = d
            state.ranges = []
            if cursor.mark_delete > state.consumed:
                old, state.consumed = state.consumed, cursor.mark_delete
                self._pointer_moved(state, old)
        return d

    def _on_acked(self, state: SubState, advanced: bool, n: int) -> None:
        d = state.dispatcher
        if d is None or self.subs.get(state.subscriber) is not state:
            return
        if advanced and d.cursor.mark_delete > state.consumed:
            old, state.consumed = state.consumed, d.cursor.mark_delete
            self._pointer_moved(state, old)
            if self.on_consumed is not None:
                self.on_consumed(self.topic)
        state.acks_dirty = True
        state.consumes_since_persist += n
        writing = state.persisting
        if writing is not None and not writing.done():
            return    # the write in flight looks at the count when it returns (``_persist_loop``): no call per ack
        if state.consumes_since_persist >= self.conf.consume_interval:
            self._persist_tracked(state.subscriber)
        else:
            self._arm_ack_timer(state)

    def _arm_ack_timer(self, state: SubState) -> None:
        """Persist ``state``'s acks within ``ack_persist_interval_ms`` (a timer already set stays)."""
        if state.ack_timer is None:
            state.ack_timer = asyncio.get_running_loop().call_later(
                self.conf.ack_persist_interval_ms / 1000.0, self._ack_timer_due, state)

    def _ack_timer_due(self, state: SubState) -> None:
        state.ack_timer = None
        if self.subs.get(state.subscriber) is state:
            self._persist_tracked(state.subscriber)

    def _persist_tracked(self, sub: bytes) -> None:
        task = self.persist_soon(sub)
        if task is not None and self.track is not None:
            self.track(task)

    def consumer_ids(self, sub: bytes, conn: ConsumerLink) -> list[int]:
        """The ids of ``sub``'s consumers attached through ``conn``."""
        state = self.subs.get(sub)
        d = state.dispatcher if state is not None else None
        return [s.consumer_id for s in d.consumers if s.conn is conn] if d is not None else []

    def _remove_slot(self, state: SubState, slot: ConsumerSlot) -> None:
        """Detach one consumer; its connection forgets the subscription when it has no other attachment."""
        d = state.dispatcher
        if d is None:
            return
        d.remove(slot)
        conn = cast("Attachment", slot.conn)   # the subscription attached it (``hub.substate``)
        if state.conn is not conn and not any(s.conn is conn for s in d.consumers):
            conn.attached(self.topic, state.subscriber, None)

    def ack(self, conn: Attachment, sub: bytes, req: pb.ConsumeRequest) -> None:
        """Apply a consumer's ack, cumulative ack, redelivery request or flow permits (one-way requests).

        Raises ``ClientNotSubscribedError`` when that consumer is not attached on ``conn``,
        ``PubSubError`` NOT_ALLOWED for a cumulative ack on a SHARED or KEY_SHARED subscription.
        """
        state = self.subs.get(sub)
        slot = state.slot(conn, req.consumerId) if state is not None else None
        if state is None or slot is None or state.dispatcher is None:
            raise errors.ClientNotSubscribedError(f"consumer {req.consumerId} of {sub!r} on {self.topic!r} is not "
                                                  "attached on this connection")
        d = state.dispatcher
        kind = req.ackType
        if kind == pb.ConsumeRequest.INDIVIDUAL:
            d.ack(req.seqIds)
        elif kind == pb.ConsumeRequest.CUMULATIVE:
            if state.stype in (pb.SHARED, pb.KEY_SHARED):
                raise errors.PubSubError(f"{sub!r} is {type_name(state.stype)}: cumulative acks are for "
                                         "EXCLUSIVE and FAILOVER subscriptions", status="NOT_ALLOWED")
            d.ack_cumulative(slot, min(req.msgId.localComponent, int(self.last_seq())))
        elif kind == pb.ConsumeRequest.REDELIVER:
            d.redeliver(slot, list(req.seqIds) or None)
        elif kind == pb.ConsumeRequest.FLOW:
            d.flow(slot, req.permits)

    async def _persist_quietly(self, state: SubState) -> None:
        try:
            await self.persist(state.subscriber)
        except errors.PubSubError as exc:
            log.warning("could not persist consume pointer of %r/%r: %s", self.topic, state.subscriber, exc)

    async def _drop_consumers(self, state: SubState, event: int | None, but: ConsumerLink | None = None) -> None:
        """Detach every consumer of ``state`` (telling those not on ``but`` ``event``) and stop its dispatcher."""
        d = state.dispatcher
        if d is None:
            return
        for slot in list(d.consumers):
            self._remove_slot(state, slot)
            if event is not None and slot.conn is not but:
                slot.conn.send_event(self.topic, state.subscriber, event, slot.consumer_id)
        await d.stop()
        if state.ack_timer is not None:
            state.ack_timer.cancel()
            state.ack_timer = None

    def stats_of(self, sub: bytes) -> dict[str, Any]:
        """The admin API's consumer view of ``sub``: ``type``, ``consumers`` (``address``, ``unacked``),
        ``unacked``, ``redelivered_total``, ``msg_rate_out``, ``delayed`` (messages held back until due in
        memory, ``hub.delayed``; 0 until a consumer attached on this owner) and ``delayed_overflow`` (more are
        held in the log only: the index is full). ``KeyError`` for an unknown subscriber."""
        state = self.subs[sub]
        d = state.dispatcher
        if d is not None:
            return {"type": type_name(state.stype), **d.stats()}
        delivery = state.delivery
        unacked = len(delivery.outstanding) if delivery is not None else 0
        consumers = [{"address": getattr(state.conn, "address", ""), "unacked": unacked}] if state.conn else []
        return {"type": type_name(state.stype), "consumers": consumers, "unacked": unacked, "redelivered_total": 0,
                "msg_rate_out": round(delivery.out.rate(), 3) if delivery is not None else 0.0, "delayed": 0,
                "delayed_overflow": False}

