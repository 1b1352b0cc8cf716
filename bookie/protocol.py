"""The bookie wire protocol without I/O: framing, messages, status codes, txn-id matching.

Both the bookie server and the ledger client are thin asyncio shells around
this module; everything here is testable with byte strings alone::

    decoder = FrameDecoder(max_frame_size=DEFAULT_MAX_FRAME_SIZE)
    for frame in decoder.feed(data):            # FrameTooLargeError: close the connection
        request = parse_request(frame)          # MalformedFrameError: answer BAD_REQUEST
        ...
    transport.write(encode_frame(response))

    conn = ServerConnection(max_frame_size, max_pending_requests, max_response_bytes)   # server side
    conn.receive_data(data)
    while (event := conn.next_event()) not in (NEED_DATA, PAUSED):
        ...                                     # a Request to serve, or a Response to send as is
    transport.pause_reading() if not conn.reading else transport.resume_reading()
    status_of(exc); add_header(request); add_response(txn_id, ledger_id, entry_id, exc)
    add_ok_frame(txn_id, ledger_id, entry_id)   # the framed OK answer, without a Response object
    AddAcks().frame(txn_id, ledger_id, entry_id)   # the same bytes, cheaper (one reused Response per connection)

    polls = LongPolls(max_per_connection, max_per_ledger)   # parked long-poll READ_LACs (server side)
    parked = polls.park(conn, request, now)     # None: over a limit, answer TOO_MANY_REQUESTS
    polls.lac_rose(ledger_id, lac); polls.expire(parked); polls.drop(conn); polls.take_all()

    pending = PendingRequests()                 # client side
    req = add_request(pending.next_txn_id(), ledger_id, entry_id, key, payload)
    pending.add(req, future)
    ...
    future = pending.complete(response)         # ProtocolError if it matches nothing

    txns = ClientTxns()                         # the ledger client's connections
    body = AddBodies(ledger_id, key).body(entry_id, payload)   # one ADD_ENTRY encoding for every bookie
    head = add_frame_head(txns.add_next(ADD_ENTRY, callback), body)   # send head, then body
    parts, size = add_entries_frame(txns.add_next(ADD_ENTRIES, callback), bodies.ledger_fields, [payload, ...])
    adds_answered = txns.answer(frames, misfit)  # parse every response read, run each callback in order

Frames are a 4-byte big-endian unsigned length followed by that many bytes
of one protobuf ``Request`` or ``Response`` (``bookie/proto/bookie.proto``).
The default ``max_frame_size`` is BookKeeper's ``nettyMaxFrameSizeBytes``
(5 MiB = 5242880); a frame longer than that is refused before its body is
buffered.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Container
from typing import Generic, Protocol, TypeVar

from google.protobuf.message import DecodeError

from bookie import errors
from bookie.digest import HEADER_SIZE
from bookie.proto import bookie_pb2 as pb

# the framing moved to bookie.wire (shared with the hub); re-exported for the importers of this module
from bookie.wire.framing import DEFAULT_MAX_FRAME_SIZE as DEFAULT_MAX_FRAME_SIZE
from bookie.wire.framing import LENGTH_PREFIX as LENGTH_PREFIX
from bookie.wire.framing import PREFIX_SIZE as PREFIX_SIZE
from bookie.wire.framing import FrameBudget as FrameBudget
from bookie.wire.framing import FrameDecoder as FrameDecoder
from bookie.wire.framing import encode_frame as encode_frame
from bookie.wire.txns import TXN_ID_MASK, TxnTable

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
OPERATIONS = frozenset({ADD_ENTRY, READ_ENTRY, READ_LAC, GET_BOOKIE_INFO, WRITE_LAC, ADD_ENTRIES, ADD_ENTRIES_MULTI})
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


_V2 = struct.Struct(">BB")
_V3 = struct.Struct(">BBB")
_V4 = struct.Struct(">BBBB")
_BYTE = [bytes((i,)) for i in range(0x80)]


def _varint(value: int) -> bytes:
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


class _Signal:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Signal("NEED_DATA")
"""``ServerConnection.next_event``: no complete request is buffered; read more."""
PAUSED = _Signal("PAUSED")
"""``ServerConnection.next_event``: serve nothing more now (see ``ServerConnection.paused``)."""

_request_from = Request.FromString
_response_from = Response.FromString

Event = Request | Response | _Signal
"""What ``ServerConnection.next_event`` returns: a request to serve, a response to send as is, a signal."""

DEFAULT_MAX_PENDING_REQUESTS = 10000
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024


class ServerConnection:
    """The bookie's rules for one client connection, without I/O (h11 style).

    Bytes go in with ``receive_data``; ``next_event()`` returns, in order,
    each ``Request`` to serve, each ``Response`` to send as it is (a
    ``BAD_REQUEST`` for an undecodable frame, txn id 0; a ``TOO_LARGE`` for
    an oversized frame, after which the connection closes once idle),
    ``NEED_DATA`` or ``PAUSED``. The shell reports what happens to the
    requests and the output: ``request_started``/``request_finished`` for
    requests answered later (an add awaiting its commit),
    ``response_queued``/``flushed`` for the response bytes queued between two
    writes, ``writing_paused``/``writing_resumed`` from the transport's
    ``pause_writing``/``resume_writing``, ``drain`` on shutdown.

    Decisions: ``paused`` (serve no more requests, stop reading) while the
    transport's write buffer is over its high-water mark, while
    ``max_pending_requests`` requests are in flight (until half of them
    finished), while ``max_response_bytes`` of responses wait for a flush
    (``response_queued`` returns True: flush now), once draining or broken;
    ``reading`` says whether the transport should read; ``close_now`` says
    a broken connection has answered everything it read.
    """

    __slots__ = ("_held", "_stop", "broken", "decoder", "draining", "in_flight", "max_pending_requests",
                 "max_response_bytes", "queued_bytes", "write_paused")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.decoder = FrameDecoder(max_frame_size)
        self.max_pending_requests = max_pending_requests
        self.max_response_bytes = max_response_bytes
        self.in_flight = 0
        self.queued_bytes = 0
        self.write_paused = False
        self.draining = False
        self.broken = False
        self._held = False  # paused for requests in flight: hold until half of them finished
        self._stop = False  # cached ``paused``

    # --- input ----------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer bytes read from the client (ignored once the stream broke)."""
        if not self.broken:
            self.decoder.receive(data)

    @property
    def buffered(self) -> int:
        """Bytes read but not yet served (an incomplete frame, and frames held while paused)."""
        return self.decoder.buffered

    def next_event(self) -> Event:
        """The next thing to do; see the class docstring."""
        if self._stop:
            return PAUSED
        try:
            frame = self.decoder.next_frame()
        except errors.FrameTooLargeError as exc:
            self.broken = True
            self._update()
            return error_response(TOO_LARGE, str(exc))
        if frame is None:
            return NEED_DATA
        try:
            return _request_from(frame)
        except (DecodeError, ValueError, RuntimeError) as exc:
            return error_response(BAD_REQUEST, f"malformed request frame of {len(frame)} bytes: {exc}")

    # --- what the shell reports -----------------------------------------------------------------

    def request_started(self) -> None:
        self.in_flight += 1
        if self.in_flight >= self.max_pending_requests:
            self._held = True
            self._stop = True

    def request_finished(self) -> bool:
        """Count a request answered; True when the shell must act (serve again, or ``close_now``)."""
        self.in_flight -= 1
        if self._held and self.in_flight <= self.max_pending_requests // 2:
            self._held = False
            self._update()
            return True
        return self.broken and self.in_flight == 0

    def requests_finished(self, n: int) -> bool:
        """``request_finished`` for ``n`` requests answered together (a run of adds)."""
        self.in_flight -= n
        if self._held and self.in_flight <= self.max_pending_requests // 2:
            self._held = False
            self._update()
            return True
        return self.broken and self.in_flight == 0

    def response_queued(self, nbytes: int) -> bool:
        """Count a queued response; True when the shell should flush now (too much is queued)."""
        self.queued_bytes += nbytes
        if self.queued_bytes >= self.max_response_bytes:
            self._stop = True
            return True
        return False

    def flushed(self) -> None:
        self.queued_bytes = 0
        if self._stop:
            self._update()

    def writing_paused(self) -> None:
        self.write_paused = True
        self._stop = True

    def writing_resumed(self) -> None:
        self.write_paused = False
        self._update()

    def drain(self) -> None:
        """Shutting down: serve nothing more that is read."""
        self.draining = True
        self._stop = True

    # --- decisions ------------------------------------------------------------------------------

    def _update(self) -> None:
        self._stop = (self.write_paused or self.draining or self.broken or self._held
                      or self.queued_bytes >= self.max_response_bytes)

    @property
    def paused(self) -> bool:
        """No more requests are to be served now (they stay buffered)."""
        return self._stop

    @property
    def held_by_output(self) -> bool:
        """Paused only because responses wait for a flush (``flushed`` lifts it)."""
        return self._stop and not (self.write_paused or self.draining or self.broken or self._held)

    @property
    def reading(self) -> bool:
        """Whether the transport should read: not while paused (what is read would pile up)."""
        return not self._stop

    @property
    def close_now(self) -> bool:
        """A broken connection has answered every request read before the bad frame."""
        return self.broken and self.in_flight == 0


K = TypeVar("K")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class ParkedRead(Generic[K]):
    """A long-poll READ_LAC waiting at the bookie: its connection, request and deadline (loop time).

    ``timer`` is the shell's to use (the handle of the call that answers it at
    the deadline).
    """

    __slots__ = ("conn", "deadline", "request", "timer")

    def __init__(self, conn: K, request: Request, deadline: float) -> None:
        self.conn = conn
        self.request = request
        self.deadline = deadline
        self.timer: Cancellable | None = None

    @property
    def ledger_id(self) -> int:
        return self.request.ledger_id

    def __repr__(self) -> str:
        return (f"<ParkedRead ledger={self.request.ledger_id} after={self.request.previous_lac} "
                f"deadline={self.deadline:.3f}>")


DEFAULT_MAX_LONG_POLLS_PER_CONNECTION = 1000
DEFAULT_MAX_LONG_POLLS_PER_LEDGER = 16


class LongPolls(Generic[K]):
    """The bookie's parked long-poll READ_LACs, without I/O; ``K`` is whatever names a connection.

    ``park(conn, request, now)`` parks a request (its deadline is ``now`` plus
    its ``timeout_ms``) and returns the ``ParkedRead``, or ``None`` when the
    connection already parks ``max_per_connection`` requests, or
    ``max_per_ledger`` for that ledger (the shell answers TOO_MANY_REQUESTS).
    ``lac_rose(ledger_id, lac)`` removes and returns the reads of that ledger
    that waited for a LAC below ``lac`` (answer them); ``expire(parked)`` removes
    one at its deadline (True: it was still parked, answer it); ``drop(conn)``
    forgets a lost connection's reads; ``take_all()`` empties the set
    (shutdown). Each request parked counts as in flight on its connection
    until one of those returns it (the shell's ``request_started`` and
    ``request_finished``).
    """

    __slots__ = ("_by_conn", "_by_ledger", "_per_conn_ledger", "max_per_connection", "max_per_ledger")

    def __init__(self, max_per_connection: int = DEFAULT_MAX_LONG_POLLS_PER_CONNECTION,
                 max_per_ledger: int = DEFAULT_MAX_LONG_POLLS_PER_LEDGER) -> None:
        if max_per_connection <= 0 or max_per_ledger <= 0:
            raise ValueError("long-poll limits must be positive")
        self.max_per_connection = max_per_connection
        self.max_per_ledger = max_per_ledger
        self._by_ledger: dict[int, dict[ParkedRead[K], None]] = {}
        self._by_conn: dict[K, dict[ParkedRead[K], None]] = {}
        self._per_conn_ledger: dict[tuple[K, int], int] = {}

    def __len__(self) -> int:
        return sum(len(reads) for reads in self._by_conn.values())

    def watched(self, ledger_id: int) -> bool:
        """Whether a read waits on ``ledger_id`` (the shell's cheap test on every LAC rise)."""
        return ledger_id in self._by_ledger

    @property
    def watched_ledgers(self) -> Container[int]:
        """A live view: ``ledger_id in polls.watched_ledgers`` is ``watched(ledger_id)`` without a call."""
        return self._by_ledger.keys()

    def parked_by(self, conn: K) -> int:
        return len(self._by_conn.get(conn, ()))

    def park(self, conn: K, request: Request, now: float) -> ParkedRead[K] | None:
        """Park ``request``; ``None`` when ``conn`` is at a limit (nothing parked)."""
        ledger_id = request.ledger_id
        mine = self._by_conn.get(conn)
        if mine is not None and len(mine) >= self.max_per_connection:
            return None
        key = (conn, ledger_id)
        if self._per_conn_ledger.get(key, 0) >= self.max_per_ledger:
            return None
        parked = ParkedRead(conn, request, now + request.timeout_ms / 1000.0)
        if mine is None:
            mine = self._by_conn[conn] = {}
        mine[parked] = None
        self._by_ledger.setdefault(ledger_id, {})[parked] = None
        self._per_conn_ledger[key] = self._per_conn_ledger.get(key, 0) + 1
        return parked

    def lac_rose(self, ledger_id: int, lac: int) -> list[ParkedRead[K]]:
        """Remove and return the reads of ``ledger_id`` waiting for a LAC above theirs, now below ``lac``."""
        waiting = self._by_ledger.get(ledger_id)
        if not waiting:
            return []
        due = [p for p in waiting if p.request.previous_lac < lac]
        for p in due:
            self._forget(p)
        return due

    def expire(self, parked: ParkedRead[K]) -> bool:
        """Remove ``parked`` (its deadline passed); False when it was answered or dropped already."""
        waiting = self._by_ledger.get(parked.ledger_id)
        if waiting is None or parked not in waiting:
            return False
        self._forget(parked)
        return True

    def drop(self, conn: K) -> list[ParkedRead[K]]:
        """Forget every read of ``conn`` (the connection is gone) and return them."""
        reads = list(self._by_conn.get(conn, ()))
        for p in reads:
            self._forget(p)
        return reads

    def take_all(self) -> list[ParkedRead[K]]:
        """Remove and return every parked read (the bookie is stopping: answer them)."""
        reads = [p for waiting in self._by_ledger.values() for p in waiting]
        self._by_ledger.clear()
        self._by_conn.clear()
        self._per_conn_ledger.clear()
        return reads

    def _forget(self, p: ParkedRead[K]) -> None:
        ledger_id = p.ledger_id
        waiting = self._by_ledger[ledger_id]
        del waiting[p]
        if not waiting:
            del self._by_ledger[ledger_id]
        mine = self._by_conn[p.conn]
        del mine[p]
        if not mine:
            del self._by_conn[p.conn]
        key = (p.conn, ledger_id)
        left = self._per_conn_ledger[key] - 1
        if left:
            self._per_conn_ledger[key] = left
        else:
            del self._per_conn_ledger[key]


# --- txn-id matching (client side) -------------------------------------------------------------

T = TypeVar("T")


class PendingRequests(TxnTable[tuple[int, T]], Generic[T]):
    """Outstanding requests of one connection, keyed by txn id (``bookie.wire.TxnTable``).

    Holds any value per request (a future, a callback...) with the request's
    op. Responses may arrive in any order; ``complete`` matches one to its
    request and checks the op. Txn ids come from ``next_txn_id`` (1, 2, ...;
    0 is reserved for the bookie's replies to undecodable frames).
    """

    __slots__ = ()

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
        return [v for _, v in self.drain_values()]


# --- client side: one ADD_ENTRY encoding framed for every bookie (the ledger client's section) ---

_TXN_TAG = 0x08  # Request.txn_id is field 1, wire type 0 (varint)
_HEAD_1 = struct.Struct(">IBB")  # length prefix, tag, a 1-byte varint
_HEAD_2 = struct.Struct(">IBBB")
_HEAD_3 = struct.Struct(">IBBBB")
_HEAD_4 = struct.Struct(">IBBBBB")


def add_request_body(ledger_id: int, entry_id: int, master_key: bytes, payload: bytes, *,
                     recovery: bool = False) -> bytes:
    """An ADD_ENTRY ``Request`` serialized without a txn id: encoded once, framed per bookie (``add_frame_head``)."""
    return Request(op=ADD_ENTRY, ledger_id=ledger_id, entry_id=entry_id, master_key=master_key, body=payload,
                   recovery=recovery).SerializeToString()


class AddBodies:
    """``add_request_body`` for one ledger writer: ``bodies.body(entry_id, payload)`` (the client's hot path).

    The same bytes as ``add_request_body``, put together from the ledger's
    fields encoded once per writer (op, ledger id, master key, recovery
    flag), the entry id's varint and the payload: no protobuf object per add,
    and none kept either. (A ``Request`` kept per writer with ``body`` set
    for every add grew by each payload: a upb message's arena never frees
    the bytes a field held before, so the hub kept about 460 bytes per
    published message, issue 35.) ``ValueError`` for an entry id outside
    0 .. 2**63-1.
    """

    __slots__ = ("_head", "_key", "_tail", "ledger_fields", "ledger_id", "multi_fields")

    def __init__(self, ledger_id: int, master_key: bytes, *, recovery: bool = False) -> None:
        self.ledger_id = ledger_id
        # fields in number order, as protobuf writes them: op, ledger_id | entry_id | master_key, body | recovery
        self._head = Request(op=ADD_ENTRY, ledger_id=ledger_id).SerializeToString()
        self._key = Request(master_key=master_key).SerializeToString()
        self._tail = Request(recovery=recovery).SerializeToString()
        self.ledger_fields = Request(ledger_id=ledger_id, master_key=master_key, recovery=recovery).SerializeToString()
        """The ledger's fields of an ADD_ENTRIES request (``add_entries_frame``)."""
        self.multi_fields = Request(master_key=master_key, recovery=recovery).SerializeToString()
        """The fields of an ADD_ENTRIES_MULTI request shared by the ledgers framed together (no ledger id)."""

    def body(self, entry_id: int, payload: bytes) -> bytes:
        if not 0 <= entry_id < 1 << 63:
            raise ValueError(f"entry id {entry_id} outside 0 .. 2**63-1")
        return b"".join((self._head, _ENTRY_ID_TAG + _varint(entry_id) if entry_id else b"", self._key,
                         _BODY_TAG + _varint(len(payload)) if payload else b"", payload, self._tail))


_ENTRY_ID_TAG = b"\x20"   # Request.entry_id is field 4, wire type 0 (varint)
_BODY_TAG = b"\x32"       # Request.body is field 6, wire type 2 (length-delimited)


def add_frame_head(txn_id: int, body: bytes) -> bytes:
    """The bytes that make ``body`` (from ``add_request_body``) a frame with ``txn_id`` (1 .. 2**64-1).

    Send the head, then ``body`` itself (``writelines``: the body is shared by
    every bookie, never copied). Protobuf parses concatenated messages as one,
    so the txn id field is its own encoding: tag, then a base-128 varint.
    """
    size = len(body)
    if txn_id < 0x80:
        return _HEAD_1.pack(size + 2, _TXN_TAG, txn_id)
    if txn_id < 0x4000:
        return _HEAD_2.pack(size + 3, _TXN_TAG, (txn_id & 0x7F) | 0x80, txn_id >> 7)
    if txn_id < 0x200000:
        return _HEAD_3.pack(size + 4, _TXN_TAG, (txn_id & 0x7F) | 0x80, ((txn_id >> 7) & 0x7F) | 0x80,
                            txn_id >> 14)
    if txn_id < 0x10000000:  # a long-lived connection (a hub's) passes 2**21 adds within the hour
        return _HEAD_4.pack(size + 5, _TXN_TAG, (txn_id & 0x7F) | 0x80, ((txn_id >> 7) & 0x7F) | 0x80,
                            ((txn_id >> 14) & 0x7F) | 0x80, txn_id >> 21)
    varint = bytearray((_TXN_TAG,))
    while txn_id >= 0x80:
        varint.append((txn_id & 0x7F) | 0x80)
        txn_id >>= 7
    varint.append(txn_id)
    return LENGTH_PREFIX.pack(len(varint) + size) + varint


_ENTRIES_TAG = 0x62   # Request.entries is field 12, wire type 2 (length-delimited)
_ENTRY_LEADS = struct.Struct(">BB"), struct.Struct(">BBB"), struct.Struct(">BBBB")
_OP_FIELD: dict[int, bytes] = {op: b"\x10" + bytes((op,)) for op in (ADD_ENTRIES, ADD_ENTRIES_MULTI)}


def add_entries_frame(txn_id: int, ledger_fields: bytes, payloads: list[bytes],
                      op: int = ADD_ENTRIES) -> tuple[list[bytes], int]:
    """One ADD_ENTRIES frame of ``payloads`` as parts for ``writelines``, and its length.

    With ``op=ADD_ENTRIES_MULTI`` and ``AddBodies.multi_fields`` the payloads
    may be of several ledgers (each payload's header names its ledger).

    ``ledger_fields`` is ``AddBodies.ledger_fields`` (ledger id, master key,
    recovery flag, encoded once per writer). The parts are the head (length
    prefix, txn id, op, ledger fields), then per entry a field lead (tag,
    length varint) and the payload itself, shared by every bookie and never
    copied: protobuf reads the concatenation as ``Request(txn_id,
    op=ADD_ENTRIES, ledger_id=..., master_key=..., entries=[...])``.
    """
    parts = [b""]
    total = 0
    two, three, four = _ENTRY_LEADS
    for payload in payloads:
        n = len(payload)
        if n < 0x80:
            lead = two.pack(_ENTRIES_TAG, n)
        elif n < 0x4000:
            lead = three.pack(_ENTRIES_TAG, n & 0x7F | 0x80, n >> 7)
        elif n < 0x200000:
            lead = four.pack(_ENTRIES_TAG, n & 0x7F | 0x80, (n >> 7) & 0x7F | 0x80, n >> 14)
        else:
            lead = bytes((_ENTRIES_TAG,)) + _varint(n)
        parts.append(lead)
        parts.append(payload)
        total += len(lead) + n
    head = b"\x08" + _varint(txn_id) + _OP_FIELD[op] + ledger_fields
    total += len(head)
    parts[0] = LENGTH_PREFIX.pack(total) + head
    return parts, total + PREFIX_SIZE


_Callback = TypeVar("_Callback", bound=Callable[[Response], object])


class ClientTxns(PendingRequests[T]):
    """``PendingRequests`` that also takes requests sent as pre-encoded frames (``add_frame_head``)."""

    __slots__ = ()

    def add_next(self, op: int, value: T) -> int:
        """Take the next txn id for a request of ``op`` sent as a pre-encoded frame; return it."""
        pending = self._pending
        txn_id = self._next = (self._next + 1) & TXN_ID_MASK or 1    # TxnTable.take inlined: the add path
        while txn_id in pending:  # after 2**64 requests: skip ids still outstanding
            txn_id = self.next_txn_id()
        pending[txn_id] = (op, value)
        return txn_id

    def answer(self: ClientTxns[_Callback], frames: list[bytes],
               misfit: Callable[[Response | None, errors.ProtocolError], None]) -> int:
        """Parse each response frame and run the callback of the request it answers, in order.

        Returns how many answered an add (ADD_ENTRY, ADD_ENTRIES, ADD_ENTRIES_MULTI). A frame that does not parse
        (``misfit(None, MalformedFrameError)``) or matches no outstanding
        request of its op (``misfit(response, ProtocolError)``, as
        ``complete`` raises it) is skipped. The client's read path: one call
        per read, not per frame.
        """
        pending = self._pending
        parse = _response_from
        adds = 0
        for frame in frames:
            try:
                response = parse(frame)
            except (DecodeError, ValueError, RuntimeError) as exc:
                misfit(None, errors.MalformedFrameError(f"malformed response frame of {len(frame)} bytes: {exc}"))
                continue
            entry = pending.pop(response.txn_id, None)
            if entry is None or entry[0] != response.op:
                if entry is not None:
                    pending[response.txn_id] = entry
                try:
                    self.complete(response)  # raises the error that says what is wrong
                except errors.ProtocolError as exc:
                    misfit(response, exc)
                continue
            if entry[0] in ADD_OPS:
                adds += 1
            entry[1](response)
        return adds

    def add_txn(self, txn_id: int, op: int, value: T) -> None:
        """Remember ``value`` for a request known by its txn id and op; ``ProtocolError`` if outstanding."""
        if txn_id in self._pending:
            raise errors.ProtocolError(f"txn id {txn_id} is already outstanding")
        self._pending[txn_id] = (op, value)
