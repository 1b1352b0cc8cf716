"""The client's most frequent frame, a SUCCESS answer to a publish, read by hand (issue 32).

    got = read_published(frame)          # (txn_id, first seq id), or None: protobuf reads the frame
                                         # (a PUBLISH_MULTI's: (txn_id, [each part's first seq id]))
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

from hub.frames import long_varint
from hub.proto import pubsub_pb2 as pb

__all__ = ["ANSWER_LEAD", "PublishedReceived", "read_published"]

T = TypeVar("T")

ANSWER_LEAD = b"\x08\x01\x18"
"""How an answer to a request starts: protocolVersion VERSION_ONE, then the txnId tag (a delivery has no txn id)."""

_MAX_VARINT = 1 << 64


@dataclass(slots=True)
class PublishedReceived(Generic[T]):
    """A SUCCESS answer to a publish, read by hand: the request's ``value`` and the first stored seq id (of a
    PUBLISH_MULTI's answer: each part's, in order).

    Not frozen (one per answer: a frozen dataclass's ``__init__`` costs several times as much).
    """

    value: T
    first: int | list[int]
    frame: bytes

    @property
    def response(self) -> pb.PubSubResponse:
        """The answer as protobuf reads it (parsed on each call)."""
        return pb.PubSubResponse.FromString(self.frame)


def read_published(frame: bytes) -> tuple[int, int | list[int]] | None:
    """``(txn_id, seq_id)`` of a frame body (no length prefix) that is exactly a SUCCESS answer to a publish:
    ``ANSWER_LEAD``, a txn id other than 0, the topic (or none), then the ``publishResponse`` up to the end,
    holding a ``publishedMsgId`` of a ``localComponent`` (not 0) alone and a ``stored`` count (or none), in that
    order, each once, with the topic and the lengths under 0x80 bytes (one-byte varints, as the hub's answers
    to a topic of fewer than 128 bytes have them); else None. Of a PUBLISH_MULTI's SUCCESS answer (``ANSWER_LEAD``,
    the txn id, then ``multiPublishResponse`` up to the end, each part a SUCCESS as ``_read_multi`` reads it):
    ``(txn_id, [seq id of each part, in order])`` (issue 34).

    Read in one pass, no call per field: a one-byte varint inline, a longer one by ``hub.frames.long_varint``
    (the hub's reader of its publishes); the answer then skips the rest of protobuf's way.
    """
    b = frame
    try:   # the read inline here, not a call of its own: a call less per answer (issue 32)
        if not b.startswith(ANSWER_LEAD):
            return None
        txn = b[3]                           # txnId (3): a varint of up to 10 bytes, under 2**64, not 0
        i = 4
        if txn >= 0x80:
            txn, i = long_varint(b, i, txn)
        if not 0 < txn < _MAX_VARINT:
            return None
        if b[i] == 0x7A:                     # multiPublishResponse (15): a PUBLISH_MULTI's answer
            seqs = _read_multi(b, i + 1)
            return None if seqs is None else (txn, seqs)
        if b[i] == 0x2A:                     # topic (bytes 5): not read
            size = b[i + 1]
            if size >= 0x80:
                return None
            i += 2 + size
        n = len(b)
        size = b[i + 1]                      # publishResponse (10), up to the end of the frame ...
        if b[i] != 0x52 or size >= 0x80 or size != n - i - 2 or b[i + 2] != 0x0A:   # ... its publishedMsgId (1) first
            return None
        size = b[i + 3]
        if size >= 0x80 or b[i + 4] != 0x08:  # localComponent (1) alone
            return None
        end = i + 4 + size
        seq = b[i + 5]
        i += 6
        if seq >= 0x80:
            seq, i = long_varint(b, i, seq)
        if i != end or not 0 < seq < _MAX_VARINT:
            return None
        if i < n:                            # stored (2): SUCCESS stored all of them; its varint ends the frame
            if b[i] != 0x10:
                return None
            stored = b[i + 1:]
            if not 0 < len(stored) <= 10 or stored[-1] >= 0x80 or (len(stored) == 10 and stored[-1] > 1) \
                    or any(c < 0x80 for c in stored[:-1]):
                return None
        return txn, seq
    except IndexError:   # a varint or a field past the end
        return None


def _read_multi(b: bytes, i: int) -> list[int] | None:
    """The parts' seq ids of a ``multiPublishResponse`` whose length's varint is at ``i`` and whose answers run
    up to the end of ``b``, each exactly ``hub.frames_multi.part_published(seq, stored, batched)`` of a seq id
    (not 0), with or without ``stored`` (SUCCESS stored them all), its lengths under 0x80 (one-byte varints);
    else None (protobuf reads it). One pass, as ``read_published`` (issue 34)."""
    try:
        size = b[i]                          # the answers' length: up to the end of the frame
        i += 1
        if size >= 0x80:
            size, i = long_varint(b, i, size)
        n = len(b)
        if size != n - i:
            return None
        seqs: list[int] = []
        while i < n:
            size = b[i + 1]                  # answers (1) { publishResponse (10) { publishedMsgId (1) { ...
            if b[i] != 0x0A or size >= 0x80 or b[i + 2] != 0x52 or b[i + 3] != size - 2 or b[i + 4] != 0x0A:
                return None
            end = i + 2 + size
            size = b[i + 5]
            if size >= 0x80 or b[i + 6] != 0x08:   # ... localComponent (1) alone }
                return None
            last = i + 6 + size
            seq = b[i + 7]
            i += 8
            if seq >= 0x80:
                seq, i = long_varint(b, i, seq)
            if i != last or not 0 < seq < _MAX_VARINT:
                return None
            if i < end:                      # stored (2): a varint up to the part's end
                if b[i] != 0x10 or end - i > 11:
                    return None
                i += 1
                while i < end - 1:
                    if b[i] < 0x80:
                        return None
                    i += 1
                if i != end - 1 or b[i] >= 0x80 or (end - last == 11 and b[i] > 1):
                    return None
                i += 1
            elif i != end:
                return None
            seqs.append(seq)
        return seqs
    except IndexError:   # a varint or a field past the end
        return None
