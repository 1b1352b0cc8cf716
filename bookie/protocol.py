"""The bookie wire protocol without I/O: framing, messages, status codes, txn-id matching.

Both the bookie server and the ledger client are thin asyncio shells around
this module; everything here is testable with byte strings alone::

    decoder = FrameDecoder(max_frame_size=DEFAULT_MAX_FRAME_SIZE)
    for frame in decoder.feed(data):            # FrameTooLargeError: close the connection
        request = parse_request(frame)          # MalformedFrameError: answer BAD_REQUEST
        ...
    transport.write(encode_frame(response))

    pending = PendingRequests()                 # client side
    req = add_request(pending.next_txn_id(), ledger_id, entry_id, key, payload)
    pending.add(req, future)
    ...
    future = pending.complete(response)         # ProtocolError if it matches nothing

Frames are a 4-byte big-endian unsigned length followed by that many bytes
of one protobuf ``Request`` or ``Response`` (``bookie/proto/bookie.proto``).
The default ``max_frame_size`` is BookKeeper's ``nettyMaxFrameSizeBytes``
(5 MiB = 5242880); a frame longer than that is refused before its body is
buffered.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Generic, TypeVar

from google.protobuf.message import DecodeError

from bookie import errors
from bookie.proto import bookie_pb2 as pb

Request = pb.Request
Response = pb.Response
OperationType = pb.OperationType
StatusCode = pb.StatusCode

ADD_ENTRY = pb.ADD_ENTRY
READ_ENTRY = pb.READ_ENTRY
READ_LAC = pb.READ_LAC
GET_BOOKIE_INFO = pb.GET_BOOKIE_INFO
OPERATIONS = frozenset({ADD_ENTRY, READ_ENTRY, READ_LAC, GET_BOOKIE_INFO})

OK = pb.OK
NO_ENTRY = pb.NO_ENTRY
NO_LEDGER = pb.NO_LEDGER
FENCED = pb.FENCED
UNAUTHORIZED = pb.UNAUTHORIZED
BAD_REQUEST = pb.BAD_REQUEST
READ_ONLY = pb.READ_ONLY
TOO_LARGE = pb.TOO_LARGE
UNKNOWN_OP = pb.UNKNOWN_OP
ERROR = pb.ERROR

LAST_ENTRY = -1
"""``entry_id`` of a READ_ENTRY that asks for the last entry the bookie stores."""

DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024
"""BookKeeper's ``nettyMaxFrameSizeBytes`` default (5242880)."""

LENGTH_PREFIX = struct.Struct(">I")
PREFIX_SIZE = LENGTH_PREFIX.size
_MAX_ENCODABLE = 0xFFFFFFFF

STATUS_ERRORS: dict[int, type[errors.BKError]] = {
    NO_ENTRY: errors.NoSuchEntryError,
    NO_LEDGER: errors.NoSuchLedgerError,
    FENCED: errors.LedgerFencedError,
    UNAUTHORIZED: errors.UnauthorizedError,
    BAD_REQUEST: errors.BadRequestError,
    READ_ONLY: errors.BookieReadOnlyError,
    TOO_LARGE: errors.TooLargeError,
    UNKNOWN_OP: errors.UnknownOpError,
    ERROR: errors.BookieServerError,
}
"""The ``BKError`` subclass a client raises for each non-OK status."""


class FrameDecoder:
    """Splits a byte stream into frame bodies.

    ``feed(data)`` returns the complete frames now available (as ``bytes``,
    possibly none) and keeps the incomplete tail. A header announcing more
    than ``max_frame_size`` bytes raises ``FrameTooLargeError`` at once (the
    body is never buffered); the error's ``frames`` holds the complete frames
    before it. The decoder is then unusable, as the stream is.
    """

    __slots__ = ("_broken", "_buf", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size <= 0:
            raise ValueError(f"max_frame_size must be positive, not {max_frame_size}")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._broken: errors.FrameTooLargeError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data``; return every frame body it completes, in order."""
        if self._broken is not None:
            raise self._broken
        buf: bytes | bytearray
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = bytes(data)
        frames: list[bytes] = []
        pos = 0
        end_of_data = len(buf)
        limit = self.max_frame_size
        unpack = LENGTH_PREFIX.unpack_from
        while end_of_data - pos >= PREFIX_SIZE:
            (size,) = unpack(buf, pos)
            if size > limit:
                self._buf = bytearray()
                message = f"frame of {size} bytes exceeds max_frame_size {limit}"
                self._broken = errors.FrameTooLargeError(message)
                raise errors.FrameTooLargeError(message, frames=frames)
            end = pos + PREFIX_SIZE + size
            if end > end_of_data:
                break
            frames.append(bytes(buf[pos + PREFIX_SIZE:end]))
            pos = end
        if buf is self._buf:
            del self._buf[:pos]
        elif pos < end_of_data:
            self._buf = bytearray(buf[pos:])
        return frames


def encode_frame(message: Request | Response) -> bytes:
    """The length-prefixed frame of ``message``."""
    body = message.SerializeToString()
    return LENGTH_PREFIX.pack(len(body)) + body


def frame_bytes(body: bytes) -> bytes:
    """Length-prefix an already serialized message (``ValueError`` over 4 GiB)."""
    if len(body) > _MAX_ENCODABLE:
        raise ValueError(f"frame of {len(body)} bytes cannot be length-prefixed")
    return LENGTH_PREFIX.pack(len(body)) + body


M = TypeVar("M", Request, Response)


def _parse(message: M, frame: bytes, what: str) -> M:
    try:
        message.ParseFromString(frame)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise errors.MalformedFrameError(f"malformed {what} frame of {len(frame)} bytes: {exc}") from None
    return message


def parse_request(frame: bytes) -> Request:
    """Decode one request frame body; ``MalformedFrameError`` when it is not a Request."""
    return _parse(Request(), frame, "request")


def parse_response(frame: bytes) -> Response:
    """Decode one response frame body; ``MalformedFrameError`` when it is not a Response."""
    return _parse(Response(), frame, "response")


# --- requests (client side) -------------------------------------------------------------------

def add_request(txn_id: int, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes,
                *, recovery: bool = False) -> Request:
    """ADD_ENTRY of ``payload`` (an ``encode_entry`` result); ``recovery`` passes a fence."""
    return Request(txn_id=txn_id, op=ADD_ENTRY, ledger_id=ledger_id, entry_id=entry_id,
                   master_key=master_key, body=payload, recovery=recovery)


def read_request(txn_id: int, ledger_id: int, entry_id: int, *, fence: bool = False,
                 master_key: bytes = b"") -> Request:
    """READ_ENTRY (``entry_id=LAST_ENTRY`` reads the last one); fencing needs the master key."""
    return Request(txn_id=txn_id, op=READ_ENTRY, ledger_id=ledger_id, entry_id=entry_id,
                   fence=fence, master_key=master_key)


def read_lac_request(txn_id: int, ledger_id: int) -> Request:
    return Request(txn_id=txn_id, op=READ_LAC, ledger_id=ledger_id)


def bookie_info_request(txn_id: int) -> Request:
    return Request(txn_id=txn_id, op=GET_BOOKIE_INFO)


# --- responses (server side) -------------------------------------------------------------------

def response_to(request: Request, status: pb.StatusCode = OK, message: str = "") -> Response:
    """A response echoing ``request``'s txn id, op, ledger and entry ids."""
    return Response(txn_id=request.txn_id, op=request.op, status=status, ledger_id=request.ledger_id,
                    entry_id=request.entry_id, message=message)


def error_response(status: pb.StatusCode, message: str, txn_id: int = 0) -> Response:
    """A response to a frame that could not be decoded (txn id 0 when unknown)."""
    return Response(txn_id=txn_id, status=status, message=message)


def status_name(status: int) -> str:
    """``"OK"``, ``"FENCED"``...; ``"STATUS_<n>"`` for a code this version does not know."""
    try:
        return StatusCode.Name(status)
    except ValueError:
        return f"STATUS_{status}"


def op_name(op: int) -> str:
    try:
        return OperationType.Name(op)
    except ValueError:
        return f"OP_{op}"


def error_for(response: Response) -> errors.BKError | None:
    """The ``BKError`` a non-OK response stands for (``None`` for OK)."""
    if response.status == OK:
        return None
    cls = STATUS_ERRORS.get(response.status, errors.BookieServerError)
    what = f"{op_name(response.op)} {response.ledger_id}:{response.entry_id}"
    detail = f": {response.message}" if response.message else ""
    return cls(f"{status_name(response.status)} on {what}{detail}")


def raise_for_status(response: Response) -> Response:
    """Return ``response`` if OK, else raise the matching ``BKError``."""
    exc = error_for(response)
    if exc is not None:
        raise exc
    return response


# --- txn-id matching (client side) -------------------------------------------------------------

T = TypeVar("T")


class PendingRequests(Generic[T]):
    """Outstanding requests of one connection, keyed by txn id.

    Holds any value per request (a future, a callback...). Responses may
    arrive in any order; ``complete`` matches one to its request and checks
    the op. Txn ids come from ``next_txn_id`` (1, 2, ...; 0 is reserved for
    the bookie's replies to undecodable frames).
    """

    __slots__ = ("_next", "_pending")

    def __init__(self) -> None:
        self._pending: dict[int, tuple[int, T]] = {}
        self._next = 0

    def next_txn_id(self) -> int:
        self._next = (self._next + 1) & 0xFFFFFFFFFFFFFFFF or 1
        return self._next

    def add(self, request: Request, value: T) -> None:
        """Remember ``value`` for ``request``; ``ProtocolError`` if its txn id is outstanding."""
        if request.txn_id in self._pending:
            raise errors.ProtocolError(f"txn id {request.txn_id} is already outstanding")
        self._pending[request.txn_id] = (request.op, value)

    def complete(self, response: Response) -> T:
        """Remove and return the value of the request ``response`` answers.

        Raises ``ProtocolError`` for a txn id that is not outstanding (0
        included: the bookie could not decode some frame) or an op that does
        not match the request's.
        """
        entry = self._pending.pop(response.txn_id, None)
        if entry is None:
            raise errors.ProtocolError(
                f"response with txn id {response.txn_id} ({status_name(response.status)}"
                f"{': ' + response.message if response.message else ''}) matches no request")
        op, value = entry
        if response.op != op:
            self._pending[response.txn_id] = entry
            raise errors.ProtocolError(
                f"response to txn {response.txn_id} is {op_name(response.op)}, request was {op_name(op)}")
        return value

    def pop(self, txn_id: int) -> T | None:
        """Forget one request (timed out); its value, or ``None``."""
        entry = self._pending.pop(txn_id, None)
        return None if entry is None else entry[1]

    def drain(self) -> list[T]:
        """Forget every request (connection lost) and return their values."""
        values = [v for _, v in self._pending.values()]
        self._pending.clear()
        return values

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, txn_id: object) -> bool:
        return txn_id in self._pending

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._pending))
