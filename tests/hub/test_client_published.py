"""A publish's SUCCESS answer read by hand (``hub.client_published``) says what protobuf says, or defers to it."""

from __future__ import annotations

import asyncio

from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.client_answers import BatchAnswer
from hub.client_published import PublishedReceived, read_published
from hub.frames import published, published_batch_ok
from hub.proto import pubsub_pb2 as pb
from hub.protocol import ClientConnection, ConnectionBroken, ResponseReceived, encode, response

U64 = st.integers(min_value=0, max_value=2**64 - 1)
U32 = st.integers(min_value=0, max_value=2**32 - 1)
POSITIVE = st.integers(min_value=1, max_value=2**64 - 1)


def _protobuf_view(frame: bytes) -> tuple[int, int] | None:
    """What protobuf reads in ``frame``, as ``read_published`` should: (txn id, seq id) of a plain SUCCESS
    answer to a publish, else None."""
    try:
        resp = pb.PubSubResponse.FromString(frame)
    except DecodeError:
        return None
    if {f.name for f, _ in resp.ListFields()} - {"protocolVersion", "txnId", "topic", "publishResponse"}:
        return None
    pr = resp.publishResponse
    if resp.protocolVersion != pb.VERSION_ONE or not resp.txnId or resp.statusCode != pb.SUCCESS \
            or resp.WhichOneof("body") != "publishResponse" or pr.HasField("trace") \
            or pr.publishedMsgId.remoteComponents or not pr.publishedMsgId.localComponent:
        return None
    return resp.txnId, pr.publishedMsgId.localComponent


@settings(max_examples=300, deadline=None)
@given(POSITIVE, st.one_of(st.binary(max_size=20), st.binary(min_size=120, max_size=300)), POSITIVE)
def test_the_hubs_publish_answer_is_read_as_protobuf_reads_it(txn: int, topic: bytes, seq: int) -> None:
    frame = published(txn, topic, seq)[4:]
    assert _protobuf_view(frame) == (txn, seq)
    assert read_published(frame) == ((txn, seq) if len(topic) < 0x80 else None)   # a long topic: protobuf's


@settings(max_examples=300, deadline=None)
@given(POSITIVE, st.one_of(st.binary(max_size=20), st.binary(min_size=120, max_size=300)), POSITIVE, U32)
def test_the_hubs_batched_publish_answer_is_read_as_protobuf_reads_it(txn: int, topic: bytes, first: int,
                                                                      stored: int) -> None:
    frame = published_batch_ok(txn, topic, first, stored)[4:]
    assert _protobuf_view(frame) == (txn, first)
    assert read_published(frame) == ((txn, first) if len(topic) < 0x80 else None)


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    """A PubSubResponse as protobuf serializes it: mostly a publish's answer, with now and then a field the
    hand reading does not take (a status, an error text, a trace, a redirect, a remote component...)."""
    resp = pb.PubSubResponse(txnId=draw(U64))
    if draw(st.integers(0, 5)):
        resp.protocolVersion = pb.VERSION_ONE   # else absent: a version protobuf reads as 0
    if draw(st.booleans()):
        resp.topic = draw(st.binary(max_size=20))
    if draw(st.integers(0, 4)) == 0:
        resp.statusCode = draw(st.sampled_from([pb.SUCCESS, pb.SERVICE_DOWN, pb.NOT_RESPONSIBLE_FOR_TOPIC]))
    if draw(st.integers(0, 6)) == 0:
        resp.statusMsg = draw(st.text(max_size=5))
    if draw(st.integers(0, 6)) == 0:
        resp.redirect_to = "h:1:2"
    body = draw(st.integers(0, 6))
    if body == 0:
        resp.subscribeResponse.SetInParent()
    elif body == 1:
        resp.delivery.topic = b"t"
    elif body >= 2:
        pr = resp.publishResponse
        pr.SetInParent()
        if draw(st.integers(0, 5)):
            pr.publishedMsgId.localComponent = draw(U64)
        if draw(st.booleans()):
            pr.stored = draw(U32)
        if draw(st.integers(0, 8)) == 0:
            pr.trace.SetInParent()
        if draw(st.integers(0, 8)) == 0:
            pr.publishedMsgId.remoteComponents.add(region=b"r", seqId=1)
    return bytes(resp.SerializeToString())


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    """An answer with bytes flipped, inserted, cut or dropped: anything from a valid frame to garbage."""
    return mangle(draw, draw(st.one_of(responses(), st.builds(lambda t, s, q: published(t, s, q)[4:],
                                                              U64, st.binary(max_size=5), U64))))


def mangle(draw: st.DrawFn, answer: bytes) -> bytes:
    """``answer`` with up to 3 bytes flipped, runs inserted, cut or dropped (hypothesis draws which)."""
    frame = bytearray(answer)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.integers(0, 3))
        at = draw(st.integers(0, len(frame)))
        if op == 0 and at < len(frame):
            frame[at] = draw(st.integers(0, 255))
        elif op == 1:
            frame[at:at] = draw(st.binary(min_size=1, max_size=11))
        elif op == 2:
            del frame[at:]
        else:
            del frame[at:at + draw(st.integers(1, 3))]
    return bytes(frame)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(responses(), mangled(), st.binary(max_size=40).map(lambda b: b"\x08\x01\x18" + b),
                 st.builds(lambda t, q, n: published_batch_ok(t, b"t", q, n)[4:], U64, U64, U32)))
def test_any_frame_is_read_as_protobuf_reads_it_or_left_to_protobuf(frame: bytes) -> None:
    got = read_published(frame)
    if got is not None:   # read by hand: exactly what protobuf gives (an unusual frame may defer: None)
        assert got == _protobuf_view(frame)


def test_unusual_answers_are_left_to_protobuf() -> None:
    plain = published(7, b"t", 5)[4:]
    assert read_published(plain) == (7, 5)
    assert read_published(plain + b"\x18\x01") is None                       # a field after the answer
    assert read_published(published(0, b"t", 5)[4:]) is None                 # txn 0: a reject, not an answer
    assert read_published(published(7, b"t", 0)[4:]) is None                 # no seq id
    assert read_published(published(7, b"t" * 128, 5)[4:]) is None          # a long topic: protobuf reads it
    assert read_published(published_batch_ok(7, b"t", 5, 2)[4:]) == (7, 5)   # a batch's: stored all
    assert read_published(encode(response(7, pb.SERVICE_DOWN, "down"))[4:]) is None
    traced = pb.PubSubResponse.FromString(plain)
    traced.publishResponse.trace.hub_read_ns = 1
    assert read_published(traced.SerializeToString()) is None                # a trace: protobuf reads it
    long_varint = b"\x08\x01\x18" + b"\xff" * 10 + b"\x01\x52\x04\x0a\x02\x08\x01"
    assert read_published(long_varint) is None                               # over 10 bytes: protobuf's error
    for cut in range(len(plain)):
        assert read_published(plain[:cut]) is None


def test_the_client_hands_a_publish_answer_over_without_protobuf_and_anything_else_as_before() -> None:
    client: ClientConnection[str] = ClientConnection(max_frame_size=4096)
    publish = pb.PubSubRequest(type=pb.PUBLISH, topic=b"t", publishRequest=pb.PublishRequest(topic=b"t"))
    for name in ("a", "b", "c"):
        client.send_request(publish, name)
    data = published(2, b"t", 9) + encode(response(1, pb.SERVICE_DOWN, "down")) + published(44, b"t", 1)
    events = client.receive_data(data)      # txn 44 was never sent (or timed out): dropped, as before
    assert [type(e) for e in events] == [PublishedReceived, ResponseReceived]
    first, second = events
    assert isinstance(first, PublishedReceived) and (first.value, first.first) == ("b", 9)
    assert first.response == pb.PubSubResponse.FromString(published(2, b"t", 9)[4:])
    assert isinstance(second, ResponseReceived) and second.value == "a" and second.response.statusMsg == "down"
    assert list(client) == [3] and not client.broken
    assert isinstance(client.receive_data(encode(response(0, pb.MALFORMED_REQUEST, "bad")))[-1], ConnectionBroken)


async def test_a_batch_answered_by_hand_gets_the_seq_ids_protobuf_would_give_it() -> None:
    loop = asyncio.get_running_loop()
    by_hand = [loop.create_future() for _ in range(3)]
    parsed = [loop.create_future() for _ in range(3)]
    by_hand[1].cancel()                     # a publish its caller cancelled stays so
    parsed[1].cancel()
    BatchAnswer(None, b"t", [b"x"] * 3, by_hand).published(5)  # type: ignore[arg-type]
    BatchAnswer(None, b"t", [b"x"] * 3, parsed).set_result(  # type: ignore[arg-type]
        pb.PubSubResponse.FromString(published_batch_ok(1, b"t", 5, 3)[4:]))
    assert [f.cancelled() or f.result() for f in by_hand] == [f.cancelled() or f.result() for f in parsed] \
        == [5, True, 7]
