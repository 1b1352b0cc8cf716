"""Hot-path frames of the hub assembled from wire bytes, not built by protobuf: deliveries and publish answers.

    frame = delivery(topic, subscriber, message.wire)        # one message to one subscription
    frame = delivery_batch(topic, subscriber, wires, consumer_id)
    frame = published(txn_id, topic, seq_id)                 # the answer to one publish

Each is byte for byte what protobuf itself serializes for the same response
(tests hold them to that), with the length prefix of ``bookie.wire``; the
hub writes one per message or publish, so the fixed heads are built once
(``_delivery_head`` is cached per subscription). ``hub.protocol`` re-exports
them with the frames protobuf builds.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from bookie.wire.framing import LENGTH_PREFIX
from bookie.wire.framing import varint as _varint
from hub.proto import pubsub_pb2 as pb

__all__ = ["delivery", "delivery_batch", "message_batch", "published"]


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
    size = len(inner)
    leads = _MESSAGES_LEADS
    for w in wires:
        n = len(w)
        lead = leads.get(n)
        if lead is None:
            lead = _MESSAGES_TAG + _varint(n)
            if n < 1 << 14:
                leads[n] = lead
        parts.append(lead)
        parts.append(w)
        size += len(lead) + n
    if consumer_id:
        tail = _CONSUMER_ID_TAG + _varint(consumer_id)
        parts.append(tail)
        size += len(tail)
    lead = parts[2] = _DELIVERY_TAG + _varint(size)
    parts[0] = LENGTH_PREFIX.pack(len(head) + len(lead) + size)
    return b"".join(parts)


_MESSAGES_LEADS: dict[int, bytes] = {}
"""``Delivery.messages``' tag and length varint by message length (under 16 KiB), made once each."""


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
        n = len(seq)
        tail = _published_tail(topic) + _SMALL_VARINTS[n + 3] + b"\x0a" + _SMALL_VARINTS[n + 1] + b"\x08" + seq
    else:
        tail = _published_tail(topic) + b"\x02\x0a\x00"
    if txn_id:
        body = _VERSION_TXN + _varint(txn_id) + tail                # txnId (varint 3)
    else:
        body = _VERSION_ONE_FIELD + tail
    return LENGTH_PREFIX.pack(len(body)) + body


_VERSION_TXN = _VERSION_ONE_FIELD + b"\x18"


@functools.lru_cache(maxsize=1 << 12)
def _published_tail(topic: bytes) -> bytes:
    """``published``'s fields after the txn id up to the publish response's length: the topic (bytes 5), then
    the ``publishResponse`` tag."""
    return (_field(b"\x2a", topic) if topic else b"") + _PUBLISH_RESPONSE_TAG


def message_batch(first: int, messages: Iterable[pb.Message]) -> bytes:
    """A ledger entry: the serialized ``MessageBatch(first_local_seq_id=first, messages=messages)``.

    Put together from each message's own serialization (the hub's publish
    path, one per entry): byte for byte what protobuf serializes (tested),
    without building and copying into a ``MessageBatch``, which cost about
    twice as much.
    """
    parts = [b"\x08" + _varint(first)] if first else []   # first_local_seq_id (varint 1)
    for message in messages:
        wire = message.SerializeToString()
        parts.append(_BATCH_MESSAGES_TAG + _varint(len(wire)))   # messages (2), length-delimited
        parts.append(wire)
    return b"".join(parts)


_BATCH_MESSAGES_TAG = _varint(2 << 3 | 2)
