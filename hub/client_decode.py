"""Delivered messages decoded once per process, however many subscriptions receive them.

    messages = decode_delivered(protos)     # the pubsub_pb2.Messages of one delivery frame

A process with many subscriptions to one topic (N ``HedwigClient``\\ s or N
subscriptions of one) receives each message N times, once per delivery frame.
Turning the wire message into a ``hub.message.Message`` costs several times
what parsing the frame does, so the client keeps the ``Message`` it made for
each recently delivered wire encoding and hands that one object to every
subscription that gets the same bytes. The key is the message's serialization,
so two deliveries share an object only when every field is the same (a
redelivery with another ``redelivery_count`` is a message of its own).

A consumer's deliveries (``Delivery.consumerId`` set: ``hub.consumer``) skip
the table: a SHARED, FAILOVER or KEY_SHARED subscription hands each message
to one of its consumers, so in a work queue nothing else in the process gets
the same bytes and keeping them would only cost (about a third of decoding a
message, measured). A process with several subscriptions of one topic that
should share decodes uses Hedwig subscriptions (``subscribe``/``start_delivery``).

Shared messages are immutable: ``Message`` is a frozen dataclass and
``properties`` and ``msg_id.remote`` are ``hub.message.ReadOnlyDict``\\ s.

The table keeps the last ``MAX_ENTRIES`` encodings of at most
``MAX_WIRE_BYTES`` each (larger messages are decoded per delivery), so it
holds at most about ``MAX_ENTRIES * MAX_WIRE_BYTES`` of message bytes once
warm, and typically ``MAX_ENTRIES`` times the message size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from hub.message import Message
from hub.proto import pubsub_pb2 as pb

__all__ = ["MAX_ENTRIES", "MAX_WIRE_BYTES", "decode_delivered", "decode_wires"]

MAX_ENTRIES = 4096
"""Recently delivered encodings kept (the spread, in messages, between this process's fastest and slowest
subscription of a topic that still shares decodes)."""

MAX_WIRE_BYTES = 8192
"""Larger messages are not kept (their decode is small next to their size; the table's memory stays bounded)."""

_decoded: dict[bytes, Message] = {}
_order: deque[bytes] = deque()          # _decoded's keys, oldest first (a dict's own first key is slow to find)


def decode_wires(wires: Sequence[bytes], shared: bool = True) -> list[Message]:
    """The ``Message`` of each serialized ``pubsub_pb2.Message`` in ``wires`` (in order), read-only and shared
    with other deliveries of the same bytes; ``google.protobuf.message.DecodeError`` for bytes that are not one.

    ``shared=False``: decoded without the table (read-only still), for deliveries no other subscription of
    the process is likely to get (a consumer's share of a work queue)."""
    if not shared:
        return Message.from_wires(wires)
    table = _decoded
    get = table.get
    out = []
    for wire in wires:
        msg = get(wire)
        if msg is None:
            msg = Message.from_proto(pb.Message.FromString(wire), keep_wire=wire, read_only=True)
            if len(wire) <= MAX_WIRE_BYTES:
                table[wire] = msg
                order = _order
                order.append(wire)
                if len(order) > MAX_ENTRIES:
                    table.pop(order.popleft(), None)   # the oldest: the table is in delivery order
        out.append(msg)
    return out


def decode_delivered(protos: Sequence[pb.Message], shared: bool = True) -> list[Message]:
    """``decode_wires`` of parsed messages (a delivery frame protobuf parsed as a whole)."""
    return decode_wires([proto.SerializeToString() for proto in protos], shared)
