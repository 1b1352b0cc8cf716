"""``HedwigClient``'s consumers: ``consumer()`` and subscriptions of the types beyond EXCLUSIVE.

    consumer = await c.consumer(b"jobs", b"workers", subscription_type="SHARED")   # hub.consumer.Consumer
    await c.subscribe(b"jobs", b"workers", subscription_type="SHARED")            # the Hedwig calls work too:
    await c.start_delivery(b"jobs", b"workers", handler)                           # handler's return = ack

A mixin of ``HedwigClient`` (``hub.client``): the consumer concept lives in
``hub.consumer``; this routes the client's deliveries, events and lost
connections to its consumers. A subscription subscribed with a type other
than EXCLUSIVE is a consumer underneath, attached without permits until
``start_delivery`` gives it ``max_outstanding_messages`` of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING

from hub import errors
from hub.consumer import Consumer, run_handler, subscription_type_value
from hub.message import Message, SubscriptionPreferences
from hub.proto import pubsub_pb2 as pb
from hub.protocol import MAX_SUBSCRIBER_BYTES, MAX_TOPIC_BYTES, name_problem

if TYPE_CHECKING:
    from hub.channel import HubChannel
    from hub.client_subscription import Handler
    from hub.conf import HubClientConf

__all__ = ["ClientConsumers"]

_MODES = {"CREATE": pb.SubscribeRequest.CREATE, "ATTACH": pb.SubscribeRequest.ATTACH,
          "CREATE_OR_ATTACH": pb.SubscribeRequest.CREATE_OR_ATTACH}


class ClientConsumers:
    """The consumer half of ``HedwigClient``."""

    conf: HubClientConf
    closed: bool

    if TYPE_CHECKING:
        def _call(self, topic: bytes, req: pb.PubSubRequest) -> Awaitable[tuple[HubChannel, pb.PubSubResponse]]:
            ...

        def publish(self, topic: bytes, body: bytes, properties: Mapping[str, bytes] | None = None, *,
                    message_type: str = "", producer: bytes | None = None, sequence_id: int | None = None,
                    key: bytes | None = None) -> Awaitable[int]:
            ...

    def _init_consumers(self) -> None:
        self.consumers: dict[int, Consumer] = {}
        self.typed: dict[tuple[bytes, bytes], Consumer] = {}    # subscribe(..., subscription_type=...) ones
        self._handlers: dict[tuple[bytes, bytes], asyncio.Task[None]] = {}
        self._last_consumer_id = 0

    async def consumer(self, topic: bytes, subscriber_id: bytes, subscription_type: str = "EXCLUSIVE",
                       create_or_attach: str = "CREATE_OR_ATTACH", receiver_queue_size: int = 1000,
                       ack_timeout_ms: int = 0, negative_ack_redelivery_delay_ms: int = 1000,
                       max_redeliver_count: int = 0, dead_letter_topic: bytes | str | None = None) -> Consumer:
        """An attached consumer of the subscription (made as ``create_or_attach`` says).

        Raises ``ValueError`` for a bad argument, ``MalformedRequestError`` for a name the hub would refuse,
        ``SubscriptionTypeMismatchError`` when the subscription exists with another type, ``PubSubError``
        TOPIC_BUSY when an EXCLUSIVE one is attached elsewhere, and what ``subscribe`` raises.
        """
        return await self._new_consumer(topic, subscriber_id, subscription_type, create_or_attach,
                                        receiver_queue_size, ack_timeout_ms, negative_ack_redelivery_delay_ms,
                                        max_redeliver_count, dead_letter_topic)

    async def _new_consumer(self, topic: bytes, subscriber_id: bytes, subscription_type: str,
                            create_or_attach: str, receiver_queue_size: int, ack_timeout_ms: int,
                            nack_delay_ms: int, max_redeliver_count: int, dead_letter_topic: bytes | str | None,
                            prefs: SubscriptionPreferences | None = None, force_attach: bool = False,
                            temporary_from: int = 0) -> Consumer:
        """The consumer, attached; ``temporary_from`` > 0: a reader's temporary subscription made to deliver
        from that seq id (``hub.client_reader``)."""
        if self.closed:
            raise errors.PubSubError("client is closed", status="CLIENT_CLOSED")
        problem = name_problem(topic, "topic", MAX_TOPIC_BYTES) or \
            name_problem(subscriber_id, "subscriber id", MAX_SUBSCRIBER_BYTES)
        if problem is not None:
            raise errors.MalformedRequestError(problem)
        stype = subscription_type_value(subscription_type)
        if create_or_attach not in _MODES:
            raise ValueError(f"create_or_attach must be one of {sorted(_MODES)}")
        for name, value in (("receiver_queue_size", receiver_queue_size), ("ack_timeout_ms", ack_timeout_ms),
                            ("negative_ack_redelivery_delay_ms", nack_delay_ms),
                            ("max_redeliver_count", max_redeliver_count)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, not {value}")
        if isinstance(dead_letter_topic, str):
            dead_letter_topic = dead_letter_topic.encode()
        if dead_letter_topic is not None and name_problem(dead_letter_topic, "topic", MAX_TOPIC_BYTES):
            raise errors.MalformedRequestError(f"dead_letter_topic: {name_problem(dead_letter_topic, 'topic', 255)}")
        sreq = pb.SubscribeRequest(topic=topic, subscriberId=subscriber_id, createOrAttach=_MODES[create_or_attach],
                                   forceAttach=force_attach)
        sreq.preferences.CopyFrom((prefs or SubscriptionPreferences()).to_proto())
        sreq.preferences.subscriptionType = stype  # type: ignore[assignment]
        if temporary_from:
            sreq.preferences.temporary = True
            sreq.startSeqId = temporary_from
        self._last_consumer_id += 1
        sreq.consumerId = self._last_consumer_id
        c = Consumer(self, topic, subscriber_id, self._last_consumer_id, sreq, subscription_type=subscription_type,
                     receiver_queue_size=receiver_queue_size, ack_timeout_ms=ack_timeout_ms,
                     negative_ack_redelivery_delay_ms=nack_delay_ms, max_redeliver_count=max_redeliver_count,
                     dead_letter_topic=dead_letter_topic)
        self.consumers[c.consumer_id] = c     # before the answer: deliveries may come right behind it
        try:
            resp = await c._attach()
        except BaseException:
            self.consumers.pop(c.consumer_id, None)
            raise
        c.prefs = SubscriptionPreferences.from_proto(resp.subscribeResponse.preferences)
        return c

    def _forget_consumer(self, consumer: Consumer) -> None:
        if self.consumers.get(consumer.consumer_id) is consumer:
            del self.consumers[consumer.consumer_id]
        key = (consumer.topic, consumer.subscriber)
        if self.typed.get(key) is consumer:
            del self.typed[key]

    def _consumer_delivered(self, conn: HubChannel, consumer_id: int, messages: Sequence[Message]) -> None:
        c = self.consumers.get(consumer_id)
        if c is not None:
            c._delivered(conn, messages)

    def _consumer_event(self, conn: HubChannel, consumer_id: int, event: int) -> None:
        c = self.consumers.get(consumer_id)
        if c is not None:
            c._event(conn, event)

    def _consumers_lost(self, conn: HubChannel) -> None:
        for c in list(self.consumers.values()):
            if c.conn is conn:
                c._detached(conn)

    # --- the Hedwig calls on typed subscriptions ----------------------------------------------------
    async def _subscribe_typed(self, topic: bytes, subscriber_id: bytes, subscription_type: str,
                               create_or_attach: str, prefs: SubscriptionPreferences,
                               force_attach: bool) -> SubscriptionPreferences:
        old = self.typed.pop((topic, subscriber_id), None)
        if old is not None:
            await self._stop_handler(topic, subscriber_id)
            await old.close()
        c = await self._new_consumer(topic, subscriber_id, subscription_type, create_or_attach, 0, 0, 1000, 0,
                                     None, prefs=prefs, force_attach=force_attach)
        self.typed[(topic, subscriber_id)] = c
        return c.prefs

    async def _start_typed(self, c: Consumer, handler: Handler) -> None:
        key = (c.topic, c.subscriber)
        if key in self._handlers and not self._handlers[key].done():
            raise errors.PubSubError(f"{c.subscriber!r} on {c.topic!r} is already delivering",
                                     status="ALREADY_DELIVERING")
        c.receiver_queue_size = max(1, self.conf.max_outstanding_messages)
        self._handlers[key] = asyncio.get_running_loop().create_task(run_handler(c, handler))
        c.flow(c.receiver_queue_size)

    async def _stop_handler(self, topic: bytes, subscriber_id: bytes) -> None:
        task = self._handlers.pop((topic, subscriber_id), None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _stop_typed(self, c: Consumer) -> None:
        await self._stop_handler(c.topic, c.subscriber)
        if c.conn is not None:
            req = c._request(pb.STOP_DELIVERY, "stopDeliveryRequest")
            await self._call(c.topic, req)

    async def _close_typed(self, c: Consumer) -> None:
        await self._stop_handler(c.topic, c.subscriber)
        await c.close()

    async def _close_consumers(self) -> None:
        for key in list(self._handlers):
            await self._stop_handler(*key)
        for c in list(self.consumers.values()):
            try:
                await asyncio.wait_for(c.close(), 5.0)
            except (errors.PubSubError, TimeoutError):
                c.closed = True
