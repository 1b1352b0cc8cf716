"""The hub wire protocol without I/O: bytes in, events out (in the h11 sense).

Framing is the bookie's (``bookie.wire.FrameDecoder``: a 4-byte
big-endian length, then one protobuf message of ``hub/proto/pubsub.proto``).
Every decision about frame limits, unknown operations and request validity
lives here, so the hub server and the client are thin asyncio shells::

    conn = ServerConnection(max_frame_size=conf.max_frame_size, max_message_size=conf.max_message_size)
    for event in conn.receive_data(data):
        if isinstance(event, RequestReceived):   # a valid request: dispatch event.request
            ...
        elif isinstance(event, Reject):          # answer it (event.response), keep serving
            transport.write(encode(event.response))
        elif isinstance(event, ConnectionBroken):# close the connection (event.reason)
            transport.close()

    client = ClientConnection(max_frame_size=...)
    data = client.send_request(request, value)   # assigns the txn id; value comes back with the response
    for event in client.receive_data(data):      # ResponseReceived(response, value) | PublishedReceived |
        ...                                      # DeliveryReceived | SubscriptionEventReceived | ConnectionBroken

Failure: nothing here raises on bad input; bad bytes become ``Reject``
(answer and continue) or ``ConnectionBroken`` (close) events.

The response builders and the status of a failure are ``hub.responses``' (re-exported here).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import DecodeError

from bookie.errors import FrameTooLargeError
from bookie.wire.framing import LENGTH_PREFIX, PREFIX_SIZE, FrameDecoder
from bookie.wire.txns import TxnTable
from hub.body_publish import BodyPublish, body_publish
from hub.client_decode import decode_delivered, decode_wires
from hub.client_published import ANSWER_LEAD, PublishedReceived, read_published
from hub.delayed import delay_problem, now_ms
from hub.frames import delivery, delivery_batch, publish_batch, publish_request_size, published, split_delivery
from hub.frames_multi import publish_multi
from hub.message import Message
from hub.proto import pubsub_pb2 as pb
from hub.responses import (  # the answers and request readers, re-exported here
    encode,
    expected_failure,
    failure_response,
    published_batch,
    redirect_response,
    request_topic,
    response,
    status_name,
    status_of,
    subscriber_of,
    subscription_event,
)

__all__ = ["BODIES_ALONE_FROM", "DEFAULT_MAX_REQUESTS_PER_TURN", "MAX_SUBSCRIBER_BYTES", "MAX_TOPIC_BYTES", "OPS",
           "ClientConnection", "ClientEvent", "ConnectionBroken", "DeliveryReceived", "PublishedReceived", "Reject",
           "RequestReceived", "ResponseReceived", "ServerConnection", "SubscriptionEventReceived", "delivery",
           "delivery_batch", "encode", "expected_failure", "failure_response", "name_problem", "published",
           "published_batch", "redirect_response", "request_topic", "response", "status_name", "status_of",
           "subscriber_of", "subscription_event"]

OPS = frozenset({pb.PUBLISH, pb.SUBSCRIBE, pb.CONSUME, pb.UNSUBSCRIBE, pb.START_DELIVERY, pb.STOP_DELIVERY,
                 pb.CLOSESUBSCRIPTION, pb.AUTHENTICATE, pb.PING, pb.SEEK, pb.PUBLISH_MULTI})
_PUBLISH = pb.PUBLISH
_unpack_length = LENGTH_PREFIX.unpack_from
_VERSION_ONE = pb.VERSION_ONE
_BODY_FOR_OP = {pb.PUBLISH: "publishRequest", pb.SUBSCRIBE: "subscribeRequest", pb.CONSUME: "consumeRequest",
                pb.UNSUBSCRIBE: "unsubscribeRequest", pb.START_DELIVERY: "startDeliveryRequest",
                pb.STOP_DELIVERY: "stopDeliveryRequest", pb.CLOSESUBSCRIPTION: "closeSubscriptionRequest",
                pb.AUTHENTICATE: "authenticateRequest", pb.PING: "pingRequest", pb.SEEK: "seekRequest",
                pb.PUBLISH_MULTI: "multiPublishRequest"}


MAX_TOPIC_BYTES = 255
MAX_SUBSCRIBER_BYTES = 255
"""Longest topic and subscriber id in UTF-8 bytes. Both are metastore keys: a subscription's key is
topic, NUL, subscriber id, which must fit the smallest backend's key limit (LMDB: 511 bytes), so
every topic that can be published to can also be subscribed to."""


def name_problem(name: bytes, what: str, limit: int) -> str | None:
    """Why ``name`` cannot be a topic or subscriber id (``what`` says which), or None when it can.

    A name must be non-empty UTF-8 of at most ``limit`` bytes without NUL
    (the metastore key separator). The reason names the limit and never
    echoes an over-long name.
    """
    if len(name) > limit:
        return f"{what} of {len(name)} bytes is over the limit of {limit} bytes"
    if type(name) is not bytes:   # a caller's bytearray or memoryview: hashable, as the cache needs
        name = bytes(name)
    if name in _VALID_NAMES:   # every request names its topic: the common case is one dict lookup
        return None
    problem = _short_name_problem(name, what, limit)
    if problem is None:
        if len(_VALID_NAMES) >= _MAX_VALID_NAMES:
            _VALID_NAMES.clear()
        _VALID_NAMES[name] = None
    return problem


_VALID_NAMES: dict[bytes, None] = {}
"""Names ``name_problem`` found valid (non-empty UTF-8 without NUL; the length is checked each time)."""
_MAX_VALID_NAMES = 1 << 12
"""The names remembered (emptied when full): the busy ones, not every topic of a hub that owns thousands."""


@functools.lru_cache(maxsize=1 << 12)
def _short_name_problem(name: bytes, what: str, limit: int) -> str | None:
    if not name:
        return f"{what} must be non-empty UTF-8 of at most {limit} bytes"
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return f"{what} must be UTF-8 (of at most {limit} bytes)"
    if b"\x00" in name:
        return f"{what} must not contain NUL (\\x00)"
    return None


# --- server side ----------------------------------------------------------------------------------

@dataclass(slots=True)
class RequestReceived:
    """A well-formed request; ``topic`` and ``subscriber`` are filled in from wherever they were sent.

    Not frozen: one is made per request, and a frozen dataclass's ``__init__`` cost six times as much.
    """

    request: pb.PubSubRequest
    topic: bytes
    subscriber: bytes
    plain_bytes: int = -1
    """A batched publish whose messages carry no delivery delay: their bodies' total length (the hub then
    stamps and queues them without looking at each again); -1 for any other request."""
    plain: pb.PublishRequest | None = None
    """A single publish (``msg``) whose message carries no delivery delay: its ``publishRequest``, as
    checked (the hub then stamps ``plain.msg`` without looking at the request or its delay fields
    again); None for any other request."""
    bodies: list[bytes] | None = None
    """A batched publish of bodies alone (each message holds only its ``body``: the client's producer
    batching, ``hub.frames.publish_batch``): the bodies, in order (the hub then stamps their serialized
    form, ``hub.frames.stamped_wires``); None for any other request."""


@dataclass(frozen=True, slots=True)
class Reject:
    """A request the hub answers with an error status without dispatching it."""

    response: pb.PubSubResponse


@dataclass(frozen=True, slots=True)
class ConnectionBroken:
    """The byte stream cannot be parsed any further: close the connection."""

    reason: str


ServerEvent = RequestReceived | BodyPublish | Reject | ConnectionBroken


DEFAULT_MAX_REQUESTS_PER_TURN = 256
DEFAULT_MAX_PENDING_REQUESTS = 10000


class ServerConnection:
    """The hub's view of one client connection's incoming bytes.

    Decisions: a frame over ``max_frame_size`` breaks the connection (its body
    is never buffered); a frame that is not a PubSubRequest is answered
    MALFORMED_REQUEST (txn 0); a ``protocolVersion`` other than VERSION_ONE,
    MALFORMED_REQUEST naming the version spoken; an operation this hub does
    not serve, UNKNOWN_OPERATION; a missing body, a topic or subscriber id that
    ``name_problem`` refuses (empty, not UTF-8, NUL, over
    ``MAX_TOPIC_BYTES`` / ``MAX_SUBSCRIBER_BYTES``), MALFORMED_REQUEST naming
    the limit; a message body over
    ``max_message_size``, MESSAGE_TOO_LARGE; a publish whose delay fields
    ``hub.delayed.delay_problem`` refuses (both set, negative: MALFORMED_REQUEST;
    beyond ``max_delivery_delay_ms`` by ``clock_ms``: DELIVERY_DELAY_TOO_LONG),
    that status, the whole request refused. CONSUME is one-way: it gets a
    response only when rejected.

    Fairness: one call of ``receive_data`` or ``next_events`` yields at most
    ``max_requests_per_turn`` events; the rest stays buffered unparsed and
    ``backlogged`` is True: the shell stops reading and calls ``next_events``
    on the next loop turn, so one client's burst of tiny frames cannot hold
    the event loop (and every other client) for long.

    Memory: while ``max_pending_requests`` requests are in flight (read, not
    answered yet: publishes wait for their ledger entry) ``should_read`` is
    False, until half of them are answered (``request_finished`` returns True
    then: read again), as a bookie does. So a client publishing faster than
    the bookies store cannot make the hub queue without bound.

    Half-close: ``request_started`` / ``request_finished`` count requests
    that will be answered; after ``eof_received`` (the client will send
    nothing more) ``close_now`` becomes True once every request read is
    answered, so answers in flight are still written.
    """

    def __init__(self, max_frame_size: int, max_message_size: int,
                 max_requests_per_turn: int = DEFAULT_MAX_REQUESTS_PER_TURN,
                 max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS, max_delivery_delay_ms: int = 0,
                 clock_ms: Callable[[], int] = now_ms, body_publishes: bool = False) -> None:
        if max_requests_per_turn < 1:
            raise ValueError(f"max_requests_per_turn must be positive, not {max_requests_per_turn}")
        if max_pending_requests < 1:
            raise ValueError(f"max_pending_requests must be positive, not {max_pending_requests}")
        self.max_pending_requests = max_pending_requests
        self.held = False         # max_pending_requests in flight: not read until half are answered
        self._decoder = FrameDecoder(max_frame_size)
        self.max_message_size = max_message_size
        self.max_delivery_delay_ms = max_delivery_delay_ms   # 0: no limit (hub.delayed)
        self.clock_ms = clock_ms
        self.body_publishes = body_publishes   # a valid single publish of a body alone is a BodyPublish
        self.max_requests_per_turn = max_requests_per_turn
        self.broken = False
        self.backlogged = False   # stopped at the per-turn budget: call next_events on the next turn
        self.in_flight = 0        # requests dispatched and not answered yet
        self.eof = False          # the client half-closed its side
        self.partial_since: float | None = None   # clock time the incomplete frame now held was started
        self.buffered = 0   # bytes read and not parsed yet (an incomplete frame, frames left for the next turn)

    def receive_data(self, data: bytes) -> list[ServerEvent]:
        """Take ``data``; the events of the first ``max_requests_per_turn`` complete frames."""
        if self.broken:
            return []
        decoder = self._decoder
        if self.buffered or type(data) is not bytes:
            decoder.receive(data)
            return self.next_events()
        # nothing held (the usual case): complete frames split from ``data`` itself, no call per frame (issue 32);
        # the rest (an incomplete or oversized frame, frames past the turn's budget) goes the decoder's way
        out: list[ServerEvent] = []
        pos, end = 0, len(data)
        limit = decoder.max_frame_size
        budget = self.max_requests_per_turn
        unpack = _unpack_length
        check = self._check
        while end - pos >= PREFIX_SIZE and len(out) < budget:
            (size,) = unpack(data, pos)
            stop = pos + PREFIX_SIZE + size
            if size > limit or stop > end:
                break
            out.append(check(data[pos + PREFIX_SIZE:stop]))
            pos = stop
        if pos == end:
            self.backlogged = len(out) >= budget   # as the decoder's way: a full budget yields the turn
            return out
        decoder.receive(data[pos:] if pos else data)
        return self._more_events(out)

    def next_events(self) -> list[ServerEvent]:
        """Up to ``max_requests_per_turn`` events from bytes already received; sets ``backlogged``."""
        return self._more_events([])

    def _more_events(self, out: list[ServerEvent]) -> list[ServerEvent]:
        """``next_events`` after the events ``out`` of this turn already."""
        self.backlogged = not self.broken
        if self.backlogged:
            next_frame = self._decoder.next_frame
            budget = self.max_requests_per_turn
            while len(out) < budget:
                try:
                    frame = next_frame()
                except FrameTooLargeError as exc:
                    self.broken = True
                    out.append(ConnectionBroken(str(exc)))
                    frame = None
                if frame is None:
                    self.backlogged = False
                    break
                out.append(self._check(frame))
        self.buffered = self._decoder.buffered
        return out

    def clear(self) -> None:
        """Drop every byte held (the connection is gone)."""
        self._decoder.clear()
        self.buffered = 0
        self.backlogged = False
        self.partial_since = None

    def track_partial(self, progressed: bool, now: Callable[[], float]) -> None:
        """After serving a read: start, keep or stop the clock of the incomplete frame held.

        ``progressed``: this read completed frames (a frame still incomplete is
        a new one). Nothing incomplete held, or only complete frames left for a
        later turn (our delay, not the client's): no clock. The shell closes a
        connection whose clock runs past ``incomplete_frame_timeout``.
        """
        if not self.buffered or self.backlogged:
            self.partial_since = None
        elif progressed or self.partial_since is None:
            self.partial_since = now()

    def request_started(self) -> None:
        """A request was dispatched; it will be answered (``request_finished``)."""
        self.in_flight += 1
        if self.in_flight >= self.max_pending_requests:
            self.held = True

    def request_finished(self) -> bool:
        """A request was answered; True when that lifted the hold of ``max_pending_requests`` (read again)."""
        self.in_flight -= 1
        if self.held and self.in_flight <= self.max_pending_requests // 2:
            self.held = False
            return True
        return False

    def eof_received(self) -> None:
        """The client half-closed: it sends nothing more, but still reads."""
        self.eof = True

    def should_read(self, writable: bool) -> bool:
        """Read more while the client reads what we write (``writable``) and no requests wait for a later turn."""
        return writable and not self.backlogged and not self.eof and not self.held

    @property
    def close_now(self) -> bool:
        """Half-closed and every request read is answered: the shell may close."""
        return self.eof and self.in_flight <= 0 and not self.backlogged

    def _check(self, frame: bytes) -> ServerEvent:
        limit = self.max_message_size   # a single one's longest is -1, a batched one's body b"": both in one test
        if self.body_publishes and (ev := body_publish(frame)) is not None and ev.topic in _VALID_NAMES \
                and len(ev.body) <= limit and ev.longest <= limit:   # else protobuf's parse and checks
            return ev
        try:
            req = pb.PubSubRequest.FromString(frame)
        except (DecodeError, ValueError, RuntimeError) as exc:
            return Reject(response(0, pb.MALFORMED_REQUEST, f"malformed request frame of {len(frame)} bytes: {exc}"))
        txn = req.txnId
        if req.protocolVersion != _VERSION_ONE:
            return Reject(response(txn, pb.MALFORMED_REQUEST, f"protocolVersion {req.protocolVersion} is not "
                                                              f"supported: this hub speaks VERSION_ONE (1)"))
        op = req.type
        body = req.WhichOneof("body")
        if op == _PUBLISH and body == "publishRequest":
            # the hub's most frequent request: the checks below, in their order, without their lookups and calls
            pub = req.publishRequest
            topic = req.topic or pub.topic   # request_topic's
        else:
            if op not in OPS:
                return Reject(response(txn, pb.UNKNOWN_OPERATION, f"unknown operation {op}"))
            want = _BODY_FOR_OP[op]
            if body != want:
                return Reject(response(txn, pb.MALFORMED_REQUEST, f"operation {pb.OperationType.Name(op)} "
                                                                  f"needs a {want}"))
            if op == pb.AUTHENTICATE or op == pb.PING or op == pb.PUBLISH_MULTI:   # no topic of its own
                return RequestReceived(req, b"", b"")   # (a multi's parts: hub.connection_multi checks them)
            topic = request_topic(req)
        if len(topic) > MAX_TOPIC_BYTES or topic not in _VALID_NAMES:   # else valid: name_problem's cache
            problem = name_problem(topic, "topic", MAX_TOPIC_BYTES)
            if problem is not None:   # an over-long topic is not echoed back
                return Reject(response(txn, pb.MALFORMED_REQUEST, problem,
                                       topic=topic if len(topic) <= MAX_TOPIC_BYTES else b""))
        if op == _PUBLISH:   # ``pub`` is its publishRequest (the fast path above took every well-formed one)
            if pub.msgs:
                bodies = _bodies_alone(pub)
                if bodies is not None and max(map(len, bodies)) <= self.max_message_size:
                    return RequestReceived(req, topic, b"", sum(map(len, bodies)), None, bodies)
                refused, plain_bytes = self._batch_problem(pub)
                if refused is not None:
                    status, text = refused
                    return Reject(response(txn, status, text, topic=topic))
                return RequestReceived(req, topic, b"", plain_bytes)
            msg = pub.msg
            if not (msg.HasField("deliverAtMs") or msg.HasField("deliverAfterMs")) \
                    and len(msg.body) <= self.max_message_size:
                return RequestReceived(req, topic, b"", -1, pub)   # the common case: nothing to refuse
            refused = self.message_problem(msg)
            if refused is not None:
                return Reject(response(txn, refused[0], refused[1], topic=topic))
            return RequestReceived(req, topic, b"")
        sub = subscriber_of(req)
        problem = name_problem(sub, "subscriber id", MAX_SUBSCRIBER_BYTES)
        if problem is not None:
            return Reject(response(txn, pb.MALFORMED_REQUEST, problem, topic=topic))
        if op == pb.CONSUME and not req.consumeRequest.HasField("msgId") and \
                req.consumeRequest.ackType == pb.ConsumeRequest.CUMULATIVE:
            return Reject(response(txn, pb.MALFORMED_REQUEST, "consume needs a msgId", topic=topic))
        return RequestReceived(req, topic, sub)

    def message_problem(self, msg: pb.Message) -> tuple[int, str] | None:
        """Why a single publish's ``msg`` is refused (its size, its delay fields: a PUBLISH's, a multi's part's)."""
        if len(msg.body) > self.max_message_size:
            return pb.MESSAGE_TOO_LARGE, f"message of {len(msg.body)} bytes exceeds max_message_size " \
                                         f"{self.max_message_size}"
        if msg.HasField("deliverAtMs") or msg.HasField("deliverAfterMs"):
            return delay_problem(msg, self.clock_ms, self.max_delivery_delay_ms)
        return None

    def _batch_problem(self, pub: pb.PublishRequest) -> tuple[tuple[int, str] | None, int]:
        """Why a batched publish (``msgs``) is refused, or None: each message is checked as a single one.

        Also the bodies' total length when no message carries a delivery delay, else -1
        (``RequestReceived.plain_bytes``). One pass, one look at each message: the hub's hottest loop.
        """
        if pub.HasField("msg"):
            return (pb.MALFORMED_REQUEST, "a publish carries msg or msgs, not both"), -1
        limit = self.max_message_size
        total = 0
        delayed = False
        for i, m in enumerate(pub.msgs):
            size = len(m.body)
            total += size
            if size > limit:
                return (pb.MESSAGE_TOO_LARGE, f"message {i} of the batch ({size} bytes) exceeds "
                                              f"max_message_size {limit}"), -1
            if m.producer:
                return (pb.MALFORMED_REQUEST, "a batched publish cannot carry a producer: deduplicated "
                                              "publishes go one per request"), -1
            if m.HasField("deliverAtMs") or m.HasField("deliverAfterMs"):
                delayed = True
                refused = delay_problem(m, self.clock_ms, self.max_delivery_delay_ms)
                if refused is not None:
                    return (refused[0], f"message {i} of the batch: {refused[1]}"), -1
        return None, -1 if delayed else total


BODIES_ALONE_FROM = 16
"""``_bodies_alone`` looks at batches of at least this many messages: the check and the stamp as a whole cost
a few microseconds a request, which the per-message path's savings cover from about 16 (measured, issue 32)."""


def _bodies_alone(pub: pb.PublishRequest) -> list[bytes] | None:
    """The bodies of a batched publish whose messages hold nothing but a body, else None
    (``RequestReceived.bodies``).

    Checked as a whole, without a look at each message's other fields: the
    publish request's serialized size is what its topic and these bodies
    alone take (``publish_request_size``). A message's size is at least its
    body's field, so any other field of any message (a header, a key, a
    delay, a region, unknown fields) or of the publish request makes it
    larger; such a batch takes ``_batch_problem``'s look at each message.
    """
    msgs = pub.msgs
    if len(msgs) < BODIES_ALONE_FROM:
        return None
    bodies = [m.body for m in msgs]
    if pub.ByteSize() != publish_request_size(pub.topic, bodies):
        return None
    return bodies


# --- client side ----------------------------------------------------------------------------------

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ResponseReceived(Generic[T]):
    response: pb.PubSubResponse
    value: T


@dataclass(frozen=True, slots=True)
class DeliveryReceived:
    """One delivery frame: its messages in seq order (one, or a run: ``Delivery.messages``).

    ``decoded`` are ``hub.message.Message``\\ s, read-only and shared with every other delivery of the
    same message in this process (``hub.client_decode``); ``messages`` gives them as protobuf messages.
    """

    topic: bytes
    subscriber: bytes
    decoded: Sequence[Message]
    consumer: int = 0    # the consumer it is for (0: the Hedwig subscriber)

    @property
    def messages(self) -> list[pb.Message]:
        """``decoded`` as ``pubsub_pb2.Message``\\ s (made on each call)."""
        return [m.to_proto() for m in self.decoded]

    @property
    def message(self) -> pb.Message:
        """The first (for a plain delivery: the only) message."""
        return self.decoded[0].to_proto()


@dataclass(frozen=True, slots=True)
class SubscriptionEventReceived:
    topic: bytes
    subscriber: bytes
    event: int          # pb.SubscriptionEvent.Event
    consumer: int = 0


ClientEvent = (ResponseReceived[T] | PublishedReceived[T] | DeliveryReceived | SubscriptionEventReceived
               | ConnectionBroken)
"""What ``ClientConnection.receive_data`` reads (``PublishedReceived``: a publish's SUCCESS, read by hand)."""


class ClientConnection(Generic[T]):
    """The client's view of one hub connection: txn ids out, responses matched back in.

    ``send_request`` assigns the next txn id (1, 2, ...) and remembers
    ``value`` until the response arrives (CONSUME is one-way and remembered
    only if ``value`` is not None). Responses to txn ids not outstanding,
    and undecodable frames, break the connection.
    """

    def __init__(self, max_frame_size: int) -> None:
        self._decoder = FrameDecoder(max_frame_size)
        self._pending: TxnTable[T] = TxnTable()
        self.broken = False

    def send_request(self, request: pb.PubSubRequest, value: T | None) -> bytes:
        pending = self._pending
        request.txnId = pending.take(value) if value is not None else pending.next_txn_id()
        request.protocolVersion = pb.VERSION_ONE
        return encode(request)

    def send_publish_batch(self, topic: bytes, bodies: Sequence[bytes], value: T) -> tuple[int, bytes]:
        """``send_request`` of a PUBLISH of ``bodies`` (``PublishRequest.msgs`` of a body each), framed by hand
        (``hub.frames.publish_batch``): its txn id and its bytes."""
        txn_id = self._pending.take(value)
        return txn_id, publish_batch(txn_id, topic, bodies)

    def send_publish_multi(self, parts: Sequence[tuple[bytes, Sequence[bytes]]], value: T) -> tuple[int, bytes]:
        """``send_publish_batch`` of many topics' bodies in one PUBLISH_MULTI (``hub.frames_multi``)."""
        txn_id = self._pending.take(value)
        return txn_id, publish_multi(txn_id, parts)

    def forget(self, txn_id: int) -> T | None:
        """Drop an outstanding request (timed out)."""
        return self._pending.forget(txn_id)

    def pending(self) -> list[T]:
        """Every outstanding request's value (still outstanding)."""
        return self._pending.values()

    def drain(self) -> list[T]:
        """Every outstanding request's value (the connection is gone)."""
        return self._pending.drain_values()

    def __len__(self) -> int:
        return len(self._pending)

    def __iter__(self) -> Iterator[int]:
        return iter(self._pending)

    def receive_data(self, data: bytes) -> list[ClientEvent[T]]:
        if self.broken:
            return []
        out: list[ClientEvent[T]] = []
        try:
            frames = self._decoder.feed(data)
            tail: ConnectionBroken | None = None
        except FrameTooLargeError as exc:
            frames, tail = exc.frames, ConnectionBroken(str(exc))
        parse = pb.PubSubResponse.FromString
        pending = self._pending
        for frame in frames:
            if frame.startswith(ANSWER_LEAD) and (got := read_published(frame)) is not None:
                value = pending.forget(got[0])   # the most frequent answer, read by hand (hub.client_published)
                if value is not None:
                    out.append(PublishedReceived(value, got[1], frame))
                continue
            split = split_delivery(frame)   # a delivery's messages as bytes, each decoded once per process
            try:
                if split is not None:   # a consumer's share is decoded apart (hub.client_decode)
                    out.append(DeliveryReceived(split[0], split[1], decode_wires(split[2], not split[3]), split[3]))
                    continue
                resp = parse(frame)
                which = None if resp.txnId else resp.WhichOneof("body")   # txn 0: a delivery or an event
                if which == "delivery":
                    d = resp.delivery
                    out.append(DeliveryReceived(d.topic, d.subscriberId,
                                                decode_delivered(d.messages or (d.message,), not d.consumerId),
                                                d.consumerId))
                    continue
            except (DecodeError, ValueError, RuntimeError) as exc:
                tail = ConnectionBroken(f"malformed response frame: {exc}")
                break
            if which == "subscriptionEvent":
                e = resp.subscriptionEvent
                out.append(SubscriptionEventReceived(e.topic, e.subscriberId, e.event, e.consumerId))
            else:
                value = pending.forget(resp.txnId)
                if value is None:
                    if resp.txnId == 0:
                        tail = ConnectionBroken(f"hub rejected a frame: {status_name(resp.statusCode)} "
                                                f"{resp.statusMsg}")
                        break
                    continue  # a response to a request we gave up on (timed out)
                out.append(ResponseReceived(resp, value))
        if tail is not None:
            self.broken = True
            out.append(tail)
        return out
