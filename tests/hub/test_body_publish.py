"""hub.body_publish: a single publish of a body alone, split by hand, is what protobuf parses; anything else is not
split; and the hub stores and answers it as it does a request protobuf parsed (issue 32)."""

from __future__ import annotations

import asyncio
import itertools
import random
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.wire.framing import FrameDecoder
from hub.body_publish import BodyPublish, StampedBody, body_publish, stamped_bodies
from hub.conf import load_hub_conf
from hub.entry_index import EntryIndex
from hub.frames import publish_batch, stamped_wire, stamped_wires
from hub.message import Message
from hub.persistence import TopicLog, decode_batch
from hub.proto import pubsub_pb2 as pb
from hub.protocol import MAX_TOPIC_BYTES, ConnectionBroken, RequestReceived, ServerConnection, name_problem
from hub.server import HubConnection, HubServer
from hub.subscriptions import TopicSubscriptions
from hub.topic import Topic
from tests.hub.test_connection import FakeTransport

TOPIC = b"body-publish-topic"
SPLIT_TOPIC = b"body-publish-split-topic"   # a name of its own: TOPIC's first publish must go the long way


def frame_body(txn: int, topic: bytes, body: bytes) -> bytes:
    return publish_batch(txn, topic, [body])[4:]


def same_as_protobuf(frame: bytes, ev: BodyPublish) -> None:
    req = pb.PubSubRequest.FromString(frame)
    pub = req.publishRequest
    assert req.type == pb.PUBLISH and req.protocolVersion == pb.VERSION_ONE and not req.shouldClaim
    assert req.WhichOneof("body") == "publishRequest" and not pub.trace
    assert ev.txn_id == req.txnId and ev.request_topic == req.topic and ev.topic == (req.topic or pub.topic)
    if ev.bodies is None:
        assert pub.HasField("msg") and not pub.msgs
        assert pub.msg == pb.Message(body=ev.body)   # the message holds the body and nothing else
    else:
        assert not pub.HasField("msg") and len(pub.msgs) == len(ev.bodies) >= 2 and ev.body == b""
        assert list(pub.msgs) == [pb.Message(body=b) for b in ev.bodies]
        assert ev.longest == max(map(len, ev.bodies))
    assert ev.request() == req


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**64 - 1), st.binary(min_size=1, max_size=127), st.binary(max_size=300))
def test_a_single_publish_of_a_body_is_split_as_protobuf_parses_it(txn: int, topic: bytes, body: bytes) -> None:
    frame = frame_body(txn, topic, body)
    for _ in range(2):   # the second time from the remembered fields of the first
        ev = body_publish(frame)
        assert ev is not None
        same_as_protobuf(frame, ev)
    serialized = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=txn, topic=topic,
                                  publishRequest=pb.PublishRequest(topic=topic, msg=pb.Message(body=body)))
    if txn:   # protobuf's own serialization of the same request (it leaves a txn id of 0 out: not split)
        ev = body_publish(serialized.SerializeToString())
        assert ev is not None and (ev.txn_id, ev.topic, ev.body) == (txn, topic, body)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**64 - 1), st.binary(min_size=1, max_size=127),
       st.lists(st.binary(max_size=300), min_size=2, max_size=20))
def test_a_batched_publish_of_bodies_is_split_as_protobuf_parses_it(txn: int, topic: bytes,
                                                                    bodies: list[bytes]) -> None:
    frame = publish_batch(txn, topic, bodies)[4:]
    ev = body_publish(frame)
    assert ev is not None and ev.bodies == bodies
    same_as_protobuf(frame, ev)


def test_the_topic_may_be_named_by_the_publish_request_alone_and_the_answer_echoes_the_request_s() -> None:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=9,
                           publishRequest=pb.PublishRequest(topic=b"inner", msg=pb.Message(body=b"b")))
    ev = body_publish(req.SerializeToString())
    assert ev is not None and (ev.topic, ev.request_topic, ev.body) == (b"inner", b"", b"b")


def test_anything_more_than_a_body_is_not_split() -> None:
    def req(**msg: object) -> pb.PubSubRequest:
        return pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=3, topic=b"t",
                                publishRequest=pb.PublishRequest(topic=b"t", msg=pb.Message(body=b"b", **msg)))
    others = [req(key=b""), req(key=b"k"), req(header=pb.MessageHeader(messageType="x")), req(producer=b"p"),
              req(sequenceId=1), req(srcRegion=b"r"), req(publishTimeMs=1), req(deliverAfterMs=5), req(deliverAtMs=5)]
    traced = req()
    traced.publishRequest.trace = True
    claim = req()
    claim.shouldClaim = True
    batched = req()
    batched.publishRequest.msgs.add(body=b"c")
    subscribe = req()
    subscribe.type = pb.SUBSCRIBE
    long_topic = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=3, topic=b"t" * 200,
                                  publishRequest=pb.PublishRequest(msg=pb.Message(body=b"b")))
    for r in [*others, traced, claim, batched, subscribe, long_topic]:
        assert body_publish(r.SerializeToString()) is None, r
    frame = frame_body(3, b"t", b"body")
    assert body_publish(frame + b"\x08\x01") is None                  # a field after the body
    assert body_publish(frame[:-1]) is None                           # cut short
    for extra in ({"key": b"k"}, {"srcRegion": b"r"}, {"deliverAtMs": 5}):
        for where in (0, 2):
            batch = req()
            batch.publishRequest.ClearField("msg")
            for i in range(3):
                batch.publishRequest.msgs.add(body=b"b", **(extra if i == where else {}))   # type: ignore[arg-type]
            assert body_publish(batch.SerializeToString()) is None, batch
    one = req()
    one.publishRequest.ClearField("msg")
    one.publishRequest.msgs.add(body=b"b")
    assert body_publish(one.SerializeToString()) is None              # a batch of one: the long way
    both = pb.PubSubRequest.FromString(publish_batch(3, b"t", [b"a", b"b"])[4:])
    both.publishRequest.msg.body = b"c"
    assert body_publish(both.SerializeToString()) is None             # msg and msgs: refused the long way


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 2**20), st.binary(min_size=1, max_size=20), st.binary(max_size=200), st.randoms())
def test_a_damaged_frame_is_split_only_as_protobuf_would_parse_it(txn: int, topic: bytes, body: bytes,
                                                                    rnd: random.Random) -> None:
    frame = bytearray(frame_body(txn, topic, body) if rnd.random() < 0.5 else
                      publish_batch(txn, topic, [body, body[:5], b""])[4:])
    for _ in range(rnd.randint(1, 3)):
        what = rnd.randrange(3)
        at = rnd.randrange(len(frame))
        if what == 0:
            frame[at] = rnd.randrange(256)
        elif what == 1:
            del frame[at]
        else:
            frame.insert(at, rnd.randrange(256))
    ev = body_publish(bytes(frame))
    if ev is not None:
        same_as_protobuf(bytes(frame), ev)


def test_the_server_connection_makes_one_only_when_asked_and_only_for_a_valid_request() -> None:
    frame = publish_batch(4, b"topic", [b"x" * 10])
    plain = ServerConnection(max_frame_size=4096, max_message_size=100)
    (event,) = plain.receive_data(frame)
    assert isinstance(event, RequestReceived)    # the default: protobuf parses every request
    conn = ServerConnection(max_frame_size=4096, max_message_size=100, body_publishes=True)
    (event,) = conn.receive_data(frame)
    assert isinstance(event, BodyPublish) and (event.txn_id, event.topic, event.body) == (4, b"topic", b"x" * 10)
    (event,) = conn.receive_data(publish_batch(5, b"topic", [b"x" * 101]))   # over max_message_size: refused
    assert not isinstance(event, BodyPublish) and event.response.statusCode == pb.MESSAGE_TOO_LARGE
    (event,) = conn.receive_data(publish_batch(6, b"bad\x00topic", [b"x"]))  # an invalid name: refused
    assert not isinstance(event, BodyPublish) and event.response.statusCode == pb.MALFORMED_REQUEST
    (event,) = conn.receive_data(publish_batch(7, b"topic", [b"x", b"y" * 10]))
    assert isinstance(event, BodyPublish) and event.bodies == [b"x", b"y" * 10]
    (event,) = conn.receive_data(publish_batch(8, b"topic", [b"x", b"y" * 101]))   # one body over the limit
    assert not isinstance(event, BodyPublish) and event.response.statusCode == pb.MESSAGE_TOO_LARGE


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=6), st.sampled_from([b"", b"standalone", b"east"]),
       st.sampled_from([0, 1, 1_700_000_000_000]), st.integers(1, 2**40))
def test_a_stamped_body_reads_as_the_message_its_wire_parses_to(bodies: list[bytes], region: bytes, ms: int,
                                                                first: int) -> None:
    """What the topic log queues for a body publish (no protobuf message) reads as the message parsed from its
    wire, and the read-ahead cache builds the same messages from either (long bodies take persisted_run's
    plain way, which parses the wire)."""
    wires = stamped_wires(bodies, region, ms)
    stamped = stamped_bodies(bodies, wires, ms, region)
    parsed = [pb.Message.FromString(w) for w in wires]
    for s, m, w in zip(stamped, parsed, wires, strict=True):
        assert isinstance(s, StampedBody) and s.wire == w and s.SerializeToString() == w
        assert (s.body, s.publishTimeMs, s.srcRegion, s.producer, s.sequenceId) == \
            (m.body, m.publishTimeMs, m.srcRegion, m.producer, m.sequenceId)
        assert s.message() == m
    assert Message.persisted_run(stamped, first, wires) == Message.persisted_run(parsed, first, wires)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40).map(lambda b: ("body", b)),
                          st.binary(max_size=12).map(lambda b: ("garbage", b)),
                          st.just(("huge", b""))), min_size=1, max_size=12),
       st.lists(st.integers(0, 10_000), max_size=8), st.integers(1, 4))
def test_frames_split_from_a_read_are_the_decoder_s_frames(items: list[tuple[str, bytes]], cuts: list[int],
                                                          budget: int) -> None:
    """receive_data splits the frames of a read itself when nothing is held (issue 32): per call, the same
    events, backlog and bytes held as the decoder's way (taken for a bytearray), for any cut of the stream,
    partial and oversized frames and the per-turn budget included."""
    parts = []
    for i, (kind, data) in enumerate(items):
        if kind == "body":
            parts.append(publish_batch(i + 1, SPLIT_TOPIC, [data]))
        elif kind == "garbage":
            parts.append(struct.pack(">I", len(data)) + data)
        else:
            parts.append(struct.pack(">I", 5000) + b"x" * 10)   # over max_frame_size: breaks the stream
    fast, slow = (ServerConnection(max_frame_size=4096, max_message_size=100, max_requests_per_turn=budget,
                                   body_publishes=True) for _ in range(2))
    assert name_problem(SPLIT_TOPIC, "topic", MAX_TOPIC_BYTES) is None   # checked once: both split its publishes
    for chunk in _chunks(b"".join(parts), cuts):
        got, want = fast.receive_data(chunk), slow.receive_data(bytearray(chunk))
        assert got == want
        while True:
            assert (fast.backlogged, fast.buffered, fast.broken) == (slow.backlogged, slow.buffered, slow.broken)
            if not fast.backlogged:
                break
            assert fast.next_events() == slow.next_events()
        if any(isinstance(e, ConnectionBroken) for e in got):
            break


async def test_the_hub_stores_and_answers_a_body_publish_as_the_long_way() -> None:
    class Ledger:
        ledger_id = 7
        next_entry_id = 0

        def __init__(self) -> None:
            self.entries: list[bytes] = []

        def async_add_entry(self, data: bytes, cb: object) -> None:
            self.entries.append(data)
            cb(len(self.entries) - 1, None)   # type: ignore[operator]

    server = HubServer(load_hub_conf(None, {}))
    tlog = TopicLog(TOPIC, None, None, server.conf)
    lh = Ledger()
    tlog.lh, tlog._last_index = lh, EntryIndex(lh.ledger_id)   # type: ignore[assignment]
    server.topics[TOPIC] = Topic(tlog, TopicSubscriptions(TOPIC, None, server.conf, log=tlog))  # type: ignore[arg-type]
    conn = HubConnection(server)
    transport = FakeTransport()
    conn.connection_made(transport)
    short_way: list[BodyPublish] = []
    publish_body = conn._publish_body
    conn._publish_body = lambda ev: (short_way.append(ev), publish_body(ev))[1]   # type: ignore[method-assign]
    conn.data_received(publish_batch(1, TOPIC, [b"first"]))   # the topic name's first look: the long way
    conn.data_received(publish_batch(2, TOPIC, [b"second"]))  # a BodyPublish
    conn.data_received(publish_batch(5, TOPIC, [b"third", b"fourth"]))   # and a batched one
    for _ in range(5):
        await asyncio.sleep(0)
    assert [ev.txn_id for ev in short_way] == [2, 5]
    stored = [m for e in lh.entries for m in decode_batch(e)]
    assert [m.body for m in stored] == [b"first", b"second", b"third", b"fourth"]
    assert [m.msgId.localComponent for m in stored] == [1, 2, 3, 4]
    for m in stored:   # stamped as the long way stamps: the owner's clock, the hub's region, nothing else
        assert m.publishTimeMs > 0 and m.srcRegion == server.region_bytes and not m.HasField("key")
        plain = pb.Message(body=m.body, srcRegion=m.srcRegion, publishTimeMs=m.publishTimeMs)
        assert stamped_wire(m.body, m.srcRegion, m.publishTimeMs) == plain.SerializeToString()
    answers = [pb.PubSubResponse.FromString(f) for f in FrameDecoder(1 << 20).feed(bytes(transport.written))]
    assert [(a.txnId, a.topic, a.statusCode, a.publishResponse.publishedMsgId.localComponent,
             a.publishResponse.stored) for a in answers] == \
        [(1, TOPIC, pb.SUCCESS, 1, 0), (2, TOPIC, pb.SUCCESS, 2, 0), (5, TOPIC, pb.SUCCESS, 3, 2)]
    assert server.stats.counters["publishes"] == 4 and conn.machine.in_flight == 0
    del server.topics[TOPIC]   # a failure is answered from the parsed request (and the topic is not released)
    tlog.closed = True
    server.topics[TOPIC + b"-other"] = Topic(tlog, TopicSubscriptions(TOPIC, None, server.conf, log=tlog))  # type: ignore[arg-type]
    written = len(transport.written)
    conn.data_received(publish_batch(3, TOPIC + b"-other", [b"third"]))
    conn.data_received(publish_batch(4, TOPIC + b"-other", [b"fourth"]))
    conn.data_received(publish_batch(6, TOPIC + b"-other", [b"fifth", b"sixth"]))
    for _ in range(5):
        await asyncio.sleep(0)
    assert [ev.txn_id for ev in short_way] == [2, 5, 4, 6]
    failed = [pb.PubSubResponse.FromString(f) for f in FrameDecoder(1 << 20).feed(bytes(transport.written[written:]))]
    assert [(a.txnId, a.topic, a.statusCode, a.publishResponse.stored) for a in failed] == \
        [(3, TOPIC + b"-other", pb.SERVICE_DOWN, 0), (4, TOPIC + b"-other", pb.SERVICE_DOWN, 0),
         (6, TOPIC + b"-other", pb.SERVICE_DOWN, 0)]
    assert conn.machine.in_flight == 0 and struct.unpack(">I", bytes(transport.written[:4]))[0] > 0
