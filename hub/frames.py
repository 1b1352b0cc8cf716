"""Hot-path frames of the hub assembled from wire bytes, not built by protobuf: deliveries, publishes and answers.

    frame = delivery(topic, subscriber, message.wire)        # one message to one subscription
    frame = delivery_batch(topic, subscriber, wires, consumer_id)
    frame = delivery_run(topic, subscriber, messages)       # delivery_batch of their wires, the run built once
    frame = published(txn_id, topic, seq_id)                 # the answer to one publish
    frame = publish_batch(txn_id, topic, bodies)             # the client's batched publish of bodies alone
    split = split_delivery(body)     # the client's: (topic, subscriber, wires, consumer_id) or None

Each is byte for byte what protobuf itself serializes for the same response
(tests hold them to that), with the length prefix of ``bookie.wire``; the
hub writes one per message or publish (the client one per batch of publishes), so the fixed heads are built once
(``_delivery_head`` is cached per subscription). ``hub.protocol`` re-exports
them with the frames protobuf builds.

``split_delivery`` is the client's counterpart: it cuts a delivery frame into
its messages' wire bytes without building protobuf objects, so the client can
decode each distinct message once however many subscriptions receive it
(``hub.client_decode``).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from bookie.wire.framing import LENGTH_PREFIX
from bookie.wire.framing import varint as _varint
from hub.proto import pubsub_pb2 as pb

if TYPE_CHECKING:
    from hub.message import Message

__all__ = ["batch_entry", "delivery", "delivery_batch", "delivery_run", "long_varint", "message_batch",
           "publish_batch", "publish_request_size", "published", "split_delivery", "stamped_wire", "stamped_wires"]


def delivery(topic: bytes, subscriber: bytes, message: pb.Message | bytes) -> bytes:
    """The encoded delivery frame of one message to one subscription.

    ``message`` is a ``pubsub_pb2.Message`` or its serialized bytes (the hub
    passes ``hub.message.Message.wire``, serialized once per message however
    many subscribers get it). The frame is put together from the wire
    encoding of its fields, in field order, so it is byte for byte what
    protobuf itself serializes (a test holds it to that).
    """
    wire = message if isinstance(message, bytes) else message.SerializeToString()
    head, inner = _delivery_head(topic, subscriber)
    body = head + _field(_DELIVERY_TAG, inner + _field(_MESSAGE_TAG, wire))
    return LENGTH_PREFIX.pack(len(body)) + body


def delivery_batch(topic: bytes, subscriber: bytes, wires: list[bytes], consumer_id: int = 0) -> bytes:
    """One delivery frame carrying ``wires`` (serialized ``pubsub_pb2.Message``s, in seq order) in
    ``Delivery.messages``; assembled like ``delivery``, byte for byte what protobuf serializes (tested).
    ``consumer_id``: the consumer it is for (``Delivery.consumerId``, after the messages as field 5)."""
    head, inner = _delivery_head(topic, subscriber)
    # one join: each wire is copied once (into the frame), not once per nesting level
    parts = [b"", head, b"", inner]   # the length prefix and the delivery field's lead come last
    size = len(inner) + _add_messages(parts, wires)
    if consumer_id:
        tail = _CONSUMER_ID_TAG + _varint(consumer_id)
        parts.append(tail)
        size += len(tail)
    lead = parts[2] = _DELIVERY_TAG + _varint(size)
    parts[0] = LENGTH_PREFIX.pack(len(head) + len(lead) + size)
    return b"".join(parts)


def delivery_run(topic: bytes, subscriber: bytes, messages: Sequence[Message]) -> bytes:
    """``delivery_batch(topic, subscriber, [m.wire for m in messages])``, byte for byte (tested), with the
    run's ``Delivery.messages`` fields put together once for every subscription that gets the same run.

    A topic's subscribers at its tail get the same runs of cached messages (each persisted entry's), so
    per subscriber only the few head bytes are new. The last ``_RUNS_KEPT`` runs are kept by the identity of
    their ``Message`` objects, which they hold (so no other object can take those identities meanwhile).
    """
    key = tuple(map(id, messages))
    got = _runs.get(key)
    if got is None:
        parts: list[bytes] = []
        _add_messages(parts, [m.wire for m in messages])
        got = _runs[key] = (tuple(messages), b"".join(parts))
        _runs_order.append(key)
        global _runs_bytes
        _runs_bytes += len(got[1])
        while len(_runs_order) > _RUNS_KEPT or (_runs_bytes > _RUNS_KEPT_BYTES and len(_runs_order) > 1):
            gone = _runs.pop(_runs_order.popleft(), None)
            if gone is not None:
                _runs_bytes -= len(gone[1])
    body = got[1]
    head, inner = _delivery_head(topic, subscriber)
    size = len(inner) + len(body)
    lead = _DELIVERY_TAG + _varint(size)
    return b"".join((LENGTH_PREFIX.pack(len(head) + len(lead) + size), head, lead, inner, body))


_RUNS_KEPT = 32
_RUNS_KEPT_BYTES = 64 * 1024
"""Also at most this many bytes of runs (the newest run always stays): the subscribers at a topic's tail take
a run together, so a small window serves them, and a lagging hub's larger runs add no memory that follows
its load (they also hold their ``Message`` objects)."""
_runs_bytes = 0
_runs: dict[tuple[int, ...], tuple[tuple[Message, ...], bytes]] = {}
_runs_order: collections.deque[tuple[int, ...]] = collections.deque()


def _add_messages(parts: list[bytes], wires: Iterable[bytes]) -> int:
    """Append each wire's ``Delivery.messages`` lead (tag, length) and the wire to ``parts``; their bytes."""
    return _add_fields(parts, wires, _MESSAGES_LEADS, _MESSAGES_TAG)


def _add_fields(parts: list[bytes], wires: Iterable[bytes], leads: dict[int, bytes], tag: bytes) -> int:
    """Append each wire as a length-delimited field ``tag`` to ``parts`` (its lead from ``leads``, kept there by
    length under 16 KiB, made once each); their bytes."""
    size = 0
    for w in wires:
        n = len(w)
        lead = leads.get(n)
        if lead is None:
            lead = _lead(tag, n)
            if n < 1 << 14:
                leads[n] = lead
        parts.append(lead)
        parts.append(w)
        size += len(lead) + n
    return size


def _lead(tag: bytes, n: int) -> bytes:
    """A length-delimited field's lead: ``tag`` and the length ``n``; for ``_BODY_MESSAGE`` the lead of a
    ``PublishRequest.msgs`` message holding only a body of ``n`` bytes (its tag and length, then the body's)."""
    if tag is _BODY_MESSAGE:
        inner = _BODY_TAG + _varint(n) if n else b""   # an empty body is no field at all
        return _PUBLISH_MSGS_TAG + _varint(len(inner) + n) + inner
    return tag + _varint(n)


_MESSAGES_LEADS: dict[int, bytes] = {}
"""``Delivery.messages``' tag and length varint by message length (under 16 KiB), made once each."""
_BATCH_LEADS: dict[int, bytes] = {}
"""``MessageBatch.messages``' leads, as ``_MESSAGES_LEADS``."""
_BODY_LEADS: dict[int, bytes] = {}
"""``PublishRequest.msgs`` leads of messages holding only a body, by the body's length (``publish_batch``)."""


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field (bytes, string or sub-message) on the wire: tag, length, data."""
    return tag + _varint(len(data)) + data




_SMALL_VARINTS = [bytes([i]) for i in range(0x80)]
_DELIVERY_TAG = _varint(12 << 3 | 2)   # PubSubResponse.delivery, length-delimited
_PUBLISH_RESPONSE_TAG = _varint(10 << 3 | 2)   # PubSubResponse.publishResponse
_VERSION_ONE_FIELD = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE).SerializeToString()
_MESSAGE_TAG = _varint(3 << 3 | 2)     # Delivery.message
_MESSAGES_TAG = _varint(4 << 3 | 2)    # Delivery.messages
_CONSUMER_ID_TAG = _varint(5 << 3)     # Delivery.consumerId, a varint


@functools.lru_cache(maxsize=1 << 16)
def _delivery_head(topic: bytes, subscriber: bytes) -> tuple[bytes, bytes]:
    """The response fields before ``delivery`` and the ``Delivery`` fields before ``message``."""
    head = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE, statusCode=pb.SUCCESS, txnId=0,
                             topic=topic).SerializeToString()
    inner = pb.Delivery(topic=topic, subscriberId=subscriber).SerializeToString()
    return head, inner


def published(txn_id: int, topic: bytes, seq_id: int) -> bytes:
    """The encoded SUCCESS response to a publish, ``publishedMsgId.localComponent = seq_id``.

    Assembled from wire bytes as ``delivery`` is (one per publish, the hub's
    most frequent response); byte for byte what ``encode`` of
    ``response(txn_id, topic=topic)`` with the msg id set gives (tested).
    """
    if seq_id:   # publishResponse { publishedMsgId { localComponent (varint 1) } }: lengths under 0x80
        seq = _varint(seq_id)
        tail = _published_tail(topic) + _PUBLISHED_LEADS[len(seq)] + seq
    else:
        tail = _published_tail(topic) + b"\x02\x0a\x00"
    if txn_id:   # the length prefix first: the frame is made in one copy, not two
        txn = _varint(txn_id)                                       # txnId (varint 3)
        return _pack_length(len(_VERSION_TXN) + len(txn) + len(tail)) + _VERSION_TXN + txn + tail
    return _pack_length(len(_VERSION_ONE_FIELD) + len(tail)) + _VERSION_ONE_FIELD + tail


_VERSION_TXN = _VERSION_ONE_FIELD + b"\x18"
_PUBLISHED_LEADS = [bytes((n + 3, 0x0A, n + 1, 0x08)) for n in range(11)]
"""``published``: by the seq id varint's length, the publish response's length, the ``publishedMsgId`` tag, its
length and the ``localComponent`` tag."""
_pack_length = LENGTH_PREFIX.pack


def published_batch_ok(txn_id: int, topic: bytes, first: int, stored: int) -> bytes:
    """The encoded SUCCESS answer to a batched publish (``hub.responses.published_batch``'s, byte for byte,
    tested): ``publishResponse { publishedMsgId { localComponent = first } (if first), stored }``, put
    together as ``published`` is; ``stored`` in 0 .. 2**32-1."""
    inner = b"\x10" + _varint(stored) if stored else b""   # stored (varint 2)
    if first:
        seq = _varint(first)
        inner = b"\x0a" + _SMALL_VARINTS[len(seq) + 1] + b"\x08" + seq + inner
    body = (_VERSION_TXN + _varint(txn_id) if txn_id else _VERSION_ONE_FIELD) + _published_tail(topic) \
        + _SMALL_VARINTS[len(inner)] + inner   # the publish response's length: under 0x80
    return LENGTH_PREFIX.pack(len(body)) + body


@functools.lru_cache(maxsize=1 << 12)
def _published_tail(topic: bytes) -> bytes:
    """``published``'s fields after the txn id up to the publish response's length: the topic (bytes 5), then
    the ``publishResponse`` tag."""
    return (_field(b"\x2a", topic) if topic else b"") + _PUBLISH_RESPONSE_TAG


def message_batch(first: int, messages: Iterable[pb.Message], wires: list[bytes] | None = None) -> bytes:
    """A ledger entry: the serialized ``MessageBatch(first_local_seq_id=first, messages=messages)``.

    Put together from each message's own serialization (the hub's publish
    path, one per entry): byte for byte what protobuf serializes (tested),
    without building and copying into a ``MessageBatch``, which cost about
    twice as much. ``wires``: a list that also gets each message's
    serialization, in order (the owner builds its deliveries from them,
    ``hub.message.Message.persisted``).
    """
    serialized = [message.SerializeToString() for message in messages]
    if wires is not None:
        wires += serialized
    return batch_entry(first, serialized)


def batch_entry(first: int, serialized: Sequence[bytes]) -> bytes:
    """``message_batch`` of messages already serialized (``serialized``, in order)."""
    if len(serialized) == 1:   # the usual entry at a low rate: its lead made once (as _add_fields'), no call
        wire = serialized[0]
        lead = _BATCH_LEADS.get(len(wire))
        if lead is not None:
            return (b"\x08" + _varint(first) if first else b"") + lead + wire
    parts = [b"\x08" + _varint(first)] if first else []   # first_local_seq_id (varint 1)
    _add_fields(parts, serialized, _BATCH_LEADS, _BATCH_MESSAGES_TAG)   # messages (2), length-delimited
    return b"".join(parts)


def stamped_wires(bodies: Iterable[bytes], region: bytes, time_ms: int) -> list[bytes]:
    """Each of ``bodies`` as the serialized ``Message(body=body, srcRegion=region, publishTimeMs=time_ms)``.

    The owner's stamp of a batched publish of bodies alone (issue 32): byte
    for byte what protobuf serializes (tested; ``body`` (1), ``srcRegion`` (2)
    and ``publishTimeMs`` (8) go in field order), the stamp's bytes made once
    for the request, without a protobuf message per body.
    """
    suffix = _stamp_fields(region, time_ms)
    leads = _BODY_FIELD_LEADS
    out: list[bytes] = []
    append = out.append
    for body in bodies:
        n = len(body)
        lead = leads.get(n)
        if lead is None:
            lead = _BODY_TAG + _varint(n) if n else b""   # an empty body is no field at all
            if n < 1 << 14:
                leads[n] = lead
        append(lead + body + suffix)
    return out


def stamped_wire(body: bytes, region: bytes, time_ms: int) -> bytes:
    """``stamped_wires`` of one body (the owner's stamp of a single publish of a body alone, issue 32)."""
    n = len(body)
    lead = _BODY_FIELD_LEADS.get(n)
    if lead is None:
        lead = _BODY_TAG + _varint(n) if n else b""
        if n < 1 << 14:   # kept, as stamped_wires keeps it: made once per length
            _BODY_FIELD_LEADS[n] = lead
    return lead + body + _stamp_fields(region, time_ms)


@functools.lru_cache(maxsize=8)
def _stamp_fields(region: bytes, time_ms: int) -> bytes:
    """``stamped_wires``' bytes after the body: ``srcRegion`` (2), ``publishTimeMs`` (8), as protobuf omits
    them when empty (made once per millisecond)."""
    return (_field(b"\x12", region) if region else b"") + (b"\x40" + _varint(time_ms) if time_ms else b"")


_BODY_FIELD_LEADS: dict[int, bytes] = {}
"""``stamped_wires``: by length, the lead (tag and length) of a ``Message.body`` field."""


_BATCH_MESSAGES_TAG = _varint(2 << 3 | 2)


def publish_batch(txn_id: int, topic: bytes, bodies: Sequence[bytes]) -> bytes:
    """The encoded PUBLISH request of ``bodies`` as ``PublishRequest.msgs``, each message holding only its body;
    of one body, a plain publish (``PublishRequest.msg``).

    The client's producer batching (``hub.client_publish``): byte for byte
    what ``encode`` gives for the protobuf request the client would build
    (``protocolVersion``, ``type``, ``txnId``, ``topic``, and the publish
    request's ``topic`` and ``msgs`` or ``msg``; tested), without a protobuf
    message per body.
    """
    if len(bodies) == 1:   # a plain publish: the bytes after the txn id kept by topic and length (issue 32)
        body = bodies[0]
        tail = _ONE_TAILS.get((topic, len(body)))
        if tail is None:
            tail = _one_tail(topic, len(body))
        txn = _varint(txn_id)
        return b"".join((_pack_length(_PUBLISH_HEAD_LEN + len(txn) + len(tail) + len(body)), _PUBLISH_HEAD, txn,
                         tail, body))
    parts = [b""]
    size = _add_fields(parts, bodies, _BODY_LEADS, _BODY_MESSAGE)
    if topic:
        topic_lead = _varint(len(topic))
        topic_size = 1 + len(topic_lead) + len(topic)
        head = b"".join((_PUBLISH_HEAD, _varint(txn_id), b"\x2a", topic_lead, topic,   # txnId (3), topic (5)
                         _PUBLISH_REQUEST_TAG, _varint(topic_size + size),             # publishRequest (10)
                         b"\x0a", topic_lead, topic))                                  # its topic (1)
    else:
        head = _PUBLISH_HEAD + _varint(txn_id) + _PUBLISH_REQUEST_TAG + _varint(size)
    parts[0] = LENGTH_PREFIX.pack(len(head) + size) + head
    return b"".join(parts)


def _one_tail(topic: bytes, n: int) -> bytes:
    """``publish_batch``'s bytes of one body of ``n`` bytes between the txn id and the body: the topic (5), the
    ``publishRequest`` (10) lead, its topic (1) and its ``msg`` (2) lead with the body's lead (kept in
    ``_ONE_TAILS``, up to ``_ONE_TAILS_KEPT`` of them)."""
    inner = _BODY_TAG + _varint(n) if n else b""   # an empty body is no field at all
    lead = _PUBLISH_MSG_TAG + _varint(len(inner) + n) + inner
    size = len(lead) + n
    if topic:
        topic_field = _varint(len(topic)) + topic
        tail = b"".join((b"\x2a", topic_field, _PUBLISH_REQUEST_TAG, _varint(1 + len(topic_field) + size),
                         b"\x0a", topic_field, lead))
    else:
        tail = _PUBLISH_REQUEST_TAG + _varint(size) + lead
    if len(_ONE_TAILS) >= _ONE_TAILS_KEPT:
        _ONE_TAILS.clear()
    _ONE_TAILS[topic, n] = tail
    return tail


_ONE_TAILS: dict[tuple[bytes, int], bytes] = {}
_ONE_TAILS_KEPT = 4096


def publish_request_size(topic: bytes, bodies: Sequence[bytes]) -> int:
    """The serialized size of ``PublishRequest(topic=topic, msgs=[Message(body=b) for b in bodies])``
    (``ByteSize``), from the bodies' lengths: the hub's check that a batch holds bodies alone."""
    sizes = list(map(len, bodies))
    leads = _BODY_LEADS
    try:
        lead_bytes = sum(map(len, map(leads.__getitem__, sizes)))   # the usual case: each length seen before
    except KeyError:
        lead_bytes = 0
        for n in sizes:
            lead = leads.get(n)
            if lead is None:
                lead = _lead(_BODY_MESSAGE, n)
                if n < 1 << 14:
                    leads[n] = lead
            lead_bytes += len(lead)
    return (len(_field(b"\x0a", topic)) if topic else 0) + sum(sizes) + lead_bytes


_PUBLISH_HEAD = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH).SerializeToString() + b"\x18"
_PUBLISH_HEAD_LEN = len(_PUBLISH_HEAD)
_PUBLISH_REQUEST_TAG = _varint(10 << 3 | 2)   # PubSubRequest.publishRequest
_PUBLISH_MSG_TAG = _varint(2 << 3 | 2)        # PublishRequest.msg
_PUBLISH_MSGS_TAG = _varint(3 << 3 | 2)       # PublishRequest.msgs
_BODY_TAG = _varint(1 << 3 | 2)               # Message.body
_BODY_MESSAGE = b"body message"
"""``_add_fields``' tag for ``PublishRequest.msgs`` messages of a body alone (``_lead``)."""


def split_delivery(body: bytes) -> tuple[bytes, bytes, list[bytes], int] | None:
    """A delivery frame's body (no length prefix) as ``(topic, subscriber, wires, consumer_id)``, else None.

    ``wires`` are the serialized ``pubsub_pb2.Message``\\ s as protobuf would hand them out:
    ``Delivery.messages`` if any, else the one ``Delivery.message`` (``b""`` when absent). The
    messages themselves are not parsed: the caller parses each (``hub.client_decode``). None for
    anything else or anything unusual (a txn id, another body, an error text, an unknown or repeated
    field, a bad length): protobuf then parses the frame and judges it, so the result is always what
    protobuf itself would give.
    """
    try:
        return _split_delivery(body)
    except IndexError:    # a varint or length past the end
        return None


def _split_delivery(body: bytes) -> tuple[bytes, bytes, list[bytes], int] | None:
    n = len(body)
    i = 0
    start = end = -1
    while i < n:                          # PubSubResponse
        tag = body[i]
        i += 1
        if tag == 0x62:                   # delivery (12), length-delimited
            if start >= 0:
                return None               # twice: protobuf would merge them
            size = body[i]
            i += 1
            if size >= 0x80:
                size, i = long_varint(body, i, size)
            start, end = i, i + size
            i = end
        elif tag == 0x08 or tag == 0x10:  # protocolVersion, statusCode: nothing a delivery uses
            i += 1
            if body[i - 1] >= 0x80:
                _, i = long_varint(body, i, body[i - 1])
        elif tag == 0x18:                 # txnId: a delivery has none
            if body[i]:
                return None
            i += 1
        elif tag == 0x2A:                 # topic (the delivery carries its own)
            size = body[i]
            i += 1
            if size >= 0x80:
                size, i = long_varint(body, i, size)
            i += size
        else:
            return None
    if start < 0 or end > n or i != n:
        return None
    topic = subscriber = b""
    wires: list[bytes] = []
    single = b""
    singles = consumer = 0
    i = start
    while i < end:                        # Delivery
        tag = body[i]
        i += 1
        if tag == 0x28:                   # consumerId
            consumer = body[i]
            i += 1
            if consumer >= 0x80:
                consumer, i = long_varint(body, i, consumer)
                if consumer >> 64:
                    return None
            continue
        size = body[i]
        i += 1
        if size >= 0x80:
            size, i = long_varint(body, i, size)
        j = i + size
        if j > end:
            return None
        if tag == 0x22:                   # messages
            wires.append(body[i:j])
        elif tag == 0x0A:
            topic = body[i:j]
        elif tag == 0x12:
            subscriber = body[i:j]
        elif tag == 0x1A and not singles:  # message (a second one would be merged into the first)
            single = body[i:j]
            singles = 1
        else:
            return None
        i = j
    if wires and singles:
        return None
    return topic, subscriber, wires or [single], consumer


def long_varint(body: bytes, i: int, first: int) -> tuple[int, int]:
    """The varint whose first byte ``first`` (>= 0x80) was read, ending at or after ``i``; and the index after it."""
    value = first & 0x7F
    shift = 7
    while True:
        b = body[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise IndexError("varint longer than 10 bytes")
