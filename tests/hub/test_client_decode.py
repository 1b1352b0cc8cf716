"""The client's shared decode of delivered messages (hub.client_decode) and read-only messages (hub.message)."""

from __future__ import annotations

import collections
import copy
import json
import pickle
from collections.abc import Callable

import pytest

from hub import client_decode
from hub.client_decode import decode_delivered
from hub.message import EMPTY, Message, MessageId, ReadOnlyDict
from hub.proto import pubsub_pb2 as pb
from hub.protocol import ClientConnection, DeliveryReceived, delivery_batch


def _received(topic: bytes, subscriber: bytes, messages: list[Message]) -> list[pb.Message]:
    """The pubsub_pb2.Messages a client parses from the hub's delivery frame of ``messages``."""
    client: ClientConnection[str] = ClientConnection(max_frame_size=1 << 20)
    events = client.receive_data(delivery_batch(topic, subscriber, [m.wire for m in messages]))
    assert len(events) == 1 and isinstance(events[0], DeliveryReceived)
    return list(events[0].messages)


def _sample(n: int, **fields: object) -> list[Message]:
    return [Message(f"body {i}".encode(), {"type": b"History", "n": str(i).encode()},
                    MessageId(100 + i, {"west": 7}), "east", key=b"k%d" % i, publish_time_ms=1_700_000_000_000 + i,
                    **fields) for i in range(n)]   # type: ignore[arg-type]


def test_two_subscriptions_get_the_same_equal_message_object() -> None:
    sent = _sample(5)
    first = decode_delivered(_received(b"t", b"sub-a", sent))
    second = decode_delivered(_received(b"t", b"sub-b", sent[2:]))
    assert first == sent                       # every field survives the trip, equal to what was published
    assert [m.redelivery_count for m in first] == [0] * 5
    assert all(a is b for a, b in zip(first[2:], second, strict=True))   # decoded once, shared


def test_a_different_redelivery_count_is_a_message_of_its_own() -> None:
    plain, = decode_delivered(_received(b"t", b"s", _sample(1)))
    again, = decode_delivered(_received(b"t", b"s", _sample(1, redelivery_count=2)))
    assert again is not plain and (plain.redelivery_count, again.redelivery_count) == (0, 2)
    assert again.body == plain.body and again.seq_id == plain.seq_id


def test_shared_messages_are_read_only_but_still_dicts() -> None:
    msg, = decode_delivered(_received(b"t", b"s", _sample(1)))
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
    msg, = decode_delivered(_received(b"t", b"s", _sample(1)))
    for twin in (pickle.loads(pickle.dumps(msg)), copy.deepcopy(msg), copy.copy(msg)):
        assert twin == msg
        assert isinstance(twin.properties, ReadOnlyDict)


def test_messages_without_properties_share_the_one_empty_mapping() -> None:
    bare = Message(b"x", msg_id=MessageId(9))
    msg, = decode_delivered(_received(b"t", b"s", [bare]))
    assert msg.properties is EMPTY and msg.msg_id.remote is EMPTY and msg == bare
    with pytest.raises(TypeError):
        msg.properties["x"] = b"y"
    assert EMPTY == {}


def test_the_table_is_bounded_and_large_messages_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_decode, "MAX_ENTRIES", 3)
    monkeypatch.setattr(client_decode, "_decoded", collections.OrderedDict())
    sent = [Message(b"m%d" % i, msg_id=MessageId(i + 1)) for i in range(5)]
    first = decode_delivered(_received(b"t", b"s", sent))
    assert len(client_decode._decoded) == 3
    again = decode_delivered(_received(b"t", b"s2", sent[2:]))          # the newest 3 are kept
    assert all(a is b for a, b in zip(first[2:], again, strict=True))
    oldest, = decode_delivered(_received(b"t", b"s2", sent[:1]))        # the oldest were let go
    assert oldest == first[0] and oldest is not first[0] and len(client_decode._decoded) == 3
    big = Message(b"x" * (client_decode.MAX_WIRE_BYTES + 1), msg_id=MessageId(99))
    one, = decode_delivered(_received(b"t", b"s", [big]))
    two, = decode_delivered(_received(b"t", b"s", [big]))
    assert one == two == big and one is not two and len(client_decode._decoded) == 3


def test_from_proto_stays_writable_unless_asked() -> None:
    msg = Message.from_proto(_sample(1)[0].to_proto())
    msg.properties["x"] = b"1"   # type: ignore[index]   # the hub's own messages: plain dicts, as before
    assert type(msg.properties) is dict and type(msg.msg_id.remote) is dict
