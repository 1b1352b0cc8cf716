"""Frames of PUBLISH_MULTI (issue 34): the publishes of many topics in one request, answered in one frame.

    frame = publish_multi(txn_id, [(topic, bodies), ...])   # the client's request: a part per topic
    data = part_published(first, stored, batched)           # one part's SUCCESS answer (a nested response)
    frame = multi_published(txn_id, answers)                # the hub's answer: the parts' answers, in order

Put together from wire bytes as ``hub.frames`` does for a single topic, byte
for byte what protobuf serializes for the same messages (tested), with the
length prefix of ``bookie.wire``. A part of one body is a plain publish
(``PublishRequest.msg``), of several a batched one (``msgs``), each message
holding only its body: the client's producer batching of one event-loop
turn, across the topics one hub owns (``hub.client_publish``).
"""

from __future__ import annotations

from collections.abc import Sequence

from bookie.wire.framing import LENGTH_PREFIX
from bookie.wire.framing import varint as _varint
from hub.proto import pubsub_pb2 as pb

__all__ = ["multi_published", "part_published", "publish_multi"]

_HEAD = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH_MULTI).SerializeToString() + b"\x18"
_MULTI_REQUEST_TAG = _varint(20 << 3 | 2)      # PubSubRequest.multiPublishRequest
_PART_TAG = b"\x0a"                           # MultiPublishRequest.publishes (1), MultiPublishResponse.answers (1)
_TOPIC_TAG = b"\x0a"                          # PublishRequest.topic (1)
_MSG_TAG = b"\x12"                            # PublishRequest.msg (2)
_MSGS_TAG = b"\x1a"                           # PublishRequest.msgs (3)
_BODY_TAG = b"\x0a"                           # Message.body (1)
_VERSION_TXN = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE).SerializeToString() + b"\x18"
_MULTI_RESPONSE_TAG = _varint(15 << 3 | 2)     # PubSubResponse.multiPublishResponse


def _field(tag: bytes, data: bytes) -> bytes:
    return tag + _varint(len(data)) + data


def _body_message(body: bytes) -> bytes:
    """A ``Message`` holding only ``body`` (an empty body is no field at all)."""
    return _field(_BODY_TAG, body) if body else b""


def publish_multi(txn_id: int, parts: Sequence[tuple[bytes, Sequence[bytes]]]) -> bytes:
    """The encoded PUBLISH_MULTI request of ``parts``, each ``(topic, bodies)``: of one body a plain publish
    (``msg``), else a batched one (``msgs``); byte for byte what ``encode`` gives for the protobuf request
    (``protocolVersion``, ``type``, ``txnId``, ``multiPublishRequest``; tested)."""
    out: list[bytes] = []
    size = 0
    for topic, bodies in parts:
        inner = [_field(_TOPIC_TAG, topic) if topic else b""]
        if len(bodies) == 1:
            inner.append(_field(_MSG_TAG, _body_message(bodies[0])))
        else:
            inner.extend(_field(_MSGS_TAG, _body_message(body)) for body in bodies)
        part = b"".join(inner)
        lead = _PART_TAG + _varint(len(part))
        out.append(lead)
        out.append(part)
        size += len(lead) + len(part)
    head = (_HEAD + _varint(txn_id) if txn_id else _HEAD[:-1]) + _MULTI_REQUEST_TAG + _varint(size)
    return LENGTH_PREFIX.pack(len(head) + size) + head + b"".join(out)


def part_published(first: int, stored: int, batched: bool) -> bytes:
    """A part's SUCCESS answer, serialized: ``PubSubResponse(publishResponse=PublishResponse(publishedMsgId=
    MessageSeqId(localComponent=first), stored=stored if batched))``, as a single or a batched publish of its
    own is answered (``hub.frames.published``, ``published_batch_ok``) without the fields the request has."""
    inner = b"\x10" + _varint(stored) if batched and stored else b""   # stored (varint 2)
    if first:
        inner = _field(b"\x0a", b"\x08" + _varint(first)) + inner      # publishedMsgId { localComponent }
    return _field(b"\x52", inner)                                       # publishResponse (10)


_SEQ_PARTS = [_PART_TAG + bytes((n + 5,)) + b"\x52" + bytes((n + 3,)) + b"\x0a" + bytes((n + 1,)) + b"\x08"
              for n in range(11)]
"""By the length n of a seq id's varint: a part's lead and ``part_published(seq, 0, False)`` up to the varint."""


def multi_published(txn_id: int, answers: Sequence[bytes | int]) -> bytes:
    """The encoded SUCCESS answer to a PUBLISH_MULTI: ``answers`` (each a serialized ``PubSubResponse``, in the
    parts' order) in ``multiPublishResponse.answers``; byte for byte what protobuf serializes (tested). An int
    (at least 1) stands for ``part_published(seq, 0, False)``, encoded here with the frame (issue 34)."""
    body = [b""]
    size = 0
    for answer in answers:
        if isinstance(answer, int):
            v = _varint(answer)
            part = _SEQ_PARTS[len(v)] + v
            body.append(part)
            size += len(part)
            continue
        lead = _PART_TAG + _varint(len(answer))
        body.append(lead)
        body.append(answer)
        size += len(lead) + len(answer)
    head = (_VERSION_TXN + _varint(txn_id) if txn_id else _VERSION_TXN[:-1]) + _MULTI_RESPONSE_TAG + _varint(size)
    body[0] = LENGTH_PREFIX.pack(len(head) + size) + head
    return b"".join(body)
