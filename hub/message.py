"""A published message as applications, handlers and filters see it.

    msg = Message(body=b"hello", properties={"type": b"History"})
    msg.seq_id          # the local component of its seq id (1, 2, 3, ... per topic); 0 before publish
    msg.msg_id          # MessageId(local, {region: seq}) with the per-region components
    msg.src_region      # the region that first persisted it ("standalone" by default)
    msg.message_type    # the header's system property messageType ("" when unset; for filters)
    msg.key             # the message key (bytes), None when it was published without one
    msg.publish_time_ms # the owner's clock (epoch ms) when it was stored; 0 for messages stored before
    msg.redelivery_count  # on delivery to a consumer: how often it was handed out before (0 the first time)
    msg.deliver_at_ms   # delayed delivery (hub.delayed): not handed out before this (epoch ms); 0: not delayed

``Message.from_proto`` / ``to_proto`` convert to and from the wire's
``pubsub_pb2.Message``. ``hub.client.Message`` is this class.

A ``Message`` is a frozen dataclass. ``from_proto(..., read_only=True)`` also
makes its mappings (``properties``, ``msg_id.remote``) ``ReadOnlyDict``s: the
client decodes a delivered message once per process and hands that one object
to every subscription that receives it (``hub.client_decode``), so nothing in
it may change.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bookie.wire.framing import varint
from hub.body_publish import StampedBody
from hub.frames import long_varint
from hub.proto import pubsub_pb2 as pb

__all__ = ["EMPTY", "Message", "MessageId", "ReadOnlyDict", "SubscriptionPreferences"]


class ReadOnlyDict(dict):  # type: ignore[type-arg]
    """A ``dict`` that refuses changes (``TypeError``): the mappings of a message shared between subscriptions.

    It is still a ``dict`` (``isinstance``, ``==``, ``json``); ``copy()`` and ``|`` give a plain, writable
    ``dict``, and pickling or ``copy.deepcopy`` give a ``ReadOnlyDict`` again.
    """

    __slots__ = ()

    def _read_only(self, *args: object, **kwargs: object) -> None:
        raise TypeError("this mapping belongs to a delivered message, which may be shared between "
                        "subscriptions: it is read-only (copy it with dict(...) to change it)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore

    def __reduce__(self) -> tuple[type[ReadOnlyDict], tuple[dict[object, object]]]:
        return ReadOnlyDict, (dict(self),)


EMPTY = ReadOnlyDict()
"""The one empty ``ReadOnlyDict``: every read-only message without properties or remote components shares it."""


_new = object.__new__
"""``from_proto`` builds the frozen dataclasses without ``__init__``: ``__init__`` sets each field
through ``object.__setattr__``, and a message is built once per delivery on the hot path, so the
fields go straight into the instance dict (every field, as ``__init__`` would)."""


@dataclass(frozen=True)
class MessageId:
    """A seq id: the local component plus one component per remote region (a version vector)."""

    local: int = 0
    remote: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_proto(cls, seq: pb.MessageSeqId, *, read_only: bool = False) -> MessageId:
        """The id of ``seq``; with ``read_only``, ``remote`` is a ``ReadOnlyDict``."""
        out = _new(cls)
        fields = out.__dict__
        fields["local"] = seq.localComponent
        remote = seq.remoteComponents
        if read_only:
            fields["remote"] = ReadOnlyDict({r.region.decode("utf-8", "replace"): r.seqId for r in remote}) \
                if remote else EMPTY
        else:
            fields["remote"] = {r.region.decode("utf-8", "replace"): r.seqId for r in remote} if remote else {}
        return out

    def to_proto(self) -> pb.MessageSeqId:
        out = pb.MessageSeqId(localComponent=self.local)
        for region, seq in sorted(self.remote.items()):
            out.remoteComponents.add(region=region.encode(), seqId=seq)
        return out


@dataclass(frozen=True)
class Message:
    """One message: ``body`` (bytes), ``properties`` (str -> bytes), and once published its ids.

    ``message_type`` is the header's one system property (``MessageHeader.messageType`` of the
    message filter design); ``properties`` are the application's own.
    """

    body: bytes
    properties: Mapping[str, bytes] = field(default_factory=dict)
    msg_id: MessageId = field(default_factory=MessageId)
    src_region: str = ""
    message_type: str = ""
    key: bytes | None = None
    publish_time_ms: int = 0
    redelivery_count: int = 0
    deliver_at_ms: int = 0

    @property
    def seq_id(self) -> int:
        """The local component of the seq id (0 for a message not yet published)."""
        return self.msg_id.local

    @classmethod
    def from_proto(cls, msg: pb.Message, *, keep_wire: bool | bytes = False, read_only: bool = False) -> Message:
        """The message of ``msg``; with ``keep_wire`` its ``wire`` is ``msg`` serialized (no second conversion;
        ``keep_wire`` may be those bytes, already made). With ``read_only`` its mappings are ``ReadOnlyDict``s
        (a message to be shared)."""
        out = _new(cls)
        fields = out.__dict__
        fields["body"] = msg.body
        if msg.HasField("header"):
            header = msg.header
            entries = header.properties.entries
            if read_only:
                fields["properties"] = ReadOnlyDict({e.key: e.value for e in entries}) if entries else EMPTY
            else:
                fields["properties"] = {e.key: e.value for e in entries}
            fields["message_type"] = header.messageType
        else:
            fields["properties"] = EMPTY if read_only else {}
            fields["message_type"] = ""
        seq = msg.msgId        # MessageId.from_proto, inline: a client decodes each delivered message
        ids = _new(MessageId)
        id_fields = ids.__dict__
        id_fields["local"] = seq.localComponent
        remote = seq.remoteComponents
        if remote:
            components = {r.region.decode("utf-8", "replace"): r.seqId for r in remote}
            id_fields["remote"] = ReadOnlyDict(components) if read_only else components
        else:
            id_fields["remote"] = EMPTY if read_only else {}
        fields["msg_id"] = ids
        fields["src_region"] = _region_name(msg.srcRegion)
        fields["key"] = msg.key if msg.HasField("key") else None
        fields["publish_time_ms"] = msg.publishTimeMs
        fields["redelivery_count"] = msg.redeliveryCount
        fields["deliver_at_ms"] = msg.deliverAtMs
        if keep_wire:
            fields["wire"] = keep_wire if isinstance(keep_wire, bytes) else msg.SerializeToString()
        return out

    @classmethod
    def from_wires(cls, wires: Sequence[bytes]) -> list[Message]:
        """``from_proto(pb.Message.FromString(w), keep_wire=w, read_only=True)`` of each of ``wires``, in one
        loop: a consumer's delivery frame decoded without two calls and the keyword handling per message
        (``hub.client_decode``); ``google.protobuf.message.DecodeError`` for bytes that are not a message.

        The usual delivered message is read from its bytes without protobuf (issue 29: the parse and its
        field reads were a sixth of a work-queue consumer's CPU): a body under 128 bytes (1), then perhaps
        ``srcRegion`` (2), then a ``msgId`` (3) holding its local component alone, then what ``_tail``
        takes (``key``, ``publishTimeMs``, ``redeliveryCount``). The region and the tail repeat from message
        to message of a run, so they are compared, not read, after the first. Any other bytes take
        protobuf's parse.
        """
        out: list[Message] = []
        append = out.append
        new = _new
        empty = EMPTY
        tails = _TAILS
        region_field = b""         # the last srcRegion field read, and its name
        region_name = ""
        for wire in wires:
            try:
                size = wire[1]
                at = size + 2
                if wire[0] != 0x0A or size >= 0x80:
                    raise IndexError
                src = ""
                if wire[at] == 0x12:                 # srcRegion
                    if not (region_field and wire.startswith(region_field, at)):
                        region_field = wire[at:at + 2 + wire[at + 1]]
                        if wire[at + 1] >= 0x80 or len(region_field) != 2 + wire[at + 1]:
                            region_field = b""
                            raise IndexError
                        region_name = _region_name(region_field[2:])
                    at += len(region_field)
                    src = region_name
                if wire[at] != 0x1A or wire[at + 2] != 0x08:   # msgId { localComponent }: its length is
                    raise IndexError                            # the varint's and one (the tag 0x08)
                end = at + 2 + wire[at + 1]
                local = wire[at + 3]
                width = end - at - 3         # the varint's bytes, if it fills the msgId
                if width == 1:
                    if local >= 0x80:
                        raise IndexError
                elif width == 2 and local >= 0x80 and wire[at + 4] < 0x80:   # seq ids up to 16 383
                    local = (local & 0x7F) | wire[at + 4] << 7
                elif width == 3 and local >= 0x80 and wire[at + 4] >= 0x80 and wire[at + 5] < 0x80:
                    local = (local & 0x7F) | (wire[at + 4] & 0x7F) << 7 | wire[at + 5] << 14   # up to 2 097 151
                else:
                    local, i = _varint_at(wire, at + 3)
                    if i != end or local >> 64:
                        raise IndexError
                tail = wire[end:]
                got = tails.get(tail)
                if got is None:
                    got = _tail(tail)
                    if len(tails) >= _TAILS_KEPT:
                        tails.clear()
                    tails[tail] = got
                if not got:
                    raise IndexError
            except IndexError:
                append(cls._parsed(wire))
                continue
            made = new(cls)
            fields = made.__dict__
            fields["body"] = wire[2:size + 2]
            fields["properties"] = empty
            fields["message_type"] = ""
            msg_id = new(MessageId)
            ids = msg_id.__dict__
            ids["local"] = local
            ids["remote"] = empty
            fields["msg_id"] = msg_id
            fields["src_region"] = src
            fields["key"] = got[0]
            fields["publish_time_ms"] = got[1]
            fields["redelivery_count"] = got[2]
            fields["deliver_at_ms"] = 0
            fields["wire"] = wire
            append(made)
        return out

    @classmethod
    def _parsed(cls, wire: bytes) -> Message:
        """``from_wires`` of one wire by protobuf's parse."""
        msg = pb.Message.FromString(wire)
        made = _new(cls)
        fields = made.__dict__
        fields["body"] = msg.body
        if _HAS_FIELD(msg, "header"):
            header = msg.header
            entries = header.properties.entries
            fields["properties"] = ReadOnlyDict({e.key: e.value for e in entries}) if entries else EMPTY
            fields["message_type"] = header.messageType
        else:
            fields["properties"] = EMPTY
            fields["message_type"] = ""
        seq = msg.msgId
        msg_id = _new(MessageId)
        ids = msg_id.__dict__
        ids["local"] = seq.localComponent
        remote = seq.remoteComponents
        ids["remote"] = ReadOnlyDict({r.region.decode("utf-8", "replace"): r.seqId for r in remote}) \
            if remote else EMPTY
        fields["msg_id"] = msg_id
        fields["src_region"] = _region_name(msg.srcRegion)
        fields["key"] = msg.key if _HAS_FIELD(msg, "key") else None
        fields["publish_time_ms"] = msg.publishTimeMs
        fields["redelivery_count"] = msg.redeliveryCount
        fields["deliver_at_ms"] = msg.deliverAtMs
        fields["wire"] = wire
        return made

    @functools.cached_property
    def wire(self) -> bytes:
        """``to_proto()`` serialized: computed once, however many subscribers a message is delivered to."""
        return self.to_proto().SerializeToString()

    def to_proto(self) -> pb.Message:
        out = pb.Message(body=self.body, srcRegion=self.src_region.encode())
        if self.msg_id.local or self.msg_id.remote:
            out.msgId.CopyFrom(self.msg_id.to_proto())
        for key, value in self.properties.items():
            out.header.properties.entries.add(key=key, value=value)
        if self.message_type:
            out.header.messageType = self.message_type
        if self.key is not None:
            out.key = self.key
        if self.publish_time_ms:
            out.publishTimeMs = self.publish_time_ms
        if self.redelivery_count:
            out.redeliveryCount = self.redelivery_count
        if self.deliver_at_ms:
            out.deliverAtMs = self.deliver_at_ms
        return out

    def redelivered_wire(self, count: int) -> bytes:
        """``wire`` with ``redeliveryCount`` = ``count`` (a redelivery; ``wire`` itself stays shared)."""
        if not count:
            return self.wire
        out = pb.Message.FromString(self.wire)
        out.redeliveryCount = count
        return out.SerializeToString()

    @classmethod
    def persisted(cls, msg: pb.Message, seq: int, wire: bytes) -> Message:
        """``from_proto(msg, keep_wire=True)`` of ``msg`` with its local seq id set to ``seq``; ``msg`` itself
        is left as it is. ``wire`` is ``msg`` serialized (as the owner stored it, without a seq id).

        The owner's publish path, once per stored message (the read-ahead
        cache): ``wire`` gets the msg id where protobuf puts it (field 3,
        after ``body`` and ``srcRegion``), byte for byte what protobuf
        serializes (tested), without reading or writing ``msg``'s
        sub-messages, which is what costs most in ``from_proto``. A message
        that carries a msg id already (a region's) takes the plain way.
        """
        return cls.persisted_run([msg], seq, [wire])[0]

    @classmethod
    def persisted_run(cls, msgs: Sequence[pb.Message | StampedBody], first: int,
                      wires: Sequence[bytes]) -> list[Message]:
        """``persisted`` of each of ``msgs`` (seq ids ``first``, ``first + 1``, ...; ``wires`` their
        serializations), in one loop: a persisted entry's messages without a call per message. A
        ``StampedBody`` (``hub.body_publish``) is parsed from its wire only when the usual run does not fit."""
        out: list[Message] = []
        append = out.append
        new = _new
        names = _REGION_NAMES
        leads = _MSG_ID_LEADS
        has = _HAS_FIELD
        seq = first
        # the usual run (a batched publish of bodies alone, hub.frames.stamped_wires): each wire is a body
        # under 128 bytes, then the run's srcRegion and publishTimeMs fields, nothing else. A wire that ends
        # with those two fields and is as long as they and its body field are holds no other field (each
        # adds bytes), so its message is built from the wire and the run's values, without protobuf reads
        region_field = time_field = b""
        tail_len = 0
        region_name = ""
        stamp = 0
        if msgs:
            lead_msg = msgs[0]
            region, stamp = lead_msg.srcRegion, lead_msg.publishTimeMs
            region_field = b"\x12" + varint(len(region)) + region if region else b""
            time_field = b"\x40" + varint(stamp) if stamp else b""
            tail_len = len(region_field) + len(time_field)
            region_name = _region_name(region)
        tail = region_field + time_field
        for msg, wire in zip(msgs, wires, strict=True):
            n = len(wire) - tail_len   # the body field's size, when the wire is the usual one
            if 1 < n < 130 and wire[1] == n - 2 and wire[0] == 0x0A and wire.endswith(tail):
                made = new(cls)
                fields = made.__dict__
                fields["body"] = wire[2:n]
                fields["properties"] = EMPTY
                fields["message_type"] = ""
                msg_id = new(MessageId)
                ids = msg_id.__dict__
                ids["local"] = seq
                ids["remote"] = EMPTY
                fields["msg_id"] = msg_id
                fields["src_region"] = region_name
                fields["key"] = None
                fields["publish_time_ms"] = stamp
                fields["redelivery_count"] = 0
                fields["deliver_at_ms"] = 0
                local = varint(seq)
                fields["wire"] = b"".join((wire[:n], region_field, leads[len(local)], local, time_field))
                append(made)
                seq += 1
                continue
            if isinstance(msg, StampedBody):
                msg = msg.message()
            if has(msg, "msgId"):
                copy = pb.Message()
                copy.CopyFrom(msg)
                copy.msgId.localComponent = seq
                append(cls.from_proto(copy, keep_wire=True))
                seq += 1
                continue
            made = new(cls)
            fields = made.__dict__
            body = msg.body
            region = msg.srcRegion
            fields["body"] = body
            if has(msg, "header"):
                header = msg.header
                fields["properties"] = {e.key: e.value for e in header.properties.entries}
                fields["message_type"] = header.messageType
            else:
                fields["properties"] = {}
                fields["message_type"] = ""
            msg_id = new(MessageId)
            ids = msg_id.__dict__
            ids["local"] = seq
            ids["remote"] = {}
            fields["msg_id"] = msg_id
            name = names.get(region)
            fields["src_region"] = name if name is not None else _region_name(region)
            fields["key"] = msg.key if has(msg, "key") else None
            fields["publish_time_ms"] = msg.publishTimeMs
            fields["redelivery_count"] = msg.redeliveryCount
            fields["deliver_at_ms"] = msg.deliverAtMs
            # body (1) and srcRegion (2) come first, each as tag, length, bytes; an empty one is not written
            n, r = len(body), len(region)
            at = (n + 2 if n < 0x80 else _field_size(n)) if n else 0
            if r:
                at += r + 2 if r < 0x80 else _field_size(r)
            local = varint(seq)   # msgId (3) { localComponent (1) }: under 128 bytes, so one-byte lengths
            fields["wire"] = b"".join((wire[:at], leads[len(local)], local, wire[at:]))
            append(made)
            seq += 1
        return out


def _field_size(n: int) -> int:
    """The bytes of a length-delimited field of ``n`` bytes with a one-byte tag (0 for an empty one:
    proto3 does not write it)."""
    if not n:
        return 0
    return n + (2 if n < 0x80 else 3 if n < 0x4000 else 1 + len(varint(n)))


def _varint_at(wire: bytes, i: int) -> tuple[int, int]:
    """The varint at ``wire[i]`` and the index after it; ``IndexError`` when it runs past the end or 10 bytes."""
    b = wire[i]
    return (b, i + 1) if b < 0x80 else long_varint(wire, i + 1, b)


def _tail(tail: bytes) -> tuple[bytes | None, int, int] | tuple[()]:
    """(key, publishTimeMs, redeliveryCount) of what follows a delivered message's ``msgId`` when it is
    ``key`` (7), ``publishTimeMs`` (8) and ``redeliveryCount`` (9), each at most once, in field order (no
    field repeats, none is unknown, no value goes past its type: bytes that mean exactly this to protobuf);
    ``()`` for anything else (``from_wires`` then parses the message)."""
    n = len(tail)
    at = 0
    key = None
    stamp = count = 0
    try:
        if at < n and tail[at] == 0x3A:      # key
            size, i = _varint_at(tail, at + 1)
            at = i + size
            if at > n:
                return ()
            key = tail[i:at]
        if at < n and tail[at] == 0x40:      # publishTimeMs (uint64)
            stamp, at = _varint_at(tail, at + 1)
            if stamp >> 64:
                return ()
        if at < n and tail[at] == 0x48:      # redeliveryCount (uint32)
            count, at = _varint_at(tail, at + 1)
            if count >> 32:
                return ()
    except IndexError:
        return ()
    return (key, stamp, count) if at == n else ()


_TAILS: dict[bytes, tuple[bytes | None, int, int] | tuple[()]] = {}
"""``from_wires``: ``_tail`` of the tails seen lately (a run's messages share theirs: the same stamp)."""
_TAILS_KEPT = 1024


_REGION_NAMES: dict[bytes, str] = {}
"""Decoded region names (``persisted``, ``from_proto``): a hub stores, and a client receives, messages of a
handful of regions."""


def _region_name(region: bytes) -> str:
    """``region`` decoded (kept for the first 64 names seen)."""
    name = _REGION_NAMES.get(region)
    if name is None:
        name = region.decode("utf-8", "replace")
        if len(_REGION_NAMES) < 64:
            _REGION_NAMES[region] = name
    return name


_MSG_ID_LEADS = [b"\x1a" + bytes([n + 1]) + b"\x08" for n in range(11)]
"""``persisted_run``: by ``n``, what comes before a localComponent varint of ``n`` bytes in a msgId field (3)
that holds only it: the field's tag and length, then localComponent's tag (1)."""
_HAS_FIELD = pb.Message.HasField


@dataclass(frozen=True)
class SubscriptionPreferences:
    """A subscription's preferences, as stored with it and handed to message filters.

    ``options`` are the application's own (str -> bytes); ``message_bound`` 0
    means unbounded; ``message_filter`` is the dotted path of a server-side
    filter class (``""`` for none); ``message_window_size`` 0 means the hub's
    ``default_message_window_size``.
    """

    options: Mapping[str, bytes] = field(default_factory=dict)
    message_bound: int = 0
    message_filter: str = ""
    message_window_size: int = 0

    @classmethod
    def from_proto(cls, prefs: pb.SubscriptionPreferences) -> SubscriptionPreferences:
        return cls(options={e.key: e.value for e in prefs.options.entries},
                   message_bound=prefs.messageBound, message_filter=prefs.messageFilter,
                   message_window_size=prefs.messageWindowSize)

    def to_proto(self) -> pb.SubscriptionPreferences:
        out = pb.SubscriptionPreferences(messageBound=self.message_bound, messageFilter=self.message_filter,
                                         messageWindowSize=self.message_window_size)
        for key, value in sorted(self.options.items()):
            out.options.entries.add(key=key, value=value)
        return out
