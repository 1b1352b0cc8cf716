"""``HedwigClient``'s Hedwig subscriptions: subscribe, handlers, consumes, events and resubscribes.

A mixin of ``HedwigClient`` (``hub.client``, whose module docstring states
the handler contract and the resubscribe rules). The per-subscription state
is ``hub.client_subscription.ClientSubscription``; subscriptions of a type
other than EXCLUSIVE are consumers underneath (``hub.client_consumers``).
What it needs of the client core (``_call``, owners, tasks) is declared
below. Errors are ``hub.errors`` classes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hub import errors
from hub.channel import HubChannel
from hub.client_consumers import ClientConsumers
from hub.client_subscription import ClientSubscription, Handler
from hub.consumer import subscription_type_value
from hub.filters import ClientMessageFilter
from hub.message import Message, MessageId, SubscriptionPreferences
from hub.proto import pubsub_pb2 as pb

log = logging.getLogger("hub.client")

__all__ = ["ClientSubscriptions", "SubscriptionListener"]

_Conn = HubChannel
_Sub = ClientSubscription

SubscriptionListener = Callable[[bytes, bytes, str], Any]
"""``cb(topic, subscriber_id, event_name)``; may be a plain function or return an awaitable."""
_MODES = {"CREATE": pb.SubscribeRequest.CREATE, "ATTACH": pb.SubscribeRequest.ATTACH,
          "CREATE_OR_ATTACH": pb.SubscribeRequest.CREATE_OR_ATTACH}


def _event_name(event: int) -> str:
    try:
        return pb.SubscriptionEvent.Event.Name(event)
    except ValueError:
        return f"EVENT_{event}"


async def _logged(awaitable: Awaitable[Any], what: str) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("%s raised", what)


class ClientSubscriptions(ClientConsumers):
    """The Hedwig-subscription half of ``HedwigClient`` (consumers from ``ClientConsumers``)."""

    owner: dict[bytes, str]
    subs: dict[tuple[bytes, bytes], _Sub]
    _listeners: list[SubscriptionListener]

    if TYPE_CHECKING:
        def _check_open(self) -> None: ...

        @staticmethod
        def _check_names(topic: bytes, subscriber_id: bytes | None = None) -> None: ...

        def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    # --- subscriptions ----------------------------------------------------------------------------
    async def subscribe(self, topic: bytes, subscriber_id: bytes, create_or_attach: str = "CREATE_OR_ATTACH",
                        message_bound: int = 0, message_window_size: int = 0,
                        options: Mapping[str, bytes] | None = None, message_filter: str | None = None,
                        *, force_attach: bool = False, synchronous: bool = False,
                        hub_subscriber: bool = False, subscription_type: str = "EXCLUSIVE") -> SubscriptionPreferences:
        """Subscribe; returns the stored preferences (those given replace them).

        ``synchronous``: the hub answers only once its remote-region subscriptions are made (or
        fails with their error); ``hub_subscriber`` marks a hub subscribing for its region.
        ``subscription_type`` other than EXCLUSIVE: a consumer underneath (``hub.client_consumers``);
        ``start_delivery`` handlers work the same, a handler's return acknowledges its message."""
        self._check_open()
        self._check_names(topic, subscriber_id)
        if create_or_attach not in _MODES:
            raise ValueError(f"create_or_attach must be one of {sorted(_MODES)}")
        if subscription_type_value(subscription_type) != pb.EXCLUSIVE:
            return await self._subscribe_typed(topic, subscriber_id, subscription_type, create_or_attach,
                                               SubscriptionPreferences(
                                                   options=dict(options or {}), message_bound=message_bound,
                                                   message_filter=message_filter or "",
                                                   message_window_size=message_window_size), force_attach)
        sreq = pb.SubscribeRequest(topic=topic, subscriberId=subscriber_id, createOrAttach=_MODES[create_or_attach],
                                   forceAttach=force_attach, synchronous=synchronous,
                                   hubSubscriber=hub_subscriber)
        sreq.preferences.CopyFrom(SubscriptionPreferences(
            options=dict(options or {}), message_bound=message_bound, message_filter=message_filter or "",
            message_window_size=message_window_size).to_proto())
        s = _Sub(topic, subscriber_id, sreq)
        old = self.subs.get((topic, subscriber_id))
        if old is not None:
            s.last_handled = old.last_handled
            await self._stop_task(old)
        conn, resp = await self._call(topic, self._sub_request(sreq))
        s.conn = conn
        s.prefs = SubscriptionPreferences.from_proto(resp.subscribeResponse.preferences)
        s.req.createOrAttach = pb.SubscribeRequest.ATTACH
        s.req.forceAttach = True    # re-attaching after a failure takes over a stale attachment
        self.subs[(topic, subscriber_id)] = s
        return s.prefs

    @staticmethod
    def _sub_request(sreq: pb.SubscribeRequest) -> pb.PubSubRequest:
        req = pb.PubSubRequest(type=pb.SUBSCRIBE, topic=sreq.topic)
        req.subscribeRequest.CopyFrom(sreq)
        return req

    def _get(self, topic: bytes, sub: bytes) -> _Sub:
        s = self.subs.get((topic, sub))
        if s is None:
            raise errors.ClientNotSubscribedError(f"{sub!r} is not subscribed to {topic!r} on this client")
        return s

    async def _sub_call(self, s: _Sub, op: int, field: str) -> None:
        req = pb.PubSubRequest(topic=s.topic)
        req.type = op  # type: ignore[assignment]
        body = getattr(req, field)
        body.topic = s.topic
        body.subscriberId = s.sub
        if op == pb.START_DELIVERY:   # deliveries may carry a run of messages, as many as the queue holds
            body.maxBatchMessages = self.conf.max_outstanding_messages
        await self._call(s.topic, req)

    async def start_delivery(self, topic: bytes, subscriber_id: bytes, handler: Handler,
                             message_filter: ClientMessageFilter | None = None) -> None:
        """Deliver to ``handler`` (see the handler contract); ``PubSubError`` ALREADY_DELIVERING if started."""
        typed = self.typed.get((topic, subscriber_id))
        if typed is not None:
            await self._start_typed(typed, handler)
            return
        s = self._get(topic, subscriber_id)
        if s.handler is not None:
            raise errors.PubSubError(f"{subscriber_id!r} on {topic!r} is already delivering",
                                     status="ALREADY_DELIVERING")
        if message_filter is not None:
            message_filter.set_subscription_preferences(topic, subscriber_id, s.prefs)
        s.handler, s.filter = handler, message_filter
        s.task = asyncio.get_running_loop().create_task(self._run_handler(s))
        try:
            await self._sub_call(s, pb.START_DELIVERY, "startDeliveryRequest")
        except BaseException:
            await self._stop_task(s)
            raise

    async def _run_handler(self, s: _Sub) -> None:
        conf = self.conf
        auto_consume, per_consume = conf.auto_send_consume_message_enabled, conf.consumed_messages_buffer_size
        most = conf.max_outstanding_messages
        queue = s.queue                # cleared in place on a reset, never replaced
        while True:
            while not queue:
                s.wake.clear()
                await s.wake.wait()
            msg = queue[0]
            seq = msg.msg_id.local         # msg.seq_id, without the property call (per message per subscription)
            resets = s.resets
            if seq > s.last_handled:
                ok = True
                if s.filter is not None:
                    try:
                        ok = bool(s.filter.test_message(msg))
                    except Exception:
                        log.exception("client filter of %r/%r raised", s.topic, s.sub)
                        ok = False
                if ok and s.handler is not None:
                    try:
                        await s.handler(s.topic, s.sub, msg)
                    except Exception:
                        log.exception("handler of %r/%r raised on seq %d; delivery stops", s.topic, s.sub, seq)
                        s.handler = None
                        return
                if s.resets != resets:
                    continue           # reset while handled: the queue was emptied, redelivery follows
                s.last_handled = seq
                if auto_consume:
                    s.unsent_consumes += 1
                    if s.unsent_consumes >= per_consume:
                        self._send_consume(s, seq)
            queue.popleft()
            if s.conn is not None and s.conn.paused_by and len(queue) < most:
                s.conn.paused_by.discard((s.topic, s.sub))
                if not s.conn.paused_by and s.conn.transport is not None:
                    s.conn.transport.resume_reading()

    def _send_consume(self, s: _Sub, seq: int) -> None:
        s.unsent_consumes = 0
        if s.conn is None:
            return
        req = pb.PubSubRequest(type=pb.CONSUME, topic=s.topic)
        req.consumeRequest.topic = s.topic
        req.consumeRequest.subscriberId = s.sub
        req.consumeRequest.msgId.localComponent = seq
        s.conn.one_way(req)

    def _delivered(self, conn: _Conn, topic: bytes, sub: bytes, messages: Sequence[Message]) -> None:
        """Queue the messages of one delivery frame (seq order) for the subscription's handler task."""
        s = self.subs.get((topic, sub))
        if s is None or s.handler is None:
            return
        queue = s.queue
        last = s.last_queued
        for msg in messages:           # read-only, shared with other deliveries of them (hub.client_decode)
            seq = msg.msg_id.local
            if seq <= last:
                continue               # redelivered after a resubscribe: already queued or handled
            last = seq
            queue.append(msg)
        s.last_queued = last
        s.wake.set()
        if len(queue) >= self.conf.max_outstanding_messages and conn.transport is not None:
            conn.paused_by.add((topic, sub))
            conn.transport.pause_reading()

    def add_subscription_listener(self, listener: SubscriptionListener) -> None:
        """Call ``listener(topic, subscriber_id, event)`` on every subscription event of this client.

        ``event`` is the name of Hedwig's ``SubscriptionEvent``: ``"SUBSCRIPTION_FORCED_CLOSED"``
        (another client attached with force or unsubscribed it, or its server filter failed; the
        client has dropped the subscription, so ``consume`` and ``start_delivery`` on it raise
        ``ClientNotSubscribedError``) or ``"TOPIC_MOVED"`` (its topic changed owner; with
        ``enable_resubscribe`` the client attaches again by itself). A listener may be a plain
        function or return an awaitable (run as a task); what it raises is logged and ignored.
        """
        self._listeners.append(listener)

    def remove_subscription_listener(self, listener: SubscriptionListener) -> None:
        """Stop calling ``listener``; ``ValueError`` if it was not added."""
        self._listeners.remove(listener)

    def _notify(self, topic: bytes, sub: bytes, event: str) -> None:
        for listener in list(self._listeners):
            try:
                got = listener(topic, sub, event)
                if inspect.isawaitable(got):
                    self._spawn(_logged(got, f"subscription listener ({event} of {topic!r}/{sub!r})"))
            except Exception:
                log.exception("subscription listener raised on %s of %r/%r", event, topic, sub)

    def _sub_event(self, conn: _Conn, topic: bytes, sub: bytes, event: int) -> None:
        s = self.subs.get((topic, sub))
        if s is None or s.conn is not conn:
            return
        if event == pb.SubscriptionEvent.SUBSCRIPTION_RESET:
            log.info("subscription %r/%r was reset by an operator: redelivery follows", topic, sub)
            s.resets += 1
            s.queue.clear()
            s.last_queued = s.last_handled = s.unsent_consumes = 0
            if (topic, sub) in conn.paused_by:    # the queue that paused reading is gone
                conn.paused_by.discard((topic, sub))
                if not conn.paused_by and conn.transport is not None:
                    conn.transport.resume_reading()
            return
        s.conn = None
        if event == pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED:
            log.warning("subscription %r/%r was closed by the hub (another attach, an unsubscribe elsewhere "
                        "or a bad filter)", topic, sub)
            self._forced_closed(s)
            return
        self.owner.pop(topic, None)
        self._maybe_resubscribe(s)
        self._notify(topic, sub, _event_name(event))

    def _forced_closed(self, s: _Sub) -> None:
        """The hub closed ``s``: drop it (its consumes would go nowhere) and tell the listeners."""
        s.closed = True
        s.conn = None
        s.handler = None
        task, s.task = s.task, None
        if task is not None:
            task.cancel()
        s.queue.clear()
        if self.subs.get((s.topic, s.sub)) is s:
            del self.subs[(s.topic, s.sub)]
        self._notify(s.topic, s.sub, "SUBSCRIPTION_FORCED_CLOSED")

    def _maybe_resubscribe(self, s: _Sub) -> None:
        if self.closed or s.closed or not self.conf.enable_resubscribe or s.resubscribing:
            return
        s.resubscribing = True
        self._spawn(self._resubscribe(s))

    async def _resubscribe(self, s: _Sub) -> None:
        wait = self.conf.subscribe_reconnect_retry_wait_time / 1000.0
        try:
            while not self.closed and not s.closed and self.subs.get((s.topic, s.sub)) is s:
                try:
                    conn, resp = await self._call(s.topic, self._sub_request(s.req))
                    s.conn = conn
                    s.prefs = SubscriptionPreferences.from_proto(resp.subscribeResponse.preferences)
                    if s.handler is not None:
                        await self._sub_call(s, pb.START_DELIVERY, "startDeliveryRequest")
                    log.info("resubscribed %r/%r at %s", s.topic, s.sub, conn.address)
                    return
                except errors.ClientNotSubscribedError:
                    # removed while we were away (an unsubscribe elsewhere): as if the hub had closed it
                    log.warning("subscription %r/%r is gone; not resubscribing", s.topic, s.sub)
                    self._forced_closed(s)
                    return
                except errors.PubSubError as exc:
                    log.info("resubscribe %r/%r failed: %s", s.topic, s.sub, exc)
                    await asyncio.sleep(wait)
        finally:
            s.resubscribing = False

    async def consume(self, topic: bytes, subscriber_id: bytes, seq_id: int) -> None:
        """Consume up to ``seq_id`` (one-way; the hub applies requests of a connection in order)."""
        typed = self.typed.get((topic, subscriber_id))
        if typed is not None:   # a cumulative ack (NOT_ALLOWED on SHARED and KEY_SHARED)
            await typed.ack_cumulative(Message(b"", msg_id=MessageId(seq_id)))
            return
        s = self._get(topic, subscriber_id)
        if s.conn is None:
            raise errors.ServiceDownError(f"{subscriber_id!r} on {topic!r} is reconnecting")
        self._send_consume(s, seq_id)

    async def _stop_task(self, s: _Sub) -> None:
        s.handler = None
        task, s.task = s.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        s.queue.clear()

    async def stop_delivery(self, topic: bytes, subscriber_id: bytes) -> None:
        typed = self.typed.get((topic, subscriber_id))
        if typed is not None:
            await self._stop_typed(typed)
            return
        s = self._get(topic, subscriber_id)
        await self._stop_task(s)
        if s.conn is not None:
            await self._sub_call(s, pb.STOP_DELIVERY, "stopDeliveryRequest")

    def _flush(self, s: _Sub) -> None:
        if s.unsent_consumes and s.last_handled:
            self._send_consume(s, s.last_handled)

    async def close_subscription(self, topic: bytes, subscriber_id: bytes) -> None:
        """Flush buffered consumes, stop delivery, detach (the subscription stays stored)."""
        typed = self.typed.pop((topic, subscriber_id), None)
        if typed is not None:
            await self._close_typed(typed)
            return
        s = self._get(topic, subscriber_id)
        s.closed = True
        await self._stop_task(s)
        self._flush(s)
        self.subs.pop((topic, subscriber_id), None)
        if s.conn is not None:
            await self._sub_call(s, pb.CLOSESUBSCRIPTION, "closeSubscriptionRequest")

    async def unsubscribe(self, topic: bytes, subscriber_id: bytes) -> None:
        """Remove the subscription; ``ClientNotSubscribedError`` when it does not exist."""
        self._check_names(topic, subscriber_id)
        typed = self.typed.pop((topic, subscriber_id), None)
        if typed is not None:
            await self._close_typed(typed)
        s = self.subs.pop((topic, subscriber_id), None)
        if s is not None:
            s.closed = True
            await self._stop_task(s)
        req = pb.PubSubRequest(type=pb.UNSUBSCRIBE, topic=topic)
        req.unsubscribeRequest.topic = topic
        req.unsubscribeRequest.subscriberId = subscriber_id
        await self._call(topic, req)

