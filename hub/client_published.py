"""The client's most frequent frame, a SUCCESS answer to a publish, read by hand (issue 32).

    got = read_published(frame)          # (txn_id, first seq id), or None: protobuf reads the frame
    PublishedReceived(value, first, frame)

A publishing client gets one answer per request, nearly all of them the hub's
``hub.frames.published`` / ``published_batch_ok``: protocolVersion, txn id,
topic, ``publishResponse { publishedMsgId { localComponent } stored }``.
``ClientConnection.receive_data`` reads those fields here, without the
delivery split, the protobuf parse and the ``ResponseReceived`` it made per
answer; the answer's waiter takes the seq id (``hub.client_answers.BatchAnswer.published``)
or, for any other waiter, the parsed ``response`` (made on demand). Anything
else, unusual or malformed (another status, an error text, a trace, an
unknown, repeated or reordered field, a bad length or varint) is None here
and goes to protobuf as before, so what a waiter is told is always what
protobuf would say (tested byte for byte, ``tests/hub/test_client_published.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from hub.proto import pubsub_pb2 as pb

__all__ = ["ANSWER_LEAD", "PublishedReceived", "read_published"]

T = TypeVar("T")

ANSWER_LEAD = b"\x08\x01\x18"
"""How an answer to a request starts: protocolVersion VERSION_ONE, then the txnId tag (a delivery has no txn id)."""

_MAX_VARINT = 1 << 64


@dataclass(slots=True)
class PublishedReceived(Generic[T]):
    """A SUCCESS answer to a publish, read by hand: the request's ``value`` and the first stored seq id.

    Not frozen (one per answer: a frozen dataclass's ``__init__`` costs several times as much).
    """

    value: T
    first: int
    frame: bytes

    @property
    def response(self) -> pb.PubSubResponse:
        """The answer as protobuf reads it (parsed on each call)."""
        return pb.PubSubResponse.FromString(self.frame)


def read_published(frame: bytes) -> tuple[int, int] | None:
    """``(txn_id, seq_id)`` of a frame body (no length prefix) that is exactly a SUCCESS answer to a publish:
    ``ANSWER_LEAD``, a txn id other than 0, the topic (or none), then the ``publishResponse`` up to the end,
    holding a ``publishedMsgId`` of a ``localComponent`` alone and a ``stored`` count (or none), in that
    order, each once; else None."""
    try:
        return _read_published(frame)
    except IndexError:   # a varint or a field past the end
        return None


def _varint(b: bytes, i: int) -> tuple[int, int]:
    """The varint at ``b[i]`` and the index after it; a value of 2**64 or more (protobuf's error) is -1."""
    byte = b[i]
    if byte < 0x80:
        return byte, i + 1
    value = byte & 0x7F
    shift = 7
    while True:
        i += 1
        byte = b[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value if value < _MAX_VARINT else -1), i + 1
        shift += 7
        if shift >= 70:
            return -1, i + 1


def _read_published(b: bytes) -> tuple[int, int] | None:
    if not b.startswith(ANSWER_LEAD):
        return None
    txn, i = _varint(b, 3)
    if txn <= 0:
        return None
    if b[i] == 0x2A:                     # topic (bytes 5): not read
        size, i = _varint(b, i + 1)
        if size < 0:
            return None
        i += size
    if b[i] != 0x52:                     # publishResponse (10), up to the end of the frame
        return None
    size, i = _varint(b, i + 1)
    n = len(b)
    if i + size != n or b[i] != 0x0A:    # its publishedMsgId (1) first
        return None
    size, i = _varint(b, i + 1)
    end = i + size
    if b[i] != 0x08:                     # localComponent (1) alone
        return None
    seq, i = _varint(b, i + 1)
    if i != end or seq < 0:
        return None
    if i < n:
        if b[i] != 0x10:                 # stored (2): SUCCESS stored all of them
            return None
        stored, i = _varint(b, i + 1)
        if i != n or stored < 0:
            return None
    return txn, seq
