"""The hub's most frequent requests read without protobuf: a PUBLISH of messages holding a body alone.

    ev = body_publish(frame)     # a BodyPublish, or None: protobuf parses the frame and the hub checks it
    req = ev.request()           # the same request as protobuf parses it (the long way, when one is needed)

A client's single publish (``hub.frames.publish_batch`` of one body, or
protobuf's serialization of the same request) is ``protocolVersion``,
``type``, ``txnId``, an optional ``topic``, and a ``publishRequest`` of an
optional topic and a ``msg`` of an optional ``body``, in field order (a
batched one, ``msgs`` of such messages instead of ``msg``). Such a frame
is split by hand (issue 32): the hub stamps and stores the body
without a protobuf request, a checked event, a stamp of the parsed message
and its serialization (``hub.connection_publish.PublishPath._publish_body``).
Anything else (another field, another order, a repeated field, a varint or
length past the end) is None, so a frame split here is one protobuf would
parse to exactly these values.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

from hub.frames import long_varint
from hub.proto import pubsub_pb2 as pb

__all__ = ["BodyPublish", "StampedBody", "body_publish", "stamped_bodies"]

_HEAD = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH).SerializeToString() + b"\x18"
"""The frame's first bytes: ``protocolVersion``, ``type``, then the ``txnId`` tag (varint 3)."""


@dataclass(slots=True)
class BodyPublish:
    """A single publish of a body alone, split from its ``frame`` (``hub.protocol.ServerConnection``'s event).

    ``topic`` is the topic published to (``hub.protocol.request_topic``'s);
    ``request_topic`` the request's own ``topic`` field, which its answer
    echoes (``b""`` when only the publish request names the topic).
    """

    frame: bytes
    txn_id: int
    topic: bytes
    request_topic: bytes
    body: bytes
    bodies: list[bytes] | None = None
    """A batched publish's bodies (``msgs``, two or more, each holding a body alone), in order; ``body`` is then
    ``b""``. None for a single publish (``msg``)."""
    longest: int = -1
    """The longest body's length (-1: ``body``'s)."""

    def request(self) -> pb.PubSubRequest:
        """The request as protobuf parses it (the hub's long way: a failure's answer, an unowned topic)."""
        return pb.PubSubRequest.FromString(self.frame)


def body_publish(frame: bytes) -> BodyPublish | None:
    """``frame`` (a request frame's body, no length prefix) as a ``BodyPublish``, else None (module docstring)."""
    global _last
    if not frame.startswith(_HEAD):
        return None
    try:   # one call a frame (issue 32); an IndexError is a varint or length past the end: None
        end = len(frame)
        i = len(_HEAD)
        txn = frame[i]
        i += 1
        if txn >= 0x80:   # a client's txn ids grow: two and three bytes without long_varint's loop
            b = frame[i]
            if b < 0x80:
                txn = txn & 0x7F | b << 7
                i += 1
            elif frame[i + 1] < 0x80:
                txn = txn & 0x7F | (b & 0x7F) << 7 | frame[i + 1] << 14
                i += 2
            else:
                txn, i = long_varint(frame, i, txn)
                if txn >> 64:
                    return None
        middle, last_topic, last_request_topic, size = _last
        if end - i - len(middle) == size and frame.startswith(middle, i):   # the fields of the last one, again
            return BodyPublish(frame, txn, last_topic, last_request_topic, frame[end - size:])
        after_txn = i
        topic = b""
        if frame[i] == 0x2A:                 # topic (5), length-delimited; a long name goes the long way
            n = frame[i + 1]
            if n >= 0x80:
                return None
            i += 2
            topic = frame[i:i + n]
            i += n
        if frame[i] != 0x52:                 # publishRequest (10), to the end of the frame
            return None
        size = frame[i + 1]
        i += 2
        if size >= 0x80:
            size, i = long_varint(frame, i, size)
        if i + size != end:
            return None
        pub_topic = b""
        if frame[i] == 0x0A:                 # PublishRequest.topic (1)
            n = frame[i + 1]
            if n >= 0x80:
                return None
            i += 2
            pub_topic = frame[i:i + n]
            i += n
        if frame[i] == 0x1A:                 # PublishRequest.msgs (3), each a body alone, to the end
            return _batch(frame, i, txn, topic or pub_topic, topic)
        if frame[i] != 0x12:                 # PublishRequest.msg (2), to the end
            return None
        size = frame[i + 1]
        i += 2
        if size >= 0x80:
            size, i = long_varint(frame, i, size)
        if i + size != end:
            return None
        body = _body(frame, i, end)
        if body is None:
            return None
        _last = (frame[after_txn:end - len(body)], topic or pub_topic, topic, len(body))
        return BodyPublish(frame, txn, topic or pub_topic, topic, body)
    except IndexError:
        return None


def _batch(frame: bytes, i: int, txn: int, topic: bytes, request_topic: bytes) -> BodyPublish | None:
    """``body_publish``'s batched publish: from ``i``, two or more ``msgs`` of a body alone up to the end, else None."""
    end = len(frame)
    bodies: list[bytes] = []
    longest = 0
    while i < end:
        if frame[i] != 0x1A:
            return None
        size = frame[i + 1]
        i += 2
        if size >= 0x80:
            size, i = long_varint(frame, i, size)
        j = i + size
        if j > end:
            return None
        body = _body(frame, i, j)
        if body is None:
            return None
        if len(body) > longest:
            longest = len(body)
        bodies.append(body)
        i = j
    if len(bodies) < 2:   # a batch of one: the long way (it is a batched publish, not a plain one)
        return None
    return BodyPublish(frame, txn, topic, request_topic, b"", bodies, longest)


def _body(frame: bytes, i: int, j: int) -> bytes | None:
    """The body of the ``Message`` in ``frame[i:j]`` when it holds a body alone (empty: no body), else None; a
    length past the end raises ``IndexError`` (``body_publish`` answers None). Only off the repeated layout's way."""
    if i == j:
        return b""
    if frame[i] != 0x0A:                     # Message.body (1), to the end: the message holds nothing else
        return None
    n = frame[i + 1]
    i += 2
    if n >= 0x80:
        n, i = long_varint(frame, i, n)
    if i + n != j:
        return None
    return frame[i:j]


class StampedBody(tuple):  # type: ignore[type-arg]   # (body, publishTimeMs, srcRegion, wire)
    """A stamped body publish as its topic log queues it: ``(body, publishTimeMs, srcRegion, wire)``, ``wire`` the
    stored serialization (``hub.frames.stamped_wire``), without a protobuf message (issue 32).

    It reads as the ``pb.Message`` fields the log looks at (``body``, ``publishTimeMs``, ``srcRegion``,
    ``producer`` and ``sequenceId``, empty) and ``SerializeToString()`` gives ``wire``; ``message()`` is the
    ``pb.Message`` itself, parsed, for whoever needs more (``hub.message.Message.persisted_run``).
    Made with ``new_stamped(StampedBody, fields)`` (``tuple.__new__``: no ``__init__`` call).
    """

    __slots__ = ()

    body: bytes = property(itemgetter(0))  # type: ignore[assignment]
    publishTimeMs: int = property(itemgetter(1))  # type: ignore[assignment]
    srcRegion: bytes = property(itemgetter(2))  # type: ignore[assignment]
    wire: bytes = property(itemgetter(3))  # type: ignore[assignment]
    producer = b""
    sequenceId = 0

    def SerializeToString(self) -> bytes:  # pb.Message's name
        return self[3]  # type: ignore[no-any-return]

    def message(self) -> pb.Message:
        return pb.Message.FromString(self[3])


new_stamped = tuple.__new__
"""A queued body publish: ``new_stamped(StampedBody, (body, time_ms, region, wire))`` (no ``__init__`` call)."""


def stamped_bodies(bodies: list[bytes], wires: list[bytes], time_ms: int, region: bytes) -> list[StampedBody]:
    """``StampedBody`` of each of ``bodies`` (``wires``: their stamped serializations, in order)."""
    new = new_stamped
    return [new(StampedBody, (body, time_ms, region, wire)) for body, wire in zip(bodies, wires, strict=True)]


_last: tuple[bytes, bytes, bytes, int] = (b"\xff", b"", b"", 0)
"""The bytes after the txn id up to the body of the last frame split, its topics and its body's length: the next
frame that holds the same bytes there, and a body of that length after them, is split without another look
(a publisher's messages to one topic, of one size, differ in their txn ids and bodies alone)."""
