"""Client connections to bookies: one pipelined ``asyncio.Protocol`` per bookie address.

    pool = BookieConnectionPool(connect_timeout=3.0)
    conn = await pool.get("127.0.0.1:3181")      # BookieUnavailableError if it cannot connect
    response = await conn.request(read_request(conn.next_txn_id(), ...), timeout=5.0)

    conn = pool.connected("127.0.0.1:3181")       # the open connection, or None (no waiting)
    conn.submit(add_request(0, ...), callback)     # callback(Response | BKError), no future

The adds of one loop turn (``submit_entry``, as the ledger writer sends
them) leave as one ADD_ENTRIES frame per ledger, one answer for all of
them, or, when they are of several ledgers sharing a master key (a hub's
topics), as one ADD_ENTRIES_MULTI frame, one answer for all; a bookie that
does not know ADD_ENTRIES_MULTI gets one ADD_ENTRIES per ledger from then
on, and one that does not know ADD_ENTRIES (older versions answer
UNKNOWN_OP) every add as one ADD_ENTRY frame.
Requests submitted in one loop turn leave in one ``writelines`` call
(``bookie.outbox.Outbox``, shared with the bookie server), at the end of
the turn or as soon as ``FLUSH_BYTES`` (64 KiB) wait (see below);
responses are matched by txn id (``bookie.protocol.PendingRequests``) in
whatever order they come. ``submit`` is the allocation-free path the ledger
writer uses: the callback gets the response (any status) or, when the
connection drops, a ``BookieUnavailableError``. ``send``/``request`` wrap it
in a future. A response that matches no request (txn id 0: the bookie could
not decode a frame) goes to ``on_orphan``. The next ``pool.get`` after a
loss reconnects.

The early write at ``FLUSH_BYTES``: a client answering a large read of
responses with as many new adds starts the bookies on the first ones while
it still encodes the rest (the bookies would otherwise idle until the end
of the turn; ``quire bench ledger`` E1 W1 A1 went from 61 k to 82 k adds/s
with it, E3 W2 A2 from 42 k to 47 k, means of 4 interleaved pairs).

Failure detection: every connection turns on TCP keepalive
(``keepalive`` seconds idle and between probes) and ``TCP_USER_TIMEOUT``
(``user_timeout`` seconds), so the kernel drops a connection whose peer host
stopped acknowledging packets (a cut-off host: no RST) in about that long,
with or without requests outstanding. A bookie *process* that stopped
answering while its host still acknowledges (stopped, hung) is left to the
callers: ``conn.add_silence(now)`` (how long adds have been outstanding on
the connection without any ADD_ENTRY response) and ``conn.last_reply`` (loop
time of the last response of any kind) tell silence from slowness, and
``pool.drop(conn)`` closes a connection judged dead, so the next ``get``
opens a fresh one instead of queueing behind it.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import socket
import time
from collections.abc import Callable
from typing import TypeVar, cast

from bookie import protocol, tracing
from bookie.errors import BKError, BookieUnavailableError, ProtocolError
from bookie.frame_answers import ResponseCallback, _AddRun, _by_ledger, _LacsRun, _LedgersRun
from bookie.outbox import Outbox
from bookie.wire.sockets import set_tcp_liveness as wire_liveness

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_TCP_KEEPALIVE", "DEFAULT_TCP_USER_TIMEOUT", "FLUSH_BYTES", "BookieConnection",
           "BookieConnectionPool", "ResponseCallback", "set_tcp_liveness"]

_ADD_ENTRY = protocol.ADD_ENTRY
_ADD_ENTRIES = protocol.ADD_ENTRIES
_ADD_ENTRIES_MULTI = protocol.ADD_ENTRIES_MULTI
_WRITE_LAC_MULTI = protocol.WRITE_LAC_MULTI
_MULTI_FIELDS = operator.attrgetter("multi_fields")
_add_frame_head = protocol.add_frame_head

C = TypeVar("C", bound="BookieConnection")

DEFAULT_TCP_USER_TIMEOUT = 2.0
FLUSH_BYTES = 64 * 1024
"""A connection writes what it queued once this many bytes wait, not only at the end of the loop turn."""
DEFAULT_TCP_KEEPALIVE = 1.0
JOIN_BYTES = 16 * 1024
"""A write of several parts up to this long is joined into one buffer first (``Outbox``: less CPU than a writev)."""


def set_tcp_liveness(sock: socket.socket | None, user_timeout: float, keepalive: float) -> None:
    """Probes every ``keepalive`` s (two lost: dead) and ``TCP_USER_TIMEOUT`` of ``user_timeout`` s (0: off)."""
    wire_liveness(sock, idle=keepalive, interval=keepalive, probes=2, user_timeout=user_timeout)


def _time_out(fut: asyncio.Future[protocol.Response]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


def _resolve(fut: asyncio.Future[protocol.Response], result: protocol.Response | BKError) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


class BookieConnection(asyncio.Protocol):
    """One TCP connection to one bookie; requests pipeline, responses match by txn id."""

    def __init__(self, address: str = "", max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE,
                 on_orphan: Callable[[protocol.Response], None] | None = None, *,
                 user_timeout: float = DEFAULT_TCP_USER_TIMEOUT, keepalive: float = DEFAULT_TCP_KEEPALIVE) -> None:
        self.address = address
        self.on_orphan = on_orphan
        self._user_timeout = user_timeout
        self._keepalive = keepalive
        self._decoder = protocol.FrameDecoder(max_frame_size)
        self._pending: protocol.ClientTxns[ResponseCallback] = protocol.ClientTxns()
        self._transport: asyncio.Transport | None = None
        self._outbox = Outbox(flush_bytes=FLUSH_BYTES, join_bytes=JOIN_BYTES)
        self._loop = asyncio.get_running_loop()
        self.is_closed = False
        """True once the connection is lost or closed (then ``pool.get`` opens a new one)."""
        self.done: asyncio.Future[None] = self._loop.create_future()
        """Resolves once the connection is lost or closed."""
        self.last_reply = self._loop.time()
        """Loop time of the last response of any kind (the connection's start before one)."""
        self._adds_out = 0
        self._add_wait_since = self.last_reply
        self.batch_adds = True
        """Adds of one loop turn leave as ADD_ENTRIES frames (False once the bookie refused the op)."""
        self.batch_ledgers = True
        """Adds of several ledgers in one loop turn leave as one ADD_ENTRIES_MULTI frame (False once the
        bookie refused the op: then one ADD_ENTRIES per ledger)."""
        self._entries: list[bytes] = []   # ``submit_entry``s of this turn not framed yet
        self._entry_ledgers: list[protocol.AddBodies] = []
        self._entry_ids: list[int] = []
        self._entry_callbacks: list[ResponseCallback] = []
        self._entries_bytes = 0
        self._entries_due = False
        self.batch_lacs = True
        """Explicit LACs of one loop turn leave as one WRITE_LAC_MULTI per master key (False once the bookie
        refused the op: then one WRITE_LAC each)."""
        self._lacs: list[tuple[bytes, int, int, ResponseCallback]] = []   # ``submit_lac``s not framed yet
        self._lacs_due = False

    @classmethod
    async def connect(cls: type[C], address: str, timeout: float = 10.0,
                      max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE, *,
                      user_timeout: float = DEFAULT_TCP_USER_TIMEOUT, keepalive: float = DEFAULT_TCP_KEEPALIVE) -> C:
        """Open a connection to ``host:port``; ``BookieUnavailableError`` when that fails in ``timeout``.

        ``user_timeout``/``keepalive`` (seconds, 0 = off) set ``TCP_USER_TIMEOUT`` and keepalive probes.
        """
        host, _, port = address.rpartition(":")
        loop = asyncio.get_running_loop()

        def factory() -> C:
            return cls(address, max_frame_size, user_timeout=user_timeout, keepalive=keepalive)

        try:
            _, proto = await asyncio.wait_for(loop.create_connection(factory, host, int(port)), timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            raise BookieUnavailableError(f"cannot connect to bookie {address}: {exc or 'timeout'}") from None
        return proto

    # asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport
        self._outbox.attach(self._transport)
        set_tcp_liveness(transport.get_extra_info("socket"), self._user_timeout, self._keepalive)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            log.warning("bookie %s sent a bad frame: %s", self.address, exc)
            self._fail(BookieUnavailableError(f"bookie {self.address}: {exc}"))
            return
        if not frames:
            return
        now = self.last_reply = self._loop.time()
        adds = self._pending.answer(frames, self._misfit, self._traced_answer if tracing.FRAMES else None)
        if adds and self._adds_out:
            self._adds_out = max(0, self._adds_out - adds)
            self._add_wait_since = now
        # what the answers' callbacks queued (the next adds) leaves at the end of the turn, not now: the other
        # bookies' answers read in this turn queue more for this connection, and all go in one write

    def _traced_answer(self, response: protocol.Response) -> None:
        """A traced frame's answer (``bookie.tracing``): its copies get the bookie's stages and the read time."""
        copies = tracing.FRAMES.pop((self.address, response.txn_id), None)
        if copies is None or len(response.trace_ns) < 3:
            return
        now = time.monotonic_ns()
        read, written, acked = response.trace_ns[:3]
        for copy in copies:
            copy.times[1:] = [read, written, acked, now]

    def _traced(self, ledgers: list[protocol.AddBodies], ids: list[int]) -> list[tracing.AddTrace]:
        """The traces of the watched adds among these (``bookie.tracing``; called only while some are)."""
        watched = tracing.WATCHED
        return [t for ledger, entry_id in zip(ledgers, ids, strict=True)
                if (t := watched.get((ledger.ledger_id, entry_id))) is not None]

    def _trace_frame(self, txn_id: int, traces: list[tracing.AddTrace]) -> None:
        now = time.monotonic_ns()
        copies = [tracing.BookieTimes(self.address, now) for _ in traces]
        for trace, copy in zip(traces, copies, strict=True):
            trace.bookies.append(copy)
        tracing.FRAMES[(self.address, txn_id)] = copies

    def _misfit(self, response: protocol.Response | None, exc: ProtocolError) -> None:
        if response is not None and self.on_orphan is not None:
            self.on_orphan(response)
        else:
            log.warning("bookie %s: %s", self.address, exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(BookieUnavailableError(f"connection to bookie {self.address} lost"
                                          + (f": {exc}" if exc else "")))

    # add liveness ----------------------------------------------------------------------------
    def _add_sent(self) -> None:
        if not self._adds_out:
            self._add_wait_since = self._loop.time()
        self._adds_out += 1

    def add_silence(self, now: float) -> float:
        """Seconds (at loop time ``now``) adds have been outstanding here without any ADD_ENTRY response.

        0 while no add is outstanding; measured from the later of the last add
        response and the moment adds became outstanding, so a bookie that
        answers slowly stays near 0 and only one that answers nothing grows.
        """
        return now - self._add_wait_since if self._adds_out else 0.0

    # API -------------------------------------------------------------------------------------
    def next_txn_id(self) -> int:
        return self._pending.next_txn_id()

    def submit(self, request: protocol.Request, callback: ResponseCallback) -> None:
        """Queue ``request`` (a txn id is assigned when it has none); ``callback`` gets the outcome.

        On a closed connection the callback runs at once with ``BookieUnavailableError``.
        """
        if self.is_closed or self._transport is None:
            callback(BookieUnavailableError(f"connection to bookie {self.address} is closed"))
            return
        if not request.txn_id:
            request.txn_id = self._pending.next_txn_id()
        self._pending.add(request, callback)
        if request.op == _ADD_ENTRY:
            self._add_sent()
        self._outbox.send(protocol.encode_frame(request))

    def submit_add(self, body: bytes, callback: ResponseCallback) -> None:
        """Queue an ADD_ENTRY encoded once for every bookie (``protocol.add_request_body``); as ``submit``."""
        if self.is_closed or self._transport is None:
            callback(BookieUnavailableError(f"connection to bookie {self.address} is closed"))
            return
        if self._entries:   # entries queued before it leave first, in order
            self._frame_entries()
        txn_id = self._pending.add_next(_ADD_ENTRY, callback)
        if not self._adds_out:  # ``_add_sent`` inlined: the add path
            self._add_wait_since = self._loop.time()
        self._adds_out += 1
        self._outbox.send_pair(_add_frame_head(txn_id, body), body)

    def submit_entry(self, ledger: protocol.AddBodies, entry_id: int, payload: bytes,
                     callback: ResponseCallback) -> None:
        """Queue the add of ``payload`` (an encoded entry) to ``ledger`` (the writer's ``AddBodies``).

        The adds of one loop turn (until ``FLUSH_BYTES`` wait) leave as one
        ADD_ENTRIES frame per ledger, one answer for all; one add alone, a
        payload of ``FLUSH_BYTES`` or more, or every add once the bookie
        refused the op, as an ADD_ENTRY. Callbacks as ``submit``'s; an OK answer is one
        ``Response`` reused for the adds of a frame (read it in the callback,
        do not keep it).
        """
        if self.is_closed or self._transport is None:
            callback(BookieUnavailableError(f"connection to bookie {self.address} is closed"))
            return
        if not self.batch_adds or (len(payload) >= FLUSH_BYTES and not (
                tracing.WATCHED and (ledger.ledger_id, entry_id) in tracing.WATCHED)):   # a traced one: ADD_ENTRIES
            self.submit_add(ledger.body(entry_id, payload), callback)
            return
        self._entries.append(payload)
        self._entry_ledgers.append(ledger)
        self._entry_ids.append(entry_id)
        self._entry_callbacks.append(callback)
        queued = self._entries_bytes = self._entries_bytes + len(payload)
        if queued >= FLUSH_BYTES:   # a frame stays under 2 x FLUSH_BYTES
            self._frame_entries()
            self._outbox.flush()
        elif not self._entries_due:
            self._entries_due = True
            self._loop.call_soon(self._end_of_turn)

    def submit_lac(self, ledger_id: int, master_key: bytes, lac: int, callback: ResponseCallback) -> None:
        """Queue an explicit LAC of ``ledger_id`` (the ledger writer's WRITE_LAC); ``callback`` as ``submit``'s.

        The LACs of one loop turn leave as one WRITE_LAC_MULTI frame per
        master key (a hub's idle topics), one answer for all; one alone, or
        every one once the bookie refused the op, as a WRITE_LAC. An OK
        answer is one ``Response`` (op WRITE_LAC, the ledger and its LAC set)
        reused for the LACs of a frame: read it in the callback, do not keep it.
        """
        if self.is_closed or self._transport is None:
            callback(BookieUnavailableError(f"connection to bookie {self.address} is closed"))
            return
        if not self.batch_lacs:
            self.submit(protocol.write_lac_request(0, ledger_id, master_key, lac), callback)
            return
        self._lacs.append((master_key, ledger_id, lac, callback))
        if not self._lacs_due:
            self._lacs_due = True
            self._loop.call_soon(self._lacs_end_of_turn)

    def _lacs_end_of_turn(self) -> None:
        self._lacs_due = False
        if self._lacs:
            self._frame_lacs()
            self._outbox.flush()

    def _frame_lacs(self) -> None:
        """Frame the LACs queued by ``submit_lac``: one WRITE_LAC_MULTI per master key (a WRITE_LAC for one)."""
        lacs, self._lacs = self._lacs, []
        groups: dict[bytes, list[tuple[bytes, int, int, ResponseCallback]]] = {}
        for item in lacs:
            groups.setdefault(item[0], []).append(item)
        for key, items in groups.items():
            if len(items) == 1:
                _, ledger_id, lac, callback = items[0]
                self.submit(protocol.write_lac_request(0, ledger_id, key, lac), callback)
                continue
            run = _LacsRun(self, items)
            txn_id = self._pending.add_next(_WRITE_LAC_MULTI, run)
            self._outbox.put(protocol.encode_frame(protocol.write_lac_multi_request(
                txn_id, key, [i[1] for i in items], [i[2] for i in items])))

    def _refused_lacs(self, run: _LacsRun) -> None:
        """The bookie does not know WRITE_LAC_MULTI (an older version): send this frame's LACs, and all later,
        one WRITE_LAC each."""
        if self.batch_lacs:
            log.info("bookie %s does not serve WRITE_LAC_MULTI: sending one WRITE_LAC per ledger", self.address)
        self.batch_lacs = False
        for key, ledger_id, lac, callback in run.items:
            self.submit(protocol.write_lac_request(0, ledger_id, key, lac), callback)

    def _end_of_turn(self) -> None:
        self._entries_due = False
        if self._entries:
            self._frame_entries()
            self._outbox.flush()

    def _frame_entries(self) -> None:
        """Frame the entries queued by ``submit_entry`` into the outbox: the adds of several ledgers as one
        ADD_ENTRIES_MULTI per master key and recovery flag (``_frame_ledgers``), else one ADD_ENTRIES per run of
        one ledger (of one entry: an ADD_ENTRY)."""
        payloads, ledgers, ids, callbacks = self._entries, self._entry_ledgers, self._entry_ids, self._entry_callbacks
        self._entries, self._entry_ledgers, self._entry_ids, self._entry_callbacks = [], [], [], []
        self._entries_bytes = 0
        if ledgers.count(ledgers[0]) == len(ledgers):   # all one ledger (AddBodies compare by identity): no
            self._frame_runs(payloads, ledgers, ids, callbacks)   # generator step per add (issue 32)
        elif self.batch_ledgers and self.batch_adds:
            self._frame_ledgers(payloads, ledgers, ids, callbacks)
        else:
            self._frame_runs(*_by_ledger(payloads, ledgers, ids, callbacks))

    def _frame_ledgers(self, payloads: list[bytes], ledgers: list[protocol.AddBodies], ids: list[int],
                       callbacks: list[ResponseCallback]) -> None:
        """One ADD_ENTRIES_MULTI frame per set of ledgers sharing a master key and recovery flag (a hub's
        topics all do); a set of one ledger goes as its runs (``_frame_runs``). Called with the adds of more
        than one ledger."""
        fields = ledgers[0].multi_fields
        if all(map(fields.__eq__, map(_MULTI_FIELDS, ledgers))):   # one master key (a hub's): one frame
            self._frame_multi(fields, payloads, ledgers, ids, callbacks)
            return
        groups: dict[bytes, list[int]] = {}
        for i, ledger in enumerate(ledgers):
            groups.setdefault(ledger.multi_fields, []).append(i)
        for fields, idx in groups.items():
            if len(groups) == 1:
                part = (payloads, ledgers, ids, callbacks)
            else:
                part = ([payloads[i] for i in idx], [ledgers[i] for i in idx], [ids[i] for i in idx],
                        [callbacks[i] for i in idx])
            first = part[1][0]
            if all(ledger is first for ledger in part[1]):
                self._frame_runs(*part)
            else:
                self._frame_multi(fields, *part)

    def _frame_multi(self, fields: bytes, payloads: list[bytes], ledgers: list[protocol.AddBodies], ids: list[int],
                     callbacks: list[ResponseCallback]) -> None:
        """One ADD_ENTRIES_MULTI frame of these adds (of several ledgers sharing ``multi_fields``), into the outbox."""
        self._add_sent()
        run = _LedgersRun(self, payloads, ledgers, ids, callbacks)
        traced = self._traced(ledgers, ids) if tracing.WATCHED else None
        txn_id = self._pending.add_next(_ADD_ENTRIES_MULTI, run)
        frame, nbytes = protocol.add_entries_frame(txn_id, fields, payloads, _ADD_ENTRIES_MULTI, trace=bool(traced))
        if traced:
            self._trace_frame(txn_id, traced)
        self._outbox.put_all(frame, nbytes)

    def _frame_runs(self, payloads: list[bytes], ledgers: list[protocol.AddBodies], ids: list[int],
                    callbacks: list[ResponseCallback]) -> None:
        """One ADD_ENTRIES per run of one ledger (of one entry: an ADD_ENTRY), into the outbox."""
        n = len(payloads)
        i = 0
        while i < n:
            ledger = ledgers[i]
            j = i + 1
            while j < n and ledgers[j] is ledger:
                j += 1
            self._add_sent()
            traced = self._traced(ledgers[i:j], ids[i:j]) if tracing.WATCHED else None
            if j == i + 1 and not traced:   # one add alone (a moderate rate): an ADD_ENTRY, the bookie's cheaper path
                body = ledger.body(ids[i], payloads[i])
                self._outbox.put(_add_frame_head(self._pending.add_next(_ADD_ENTRY, callbacks[i]), body))
                self._outbox.put(body)
                i = j
                continue
            if i == 0 and j == n:   # the usual case: one ledger's adds
                run = _AddRun(self, ledger, payloads, ids, callbacks)
            else:
                run = _AddRun(self, ledger, payloads[i:j], ids[i:j], callbacks[i:j])
            txn_id = self._pending.add_next(_ADD_ENTRIES, run)
            parts, nbytes = protocol.add_entries_frame(txn_id, ledger.ledger_fields, run.payloads,
                                                       trace=bool(traced))
            if traced:   # a traced add goes as ADD_ENTRIES even alone: only that op answers with its stages
                self._trace_frame(txn_id, traced)
            self._outbox.put_all(parts, nbytes)
            i = j

    def _refused_ledgers(self, run: _LedgersRun) -> None:
        """The bookie does not know ADD_ENTRIES_MULTI (an older version): send this frame's adds, and all later,
        as one ADD_ENTRIES per ledger."""
        if self.batch_ledgers:
            log.info("bookie %s does not serve ADD_ENTRIES_MULTI: sending one ADD_ENTRIES per ledger", self.address)
        self.batch_ledgers = False
        if self.is_closed:
            for callback in run.callbacks:
                callback(BookieUnavailableError(f"connection to bookie {self.address} is closed"))
            return
        self._frame_runs(*_by_ledger(run.payloads, run.ledgers, run.ids, run.callbacks))
        self._outbox.flush()

    def _refused_batches(self, run: _AddRun) -> None:
        """The bookie does not know ADD_ENTRIES (an older version): send this run's adds, and all later, singly."""
        if self.batch_adds:
            log.info("bookie %s does not serve ADD_ENTRIES: sending adds one by one", self.address)
        self.batch_adds = False
        ledger = run.ledger
        for entry_id, payload, callback in zip(run.ids, run.payloads, run.callbacks, strict=True):
            self.submit_add(ledger.body(entry_id, payload), callback)

    def send(self, request: protocol.Request) -> asyncio.Future[protocol.Response]:
        """Queue ``request``; the future resolves to its response (any status) or fails."""
        fut: asyncio.Future[protocol.Response] = self._loop.create_future()
        self.submit(request, lambda result: _resolve(fut, result))
        return fut

    async def request(self, request: protocol.Request, timeout: float | None = None) -> protocol.Response:
        """Send and wait for the response; ``builtins.TimeoutError`` after ``timeout`` seconds."""
        fut = self.send(request)
        if timeout is None:
            return await fut
        # a timer on the future itself, not ``asyncio.wait_for`` (a coroutine and a second future for each
        # request: a takeover's fencing reads are three requests a topic, issue 34)
        timer = self._loop.call_later(timeout, _time_out, fut)
        try:
            return await fut
        except TimeoutError:
            self.forget(request.txn_id, request.op)
            raise
        finally:
            timer.cancel()

    def send_raw(self, data: bytes) -> None:
        """Queue raw bytes (tests send malformed frames with it)."""
        self._outbox.send(data)

    def forget(self, txn_id: int, op: int = 0) -> None:
        """Drop an outstanding request of ``op`` (its callback will not run)."""
        if self._pending.pop(txn_id) is not None and op == _ADD_ENTRY and self._adds_out:
            self._adds_out -= 1

    def flush(self) -> None:
        """Write what is queued now, in one ``writelines``."""
        if self._entries:
            self._frame_entries()
        if self._lacs:
            self._frame_lacs()
        self._outbox.flush()

    def _fail(self, exc: BookieUnavailableError) -> None:
        self.is_closed = True
        self._adds_out = 0
        if tracing.FRAMES:
            for key in [k for k in tracing.FRAMES if k[0] == self.address]:
                del tracing.FRAMES[key]
        self._outbox.detach()
        queued, self._entry_callbacks = self._entry_callbacks, []
        queued += [item[3] for item in self._lacs]
        self._lacs = []
        self._entries, self._entry_ledgers, self._entry_ids, self._entries_bytes = [], [], [], 0
        for callback in [*self._pending.drain(), *queued]:
            callback(exc)
        if self._transport is not None:
            self._transport.abort()
        if not self.done.done():
            self.done.set_result(None)

    def close(self, reason: str = "closed") -> None:
        """Close now: outstanding requests fail with ``BookieUnavailableError``."""
        self._fail(BookieUnavailableError(f"connection to bookie {self.address} {reason}"))


class BookieConnectionPool:
    """Connections by bookie address, opened on first use and re-opened after a loss."""

    def __init__(self, connect_timeout: float = 2.0,
                 max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE, *,
                 user_timeout: float = DEFAULT_TCP_USER_TIMEOUT, keepalive: float = DEFAULT_TCP_KEEPALIVE) -> None:
        self.connect_timeout = connect_timeout
        self.max_frame_size = max_frame_size
        self.user_timeout = user_timeout
        self.keepalive = keepalive
        self._conns: dict[str, BookieConnection] = {}
        self._connecting: dict[str, asyncio.Future[BookieConnection]] = {}

    def connected(self, address: str) -> BookieConnection | None:
        """The open connection to ``address``, or ``None`` (then ``await get(address)``)."""
        conn = self._conns.get(address)
        return conn if conn is not None and not conn.is_closed else None

    async def get(self, address: str) -> BookieConnection:
        """The open connection to ``address``, connecting if needed; ``BookieUnavailableError``."""
        conn = self.connected(address)
        if conn is not None:
            return conn
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[BookieConnection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = fut
        try:
            conn = await BookieConnection.connect(address, self.connect_timeout, self.max_frame_size,
                                                  user_timeout=self.user_timeout, keepalive=self.keepalive)
            self._conns[address] = conn
            fut.set_result(conn)
            return conn
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            self._connecting.pop(address, None)

    def drop(self, conn: BookieConnection, reason: str = "dropped: bookie not answering") -> None:
        """Close ``conn`` (its outstanding requests fail) and forget it, so the next ``get`` reconnects.

        For a connection judged dead (a bookie that answers nothing): every
        user of the pool then fails over at once instead of waiting on it.
        Nothing happens when ``conn`` is already closed.
        """
        if self._conns.get(conn.address) is conn:
            del self._conns[conn.address]
        if not conn.is_closed:
            log.warning("dropping the connection to bookie %s: %s", conn.address, reason)
            conn.close(reason)

    def flush(self) -> None:
        """Write what every connection has queued now, not at the end of the loop turn."""
        for conn in self._conns.values():
            # the hub calls this after each read of a client: most connections have nothing queued
            if conn._entries or conn._lacs or conn._outbox.queued_bytes:
                conn.flush()

    def close(self) -> None:
        """Close every connection (their outstanding requests fail)."""
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
