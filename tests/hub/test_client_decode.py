"""The client's shared decode of delivered messages (hub.client_decode) and read-only messages (hub.message)."""

from __future__ import annotations

import collections
import copy
import json
import pickle
from collections.abc import Callable

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from hub import client_decode
from hub.client_decode import decode_delivered, decode_wires
from hub.frames import split_delivery
from hub.message import EMPTY, Message, MessageId, ReadOnlyDict
from hub.proto import pubsub_pb2 as pb
from hub.protocol import ClientConnection, DeliveryReceived, delivery, delivery_batch, encode, response


def _received(topic: bytes, subscriber: bytes, messages: list[Message]) -> list[Message]:
    """The messages a client's protocol decodes from the hub's delivery frame of ``messages``."""
    client: ClientConnection[str] = ClientConnection(max_frame_size=1 << 20)
    events = client.receive_data(delivery_batch(topic, subscriber, [m.wire for m in messages]))
    assert len(events) == 1 and isinstance(events[0], DeliveryReceived)
    assert (events[0].topic, events[0].subscriber) == (topic, subscriber)
    return list(events[0].decoded)


def _sample(n: int, **fields: object) -> list[Message]:
    return [Message(f"body {i}".encode(), {"type": b"History", "n": str(i).encode()},
                    MessageId(100 + i, {"west": 7}), "east", key=b"k%d" % i, publish_time_ms=1_700_000_000_000 + i,
                    **fields) for i in range(n)]   # type: ignore[arg-type]


def test_two_subscriptions_get_the_same_equal_message_object() -> None:
    sent = _sample(5)
    first = (_received(b"t", b"sub-a", sent))
    second = (_received(b"t", b"sub-b", sent[2:]))
    assert first == sent                       # every field survives the trip, equal to what was published
    assert [m.redelivery_count for m in first] == [0] * 5
    assert all(a is b for a, b in zip(first[2:], second, strict=True))   # decoded once, shared


def test_a_consumers_deliveries_are_decoded_apart_equal_and_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_decode, "_decoded", {})
    monkeypatch.setattr(client_decode, "_order", collections.deque())
    sent = _sample(3)
    client: ClientConnection[str] = ClientConnection(max_frame_size=1 << 20)
    frame = delivery_batch(b"t", b"workers", [m.wire for m in sent], 7)   # consumer 7's share of a work queue
    first, again = (client.receive_data(frame)[0], client.receive_data(frame)[0])
    assert isinstance(first, DeliveryReceived) and isinstance(again, DeliveryReceived) and first.consumer == 7
    assert list(first.decoded) == list(again.decoded) == sent
    assert all(a is not b for a, b in zip(first.decoded, again.decoded, strict=True))   # not kept: no table cost
    assert client_decode._decoded == {} and not client_decode._order
    with pytest.raises(TypeError):
        first.decoded[0].properties["x"] = b"y"                          # still read-only, as shared ones are
    resp = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE, statusCode=pb.SUCCESS, txnId=0, topic=b"t",
                             statusMsg="parsed by protobuf")
    resp.delivery.topic, resp.delivery.subscriberId, resp.delivery.consumerId = b"t", b"workers", 7
    for m in sent:
        resp.delivery.messages.append(m.to_proto())
    parsed, = client.receive_data(encode(resp))
    assert isinstance(parsed, DeliveryReceived) and list(parsed.decoded) == sent and client_decode._decoded == {}


def test_a_consumers_loop_decode_is_from_proto_field_for_field() -> None:
    variants = [pb.Message(body=b"plain", srcRegion=b"standalone"), pb.Message(), pb.Message(body=b"x" * 300)]
    full = pb.Message(body=b"b", srcRegion=b"east", key=b"", publishTimeMs=5, redeliveryCount=2, deliverAtMs=9)
    full.msgId.localComponent = 1 << 40
    full.msgId.remoteComponents.add(region=b"west", seqId=3)
    full.header.messageType = "History"
    full.header.properties.entries.add(key="a", value=b"1")
    variants += [full, pb.Message(body=b"id only", msgId=pb.MessageSeqId(localComponent=77))]
    wires = [v.SerializeToString() for v in variants]
    got = decode_wires(wires, shared=False)
    want = [Message.from_proto(v, keep_wire=w, read_only=True) for v, w in zip(variants, wires, strict=True)]
    assert got == want
    for a, b in zip(got, want, strict=True):
        assert (a.wire, type(a.properties), type(a.msg_id.remote), a.key) == (b.wire, ReadOnlyDict, ReadOnlyDict, b.key)
    assert got[3].key == b"" and got[0].key is None and got[3].msg_id.remote == {"west": 3}
    with pytest.raises(DecodeError):
        decode_wires([b"\xff\xff"], shared=False)



def _plain(body: bytes, region: bytes, seq: int, key: bytes | None, stamp: int, count: int) -> bytes:
    m = pb.Message(body=body, srcRegion=region, publishTimeMs=stamp, redeliveryCount=count)
    if seq:
        m.msgId.localComponent = seq
    if key is not None:
        m.key = key
    return m.SerializeToString()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=140), st.sampled_from([b"", b"standalone", b"east", b"r" * 130]),
                          st.sampled_from([0, 1, 127, 128, 16_383, 16_384, 1 << 20, 1 << 21, 1 << 63]),
                          st.one_of(st.none(), st.binary(max_size=140)),
                          st.sampled_from([0, 1_700_000_000_000, 1_700_000_000_001, 1 << 63]),
                          st.sampled_from([0, 1, 300])), min_size=1, max_size=10),
       st.lists(st.tuples(st.integers(0, 9), st.binary(min_size=1, max_size=3)), max_size=2))
def test_a_consumers_read_of_usual_bytes_is_protobufs(
        specs: list[tuple[bytes, bytes, int, bytes | None, int, int]], extra: list[tuple[int, bytes]]) -> None:
    """``from_wires`` reads the usual delivered message from its bytes (issue 29); whatever the bytes (a
    field more, a field repeated, bytes cut short, a region or tail that changes within a run), each message
    equals protobuf's reading, or the call raises as protobuf's parse does."""
    wires = [_plain(*spec) for spec in specs]
    for i, tail in extra:                   # appended fields or junk: protobuf's parse decides
        wires[i % len(wires)] += tail
    try:
        want = [Message.from_proto(pb.Message.FromString(w), keep_wire=w, read_only=True) for w in wires]
    except DecodeError:
        with pytest.raises(DecodeError):
            Message.from_wires(wires)
        return
    got = Message.from_wires(wires)
    assert got == want
    assert [m.wire for m in got] == wires and all(m.msg_id.remote is EMPTY for m in got if not m.msg_id.remote)


def test_a_consumers_read_takes_protobufs_way_for_bytes_it_does_not_know() -> None:
    base = _plain(b"body", b"standalone", 300, None, 1_700_000_000_000, 0)
    cut = [base[:n] for n in range(1, len(base))]
    odd = [base + _plain(b"again", b"", 0, None, 0, 0),            # body twice: protobuf keeps the last
           base + b"\x1a\x02\x08\x05",                            # msgId twice: merged
           b"\x1a\x02\x08\x05" + base,                            # a field out of order
           base.replace(b"\x1a\x03\x08\xac\x02", b"\x1a\x04\x08\xac\x82\x00"),   # a long varint, the same value
           base + b"\x48\xff\xff\xff\xff\x1f",                  # redeliveryCount past 32 bits
           base + b"\x50\x05"]                                     # deliverAtMs
    for wire in cut + odd:
        try:
            want = Message.from_proto(pb.Message.FromString(wire), keep_wire=wire, read_only=True)
        except DecodeError:
            with pytest.raises(DecodeError):
                Message.from_wires([base, wire])
            continue
        assert Message.from_wires([base, wire, base]) == [Message.from_wires([base])[0], want,
                                                           Message.from_wires([base])[0]], wire



def test_a_consumers_usual_messages_are_read_without_protobuf(monkeypatch: pytest.MonkeyPatch) -> None:
    wires = [_plain(b"x" * 100, b"standalone", 1000 + i, None, 1_700_000_000_000 + i // 3, i % 2) for i in range(9)]
    wires.append(_plain(b"keyed", b"", 1 << 40, b"user-7", 0, 0))
    parsed: list[bytes] = []
    monkeypatch.setattr(Message, "_parsed", classmethod(lambda cls, w: parsed.append(w)))
    got = Message.from_wires(wires)
    assert parsed == [] and [m.seq_id for m in got] == [*range(1000, 1009), 1 << 40]
    assert got[-1].key == b"user-7" and got[1].redelivery_count == 1 and got[0].src_region == "standalone"


def test_a_different_redelivery_count_is_a_message_of_its_own() -> None:
    plain, = (_received(b"t", b"s", _sample(1)))
    again, = (_received(b"t", b"s", _sample(1, redelivery_count=2)))
    assert again is not plain and (plain.redelivery_count, again.redelivery_count) == (0, 2)
    assert again.body == plain.body and again.seq_id == plain.seq_id


def test_shared_messages_are_read_only_but_still_dicts() -> None:
    msg, = (_received(b"t", b"s", _sample(1)))
    assert isinstance(msg.properties, dict) and msg.properties == {"type": b"History", "n": b"0"}
    changes: list[Callable[[dict[str, bytes]], object]] = [
        lambda p: p.__setitem__("x", b"1"), lambda p: p.pop("type"), lambda p: p.update(x=b"1"),
        lambda p: p.clear(), lambda p: p.setdefault("x", b"1"), lambda p: p.popitem(),
        lambda p: p.__delitem__("type")]
    assert isinstance(msg.properties, dict)
    for change in changes:
        with pytest.raises(TypeError, match="read-only"):
            change(msg.properties)
    with pytest.raises(TypeError):
        msg.msg_id.remote["west"] = 8   # type: ignore[index]
    with pytest.raises(AttributeError):
        msg.body = b"x"   # type: ignore[misc]
    assert msg.properties == {"type": b"History", "n": b"0"} and msg.msg_id.remote == {"west": 7}
    writable = dict(msg.properties) | {"x": b"1"}
    writable["y"] = b"2"
    assert msg.properties.copy() == {"type": b"History", "n": b"0"} and type(msg.properties.copy()) is dict
    assert json.dumps({k: v.decode() for k, v in msg.properties.items()})


def test_read_only_messages_pickle_and_copy_as_read_only_equals() -> None:
    msg, = (_received(b"t", b"s", _sample(1)))
    for twin in (pickle.loads(pickle.dumps(msg)), copy.deepcopy(msg), copy.copy(msg)):
        assert twin == msg
        assert isinstance(twin.properties, ReadOnlyDict)


def test_messages_without_properties_share_the_one_empty_mapping() -> None:
    bare = Message(b"x", msg_id=MessageId(9))
    msg, = (_received(b"t", b"s", [bare]))
    assert msg.properties is EMPTY and msg.msg_id.remote is EMPTY and msg == bare
    with pytest.raises(TypeError):
        msg.properties["x"] = b"y"
    assert EMPTY == {}


def test_the_table_is_bounded_and_large_messages_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_decode, "MAX_ENTRIES", 3)
    monkeypatch.setattr(client_decode, "_decoded", {})
    monkeypatch.setattr(client_decode, "_order", collections.deque())
    sent = [Message(b"m%d" % i, msg_id=MessageId(i + 1)) for i in range(5)]
    first = (_received(b"t", b"s", sent))
    assert len(client_decode._decoded) == 3
    again = (_received(b"t", b"s2", sent[2:]))          # the newest 3 are kept
    assert all(a is b for a, b in zip(first[2:], again, strict=True))
    oldest, = (_received(b"t", b"s2", sent[:1]))        # the oldest were let go
    assert oldest == first[0] and oldest is not first[0] and len(client_decode._decoded) == 3
    big = Message(b"x" * (client_decode.MAX_WIRE_BYTES + 1), msg_id=MessageId(99))
    one, = (_received(b"t", b"s", [big]))
    two, = (_received(b"t", b"s", [big]))
    assert one == two == big and one is not two and len(client_decode._decoded) == 3


def test_a_frame_protobuf_parses_whole_decodes_to_the_same_shared_messages() -> None:
    sent = _sample(3)
    resp = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE, statusCode=pb.SUCCESS, txnId=0, topic=b"t",
                             statusMsg="an error text: not a frame split by hand")
    resp.delivery.topic, resp.delivery.subscriberId = b"t", b"s"
    for m in sent:
        resp.delivery.messages.add().CopyFrom(m.to_proto())
    events = ClientConnection[str](max_frame_size=1 << 20).receive_data(encode(resp))
    assert len(events) == 1 and isinstance(events[0], DeliveryReceived)
    assert all(a is b for a, b in zip(events[0].decoded, decode_delivered(resp.delivery.messages), strict=True))
    assert list(events[0].decoded) == sent


def test_from_proto_stays_writable_unless_asked() -> None:
    msg = Message.from_proto(_sample(1)[0].to_proto())
    msg.properties["x"] = b"1"   # type: ignore[index]   # the hub's own messages: plain dicts, as before
    assert type(msg.properties) is dict and type(msg.msg_id.remote) is dict


def test_the_hub_s_frames_are_split_by_hand_and_others_left_to_protobuf() -> None:
    sent = _sample(2)
    assert split_delivery(delivery_batch(b"t", b"s", [m.wire for m in sent], 7)[4:]) == \
        (b"t", b"s", [m.wire for m in sent], 7)
    assert split_delivery(delivery(b"t", b"s", sent[0].wire)[4:]) == (b"t", b"s", [sent[0].wire], 0)
    resp = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE, txnId=0, topic=b"t", statusMsg="text")
    resp.delivery.topic = b"t"
    assert split_delivery(encode(resp)[4:]) is None
    assert split_delivery(encode(response(3, topic=b"t"))[4:]) is None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=12), st.binary(max_size=12), st.lists(st.binary(max_size=60), max_size=3),
       st.booleans(), st.integers(min_value=0, max_value=2**64 - 1), st.integers(min_value=0, max_value=3),
       st.booleans(), st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=255),
       st.binary(max_size=6))
def test_a_split_frame_is_exactly_what_protobuf_parses(topic: bytes, sub: bytes, bodies: list[bytes], single: bool,
                                                       consumer: int, txn: int, status: bool, at: int, byte: int,
                                                       extra: bytes) -> None:
    """Whatever the bytes (hub frames, other bodies, cut, altered, with junk after): either ``split_delivery``
    leaves the frame to protobuf, or it gives what protobuf parses from it, and its wires fail to decode
    exactly when protobuf refuses the frame."""
    resp = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE, txnId=txn, topic=topic)
    if status:
        resp.statusMsg = "x"
    resp.delivery.topic, resp.delivery.subscriberId, resp.delivery.consumerId = topic, sub, consumer
    for i, body in enumerate(bodies):
        target = resp.delivery.message if single and i == 0 else resp.delivery.messages.add()
        target.CopyFrom(Message(body, {"k": body[:2]}, MessageId(i + 1)).to_proto())
    good = encode(resp)[4:]
    for data in (good, good[:at], good[:at] + bytes([byte]) + good[at + 1:], good + extra, extra + good):
        split = split_delivery(data)
        try:
            parsed = pb.PubSubResponse.FromString(data)
        except DecodeError:
            parsed = None
        if split is None:
            continue
        if parsed is None:
            with pytest.raises(DecodeError):
                decode_wires(split[2])
            continue
        d = parsed.delivery
        assert parsed.txnId == 0 and parsed.WhichOneof("body") == "delivery"
        assert split[0] == d.topic and split[1] == d.subscriberId and split[3] == d.consumerId
        try:
            decoded = decode_wires(split[2])
        except DecodeError:
            pytest.fail("protobuf parsed the frame but a wire did not decode")
        assert decoded == [Message.from_proto(p) for p in (d.messages or (d.message,))]
