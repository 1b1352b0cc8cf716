"""hub.protocol: the sans-IO state machine on bytes (limits, unknown ops, statuses, txn matching)."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.frames import message_batch, publish_batch, stamped_wires
from hub.proto import pubsub_pb2 as pb
from hub.protocol import (
    BODIES_ALONE_FROM,
    MAX_SUBSCRIBER_BYTES,
    MAX_TOPIC_BYTES,
    ClientConnection,
    ConnectionBroken,
    DeliveryReceived,
    Reject,
    RequestReceived,
    ResponseReceived,
    ServerConnection,
    delivery,
    delivery_batch,
    encode,
    published,
    published_batch,
    response,
)


def server() -> ServerConnection:
    return ServerConnection(max_frame_size=4096, max_message_size=100)


def publish(topic: bytes = b"t", body: bytes = b"x", txn: int = 1) -> pb.PubSubRequest:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=txn, topic=topic)
    req.publishRequest.topic = topic
    req.publishRequest.msg.body = body
    return req


def test_valid_publish_split_across_feeds() -> None:
    data = encode(publish(txn=7)) + encode(publish(b"u", txn=8))
    conn = server()
    events = [e for i in range(len(data)) for e in conn.receive_data(data[i:i + 1])]
    assert [type(e) for e in events] == [RequestReceived, RequestReceived]
    assert [e.topic for e in events if isinstance(e, RequestReceived)] == [b"t", b"u"]


def status_of(req: pb.PubSubRequest) -> int:
    (event,) = server().receive_data(encode(req))
    assert isinstance(event, Reject)
    assert event.response.txnId == req.txnId
    return event.response.statusCode


def test_statuses() -> None:
    assert status_of(publish(topic=b"")) == pb.MALFORMED_REQUEST
    assert status_of(publish(topic=b"\xff\xfe")) == pb.MALFORMED_REQUEST
    assert status_of(publish(body=b"y" * 101)) == pb.MESSAGE_TOO_LARGE
    unknown = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, txnId=3, topic=b"t")
    unknown.type = 99  # type: ignore[assignment]
    assert status_of(unknown) == pb.UNKNOWN_OPERATION
    no_body = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.SUBSCRIBE, txnId=4, topic=b"t")
    assert status_of(no_body) == pb.MALFORMED_REQUEST
    sub = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.SUBSCRIBE, txnId=5, topic=b"t")
    sub.subscribeRequest.topic = b"t"
    assert status_of(sub) == pb.MALFORMED_REQUEST  # no subscriber id


def test_garbage_frame_is_answered_and_the_stream_continues() -> None:
    conn = server()
    events = conn.receive_data(struct.pack(">I", 3) + b"\xff\xff\xff" + encode(publish(txn=2)))
    assert isinstance(events[0], Reject) and events[0].response.statusCode == pb.MALFORMED_REQUEST
    assert isinstance(events[1], RequestReceived)


def test_oversized_frame_breaks_the_connection_after_earlier_frames() -> None:
    conn = server()
    events = conn.receive_data(encode(publish()) + struct.pack(">I", 1 << 30))
    assert isinstance(events[0], RequestReceived) and isinstance(events[-1], ConnectionBroken)
    assert conn.receive_data(encode(publish())) == []


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=600), st.integers(min_value=1, max_value=50))
def test_fuzzed_bytes_never_raise(data: bytes, chunk: int) -> None:
    conn = server()
    for i in range(0, len(data), chunk):
        for event in conn.receive_data(data[i:i + chunk]):
            assert isinstance(event, RequestReceived | Reject | ConnectionBroken)
            if isinstance(event, Reject):
                assert event.response.statusCode != pb.SUCCESS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=30), min_size=1, max_size=20), st.integers(1, 40))
def test_fuzzed_valid_publishes_all_arrive(topics: list[bytes], chunk: int) -> None:
    reqs = [publish(topic=t.hex().encode(), txn=i + 1) for i, t in enumerate(topics)]
    data = b"".join(encode(r) for r in reqs)
    conn = server()
    got = [e for i in range(0, len(data), chunk) for e in conn.receive_data(data[i:i + chunk])]
    assert [e.request.txnId for e in got if isinstance(e, RequestReceived)] == [r.txnId for r in reqs]


def test_client_matches_txns_and_splits_deliveries() -> None:
    client: ClientConnection[str] = ClientConnection(max_frame_size=4096)
    client.send_request(publish(), "first")
    client.send_request(publish(), "second")
    msg = pb.Message(body=b"hi")
    data = encode(response(2)) + delivery(b"t", b"s", msg) + encode(response(1))
    events = client.receive_data(data)
    assert [e.value for e in events if isinstance(e, ResponseReceived)] == ["second", "first"]
    assert [e.message.body for e in events if isinstance(e, DeliveryReceived)] == [b"hi"]
    assert len(client) == 0
    events = client.receive_data(encode(response(0, pb.MALFORMED_REQUEST, "bad")))
    assert isinstance(events[-1], ConnectionBroken)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_client_fuzzed_bytes_never_raise(data: bytes) -> None:
    client: ClientConnection[int] = ClientConnection(max_frame_size=1024)
    client.send_request(publish(), 1)
    for event in client.receive_data(data):
        assert event is not None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300), st.binary(max_size=2000),
       st.dictionaries(st.text(max_size=10), st.binary(max_size=20), max_size=3),
       st.integers(min_value=0, max_value=2**63), st.text(max_size=10))
def test_delivery_frame_is_what_protobuf_serializes(topic: bytes, subscriber: bytes, body: bytes,
                                                     props: dict[str, bytes], seq: int, region: str) -> None:
    """The hand-assembled delivery frame (message serialized once) equals protobuf's own, byte for byte."""
    from hub.message import Message, MessageId

    msg = Message(body, props, MessageId(seq, {"r2": 7} if seq % 2 else {}), region)
    resp = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE, statusCode=pb.SUCCESS, txnId=0, topic=topic)
    resp.delivery.topic = topic
    resp.delivery.subscriberId = subscriber
    resp.delivery.message.CopyFrom(msg.to_proto())
    assert delivery(topic, subscriber, msg.wire) == encode(resp)
    assert delivery(topic, subscriber, msg.to_proto()) == encode(resp)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300),
       st.lists(st.tuples(st.binary(max_size=2000), st.integers(min_value=1, max_value=2**63)), min_size=2,
                max_size=8))
def test_batched_delivery_frame_is_what_protobuf_serializes_and_the_client_splits_it(
        topic: bytes, subscriber: bytes, messages: list[tuple[bytes, int]]) -> None:
    from hub.message import Message, MessageId

    msgs = [Message(body, {"k": body[:3]}, MessageId(seq)) for body, seq in messages]
    resp = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE, statusCode=pb.SUCCESS, txnId=0, topic=topic)
    resp.delivery.topic = topic
    resp.delivery.subscriberId = subscriber
    for m in msgs:
        resp.delivery.messages.add().CopyFrom(m.to_proto())
    frame = delivery_batch(topic, subscriber, [m.wire for m in msgs])
    assert frame == encode(resp)
    client: ClientConnection[str] = ClientConnection(max_frame_size=1 << 20)
    events = client.receive_data(frame + delivery(topic, subscriber, msgs[0].wire))
    frames = [e for e in events if isinstance(e, DeliveryReceived)]
    assert [len(e.messages) for e in frames] == [len(messages), 1]          # one event per frame
    assert [(e.topic, e.subscriber, m.body, m.msgId.localComponent) for e in frames for m in e.messages] == \
        [(topic, subscriber, body, seq) for body, seq in [*messages, messages[0]]]


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**64 - 1), st.binary(max_size=300),
       st.integers(min_value=0, max_value=2**64 - 1))
def test_publish_response_is_what_protobuf_serializes(txn: int, topic: bytes, seq: int) -> None:
    resp = response(txn, topic=topic)
    resp.publishResponse.publishedMsgId.localComponent = seq
    assert published(txn, topic, seq) == encode(resp)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**64 - 1), st.binary(max_size=300),
       st.integers(min_value=0, max_value=2**64 - 1), st.integers(min_value=0, max_value=2**32 - 1))
def test_batched_publish_response_is_what_protobuf_serializes(txn: int, topic: bytes, first: int,
                                                              stored: int) -> None:
    resp = response(txn, topic=topic)
    if first:
        resp.publishResponse.publishedMsgId.localComponent = first
    resp.publishResponse.stored = stored
    assert published_batch(txn, topic, first, stored) == encode(resp)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.dictionaries(st.text(max_size=10), st.binary(max_size=20), max_size=3),
       st.integers(min_value=0, max_value=2**63),
       st.dictionaries(st.text(min_size=1, max_size=5), st.integers(min_value=1, max_value=2**40), max_size=3),
       st.text(max_size=10))
def test_message_from_proto_is_the_message_to_proto_came_from(body: bytes, props: dict[str, bytes], seq: int,
                                                               remote: dict[str, int], region: str) -> None:
    """``from_proto`` fills the frozen dataclass without ``__init__``: same value, same wire, still frozen."""
    from hub.message import Message, MessageId

    msg = Message(body, props, MessageId(seq, remote), region)
    back = Message.from_proto(msg.to_proto())
    assert back == msg and back.msg_id == msg.msg_id and back.seq_id == seq
    kept = Message.from_proto(msg.to_proto(), keep_wire=True)
    assert kept == msg and kept.wire == msg.wire
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.body = b"changed"  # type: ignore[misc]


def subscribe(topic: bytes = b"t", sub: bytes = b"s", txn: int = 1) -> pb.PubSubRequest:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.SUBSCRIBE, txnId=txn, topic=topic)
    req.subscribeRequest.topic = topic
    req.subscribeRequest.subscriberId = sub
    return req


def reject_of(req: pb.PubSubRequest, conn: ServerConnection | None = None) -> pb.PubSubResponse:
    (event,) = (conn or server()).receive_data(encode(req))
    assert isinstance(event, Reject), event
    assert event.response.txnId == req.txnId
    return event.response


@pytest.mark.parametrize(("req", "says"), [
    (publish(topic=b"a\x00b"), "topic must not contain NUL"),
    (subscribe(topic=b"a\x00b"), "topic must not contain NUL"),
    (subscribe(sub=b"\x00"), "subscriber id must not contain NUL"),
    (publish(topic=b"t" * (MAX_TOPIC_BYTES + 1)), f"topic of 256 bytes is over the limit of {MAX_TOPIC_BYTES} bytes"),
    (publish(topic="é".encode() * 128), "topic of 256 bytes is over the limit of 255 bytes"),   # bytes, not chars
    (subscribe(sub=b"s" * (MAX_SUBSCRIBER_BYTES + 1)), "subscriber id of 256 bytes is over the limit of 255"),
    (subscribe(topic=b""), "topic must be non-empty UTF-8 of at most 255 bytes"),
    (subscribe(sub=b"\xff"), "subscriber id must be UTF-8"),
])
def test_bad_names_are_malformed_naming_the_limit(req: pb.PubSubRequest, says: str) -> None:
    resp = reject_of(req)
    assert resp.statusCode == pb.MALFORMED_REQUEST      # old code: NUL and over-long names were dispatched
    assert says in resp.statusMsg
    assert len(resp.statusMsg) < 100 and len(resp.topic) <= MAX_TOPIC_BYTES   # the name is not echoed


def test_a_huge_topic_is_answered_not_a_broken_connection() -> None:
    conn = ServerConnection(max_frame_size=4 << 20, max_message_size=1258291)
    huge = b"t" * 1_300_000
    resp = reject_of(publish(topic=huge), conn)
    assert resp.statusCode == pb.MALFORMED_REQUEST and "1300000 bytes" in resp.statusMsg
    assert resp.topic == b"" and len(resp.SerializeToString()) < 200
    assert [type(e) for e in conn.receive_data(encode(publish(txn=2)))] == [RequestReceived]   # still serving


def test_names_at_the_limits_fit_a_subscription_key() -> None:
    from hub.metadata import SEPARATOR
    from metastore.backends.lmdb import MAX_KEY_BYTES

    topic, sub = "é".encode() * 127 + b"t", b"s" * MAX_SUBSCRIBER_BYTES
    assert len(topic) == MAX_TOPIC_BYTES
    (event,) = server().receive_data(encode(subscribe(topic, sub)))
    assert isinstance(event, RequestReceived) and (event.topic, event.subscriber) == (topic, sub)
    assert len(topic) + len(SEPARATOR) + len(sub) <= MAX_KEY_BYTES   # the smallest backend's key limit


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_accepted_names_are_exactly_the_valid_ones(topic: bytes, sub: bytes) -> None:
    def valid(name: bytes, limit: int) -> bool:
        try:
            name.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return 0 < len(name) <= limit and b"\x00" not in name

    (event,) = server().receive_data(encode(subscribe(topic, sub)))
    ok = valid(topic, MAX_TOPIC_BYTES) and valid(sub, MAX_SUBSCRIBER_BYTES)
    assert isinstance(event, RequestReceived) == ok
    if not ok:
        assert isinstance(event, Reject) and event.response.statusCode == pb.MALFORMED_REQUEST


def test_a_burst_of_tiny_frames_is_served_a_budget_per_turn() -> None:
    conn = ServerConnection(max_frame_size=4096, max_message_size=100, max_requests_per_turn=100)
    burst = b"\x00\x00\x00\x00" * 1000 + encode(publish(txn=5))   # 1000 empty frames, then a real request
    first = conn.receive_data(burst)
    assert len(first) == 100 and conn.backlogged
    served = list(first)
    while conn.backlogged:
        served += conn.next_events()
        assert len(served) <= 1001
    assert len(served) == 1001 and isinstance(served[-1], RequestReceived) and served[-1].request.txnId == 5
    assert conn.buffered == 0 and conn.next_events() == [] and not conn.backlogged


@pytest.mark.parametrize("version", [0, 2, 77])
def test_a_protocol_version_other_than_one_is_refused_naming_the_version_spoken(version: int) -> None:
    req = publish(txn=9)
    req.protocolVersion = version  # type: ignore[assignment]
    resp = reject_of(req)
    assert resp.statusCode == pb.MALFORMED_REQUEST
    assert f"protocolVersion {version} is not supported" in resp.statusMsg and "VERSION_ONE" in resp.statusMsg


def test_half_close_waits_for_the_answers_in_flight() -> None:
    conn = server()
    (ev,) = conn.receive_data(encode(publish()))
    assert isinstance(ev, RequestReceived)
    conn.request_started()
    conn.eof_received()
    assert not conn.close_now          # the publish is still being persisted: its answer must go out
    conn.request_finished()
    assert conn.close_now
    idle = server()
    idle.eof_received()
    assert idle.close_now


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**64 - 1),
       st.lists(st.tuples(st.binary(max_size=300), st.integers(min_value=0, max_value=2**63 - 1),
                          st.binary(max_size=20)), max_size=5))
def test_a_message_batch_entry_is_what_protobuf_serializes(first: int, fields: list[tuple[bytes, int, bytes]]) -> None:
    messages = [pb.Message(body=body, publishTimeMs=ms, srcRegion=region) for body, ms, region in fields]
    entry = pb.MessageBatch(first_local_seq_id=first)
    entry.messages.extend(messages)
    assert message_batch(first, messages) == entry.SerializeToString()


_LONG_BODIES = st.integers(min_value=16_380, max_value=16_400).map(lambda n: b"L" * n)
"""Bodies of about 16 KiB, where a length's varint grows a byte (of little entropy: hypothesis's health check)."""


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=2**64 - 1),
       st.lists(st.one_of(st.binary(max_size=300), _LONG_BODIES), min_size=1, max_size=BODIES_ALONE_FROM + 2))
def test_a_batch_of_bodies_framed_by_hand_is_what_protobuf_serializes(topic: bytes, txn: int,
                                                                      bodies: list[bytes]) -> None:
    """The client's hand-framed batched publish equals protobuf's own request, byte for byte, and the hub
    reads it as a batched publish without delays (``plain_bytes``: the bodies' total)."""
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=txn, topic=topic)
    req.publishRequest.topic = topic
    if len(bodies) == 1:   # alone: a plain publish
        req.publishRequest.msg.body = bodies[0]
    else:
        for body in bodies:
            req.publishRequest.msgs.add(body=body)
    frame = publish_batch(txn, topic, bodies)
    assert frame == encode(req)
    if topic and b"\x00" not in topic and len(topic) <= MAX_TOPIC_BYTES and _utf8(topic):
        (event,) = ServerConnection(max_frame_size=1 << 20, max_message_size=1 << 20).receive_data(frame)
        assert isinstance(event, RequestReceived)
        pub = event.request.publishRequest
        assert ([m.body for m in pub.msgs] or [pub.msg.body]) == bodies
        assert event.plain_bytes == (sum(map(len, bodies)) if len(bodies) > 1 else -1)
        assert event.bodies == (bodies if len(bodies) >= BODIES_ALONE_FROM else None)   # stamped as bytes


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=300), _LONG_BODIES), max_size=5),
       st.binary(max_size=20), st.integers(min_value=0, max_value=2**64 - 1))
def test_stamped_bodies_are_what_protobuf_serializes(bodies: list[bytes], region: bytes, ms: int) -> None:
    """The hub's stamp of a batched publish of bodies alone, made from the bodies: protobuf's bytes."""
    want = [pb.Message(body=b, srcRegion=region, publishTimeMs=ms).SerializeToString() for b in bodies]
    assert stamped_wires(bodies, region, ms) == want


def test_a_batch_with_more_than_bodies_is_checked_message_by_message() -> None:
    """A header, a key, a region, a delay or an unknown field: no ``bodies`` (each message is looked at)."""
    conn = ServerConnection(max_frame_size=4096, max_message_size=100)
    n = BODIES_ALONE_FROM
    for extra in ({"key": b"k"}, {"key": b""}, {"header": pb.MessageHeader(messageType="t")},
                  {"srcRegion": b"elsewhere"}, {"publishTimeMs": 5}, {"deliverAtMs": 0}, {}):
        for where in (0, n - 1):
            req = publish()
            req.publishRequest.ClearField("msg")
            for i in range(n):
                req.publishRequest.msgs.add(body=b"b", **(extra if where == i else {}))
            (event,) = conn.receive_data(encode(req))
            assert isinstance(event, RequestReceived) and event.plain_bytes == (-1 if "deliverAtMs" in extra else n)
            assert event.bodies == ([b"b"] * n if not extra else None)
            conn.request_finished()
    req = publish()
    req.publishRequest.ClearField("msg")
    for _ in range(n - 1):
        req.publishRequest.msgs.add(body=b"b")
    req.publishRequest.msgs.append(pb.Message.FromString(b"\x0a\x01b\x78\x01"))   # and field 15: unknown
    (event,) = conn.receive_data(encode(req))
    assert isinstance(event, RequestReceived) and event.bodies is None and event.plain_bytes == n
    conn.request_finished()
    req = publish()
    req.publishRequest.ClearField("msg")
    for i in range(n):
        req.publishRequest.msgs.add(body=b"x" * (101 if i == 1 else 1))
    (event,) = conn.receive_data(encode(req))   # bodies alone, one too large: refused as before
    assert isinstance(event, Reject) and event.response.statusCode == pb.MESSAGE_TOO_LARGE


def _utf8(name: bytes) -> bool:
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_a_batched_publish_with_a_delay_is_not_plain() -> None:
    """A message with a delivery delay in a batch: the hub stamps each message on its own (``plain_bytes`` -1)."""
    req = publish()
    req.publishRequest.ClearField("msg")
    req.publishRequest.msgs.add(body=b"a")
    req.publishRequest.msgs.add(body=b"b", deliverAfterMs=5)
    (event,) = ServerConnection(max_frame_size=4096, max_message_size=100).receive_data(encode(req))
    assert isinstance(event, RequestReceived) and event.plain_bytes == -1
    del req.publishRequest.msgs[1]
    (event,) = ServerConnection(max_frame_size=4096, max_message_size=100).receive_data(encode(req))
    assert isinstance(event, RequestReceived) and event.plain_bytes == 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=3),
       st.lists(st.tuples(st.binary(max_size=200), st.integers(min_value=1, max_value=2**63)), min_size=2,
                max_size=8))
def test_a_run_built_once_gives_every_subscription_delivery_batch_s_frame(
        subscribers: list[bytes], messages: list[tuple[bytes, int]]) -> None:
    """``delivery_run`` (the run's message fields assembled once, shared by the subscriptions that get it) is
    byte for byte ``delivery_batch`` for each subscriber, and another run of as many messages gets its own."""
    from hub.frames import delivery_run
    from hub.message import Message, MessageId

    msgs = [Message(body, {"k": body[:3]}, MessageId(seq)) for body, seq in messages]
    other = [Message(body + b"!", msg_id=MessageId(seq)) for body, seq in messages]
    for sub in subscribers:
        assert delivery_run(b"topic", sub, msgs) == delivery_batch(b"topic", sub, [m.wire for m in msgs])
        assert delivery_run(b"topic", sub, other) == delivery_batch(b"topic", sub, [m.wire for m in other])
        assert delivery_run(b"topic", sub, msgs[1:]) == delivery_batch(b"topic", sub, [m.wire for m in msgs[1:]])


_UNKNOWN_FIELD = b"\x7a\x03abc"   # field 15, length-delimited: a field of a newer client


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=2**64 - 1), st.binary(max_size=300), st.binary(max_size=20),
       st.one_of(st.none(), st.tuples(st.dictionaries(st.text(max_size=5), st.binary(max_size=5), max_size=2),
                                      st.text(max_size=5))),
       st.one_of(st.none(), st.binary(max_size=5)), st.integers(min_value=0, max_value=2**63 - 1),
       st.one_of(st.none(), st.integers(min_value=0, max_value=2**62)), st.binary(max_size=5),
       st.one_of(st.none(), st.dictionaries(st.sampled_from([b"east", b"west"]), st.integers(0, 2**40))),
       st.booleans())
def test_a_persisted_message_is_from_proto_of_the_message_with_its_seq_id(
        seq: int, body: bytes, region: bytes, header: tuple[dict[str, bytes], str] | None, key: bytes | None,
        publish_ms: int, deliver_at: int | None, producer: bytes, remote: dict[bytes, int] | None,
        unknown: bool) -> None:
    from hub.message import Message

    m = pb.Message(body=body, srcRegion=region, publishTimeMs=publish_ms, producer=producer)
    if header is not None:
        m.header.messageType = header[1]
        for k, v in header[0].items():
            m.header.properties.entries.add(key=k, value=v)
    if key is not None:
        m.key = key
    if deliver_at is not None:
        m.deliverAtMs = deliver_at
    if remote is not None:          # a region's message: it carries a msg id already
        for r, s in sorted(remote.items()):
            m.msgId.remoteComponents.add(region=r, seqId=s)
    if unknown:
        m = pb.Message.FromString(m.SerializeToString() + _UNKNOWN_FIELD)
    wires: list[bytes] = []
    message_batch(seq, [m], wires)
    (stored,) = wires
    assert stored == m.SerializeToString()
    expected = pb.Message()
    expected.CopyFrom(m)
    expected.msgId.localComponent = seq
    got = Message.persisted(m, seq, stored)
    assert got == Message.from_proto(expected)
    assert got.wire == expected.SerializeToString()       # byte for byte what protobuf serializes
    assert m.SerializeToString() == stored                # the stored message is left as it was


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=2**63), st.lists(
    st.tuples(st.binary(max_size=200), st.sampled_from([b"", b"standalone", b"r" * 130]),
              st.one_of(st.none(), st.binary(max_size=4)), st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_a_persisted_run_is_persisted_of_each_message_in_seq_order(
        first: int, specs: list[tuple[bytes, bytes, bytes | None, bool, bool]]) -> None:
    from hub.message import Message

    msgs = []
    for body, region, key, header, remote in specs:
        m = pb.Message(body=body, srcRegion=region, publishTimeMs=1_700_000_000_000)
        if key is not None:
            m.key = key
        if header:
            m.header.properties.entries.add(key="type", value=b"History")
        if remote:                          # a region's message: the plain way, inside the run
            m.msgId.remoteComponents.add(region=b"west", seqId=3)
        msgs.append(m)
    wires: list[bytes] = []
    message_batch(first, msgs, wires)
    run = Message.persisted_run(msgs, first, wires)
    assert [m.seq_id for m in run] == list(range(first, first + len(msgs)))
    for i, (m, got) in enumerate(zip(msgs, run, strict=True)):
        expected = pb.Message()
        expected.CopyFrom(m)
        expected.msgId.localComponent = first + i
        assert got == Message.from_proto(expected)
        assert got.wire == expected.SerializeToString()     # byte for byte what protobuf serializes


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=2**40), st.lists(
    st.tuples(st.binary(max_size=140), st.sampled_from([b"", b"standalone", b"east", b"west"]),
              st.sampled_from([0, 1, 1_700_000_000_000, 1_700_000_000_001]), st.booleans()),
    min_size=1, max_size=8))
def test_a_run_of_bodies_alone_is_built_from_its_wires_as_from_proto_would(
        first: int, specs: list[tuple[bytes, bytes, int, bool]]) -> None:
    """persisted_run's path for the usual run (bodies alone with the run's stamp, ``stamped_wires``) takes a
    message only when its wire holds nothing else: another stamp or an unknown field takes the plain way."""
    from hub.message import Message

    msgs, wires = [], []
    for body, region, time_ms, unknown in specs:
        wire = stamped_wires([body], region, time_ms)[0]
        if unknown:
            wire += _UNKNOWN_FIELD
        msgs.append(pb.Message.FromString(wire))
        wires.append(wire)
    run = Message.persisted_run(msgs, first, wires)
    for i, (m, got) in enumerate(zip(msgs, run, strict=True)):
        expected = pb.Message()
        expected.CopyFrom(m)
        expected.msgId.localComponent = first + i
        assert got == Message.from_proto(expected)
        assert got.wire == expected.SerializeToString()
        assert got.body == m.body and got.seq_id == first + i
