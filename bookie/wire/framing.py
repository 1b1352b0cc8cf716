"""Length-prefixed framing shared by the bookie and the hub: split a byte stream, frame a message.

    decoder = FrameDecoder(max_frame_size=DEFAULT_MAX_FRAME_SIZE)
    for frame in decoder.feed(data):            # FrameTooLargeError: close the connection
        request = Request.FromString(frame)
    transport.write(encode_frame(response))     # any protobuf message

    budget = FrameBudget(limit)                 # bytes all connections may hold in partial frames
    for key in budget.update(conn_key, held): ...   # close these connections, newest first
    budget.release(conn_key)

A frame is a 4-byte big-endian unsigned length followed by that many bytes
(one protobuf message of the speaker's schema). The default
``max_frame_size`` is BookKeeper's ``nettyMaxFrameSizeBytes`` (5 MiB =
5242880); a frame longer than that is refused before its body is buffered.

No I/O happens here. Failure: ``FrameDecoder`` raises
``bookie.errors.FrameTooLargeError`` for an oversized header.
"""

from __future__ import annotations

import struct

from google.protobuf.message import Message as ProtoMessage

from bookie import errors

__all__ = ["DEFAULT_MAX_FRAME_SIZE", "LENGTH_PREFIX", "PREFIX_SIZE", "FrameBudget", "FrameDecoder", "encode_frame",
           "varint"]

DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024
"""BookKeeper's ``nettyMaxFrameSizeBytes`` default (5242880)."""

LENGTH_PREFIX = struct.Struct(">I")
PREFIX_SIZE = LENGTH_PREFIX.size


class FrameDecoder:
    """Splits a byte stream into frame bodies.

    ``feed(data)`` returns the complete frames now available (as ``bytes``,
    possibly none) and keeps the incomplete tail. A header announcing more
    than ``max_frame_size`` bytes raises ``FrameTooLargeError`` at once (the
    body is never buffered); the error's ``frames`` holds the complete frames
    before it. The decoder is then unusable, as the stream is.

    ``receive(data)`` + ``next_frame()`` split the same stream one frame at a
    time (``None``: the next frame is incomplete), so a connection that stops
    serving requests keeps the rest of what it read unparsed.
    """

    __slots__ = ("_broken", "_buf", "_pos", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size <= 0:
            raise ValueError(f"max_frame_size must be positive, not {max_frame_size}")
        self.max_frame_size = max_frame_size
        self._buf: bytes | bytearray = b""
        self._pos = 0
        self._broken: errors.FrameTooLargeError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held: an incomplete frame, and complete frames not taken yet."""
        return len(self._buf) - self._pos

    def receive(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data``; ``FrameTooLargeError`` if the stream already broke."""
        if self._broken is not None:
            raise self._broken
        buf = self._buf
        pos = self._pos
        if pos == len(buf):  # nothing held (the usual case): keep ``data`` itself, no copy
            self._buf = data if type(data) is bytes else bytes(data)
            self._pos = 0
            return
        if isinstance(buf, bytearray):
            if pos:
                del buf[:pos]
        else:
            buf = self._buf = bytearray(memoryview(buf)[pos:])
        self._pos = 0
        buf += data

    def next_frame(self) -> bytes | None:
        """The next complete frame body, or ``None``; ``FrameTooLargeError`` for an oversized header."""
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < PREFIX_SIZE:
            return None
        (size,) = LENGTH_PREFIX.unpack_from(buf, pos)
        if size > self.max_frame_size:
            self.clear()
            self._broken = errors.FrameTooLargeError(
                f"frame of {size} bytes exceeds max_frame_size {self.max_frame_size}")
            raise self._broken
        end = pos + PREFIX_SIZE + size
        if end > len(buf):
            return None
        self._pos = end
        frame = buf[pos + PREFIX_SIZE:end]
        return frame if type(frame) is bytes else bytes(frame)

    def clear(self) -> None:
        """Drop everything buffered (the connection is gone)."""
        self._buf = b""
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data``; return every frame body it completes, in order."""
        self.receive(data)
        frames: list[bytes] = []
        buf = self._buf
        pos = self._pos
        end_of_data = len(buf)
        unpack = LENGTH_PREFIX.unpack_from
        limit = self.max_frame_size
        whole = type(buf) is bytes
        while end_of_data - pos >= PREFIX_SIZE:  # ``next_frame`` inlined: one call per read, not per frame
            (size,) = unpack(buf, pos)
            if size > limit:
                self._pos = pos
                try:
                    self.next_frame()  # raises (and breaks the stream) as it does alone
                except errors.FrameTooLargeError as exc:
                    raise errors.FrameTooLargeError(str(exc), frames=frames) from None
            end = pos + PREFIX_SIZE + size
            if end > end_of_data:
                break
            frame = buf[pos + PREFIX_SIZE:end]
            frames.append(frame if whole else bytes(frame))  # type: ignore[arg-type]  # bytes when ``whole``
            pos = end
        self._pos = pos
        return frames


def encode_frame(message: ProtoMessage) -> bytes:
    """The length-prefixed frame of ``message`` (any protobuf message: the hub frames its own the same way)."""
    body = message.SerializeToString()
    return LENGTH_PREFIX.pack(len(body)) + body


class FrameBudget:
    """What all connections together may hold in bytes read but not served (partial frames).

    ``update(key, held)`` records one connection's holding (keys grow with
    connection age: newer is larger) and returns the keys to close, newest
    first, until the total is back within ``limit``; ``release(key)`` when a
    connection is gone.
    """

    __slots__ = ("_held", "limit", "total")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"limit must be positive, not {limit}")
        self.limit = limit
        self.total = 0
        self._held: dict[int, int] = {}

    def update(self, key: int, held: int) -> list[int]:
        if not held and key not in self._held:
            return []
        old = self._held.pop(key, 0)
        if held:
            self._held[key] = held
        self.total += held - old
        if self.total <= self.limit:
            return []
        victims: list[int] = []
        over = self.total - self.limit
        for k in sorted(self._held, reverse=True):
            victims.append(k)
            over -= self._held[k]
            if over <= 0:
                break
        return victims

    def release(self, key: int) -> None:
        self.total -= self._held.pop(key, 0)


_V2 = struct.Struct(">BB")
_V3 = struct.Struct(">BBB")
_V4 = struct.Struct(">BBBB")
_BYTE = [bytes((i,)) for i in range(0x80)]


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of an int in 0 .. 2**64-1."""
    if value < 0x80:
        return _BYTE[value]
    if value < 0x4000:
        return _V2.pack(value & 0x7F | 0x80, value >> 7)
    if value < 0x200000:
        return _V3.pack(value & 0x7F | 0x80, (value >> 7) & 0x7F | 0x80, value >> 14)
    if value < 0x10000000:
        return _V4.pack(value & 0x7F | 0x80, (value >> 7) & 0x7F | 0x80, (value >> 14) & 0x7F | 0x80, value >> 21)
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
