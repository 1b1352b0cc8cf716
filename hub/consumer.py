"""The asyncio consumer (DESIGN.md section 6b): ``HedwigClient.consumer`` returns one.

    consumer = await c.consumer(b"jobs", b"workers", subscription_type="SHARED")
    async with consumer:                          # closes the subscription (not unsubscribe) on exit
        msg = await consumer.receive(timeout=5.0) # hub.client.Message; TimeoutError when none came
        await consumer.ack(msg)                   # individual, any order
        await consumer.nack(msg)                  # redelivered after negative_ack_redelivery_delay_ms
        async for msg in consumer: ...            # until the consumer is closed

Pulsar's client-side rules, on Quire's wire (``ConsumeRequest`` kinds):

* Flow control: the consumer attaches with ``receiver_queue_size`` permits;
  the hub hands it no more than that many messages beyond what the
  application has received. Once the application has received half the
  queue, the consumer gives those permits back (``FLOW``, at the end of that
  event-loop turn, with what the turn received after). A consumer whose
  application stops receiving stops getting messages; the others go on.
* ``ack`` is sent one-way (the acks of one event-loop turn in one request);
  acking a message this consumer does not hold unacknowledged (never
  received by it, acked already, nacked) raises ``PubSubError`` with status
  ``MESSAGE_NOT_OUTSTANDING``; any call after ``close`` raises
  ``ConsumerClosedError``. ``ack_cumulative`` acknowledges every message up
  to the given one; on SHARED and KEY_SHARED subscriptions it raises
  ``PubSubError`` NOT_ALLOWED before anything is sent.
* ``nack`` and ``ack_timeout_ms`` are timers here: when one fires, the
  consumer asks the hub to hand the messages out again (``REDELIVER``); the
  hub adds one to their ``redelivery_count``.
* Dead letters: with ``max_redeliver_count`` N > 0, a received message whose
  ``redelivery_count`` exceeds N is published to ``dead_letter_topic``
  (default ``TOPIC-SUB-DLQ``) with its key and properties plus
  ``ORIGIN_TOPIC`` and ``ORIGIN_SEQ_ID``, then acknowledged, and the
  application never sees it. The publish is deduplicated (producer
  ``dlq/TOPIC/SUB``, sequence id = the original seq id), so a message goes to
  the dead-letter topic at most once even when two consumers race or one
  dies between the publish and the ack. If that publish fails (the role may
  not produce there, say) the failure is logged and the message is handed to
  the application like any other: it is not lost.
* A dropped connection or a topic move: the consumer attaches again with
  the same id (messages it had queued but not handed out are redelivered by
  the hub); acks made while detached are not sent (those messages come
  again: at least once).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hub import errors
from hub.message import Message, SubscriptionPreferences
from hub.proto import pubsub_pb2 as pb

if TYPE_CHECKING:
    from hub.channel import HubChannel
    from hub.conf import HubClientConf

log = logging.getLogger("hub.client")

__all__ = ["SUBSCRIPTION_TYPES", "Consumer", "ConsumerHost", "subscription_type_value"]

SUBSCRIPTION_TYPES = ("EXCLUSIVE", "SHARED", "FAILOVER", "KEY_SHARED")


def subscription_type_value(name: str) -> int:
    """The wire value of a subscription type name; ``ValueError`` naming the choices for another name."""
    if name not in SUBSCRIPTION_TYPES:
        raise ValueError(f"subscription_type must be one of {', '.join(SUBSCRIPTION_TYPES)}, not {name!r}")
    return int(pb.SubscriptionType.Value(name))


class ConsumerHost(Protocol):
    """What a consumer needs of its client (``HedwigClient``)."""

    conf: HubClientConf
    closed: bool

    def _call(self, topic: bytes, req: pb.PubSubRequest) -> Awaitable[tuple[HubChannel, pb.PubSubResponse]]: ...

    def publish(self, topic: bytes, body: bytes, properties: dict[str, bytes] | None = None, *,
                message_type: str = "", producer: bytes | None = None, sequence_id: int | None = None,
                key: bytes | None = None) -> Awaitable[int]: ...

    def _forget_consumer(self, consumer: Consumer) -> None: ...


class Consumer:
    """See the module docstring. Made by ``HedwigClient.consumer``; attached once that returns."""

    def __init__(self, client: ConsumerHost, topic: bytes, subscriber: bytes, consumer_id: int,
                 req: pb.SubscribeRequest, *, subscription_type: str, receiver_queue_size: int,
                 ack_timeout_ms: int, negative_ack_redelivery_delay_ms: int, max_redeliver_count: int,
                 dead_letter_topic: bytes | None) -> None:
        self.client = client
        self.topic = topic
        self.subscriber = subscriber
        self.consumer_id = consumer_id
        self.subscription_type = subscription_type
        self._flow_at = 1                            # permits go back once this many were received
        self.receiver_queue_size = receiver_queue_size
        self.ack_timeout_ms = ack_timeout_ms
        self.negative_ack_redelivery_delay_ms = negative_ack_redelivery_delay_ms
        self.max_redeliver_count = max_redeliver_count
        self.dead_letter_topic = dead_letter_topic or topic + b"-" + subscriber + b"-DLQ"
        self.req = req
        self.conn: HubChannel | None = None
        self.prefs = SubscriptionPreferences()       # as the subscribe answered
        self.closed = False
        self.dead_lettered = 0                       # messages this consumer moved to the dead-letter topic
        self._queue: collections.deque[Message] = collections.deque()
        self._arrived = asyncio.Event()
        self._held: dict[int, float] = {}            # seq id -> loop time handed to the application
        self._nacked: dict[int, float] = {}          # seq id -> loop time its redelivery is due
        self._acks: list[int] = []                   # individual acks of this turn, not sent yet
        self._taken = 0                              # received since the last permits went back
        self._timer: asyncio.TimerHandle | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._flow_handle: asyncio.Handle | None = None
        self._reattaching: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()     # made by the client's consumer() (per message: no lookup)

    @property
    def receiver_queue_size(self) -> int:
        return self._receiver_queue_size

    @receiver_queue_size.setter
    def receiver_queue_size(self, size: int) -> None:
        self._receiver_queue_size = size
        self._flow_at = max(1, size // 2)

    # --- attach -----------------------------------------------------------------------------------
    def _request(self, op: int, field: str) -> pb.PubSubRequest:
        req = pb.PubSubRequest(topic=self.topic)
        req.type = op  # type: ignore[assignment]
        body = getattr(req, field)
        body.topic = self.topic
        body.subscriberId = self.subscriber
        body.consumerId = self.consumer_id
        return req

    async def _attach(self) -> pb.PubSubResponse:
        """Subscribe as this consumer (its receiver queue's worth of permits); errors as ``subscribe``'s."""
        req = pb.PubSubRequest(type=pb.SUBSCRIBE, topic=self.topic)
        req.subscribeRequest.CopyFrom(self.req)
        req.subscribeRequest.receiverQueueSize = self.receiver_queue_size
        conn, resp = await self.client._call(self.topic, req)
        self.conn = conn
        self._taken = 0
        if not self.req.preferences.temporary:   # a reader's is made again, from its startSeqId
            self.req.createOrAttach = pb.SubscribeRequest.ATTACH   # a re-attach must not create it again
        return resp

    def _detached(self, conn: HubChannel | None) -> None:
        """The connection ``conn`` went away (None: a TOPIC_MOVED): attach again, in the background."""
        if conn is not None and self.conn is not conn:
            return
        self.conn = None
        self._queue.clear()          # the hub hands these out again
        if self.closed or self.client.closed or not self.client.conf.enable_resubscribe:
            return
        if self._reattaching is None or self._reattaching.done():
            self._reattaching = asyncio.get_running_loop().create_task(self._reattach())

    async def _reattach(self) -> None:
        wait = self.client.conf.subscribe_reconnect_retry_wait_time / 1000.0
        while not self.closed and not self.client.closed and self.conn is None:
            try:
                await self._attach()
                log.info("consumer %d of %r/%r attached again", self.consumer_id, self.topic, self.subscriber)
                return
            except (errors.ClientNotSubscribedError, errors.SubscriptionTypeMismatchError) as exc:
                log.warning("consumer %d of %r/%r cannot attach again (%s): closed", self.consumer_id,
                            self.topic, self.subscriber, exc)
                self._closed_by_hub()
                return
            except errors.PubSubError as exc:
                log.info("consumer %d of %r/%r: attaching again failed: %s", self.consumer_id, self.topic,
                         self.subscriber, exc)
                await asyncio.sleep(wait)

    def _closed_by_hub(self) -> None:
        self.closed = True
        self.conn = None
        self._queue.clear()
        self._arrived.set()
        if self._timer is not None:
            self._timer.cancel()
        self.client._forget_consumer(self)

    # --- from the channel -------------------------------------------------------------------------
    def _delivered(self, conn: HubChannel, messages: Sequence[Message]) -> None:
        # while attaching (conn None) deliveries may arrive in the same read as the subscribe's answer
        if self.closed or (conn is not self.conn and (self.conn is not None or conn.gone)):
            return
        self._queue.extend(messages)     # read-only, shared with other deliveries of them (hub.client_decode)
        self._arrived.set()

    def _event(self, conn: HubChannel, event: int) -> None:
        if conn is not self.conn:
            return
        if event == pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED:
            log.warning("consumer %d of %r/%r was closed by the hub", self.consumer_id, self.topic, self.subscriber)
            self._closed_by_hub()
        elif event == pb.SubscriptionEvent.SUBSCRIPTION_RESET:
            self._queue.clear()
            self._held.clear()
            self._nacked.clear()
        elif event == pb.SubscriptionEvent.TOPIC_MOVED:
            self._detached(None)

    # --- the application's side -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise errors.ConsumerClosedError(f"consumer of {self.subscriber!r} on {self.topic!r} is closed")

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message; ``TimeoutError`` (``asyncio.TimeoutError``) when none comes within ``timeout``
        seconds (None: wait), ``ConsumerClosedError`` once the consumer is closed."""
        self._check_open()
        loop = self._loop
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            while not self._queue:
                self._arrived.clear()
                if deadline is None:
                    await self._arrived.wait()
                else:
                    await asyncio.wait_for(self._arrived.wait(), max(0.0, deadline - loop.time()))
                self._check_open()
            msg = self._queue.popleft()
            self._received_one()
            if self.max_redeliver_count and msg.redelivery_count > self.max_redeliver_count \
                    and await self._dead_letter(msg):
                continue
            return self._hand_out(msg)

    def _hand_out(self, msg: Message) -> Message:
        """``msg`` goes to the application: held (unacknowledged) from now, its ack timeout running."""
        now = self._loop.time()
        self._held[msg.msg_id.local] = now
        if self.ack_timeout_ms:
            self._arm(now + self.ack_timeout_ms / 1000.0)
        return msg

    def _received_one(self) -> None:
        self._taken += 1
        if self._taken >= self._flow_at and self._flow_handle is None:
            self._flow_handle = self._loop.call_soon(self._flow_taken)

    def _flow_taken(self) -> None:
        """The permits of what was received this loop turn go back in one ``FLOW`` (at the end of the turn, as
        the request would be written then anyway: a turn that receives a whole delivery frame sends one, not
        one per half queue)."""
        self._flow_handle = None
        if self._taken and not self.closed:
            self.flow(self._taken)

    def flow(self, permits: int) -> None:
        """Let the hub send ``permits`` more messages (``receive`` does this by itself)."""
        self._taken = 0
        req = self._consume_request(pb.ConsumeRequest.FLOW)
        req.consumeRequest.permits = permits
        self._send(req)

    def _consume_request(self, kind: int) -> pb.PubSubRequest:
        req = pb.PubSubRequest(type=pb.CONSUME, topic=self.topic)
        c = req.consumeRequest
        c.topic = self.topic
        c.subscriberId = self.subscriber
        c.consumerId = self.consumer_id
        c.ackType = kind  # type: ignore[assignment]
        return req

    def _send(self, req: pb.PubSubRequest) -> None:
        conn = self.conn
        if conn is None:
            log.debug("consumer %d of %r/%r is detached: %s not sent", self.consumer_id, self.topic,
                      self.subscriber, pb.ConsumeRequest.AckType.Name(req.consumeRequest.ackType))
            return
        conn.one_way(req)

    def _outstanding(self, msg: Message) -> int:
        self._check_open()
        seq = msg.seq_id
        if seq not in self._held:
            raise errors.PubSubError(f"message {seq} of {self.topic!r} is not outstanding on this consumer "
                                     "(not received by it, or acknowledged or nacked already)",
                                     status="MESSAGE_NOT_OUTSTANDING")
        return seq

    async def ack(self, msg: Message) -> None:
        """Acknowledge ``msg`` (individually; any order). See the module docstring for the errors."""
        seq = msg.msg_id.local
        if self.closed or self._held.pop(seq, None) is None:   # (held: a loop time, never None)
            self._outstanding(msg)     # raises the error that applies (nothing was taken from held)
        self._acks.append(seq)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush_acks)

    def _queue_ack(self, seq: int) -> None:
        self._acks.append(seq)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        self._flush_handle = None
        acks, self._acks = self._acks, []
        if acks:
            req = self._consume_request(pb.ConsumeRequest.INDIVIDUAL)
            req.consumeRequest.seqIds.extend(acks)
            self._send(req)

    async def ack_cumulative(self, msg: Message) -> None:
        """Acknowledge every message up to ``msg``; EXCLUSIVE and FAILOVER only (else NOT_ALLOWED)."""
        self._check_open()
        if self.subscription_type in ("SHARED", "KEY_SHARED"):
            raise errors.PubSubError(f"ack_cumulative is for EXCLUSIVE and FAILOVER subscriptions; "
                                     f"{self.subscriber!r} is {self.subscription_type}", status="NOT_ALLOWED")
        seq = msg.seq_id
        for held in [s for s in self._held if s <= seq]:
            del self._held[held]
        for held in [s for s in self._nacked if s <= seq]:
            del self._nacked[held]
        self._flush_acks()
        req = self._consume_request(pb.ConsumeRequest.CUMULATIVE)
        req.consumeRequest.msgId.localComponent = seq
        self._send(req)

    async def nack(self, msg: Message) -> None:
        """Have ``msg`` redelivered after ``negative_ack_redelivery_delay_ms`` (to any consumer)."""
        seq = self._outstanding(msg)
        del self._held[seq]
        due = asyncio.get_running_loop().time() + self.negative_ack_redelivery_delay_ms / 1000.0
        self._nacked[seq] = due
        self._arm(due)

    def _arm(self, at: float) -> None:
        if self._timer is not None and self._timer.when() <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(at, self._due)

    def _due(self) -> None:
        """Send what is due for redelivery (nacks past their delay, holds past the ack timeout)."""
        self._timer = None
        if self.closed:
            return
        now = asyncio.get_running_loop().time()
        due = [s for s, t in self._nacked.items() if t <= now]
        for seq in due:
            del self._nacked[seq]
        if self.ack_timeout_ms:
            limit = now - self.ack_timeout_ms / 1000.0
            late = [s for s, t in self._held.items() if t <= limit]
            for seq in late:
                del self._held[seq]
            if late:
                log.info("consumer %d of %r/%r: %d messages unacknowledged past ack_timeout_ms; redelivered",
                         self.consumer_id, self.topic, self.subscriber, len(late))
            due += late
        if due:
            req = self._consume_request(pb.ConsumeRequest.REDELIVER)
            req.consumeRequest.seqIds.extend(sorted(due))
            self._send(req)
        nxt = min(self._nacked.values(), default=None)
        if self.ack_timeout_ms and self._held:
            oldest = min(self._held.values()) + self.ack_timeout_ms / 1000.0
            nxt = oldest if nxt is None else min(nxt, oldest)
        if nxt is not None:
            self._arm(max(nxt, now + 0.001))

    async def _dead_letter(self, msg: Message) -> bool:
        """Move ``msg`` to the dead-letter topic and ack it; False (logged) when the publish failed."""
        props = dict(msg.properties)
        props["ORIGIN_TOPIC"] = self.topic
        props["ORIGIN_SEQ_ID"] = str(msg.seq_id).encode()
        try:
            await self.client.publish(self.dead_letter_topic, msg.body, props, message_type=msg.message_type,
                                      key=msg.key, producer=b"dlq/" + self.topic + b"/" + self.subscriber,
                                      sequence_id=msg.seq_id)
        except errors.DuplicatePublishError:
            pass     # stored there before (its seq id fell out of the dedup window since)
        except errors.PubSubError as exc:
            log.warning("consumer of %r/%r: message %d was redelivered %d times but could not go to the "
                        "dead-letter topic %r (%s); handed to the application", self.topic, self.subscriber,
                        msg.seq_id, msg.redelivery_count, self.dead_letter_topic, exc)
            return False
        self.dead_lettered += 1
        self._queue_ack(msg.seq_id)
        return True

    async def close(self) -> None:
        """Detach this consumer (the subscription stays); its unacknowledged messages go to the others."""
        if self.closed:
            return
        self._flush_acks()
        self.closed = True
        self._arrived.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._reattaching is not None:
            self._reattaching.cancel()
        self.client._forget_consumer(self)
        conn, self.conn = self.conn, None
        self._queue.clear()
        if conn is not None and conn.alive:
            req = self._request(pb.CLOSESUBSCRIPTION, "closeSubscriptionRequest")
            with contextlib.suppress(errors.PubSubError):
                await conn.request(req, self.client.conf.server_ack_response_timeout / 1000.0)

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        queue = self._queue
        if queue and not self.closed and not self.max_redeliver_count:
            # receive()'s path for a message already queued, without a second coroutine per message
            msg = queue.popleft()
            self._taken += 1
            if self._taken >= self._flow_at and self._flow_handle is None:
                self._flow_handle = self._loop.call_soon(self._flow_taken)
            now = self._loop.time()      # _hand_out, inline
            self._held[msg.msg_id.local] = now
            if self.ack_timeout_ms:
                self._arm(now + self.ack_timeout_ms / 1000.0)
            return msg
        try:
            return await self.receive()
        except errors.ConsumerClosedError:
            raise StopAsyncIteration from None


async def run_handler(consumer: Consumer, handler: Callable[[bytes, bytes, Message], Awaitable[Any]]) -> None:
    """``start_delivery`` for a consumer: each message to ``handler``; its return acks the message.

    A handler that raises: the message is nacked (redelivered later) and delivery stops, as a Hedwig
    handler's failure stops its subscription's delivery."""
    async for msg in consumer:
        try:
            await handler(consumer.topic, consumer.subscriber, msg)
        except Exception:
            log.exception("handler of %r/%r raised on seq %d; delivery stops", consumer.topic, consumer.subscriber,
                          msg.seq_id)
            with contextlib.suppress(errors.PubSubError):
                await consumer.nack(msg)
            return
        with contextlib.suppress(errors.PubSubError):
            await consumer.ack(msg)
