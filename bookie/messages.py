"""The bookie's messages without I/O: requests, responses, status codes and their errors (``bookie.protocol``).

    request = parse_request(frame)              # MalformedFrameError: answer BAD_REQUEST
    req = add_request(txn_id, ledger_id, entry_id, key, payload)
    status_of(exc); raise_for_status(response); add_header(request)
    add_ok_frame(txn_id, ledger_id, entry_id)   # the framed OK answer, without a Response object
    ok_frame(txn_id, ADD_ENTRIES)              # an ADD_ENTRIES' framed answer when every add succeeded
    AddAcks().frame(txn_id, ledger_id, entry_id)   # the same bytes, cheaper

Importers use ``bookie.protocol``, which hands these names on.
"""

from __future__ import annotations

import struct
from typing import TypeVar

from google.protobuf.message import DecodeError

from bookie import errors
from bookie.digest import HEADER_SIZE
from bookie.proto import bookie_pb2 as pb
from bookie.wire.framing import (
    LENGTH_PREFIX,
)
from bookie.wire.framing import varint as _varint

Request = pb.Request
Response = pb.Response
OperationType = pb.OperationType
StatusCode = pb.StatusCode

ADD_ENTRY = pb.ADD_ENTRY
READ_ENTRY = pb.READ_ENTRY
READ_LAC = pb.READ_LAC
GET_BOOKIE_INFO = pb.GET_BOOKIE_INFO
WRITE_LAC = pb.WRITE_LAC
ADD_ENTRIES = pb.ADD_ENTRIES
ADD_ENTRIES_MULTI = pb.ADD_ENTRIES_MULTI
WRITE_LAC_MULTI = pb.WRITE_LAC_MULTI
OPERATIONS = frozenset({ADD_ENTRY, READ_ENTRY, READ_LAC, GET_BOOKIE_INFO, WRITE_LAC, ADD_ENTRIES, ADD_ENTRIES_MULTI,
                        WRITE_LAC_MULTI})
ADD_OPS = frozenset({ADD_ENTRY, ADD_ENTRIES, ADD_ENTRIES_MULTI})

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
TOO_MANY_REQUESTS = pb.TOO_MANY_REQUESTS

LAST_ENTRY = -1
"""``entry_id`` of a READ_ENTRY that asks for the last entry the bookie stores."""

ENTRY_HEADER = struct.Struct(">qqq")
"""Ledger id, entry id and LAC at the start of an entry payload (``bookie.digest``)."""

STATUS_ERRORS: dict[pb.StatusCode, type[errors.BKError]] = {
    NO_ENTRY: errors.NoSuchEntryError,
    NO_LEDGER: errors.NoSuchLedgerError,
    FENCED: errors.LedgerFencedError,
    UNAUTHORIZED: errors.UnauthorizedError,
    BAD_REQUEST: errors.BadRequestError,
    READ_ONLY: errors.BookieReadOnlyError,
    TOO_LARGE: errors.TooLargeError,
    UNKNOWN_OP: errors.UnknownOpError,
    ERROR: errors.BookieServerError,
    TOO_MANY_REQUESTS: errors.TooManyRequestsError,
}
"""The ``BKError`` subclass a client raises for each non-OK status."""


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


def read_lac_request(txn_id: int, ledger_id: int, *, previous_lac: int = -1, timeout_ms: int = 0) -> Request:
    """READ_LAC; with ``timeout_ms > 0`` a long poll: answered once the LAC exceeds ``previous_lac``.

    ``ValueError`` for a ``timeout_ms`` outside 0 .. ``MAX_LONG_POLL_TIMEOUT_MS``.
    """
    if not 0 <= timeout_ms <= MAX_LONG_POLL_TIMEOUT_MS:
        raise ValueError(f"timeout_ms must be 0..{MAX_LONG_POLL_TIMEOUT_MS}, not {timeout_ms}")
    if not timeout_ms:
        return Request(txn_id=txn_id, op=READ_LAC, ledger_id=ledger_id)
    return Request(txn_id=txn_id, op=READ_LAC, ledger_id=ledger_id, previous_lac=previous_lac,
                   timeout_ms=timeout_ms)


def write_lac_request(txn_id: int, ledger_id: int, master_key: bytes, lac: int) -> Request:
    """WRITE_LAC: the writer tells a bookie its last-add-confirmed (explicit LAC)."""
    return Request(txn_id=txn_id, op=WRITE_LAC, ledger_id=ledger_id, master_key=master_key, lac=lac)


def write_lac_multi_request(txn_id: int, master_key: bytes, ledger_ids: list[int], lacs: list[int]) -> Request:
    """WRITE_LAC_MULTI: the explicit LACs of several ledgers sharing ``master_key`` (``ledger_ids[i]``: ``lacs[i]``)."""
    return Request(txn_id=txn_id, op=WRITE_LAC_MULTI, master_key=master_key, lac_ledger_ids=ledger_ids, lacs=lacs)


MAX_LONG_POLL_TIMEOUT_MS = 0xFFFFFFFF
"""The largest ``timeout_ms`` a long-poll READ_LAC can carry (a ``uint32``: about 49 days)."""


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


# --- server-side rules -------------------------------------------------------------------------

STATUS_OF: dict[type[BaseException], pb.StatusCode] = {cls: status for status, cls in STATUS_ERRORS.items()}
"""The wire status for each ``BKError`` class a request may fail with (inverse of ``STATUS_ERRORS``)."""


def status_of(exc: BaseException) -> pb.StatusCode:
    """The wire status for an error raised while serving a request (``ERROR`` by default)."""
    return STATUS_OF.get(type(exc), ERROR)


def add_header(request: Request, payload: bytes | None = None) -> tuple[int, int, int]:
    """``(ledger_id, entry_id, lac)`` from an ADD_ENTRY payload's header.

    ``payload`` is ``request.body`` when the caller read it already (each
    read of a protobuf bytes field is a copy). Raises ``BadRequestError``
    when the payload is shorter than its header or names an entry other than
    the request's.
    """
    if payload is None:
        payload = request.body
    if len(payload) < HEADER_SIZE:
        raise errors.BadRequestError("entry payload shorter than its header")
    ledger_id, entry_id, lac = ENTRY_HEADER.unpack_from(payload)
    if ledger_id != request.ledger_id or entry_id != request.entry_id:
        raise errors.BadRequestError(f"payload is of entry {ledger_id}:{entry_id}")
    return ledger_id, entry_id, lac


def is_long_poll(request: Request) -> bool:
    """A READ_LAC that waits (``timeout_ms > 0``) rather than answering at once."""
    return request.timeout_ms > 0


def lac_response(request: Request, lac: int, last_entry: int) -> Response:
    """The OK answer to a READ_LAC (plain or long poll): the ledger's LAC and last entry stored."""
    resp = response_to(request)
    resp.lac = lac
    resp.entry_id = last_entry
    return resp


_BYTE = [bytes((i,)) for i in range(0x80)]


def add_ok_frame(txn_id: int, ledger_id: int, entry_id: int) -> bytes:
    """The framed OK answer to an ADD_ENTRY, encoded without a ``Response`` object (the server's hot path).

    The same bytes as ``encode_frame(add_response(txn_id, ledger_id, entry_id))``
    (proto3 leaves zero fields out, status OK included); ids must be in
    0 .. 2**63-1, as the storage checks before an add can succeed.
    """
    body = ((b"\x08" + _varint(txn_id) if txn_id else b"") + b"\x10\x01"  # txn_id; op = ADD_ENTRY
            + (b"\x20" + _varint(ledger_id) if ledger_id else b"")
            + (b"\x28" + _varint(entry_id) if entry_id else b""))
    return _BYTE[len(body)].rjust(4, b"\0") + body  # a body of 2 + 3 x 10 bytes at most


def ok_frame(txn_id: int, op: int) -> bytes:
    """The framed OK answer of ``op`` carrying only its txn id (an ADD_ENTRIES whose adds all succeeded).

    The same bytes as ``encode_frame(Response(txn_id=txn_id, op=op))``, without a ``Response`` object
    (one per ADD_ENTRIES frame on the server's hot path); ``op`` is an ``OperationType`` (under 0x80).
    """
    body = (b"\x08" + _varint(txn_id) + _OP_FIELDS[op]) if txn_id else _OP_FIELDS[op]
    return _LENGTH_PREFIXES[len(body)] + body   # a body of 2 + 10 bytes at most


_OP_FIELDS = [b"\x10" + _BYTE[op] if op else b"" for op in range(0x80)]   # Response.op (varint 2), by value
_LENGTH_PREFIXES = tuple(LENGTH_PREFIX.pack(n) for n in range(64))  # an ADD_ENTRY OK body is 35 bytes at most


class AddAcks:
    """The framed OK answers to one connection's ADD_ENTRYs (the server's hot path): ``acks.frame(txn, ledger, entry)``.

    The same bytes as ``add_ok_frame``, encoded by protobuf itself into one
    ``Response`` kept per connection: only the fields that change are set
    (less than half the cost of ``add_ok_frame``'s varints in Python).
    ``ValueError`` for an id outside its field's range.
    """

    __slots__ = ("_ledger_id", "_response", "_serialize")

    def __init__(self) -> None:
        self._response = Response(op=ADD_ENTRY)
        self._serialize = self._response.SerializeToString
        self._ledger_id = 0

    def frame(self, txn_id: int, ledger_id: int, entry_id: int) -> bytes:
        response = self._response
        response.txn_id = txn_id
        response.entry_id = entry_id
        if ledger_id != self._ledger_id:
            response.ledger_id = ledger_id
            self._ledger_id = ledger_id
        body = self._serialize()
        return _LENGTH_PREFIXES[len(body)] + body


def add_response(txn_id: int, ledger_id: int, entry_id: int, exc: BaseException | None = None) -> Response:
    """The answer to an ADD_ENTRY once its commit finished (``exc`` None) or failed."""
    if exc is None:
        return Response(txn_id=txn_id, op=ADD_ENTRY, status=OK, ledger_id=ledger_id, entry_id=entry_id)
    return Response(txn_id=txn_id, op=ADD_ENTRY, status=status_of(exc), ledger_id=ledger_id,
                    entry_id=entry_id, message=str(exc))
