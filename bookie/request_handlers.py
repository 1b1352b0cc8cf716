"""Serving the requests of a bookie's connections (``bookie.server``): adds, reads, LACs, long polls.

    requests = RequestHandlers(stats, long_polls, disk, read_only=lambda: server.read_only)
    requests.attach(storage, loop)        # once the storage is open, before the first connection
    requests.handle(req, conn)            # any decoded request; ``add_entry`` is the ADD_ENTRY hot path
    storage.on_lac = requests.on_lac      # parked long-poll READ_LACs are answered when the LAC rises

Every answer goes to the connection (``bookie.server_connection``) now or
on completion; see ``bookie.server`` for the statuses and the limits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from bookie import errors
from bookie import protocol as proto
from bookie.digest import HEADER_SIZE
from bookie.disk import DiskUsageMonitor
from bookie.group_commit import GroupCommit
from bookie.server_connection import ADD_ENTRY, ADD_OK, BookieServerProtocol
from bookie.stats import BookieStats
from bookie.storage import EntryStorage

log = logging.getLogger(__name__)

status_of = proto.status_of

__all__ = ["RequestHandlers"]


class _AddsAnswer:
    """The outcomes of one ADD_ENTRIES' adds (``RequestHandlers.add_entries``); answers once all are in.

    ``settled`` is the storage's run sink (indices into the frame's entries);
    ``failed`` records an add refused before the storage took it. ``trace``
    (a traced frame, ``bookie.tracing``): the read time, then the journal's
    and the answer's are added and sent back in ``Response.trace_ns``.
    """

    __slots__ = ("_conn", "_entries", "_errors", "_ledger_id", "_left", "_op", "_stats", "_submitting", "_trace",
                 "_txn_id")

    def __init__(self, stats: BookieStats, conn: BookieServerProtocol, txn_id: int, ledger_id: int,
                 entries: Any, op: proto.OperationType = proto.ADD_ENTRIES, trace: list[int] | None = None) -> None:
        self._stats = stats
        self._conn = conn
        self._op = op         # ADD_ENTRIES, or ADD_ENTRIES_MULTI (each add's ledger from its payload header)
        self._txn_id = txn_id
        self._ledger_id = ledger_id
        self._entries = entries
        self._left = len(entries)
        self._errors: dict[int, BaseException] = {}
        self._submitting = True
        self._trace = trace

    def refuse(self, exc: BaseException) -> None:
        """The frame as a whole is refused (no adds in it)."""
        self._errors[-1] = exc

    def failed(self, i: int, exc: BaseException) -> None:
        self._errors[i] = exc
        self._left -= 1

    def settled(self, indices: Sequence[int], exc: BaseException | None) -> None:
        if exc is not None:
            for i in indices:
                self._errors[i] = exc
        self._left -= len(indices)
        if not self._left and not self._submitting:
            if self._trace is not None:
                self._trace.append(time.monotonic_ns())   # journal written: the storage settles after the sync
            self._answer()

    def submitted(self) -> None:
        """Every add was handed to the storage or refused: answer now if none is still pending."""
        self._submitting = False
        if not self._left:
            self._answer()

    def _answer(self) -> None:
        conn, errs = self._conn, self._errors
        requests = self._stats.requests
        if not errs and self._trace is None:   # the common case: every add durable, one hand-framed OK
            conn.frame_answered(self._op, proto.ok_frame(self._txn_id, self._op), len(self._entries))
            return
        ok = len(self._entries) - len(errs.keys() - {-1})
        if ok:   # every add counts as an ADD_ENTRY in the metrics, as if sent singly
            requests[ADD_OK] = requests.get(ADD_OK, 0) + ok
        op = self._op
        if not errs:
            response = proto.Response(txn_id=self._txn_id, op=op)
        else:
            first = errs[min(errs)]
            response = proto.Response(txn_id=self._txn_id, op=op, status=status_of(first), message=str(first))
            for i, payload in enumerate(self._entries):
                exc = errs.get(i)
                if exc is not None:
                    self._stats.count(ADD_ENTRY, status_of(exc))
                ledger_id, entry_id = (proto.ENTRY_HEADER.unpack_from(payload)[:2] if len(payload) >= HEADER_SIZE
                                       else (self._ledger_id, -1))
                if op == proto.ADD_ENTRIES:   # the ledger of the request (a misplaced entry's answer names it)
                    ledger_id = self._ledger_id
                response.adds.append(proto.add_response(0, ledger_id, entry_id, exc))
        if self._trace is not None:
            trace = self._trace
            while len(trace) < 2:   # answered without waiting for the journal (every add refused)
                trace.append(trace[0])
            response.trace_ns.extend((*trace[:2], time.monotonic_ns()))
        conn.send_frame_later(op, response.status, proto.encode_frame(response))
        conn.finished()


class RequestHandlers:
    """Serves every connection's decoded requests against the storage; see the module docstring."""

    def __init__(self, stats: BookieStats, long_polls: proto.LongPolls[BookieServerProtocol],
                 disk: DiskUsageMonitor, *, read_only: Callable[[], bool]) -> None:
        self._stats = stats
        self._long_polls = long_polls
        self._disk = disk
        self._read_only = read_only
        self._lac_risen: dict[int, None] = {}  # ledgers with parked reads whose LAC rose this loop turn
        self._storage: EntryStorage | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, storage: EntryStorage, loop: asyncio.AbstractEventLoop) -> None:
        """Serve from ``storage`` on ``loop`` (the bookie has opened it)."""
        self._storage = storage
        self._loop = loop

    @property
    def storage(self) -> EntryStorage:
        if self._storage is None:
            raise RuntimeError("bookie not started")
        return self._storage

    @property
    def group(self) -> GroupCommit:
        """The storage's journal hand-off (a connection's reads: ``reading``, ``end_read``)."""
        return self.storage.journal

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("bookie not started")
        return self._loop

    # --- requests -------------------------------------------------------------------------------

    def handle(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        """Serve one decoded request; the response goes to ``conn`` now or on completion."""
        op = req.op
        if op == proto.ADD_ENTRY:
            self.add_entry(req, conn)
            return
        if op == proto.ADD_ENTRIES or op == proto.ADD_ENTRIES_MULTI:
            self.add_entries(req, conn)
            return
        try:
            if op == proto.READ_ENTRY:
                self._read(req, conn)
            elif op == proto.READ_LAC:
                if req.timeout_ms:
                    self._long_poll(req, conn)
                else:
                    storage = self.storage
                    conn.send(proto.lac_response(req, storage.read_lac(req.ledger_id),
                                                 storage.last_entry_id(req.ledger_id)))
            elif op == proto.WRITE_LAC:
                self._write_lac(req, conn)
            elif op == proto.WRITE_LAC_MULTI:
                self._write_lacs(req, conn)
            elif op == proto.GET_BOOKIE_INFO:
                conn.send(self._info(req))
            else:
                conn.send(proto.response_to(req, proto.UNKNOWN_OP, f"unknown op {op}"))
        except Exception as exc:
            self._refuse(req, conn, exc)

    def _refuse(self, req: proto.Request, conn: BookieServerProtocol, exc: Exception) -> None:
        """Answer a request whose serving raised: its ``BKError``'s status, else ``ERROR`` (logged)."""
        if isinstance(exc, errors.BKError):
            conn.send(proto.response_to(req, status_of(exc), str(exc)))
        else:
            log.error("error serving %s from %s", proto.op_name(req.op), conn.peer, exc_info=exc)
            conn.send(proto.response_to(req, proto.ERROR, f"internal error: {exc}"))

    def add_entry(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        """Serve an ADD_ENTRY (``handle``; the connection calls it directly: the hot path).

        Every check of ``handle`` holds: READ_ONLY on a read-only bookie,
        BAD_REQUEST for a payload whose header names another entry, then the
        storage's (ids in range, master key, fencing, closing, back-pressure).
        The answer is framed now (``conn.acks``: ``add_ok_frame``'s bytes) and queued by ``conn.acked``
        once the add's group is durable, with the rest of its run.
        """
        try:
            if self._read_only():
                conn.send(proto.response_to(req, proto.READ_ONLY, "bookie is read-only"))
                return
            body = req.body  # read once: each read of a protobuf bytes field is a copy
            ledger_id, entry_id, lac = proto.add_header(req, body)
            storage = self._storage
            if storage is None:
                raise RuntimeError("bookie not started")
            storage.submit_acked_add(conn.acked, conn.acks.frame(req.txn_id, ledger_id, entry_id), ledger_id,
                                     entry_id, req.master_key, body, lac, recovery=req.recovery)
        except Exception as exc:
            self._refuse(req, conn, exc)
        else:
            conn.started()

    def add_entries(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        """Serve an ADD_ENTRIES (or ADD_ENTRIES_MULTI: adds of several ledgers, each named by its payload
        header, sharing ``master_key``): each of ``req.entries`` as ``add_entry`` would, one answer for all.

        Every entry goes through the checks of ``add_entry`` in request order
        (its payload header must name ``req.ledger_id``; the entry id and LAC
        come from it) and into the storage's runs like single adds (one sink
        per frame, so a frame's adds complete as one run). The answer
        (``_AddsAnswer``) leaves once every add is durable or failed; the frame
        counts as one request in flight.
        """
        entries = req.entries
        ledger_id = req.ledger_id
        multi = req.op == proto.ADD_ENTRIES_MULTI   # several ledgers: each add's from its payload header
        storage = self._storage
        master_key, recovery = req.master_key, req.recovery
        read_only = self._read_only()
        start = 0
        if entries and not req.trace and not read_only and storage is not None:
            # the common case: every add admitted by one call; the frame joins the connection's run of acks
            start = storage.journal.admit_frame(entries, ledger_id, multi, master_key, recovery, conn.acked, req)
            if start == len(entries):
                conn.started()
                return
        answer = _AddsAnswer(self._stats, conn, req.txn_id, ledger_id, entries, req.op,
                             [time.monotonic_ns()] if req.trace else None)
        if not entries:
            answer.refuse(errors.BadRequestError("ADD_ENTRIES without entries"))
        sink = answer.settled   # one object for every add of the frame: they form one run
        if start:
            assert storage is not None
            storage.journal.add_waiter(functools.partial(sink, range(start)))
        header, header_size = proto.ENTRY_HEADER.unpack_from, HEADER_SIZE
        for i in range(start, len(entries)):
            payload = entries[i]
            try:
                if read_only:
                    raise errors.BookieReadOnlyError("bookie is read-only")
                if storage is None:
                    raise RuntimeError("bookie not started")
                if len(payload) < header_size:
                    raise errors.BadRequestError("entry payload shorter than its header")
                lid, entry_id, lac = header(payload)
                if lid != ledger_id and not multi:
                    raise errors.BadRequestError(f"payload is of entry {lid}:{entry_id}")
                storage.submit_acked_add(sink, i, lid, entry_id, master_key, payload, lac, recovery=recovery)
            except Exception as exc:
                if not isinstance(exc, errors.BKError):
                    log.error("error serving an add of ADD_ENTRIES from %s", conn.peer, exc_info=exc)
                answer.failed(i, exc)
        conn.started()
        answer.submitted()

    def frame_failed(self, req: proto.Request, exc: BaseException, conn: BookieServerProtocol) -> None:
        """An ADD_ENTRIES frame whose adds were all admitted (``GroupCommit.admit_frame``) is in a group that failed:
        every add is answered with the error, as ``_AddsAnswer`` answers (the frame is finished then)."""
        answer = _AddsAnswer(self._stats, conn, req.txn_id, req.ledger_id, req.entries, req.op)
        answer.settled(range(len(req.entries)), exc)
        answer.submitted()

    def _read(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        if not req.fence:
            conn.send(self._read_response(req))
            return

        def fenced(exc: BaseException | None) -> None:
            if exc is not None:
                conn.send_later(proto.response_to(req, status_of(exc), str(exc)))
            else:
                conn.send_later(self._read_response(req))
            conn.finished()

        self.storage.submit_fence(req.ledger_id, req.master_key, fenced)
        conn.started()

    def _read_response(self, req: proto.Request) -> proto.Response:
        try:
            entry_id, payload = self.storage.read_entry(req.ledger_id, req.entry_id)
        except errors.BKError as exc:
            return proto.response_to(req, status_of(exc), str(exc))
        resp = proto.response_to(req)
        resp.entry_id = entry_id
        resp.body = payload
        return resp

    def _write_lac(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        if self._read_only():
            conn.send(proto.response_to(req, proto.READ_ONLY, "bookie is read-only"))
            return

        def done(exc: BaseException | None) -> None:
            if exc is None:
                resp = proto.response_to(req)
                resp.lac = req.lac
            else:
                resp = proto.response_to(req, status_of(exc), str(exc))
            conn.send_later(resp)
            conn.finished()

        # UnauthorizedError, BadRequestError, BookieServerError: answered by ``handle``
        self.storage.submit_write_lac(req.ledger_id, req.master_key, req.lac, done)
        conn.started()

    def _write_lacs(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        """WRITE_LAC_MULTI: each (ledger, LAC) pair as a WRITE_LAC of that ledger; one answer once all are durable
        or failed (OK, else the first failure's status). A pair refused up front (a bad id, another master key)
        fails the answer; the others are still recorded."""
        if self._read_only():
            conn.send(proto.response_to(req, proto.READ_ONLY, "bookie is read-only"))
            return
        ledgers, lacs = req.lac_ledger_ids, req.lacs
        if not ledgers or len(ledgers) != len(lacs):
            raise errors.BadRequestError(f"WRITE_LAC_MULTI with {len(ledgers)} ledgers and {len(lacs)} LACs")
        left = len(ledgers)
        failed: list[BaseException] = []

        def done(exc: BaseException | None) -> None:
            nonlocal left
            if exc is not None:
                failed.append(exc)
            left -= 1
            if left:
                return
            if failed:
                resp = proto.response_to(req, status_of(failed[0]), str(failed[0]))
            else:
                resp = proto.response_to(req)
            conn.send_later(resp)
            conn.finished()

        conn.started()
        submit = self.storage.submit_write_lac
        for ledger_id, lac in zip(ledgers, lacs, strict=True):
            try:
                submit(ledger_id, req.master_key, lac, done)
            except errors.BKError as exc:   # refused up front: counted as done, failed
                done(exc)

    # --- long-poll READ_LAC ------------------------------------------------------------------

    def _long_poll(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        storage = self.storage
        try:
            lac: int | None = storage.read_lac(req.ledger_id)  # BadRequestError: answered by ``handle``
        except errors.NoSuchLedgerError:
            lac = None  # not here yet: the ledger's first adds may still come
        if lac is not None and lac > req.previous_lac:
            conn.send(proto.lac_response(req, lac, storage.last_entry_id(req.ledger_id)))
            return
        loop = self.loop
        parked = self._long_polls.park(conn, req, loop.time())
        if parked is None:
            conn.send(proto.response_to(
                req, proto.TOO_MANY_REQUESTS,
                f"this connection already parks {self._long_polls.parked_by(conn)} long-poll reads (limits "
                f"{self._long_polls.max_per_connection}, {self._long_polls.max_per_ledger} per ledger)"))
            return
        parked.timer = loop.call_at(parked.deadline, self._long_poll_expired, parked)
        conn.started()

    def on_lac(self, ledger_id: int, lac: int) -> None:
        """The storage's ``on_lac``: answer the reads parked on ``ledger_id`` on the next loop turn (once per turn)."""
        if not self._long_polls.watched(ledger_id):
            return
        risen = self._lac_risen
        if not risen:
            self.loop.call_soon(self._answer_risen)
        risen[ledger_id] = None

    def _answer_risen(self) -> None:
        risen = list(self._lac_risen)
        self._lac_risen.clear()
        polls = self._long_polls
        for ledger_id in risen:
            if not polls.watched(ledger_id):
                continue
            try:
                lac = self.storage.read_lac(ledger_id)
            except errors.BKError:
                continue
            for parked in polls.lac_rose(ledger_id, lac):
                self._answer_parked(parked)

    def _long_poll_expired(self, parked: proto.ParkedRead[BookieServerProtocol]) -> None:
        if self._long_polls.expire(parked):
            parked.timer = None
            self._answer_parked(parked)

    def _answer_parked(self, parked: proto.ParkedRead[BookieServerProtocol]) -> None:
        """Answer a read taken out of ``long_polls`` with the ledger's LAC now (NO_LEDGER if still unknown)."""
        if parked.timer is not None:
            parked.timer.cancel()
        req = parked.request
        storage = self.storage
        try:
            resp = proto.lac_response(req, storage.read_lac(req.ledger_id), storage.last_entry_id(req.ledger_id))
        except errors.BKError as exc:
            resp = proto.response_to(req, status_of(exc), str(exc))
        except Exception as exc:  # the storage failed: say so, the loop goes on
            log.exception("error answering a long-poll READ_LAC of ledger %d", req.ledger_id)
            resp = proto.response_to(req, proto.ERROR, f"internal error: {exc}")
        conn = parked.conn
        conn.send_later(resp)
        conn.finished()

    def drop_long_polls(self, conn: BookieServerProtocol) -> None:
        """Forget the long-poll reads ``conn`` parked (it is gone: nobody to answer)."""
        for parked in self._long_polls.drop(conn):
            if parked.timer is not None:
                parked.timer.cancel()
            conn.finished()

    def answer_all_long_polls(self) -> None:
        """Stopping: answer every parked read with the LAC the bookie has (storage still open)."""
        if self._storage is None:
            self._long_polls.take_all()
            return
        for parked in self._long_polls.take_all():
            self._answer_parked(parked)

    def _info(self, req: proto.Request) -> proto.Response:
        usage = self._disk.sample()
        resp = proto.response_to(req)
        resp.free_disk = usage.free
        resp.total_disk = usage.total
        resp.read_only = self._read_only()
        return resp
