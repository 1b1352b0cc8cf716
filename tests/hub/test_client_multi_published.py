"""A PUBLISH_MULTI's SUCCESS answer read by hand (``hub.client_published``, issue 34) says what protobuf says, or
defers to it; the parts' publishes get the same seq ids and errors either way."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from hub import errors
from hub.client import HedwigClient
from hub.client_answers import MultiAnswer
from hub.client_published import read_published
from hub.frames_multi import multi_published, part_published
from hub.proto import pubsub_pb2 as pb
from tests.hub.test_client_published import mangle
from tests.hub.test_hub import publish_req, raw_exchange
from tests.hub.test_publish_multi import names, old_hub
from tools.cluster import LocalCluster

U64 = st.integers(min_value=0, max_value=2**64 - 1)
U32 = st.integers(min_value=0, max_value=2**32 - 1)
POSITIVE = st.integers(min_value=1, max_value=2**64 - 1)
MULTI_LEAD = b"\x08\x01\x18"


def _protobuf_view(frame: bytes) -> tuple[int, list[int]] | None:
    """What protobuf reads in ``frame``, as ``read_published`` should of a PUBLISH_MULTI's answer: (txn id, each
    part's seq id) of a SUCCESS whose parts are each a SUCCESS of a seq id (``stored`` or not), else None."""
    try:
        resp = pb.PubSubResponse.FromString(frame)
    except DecodeError:
        return None
    if {f.name for f, _ in resp.ListFields()} != {"protocolVersion", "txnId", "multiPublishResponse"} \
            or resp.protocolVersion != pb.VERSION_ONE:
        return None
    seqs = []
    for part in resp.multiPublishResponse.answers:
        pr = part.publishResponse
        if {f.name for f, _ in part.ListFields()} != {"publishResponse"} \
                or {f.name for f, _ in pr.ListFields()} - {"publishedMsgId", "stored"} \
                or {f.name for f, _ in pr.publishedMsgId.ListFields()} != {"localComponent"}:
            return None
        seqs.append(pr.publishedMsgId.localComponent)
    return resp.txnId, seqs


def _hand_view(frame: bytes) -> tuple[int, list[int]] | None:
    got = read_published(frame)
    assert got is None or isinstance(got[1], list), got   # a multi answer is never read as a single one
    return got  # type: ignore[return-value]


@settings(max_examples=300, deadline=None)
@given(POSITIVE, st.lists(st.one_of(POSITIVE, st.tuples(POSITIVE, U32, st.booleans())), max_size=40))
def test_the_hubs_multi_answer_is_read_as_protobuf_reads_it(txn: int, parts: list[int | tuple[int, int, bool]]
                                                             ) -> None:
    frame = multi_published(txn, [p if isinstance(p, int) else part_published(*p) for p in parts])[4:]
    seqs = [p if isinstance(p, int) else p[0] for p in parts]
    assert _protobuf_view(frame) == (txn, seqs)
    assert _hand_view(frame) == (txn, seqs)


@st.composite
def multi_responses(draw: st.DrawFn) -> bytes:
    """A PUBLISH_MULTI's answer as protobuf serializes it: mostly parts of seq ids, now and then a field the hand
    reading does not take (a status, a failed part, a trace, a topic, a remote component, no seq id...)."""
    resp = pb.PubSubResponse(txnId=draw(U64))
    if draw(st.integers(0, 5)):
        resp.protocolVersion = pb.VERSION_ONE
    if draw(st.integers(0, 8)) == 0:
        resp.statusCode = draw(st.sampled_from([pb.SUCCESS, pb.SERVICE_DOWN, pb.UNKNOWN_OPERATION]))
    if draw(st.integers(0, 8)) == 0:
        resp.topic = b"t"
    resp.multiPublishResponse.SetInParent()
    for _ in range(draw(st.integers(0, 6))):
        part = resp.multiPublishResponse.answers.add()
        odd = draw(st.integers(0, 12))
        if odd != 1:
            part.publishResponse.SetInParent()
        if odd != 2:
            part.publishResponse.publishedMsgId.localComponent = draw(U64)
        if draw(st.booleans()):
            part.publishResponse.stored = draw(U32)
        if odd == 3:
            part.statusCode = pb.SERVICE_DOWN
        elif odd == 4:
            part.statusMsg = "down"
        elif odd == 5:
            part.publishResponse.trace.SetInParent()
        elif odd == 6:
            part.publishResponse.publishedMsgId.remoteComponents.add(region=b"r", seqId=1)
        elif odd == 7:
            part.protocolVersion = pb.VERSION_ONE
        elif odd == 8:
            part.topic = b"t"
    return bytes(resp.SerializeToString())


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    """An answer with bytes flipped, inserted, cut or dropped: anything from a valid frame to garbage."""
    return mangle(draw, draw(st.one_of(multi_responses(), st.builds(
        lambda t, seqs: multi_published(t, seqs)[4:], POSITIVE, st.lists(POSITIVE, max_size=5)))))


@settings(max_examples=1500, deadline=None)
@given(st.one_of(multi_responses(), mangled(), st.binary(max_size=40).map(lambda b: MULTI_LEAD + b"\x05\x7a" + b)))
def test_any_multi_frame_is_read_as_protobuf_reads_it_or_left_to_protobuf(frame: bytes) -> None:
    got = read_published(frame)
    if got is not None and isinstance(got[1], list):   # read by hand: exactly what protobuf gives
        assert got == _protobuf_view(frame)


def test_unusual_multi_answers_are_left_to_protobuf() -> None:
    plain = multi_published(7, [5, 300])[4:]
    assert _hand_view(plain) == (7, [5, 300])
    assert _hand_view(multi_published(7, [])[4:]) == (7, [])               # no parts: as protobuf reads it
    assert _hand_view(plain + b"\x18\x01") is None                          # a field after the answer
    assert _hand_view(multi_published(0, [5])[4:]) is None                  # txn 0: a reject, not an answer
    assert _hand_view(multi_published(7, [5, part_published(0, 0, False)])[4:]) is None   # no seq id
    failed = pb.PubSubResponse(statusCode=pb.SERVICE_DOWN, statusMsg="down")
    failed.publishResponse.stored = 1
    assert _hand_view(multi_published(7, [5, failed.SerializeToString()])[4:]) is None    # a failed part
    long_varint = MULTI_LEAD + b"\x07\x7a\x08\x0a\x06\x52\x04\x0a\x02\x08" + b"\xff" * 10 + b"\x01"
    assert _hand_view(long_varint) is None
    too_big = MULTI_LEAD + b"\x07\x7a\x0f\x0a\x0d\x52\x0b\x0a\x09\x08" + b"\xff" * 9 + b"\x02"   # over 2**64
    assert _hand_view(too_big) is None
    for cut in range(len(plain)):
        assert _hand_view(plain[:cut]) is None


@pytest.mark.asyncio(loop_scope="module")
async def test_a_multi_publish_settles_each_part_by_hand_and_a_failed_part_as_before(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    hand: list[list[int]] = []
    by_hand = MultiAnswer.published
    monkeypatch.setattr(MultiAnswer, "published", lambda self, seqs: (hand.append(seqs), by_hand(self, seqs)))
    topics = names(6)
    hub0 = cluster.hub_addresses[0]
    claims = await raw_exchange(hub0, b"".join(publish_req(t, b"first", i + 1) for i, t in enumerate(topics)), 6)
    assert {x.statusCode for x in claims} == {pb.SUCCESS}
    async with await HedwigClient.connect(hub0) as c:        # the real hub: plain and batched parts, by hand
        await asyncio.gather(*(c.publish(t, b"second") for t in topics))
        hand.clear()
        futures = [[c.publish_async(t, b"%d" % k) for k in range(1 + i % 3)] for i, t in enumerate(topics)]
        got = [await asyncio.gather(*futs) for futs in futures]
        assert got == [[3 + k for k in range(1 + i % 3)] for i in range(len(topics))]
        assert hand == [[3] * len(topics)]

    def answer(req: pb.PubSubRequest) -> bytes:   # the first part stored at 40, the second's first one only
        failed = pb.PubSubResponse(statusCode=pb.SERVICE_DOWN, statusMsg="down")
        failed.publishResponse.publishedMsgId.localComponent, failed.publishResponse.stored = 50, 1
        if len(req.multiPublishRequest.publishes) == 2:
            return multi_published(req.txnId, [40, failed.SerializeToString()])
        return multi_published(req.txnId, list(range(60, 60 + len(req.multiPublishRequest.publishes))))

    async with old_hub(hub0, answer) as (address, answered), await HedwigClient.connect(address) as c:
        await asyncio.gather(*(c.publish(t, b"third") for t in topics))    # learns the owners: the proxy
        hand.clear()
        one, *two = c.publish_async(topics[0], b"x"), c.publish_async(topics[1], b"y"), \
            c.publish_async(topics[1], b"z"), c.publish_async(topics[1], b"w")
        assert await one == 40
        assert await two[0] == 50
        for fut in two[1:]:
            with pytest.raises(errors.PubSubError) as exc:
                await fut
            expected = errors.error_for_status("SERVICE_DOWN", "down")
            assert (type(exc.value), str(exc.value)) == (type(expected), str(expected))
        assert hand == [] and len(answered) >= 1      # a failed part: protobuf's way, as before
        assert await asyncio.gather(*(c.publish_async(t, b"v") for t in topics)) == list(range(60, 66))
        assert hand == [list(range(60, 66))]
