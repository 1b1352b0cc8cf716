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
    ok_answer(frame)                            # (txn_id, op) of an all-OK frame answer, by hand; else None

Frames are a 4-byte big-endian unsigned length followed by that many bytes
of one protobuf ``Request`` or ``Response`` (``bookie/proto/bookie.proto``).
The default ``max_frame_size`` is BookKeeper's ``nettyMaxFrameSizeBytes``
(5 MiB = 5242880); a frame longer than that is refused before its body is
buffered.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import Generic, TypeVar

from google.protobuf.message import DecodeError

from bookie import errors

# the messages, the server's rules and its long polls live in modules of their own; their names are
# handed on here, for the importers of this module
from bookie.long_polls import DEFAULT_MAX_LONG_POLLS_PER_CONNECTION as DEFAULT_MAX_LONG_POLLS_PER_CONNECTION
from bookie.long_polls import DEFAULT_MAX_LONG_POLLS_PER_LEDGER as DEFAULT_MAX_LONG_POLLS_PER_LEDGER
from bookie.long_polls import Cancellable as Cancellable
from bookie.long_polls import LongPolls as LongPolls
from bookie.long_polls import ParkedRead as ParkedRead
from bookie.messages import ADD_ENTRIES as ADD_ENTRIES
from bookie.messages import ADD_ENTRIES_MULTI as ADD_ENTRIES_MULTI
from bookie.messages import ADD_ENTRY as ADD_ENTRY
from bookie.messages import ADD_OPS as ADD_OPS
from bookie.messages import BAD_REQUEST as BAD_REQUEST
from bookie.messages import ENTRY_HEADER as ENTRY_HEADER
from bookie.messages import ERROR as ERROR
from bookie.messages import FENCED as FENCED
from bookie.messages import GET_BOOKIE_INFO as GET_BOOKIE_INFO
from bookie.messages import LAST_ENTRY as LAST_ENTRY
from bookie.messages import MAX_LONG_POLL_TIMEOUT_MS as MAX_LONG_POLL_TIMEOUT_MS
from bookie.messages import NO_ENTRY as NO_ENTRY
from bookie.messages import NO_LEDGER as NO_LEDGER
from bookie.messages import OK as OK
from bookie.messages import OPERATIONS as OPERATIONS
from bookie.messages import READ_ENTRY as READ_ENTRY
from bookie.messages import READ_LAC as READ_LAC
from bookie.messages import READ_ONLY as READ_ONLY
from bookie.messages import STATUS_ERRORS as STATUS_ERRORS
from bookie.messages import STATUS_OF as STATUS_OF
from bookie.messages import TOO_LARGE as TOO_LARGE
from bookie.messages import TOO_MANY_REQUESTS as TOO_MANY_REQUESTS
from bookie.messages import UNAUTHORIZED as UNAUTHORIZED
from bookie.messages import UNKNOWN_OP as UNKNOWN_OP
from bookie.messages import WRITE_LAC as WRITE_LAC
from bookie.messages import WRITE_LAC_MULTI as WRITE_LAC_MULTI
from bookie.messages import AddAcks as AddAcks
from bookie.messages import OperationType as OperationType
from bookie.messages import Request as Request
from bookie.messages import Response as Response
from bookie.messages import StatusCode as StatusCode
from bookie.messages import add_header as add_header
from bookie.messages import add_ok_frame as add_ok_frame
from bookie.messages import add_request as add_request
from bookie.messages import add_response as add_response
from bookie.messages import bookie_info_request as bookie_info_request
from bookie.messages import error_for as error_for
from bookie.messages import error_response as error_response
from bookie.messages import is_long_poll as is_long_poll
from bookie.messages import lac_response as lac_response
from bookie.messages import ok_frame as ok_frame
from bookie.messages import op_name as op_name
from bookie.messages import parse_request as parse_request
from bookie.messages import parse_response as parse_response
from bookie.messages import raise_for_status as raise_for_status
from bookie.messages import read_lac_request as read_lac_request
from bookie.messages import read_request as read_request
from bookie.messages import response_to as response_to
from bookie.messages import status_name as status_name
from bookie.messages import status_of as status_of
from bookie.messages import write_lac_multi_request as write_lac_multi_request
from bookie.messages import write_lac_request as write_lac_request
from bookie.server_rules import DEFAULT_MAX_PENDING_REQUESTS as DEFAULT_MAX_PENDING_REQUESTS
from bookie.server_rules import DEFAULT_MAX_RESPONSE_BYTES as DEFAULT_MAX_RESPONSE_BYTES
from bookie.server_rules import NEED_DATA as NEED_DATA
from bookie.server_rules import PAUSED as PAUSED
from bookie.server_rules import Event as Event
from bookie.server_rules import ServerConnection as ServerConnection
from bookie.server_rules import _response_from

# the framing moved to bookie.wire (shared with the hub); re-exported for the importers of this module
from bookie.wire.framing import DEFAULT_MAX_FRAME_SIZE as DEFAULT_MAX_FRAME_SIZE
from bookie.wire.framing import LENGTH_PREFIX as LENGTH_PREFIX
from bookie.wire.framing import PREFIX_SIZE as PREFIX_SIZE
from bookie.wire.framing import FrameBudget as FrameBudget
from bookie.wire.framing import FrameDecoder as FrameDecoder
from bookie.wire.framing import encode_frame as encode_frame
from bookie.wire.framing import varint as _varint
from bookie.wire.txns import TXN_ID_MASK, TxnTable

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
    0 .. 2**63-1. What derives from the master key and recovery flag only is
    shared by the writers of one password (``_key_fields``): a hub keeps a
    writer per topic (issue 34).
    """

    __slots__ = ("_key", "_ledger", "_tail", "ledger_id", "multi_fields")

    def __init__(self, ledger_id: int, master_key: bytes, *, recovery: bool = False) -> None:
        self.ledger_id = ledger_id
        # fields in number order, as protobuf writes them: op, ledger_id | entry_id | master_key, body | recovery
        self._ledger = Request(ledger_id=ledger_id).SerializeToString()
        self._key, self._tail, self.multi_fields = _key_fields(master_key, recovery)
        """``multi_fields``: the fields of an ADD_ENTRIES_MULTI request shared by the ledgers framed together
        (no ledger id)."""

    @property
    def ledger_fields(self) -> bytes:
        """The ledger's fields of an ADD_ENTRIES request (``add_entries_frame``): ledger id, master key, recovery."""
        return self._ledger + self.multi_fields

    def body(self, entry_id: int, payload: bytes) -> bytes:
        if not 0 <= entry_id < 1 << 63:
            raise ValueError(f"entry id {entry_id} outside 0 .. 2**63-1")
        return b"".join((_ADD_ENTRY_OP, self._ledger, _ENTRY_ID_TAG + _varint(entry_id) if entry_id else b"",
                         self._key, _BODY_TAG + _varint(len(payload)) if payload else b"", payload, self._tail))


@functools.lru_cache(maxsize=64)
def _key_fields(master_key: bytes, recovery: bool) -> tuple[bytes, bytes, bytes]:
    """An add's master key field, its recovery field, and both (``AddBodies``): one copy per password."""
    return (Request(master_key=master_key).SerializeToString(), Request(recovery=recovery).SerializeToString(),
            Request(master_key=master_key, recovery=recovery).SerializeToString())


_ADD_ENTRY_OP = Request(op=ADD_ENTRY).SerializeToString()
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


_TRACE_FIELD = b"\x68\x01"   # Request.trace (field 13, varint) = true
_ENTRIES_TAG = 0x62   # Request.entries is field 12, wire type 2 (length-delimited)
_ENTRY_LEADS = struct.Struct(">BB"), struct.Struct(">BBB"), struct.Struct(">BBBB")
_OP_FIELD: dict[int, bytes] = {op: b"\x10" + bytes((op,)) for op in (ADD_ENTRIES, ADD_ENTRIES_MULTI)}


def add_entries_frame(txn_id: int, ledger_fields: bytes, payloads: list[bytes],
                      op: int = ADD_ENTRIES, *, trace: bool = False) -> tuple[list[bytes], int]:
    """One ADD_ENTRIES frame of ``payloads`` as parts for ``writelines``, and its length.

    With ``op=ADD_ENTRIES_MULTI`` and ``AddBodies.multi_fields`` the payloads
    may be of several ledgers (each payload's header names its ledger).

    ``ledger_fields`` is ``AddBodies.ledger_fields`` (ledger id, master key,
    recovery flag, encoded once per writer). The parts are the head (length
    prefix, txn id, op, ledger fields), then per entry a field lead (tag,
    length varint) and the payload itself, shared by every bookie and never
    copied: protobuf reads the concatenation as ``Request(txn_id,
    op=ADD_ENTRIES, ledger_id=..., master_key=..., entries=[...])``.
    ``trace`` sets ``Request.trace`` (a sampled frame: ``bookie.tracing``).
    """
    parts = [b""]
    total = 0
    two, three, four = _ENTRY_LEADS
    size = -1   # the length the lead was made for: a frame's payloads are mostly of one length
    lead = b""
    for payload in payloads:
        n = len(payload)
        if n != size:
            size = n
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
    if trace:
        head += _TRACE_FIELD
    total += len(head)
    parts[0] = LENGTH_PREFIX.pack(total) + head
    return parts, total + PREFIX_SIZE


_OK_ANSWER_MAX = 12   # bytes of the longest answer ``ok_answer`` reads: a txn id of 9 bytes, the op


def ok_answer(frame: bytes) -> tuple[int, int] | None:
    """``(txn_id, op)`` of an OK answer of nothing but those two, else ``None``.

    Hand-parsed, no ``Response`` (the ledger client's read path, issue 32):
    the body of ``ok_frame`` (an ADD_ENTRIES or ADD_ENTRIES_MULTI whose adds
    all succeeded, a WRITE_LAC_MULTI), i.e. the bytes protobuf writes for
    ``Response(txn_id=..., op=...)`` with status OK; what it returns is what
    ``parse_response`` reads from them. Anything else (a txn id of 0 or of
    2**63 or more, a status, an id, a message, a trace, per-add answers,
    another field) is ``None``: parse it with ``parse_response``.
    """
    n = len(frame)
    if n < 4 or n > _OK_ANSWER_MAX or frame[0] != 0x08 or frame[n - 2] != 0x10:
        return None
    op = frame[n - 1]
    last = frame[n - 3]   # the txn id's varint is frame[1:n-2]: only its last byte below 0x80
    if last >= 0x80 or not 0 < op < 0x80:
        return None
    txn_id = shift = 0
    for b in frame[1:n - 3]:
        if b < 0x80:
            return None
        txn_id |= (b & 0x7F) << shift
        shift += 7
    txn_id |= last << shift
    return (txn_id, op) if txn_id else None


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
               misfit: Callable[[Response | None, errors.ProtocolError], None],
               traced: Callable[[Response], None] | None = None) -> int:
        """Parse each response frame and run the callback of the request it answers, in order.

        Returns how many answered an add (ADD_ENTRY, ADD_ENTRIES, ADD_ENTRIES_MULTI). A frame that does not parse
        (``misfit(None, MalformedFrameError)``) or matches no outstanding
        request of its op (``misfit(response, ProtocolError)``, as
        ``complete`` raises it) is skipped. The client's read path: one call
        per read, not per frame. ``traced`` (while traced frames are out:
        ``bookie.tracing``) sees each add's answer carrying stage times first.
        An OK answer of nothing but its txn id and op (``ok_answer``) goes to
        the value's ``answered_ok()`` when it has one, parsed by hand (no
        ``Response``); a value without one gets the ``Response``.
        """
        pending = self._pending
        parse = _response_from
        adds = 0
        for frame in frames:
            ok = ok_answer(frame) if len(frame) <= _OK_ANSWER_MAX else None
            if ok is not None:   # a frame's all-OK answer, read by hand (``ok_answer``): no Response for a
                txn_id, op = ok   # callback that takes it without one (``answered_ok``)
                entry = pending.get(txn_id)
                if entry is not None and entry[0] == op:
                    answered_ok = getattr(entry[1], "answered_ok", None)
                    if answered_ok is not None:
                        del pending[txn_id]
                        if op in ADD_OPS:
                            adds += 1
                        answered_ok()
                        continue
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
                if traced is not None and response.trace_ns:
                    traced(response)
            entry[1](response)
        return adds

    def add_txn(self, txn_id: int, op: int, value: T) -> None:
        """Remember ``value`` for a request known by its txn id and op; ``ProtocolError`` if outstanding."""
        if txn_id in self._pending:
            raise errors.ProtocolError(f"txn id {txn_id} is already outstanding")
        self._pending[txn_id] = (op, value)
