"""The bookie server: an asyncio shell around ``bookie.protocol`` and ``bookie.storage``.

    server = BookieServer(BookieConf.from_file("conf/bk_server.conf"))
    await server.start()          # storage open, listening, registered
    server.address                # "127.0.0.1:3181"
    await server.stop()           # unregister, finish in-flight commits, close

Each connection is an ``asyncio.Protocol`` around a
``protocol.ServerConnection`` (the rules: framing, BAD_REQUEST/TOO_LARGE,
flow control) and an ``Outbox`` (responses leave in one ``writelines`` per
loop turn). Adds are acknowledged after their group commit
(``EntryStorage``). ADD_ENTRY has a fast path (``add_entry``, called by the
connection without ``handle``'s dispatch; the same checks and statuses):
its OK answer is framed when the add is accepted (``protocol.AddAcks``) and
the storage hands each connection's adds back in runs, so a group's answers
are queued, counted and released from flow control once per run, not per add.
ADD_ENTRIES (``add_entries``: several adds in one frame, what the ledger
client sends) serves each add the same way and answers once for the frame;
ADD_ENTRIES_MULTI is the same for the adds of several ledgers (each named
by its payload header) sharing one master key.
Bad input never stops the process: an undecodable frame is answered
``BAD_REQUEST`` (txn id 0), an unknown op ``UNKNOWN_OP``, an oversized
frame ``TOO_LARGE`` and the connection is then closed (the stream is out
of step).

Memory stays bounded whatever clients do: a connection's requests are not
read while its transport's write buffer is over the high-water mark, while
``max_pending_requests`` of its requests are in flight, or while
``max_pending_response_bytes`` of responses wait to be written; and all
connections together hold at most ``max_partial_frame_bytes`` of
incomplete frames (over it, the newest offender is closed, with a log line).

Long-poll READ_LACs (``timeout_ms > 0``) that cannot be answered at once are
parked (``protocol.LongPolls``) until the ledger's LAC rises past their
``previous_lac`` (the storage's ``on_lac`` hook, from adds and WRITE_LACs)
or their timeout ends; each counts as a request in flight on its
connection. A connection parks at most ``max_long_poll_reads_per_connection``
(``max_long_poll_reads_per_ledger`` per ledger); more get TOO_MANY_REQUESTS.
A lost connection's parked reads are dropped; ``stop`` answers the rest with
the LAC the bookie has.

Background duties, each a task of its own: the disk check
(``bookie.disk``; adds get ``READ_ONLY`` on a read-only bookie, reads go on;
the registration follows), the registration watchdog (re-registers if the
metastore session expired) and garbage collection (``bookie.gc``). Fencing
reads are accepted on a read-only bookie (fencing must reach every bookie of
an ensemble for recovery to be safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import sys
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, cast

from bookie import errors
from bookie import protocol as proto
from bookie.admin import bookie_readiness, bookie_routes
from bookie.autorecovery import AutoRecovery
from bookie.conf import BookieConf
from bookie.digest import HEADER_SIZE
from bookie.disk import DiskUsage, DiskUsageMonitor
from bookie.gc import GarbageCollector
from bookie.http import HttpServer, admin_token, resolve_http_port
from bookie.metadata import LedgerMetadataManager
from bookie.outbox import Outbox
from bookie.registration import BookieRegistration
from bookie.stats import BookieStats
from bookie.storage import EntryStorage
from metastore import MetaStore, open_metastore
from metastore.errors import MetastoreError
from metastore.tasks import spawn

log = logging.getLogger(__name__)

status_of = proto.status_of
add_ok_frame = proto.add_ok_frame
ADD_ENTRY = proto.ADD_ENTRY
OK = proto.OK
ADD_OK = (ADD_ENTRY, OK)

__all__ = ["BookieServer", "BookieServerProtocol", "DiskUsageMonitor", "status_of", "tune_gc"]

SWITCH_INTERVAL = 0.0005
"""GIL switch interval of a bookie process (seconds; CPython's default is 0.005).

The journal and flush threads need the GIL for a moment after each write;
while the event loop thread is busy they wait up to one switch interval for
it, and every add of the group waits with them. 0.5 ms keeps that wait well
under a journal sync and costs nothing while only one thread wants the GIL."""

GC_THRESHOLD = (20_000, 10, 10)
"""Cyclic GC thresholds of a bookie process (``tune_gc``; CPython's default is (700, 10, 10)).

Each add in flight held a completion closure (now: its framed answer, in its
connection's run: ``EntryStorage.submit_acked_add``), so at 700 a pipelining client
(1 000 adds outstanding) set off a young collection every 700 adds whose
survivors climbed to the old generations: 0.5-0.6 s of collections per
425 000 adds (two pipelined runs and a fixed-rate one), pauses up to 37-111
ms; with these settings and ``freeze`` 0.05-0.08 s. Per-add objects die by
reference count long before 20 000 of them accumulate."""


def tune_gc() -> None:
    """Process-wide GC settings of a bookie process; the launcher calls it once, after the imports.

    What exists then (modules, protobuf descriptors, ...) is frozen: no
    collection traverses it again.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


_QUIET_LOGGERS = ("kazoo",)
"""Metastore client libraries whose retry chatter is silenced while the bookie starts."""


@contextlib.contextmanager
def _quiet_client_logs() -> Iterator[None]:
    """Hide client-library warnings (connection retries) during start-up: a failure is one line."""
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


class _AddsAnswer:
    """The outcomes of one ADD_ENTRIES' adds (``BookieServer.add_entries``); answers once all are in.

    ``settled`` is the storage's run sink (indices into the frame's entries);
    ``failed`` records an add refused before the storage took it.
    """

    __slots__ = ("_conn", "_entries", "_errors", "_ledger_id", "_left", "_op", "_server", "_submitting", "_txn_id")

    def __init__(self, server: BookieServer, conn: BookieServerProtocol, txn_id: int, ledger_id: int,
                 entries: Any, op: proto.OperationType = proto.ADD_ENTRIES) -> None:
        self._server = server
        self._conn = conn
        self._op = op         # ADD_ENTRIES, or ADD_ENTRIES_MULTI (each add's ledger from its payload header)
        self._txn_id = txn_id
        self._ledger_id = ledger_id
        self._entries = entries
        self._left = len(entries)
        self._errors: dict[int, BaseException] = {}
        self._submitting = True

    def refuse(self, exc: BaseException) -> None:
        """The frame as a whole is refused (no adds in it)."""
        self._errors[-1] = exc

    def failed(self, i: int, exc: BaseException) -> None:
        self._errors[i] = exc
        self._left -= 1

    def settled(self, indices: list[int], exc: BaseException | None) -> None:
        if exc is not None:
            for i in indices:
                self._errors[i] = exc
        self._left -= len(indices)
        if not self._left and not self._submitting:
            self._answer()

    def submitted(self) -> None:
        """Every add was handed to the storage or refused: answer now if none is still pending."""
        self._submitting = False
        if not self._left:
            self._answer()

    def _answer(self) -> None:
        conn, errs = self._conn, self._errors
        requests = self._server.stats.requests
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
                    self._server.stats.count(ADD_ENTRY, status_of(exc))
                ledger_id, entry_id = (proto.ENTRY_HEADER.unpack_from(payload)[:2] if len(payload) >= HEADER_SIZE
                                       else (self._ledger_id, -1))
                if op == proto.ADD_ENTRIES:   # the ledger of the request (a misplaced entry's answer names it)
                    ledger_id = self._ledger_id
                response.adds.append(proto.add_response(0, ledger_id, entry_id, exc))
        conn.send_frame_later(op, response.status, proto.encode_frame(response))
        conn.finished()


class BookieServerProtocol(asyncio.Protocol):
    """One client connection; see the module docstring."""

    def __init__(self, server: BookieServer, key: int) -> None:
        conf = server.conf
        self._server = server
        self.key = key
        self.state = proto.ServerConnection(conf.max_frame_size, conf.max_pending_requests,
                                            conf.max_pending_response_bytes)
        self.outbox = Outbox(on_flush=self.state.flushed)
        self.started = self.state.request_started  # a request is answered later (``finished``)
        self.acked = self._acked  # the storage's sink for this connection's adds: one object, so runs form
        self.acks = proto.AddAcks()  # frames the OK answers to its adds
        self._reading = True
        self.transport: asyncio.Transport | None = None
        self.peer = "?"

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.outbox.attach(self.transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._server.connections.add(self)
        if self._server.draining:
            self.state.drain()
            self._update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._server.budget.release(self.key)
        self.state.decoder.clear()
        self.outbox.detach()
        self.transport = None
        self._server.drop_long_polls(self)  # after: nothing is resumed or written for them

    def pause_writing(self) -> None:
        self.state.writing_paused()
        self._update_reading()

    def resume_writing(self) -> None:
        self.state.writing_resumed()
        self._serve()
        self.outbox.flush()

    def data_received(self, data: bytes) -> None:
        state = self.state
        state.receive_data(data)
        self._serve()
        self.outbox.flush()
        if self.transport is not None:
            self._server.charge(self, state.buffered)

    # --- serving --------------------------------------------------------------------------------

    def _serve(self) -> None:
        """Serve buffered requests until the rules say stop or more data is needed."""
        state = self.state
        handle = self._server.handle
        add = self._server.add_entry
        next_event = state.next_event
        request_type = proto.Request
        while self.transport is not None:
            event = next_event()
            if type(event) is request_type:
                if event.op == ADD_ENTRY:
                    add(event, self)  # ``handle``'s hot path, without its dispatch
                else:
                    handle(event, self)
            elif event is proto.NEED_DATA:
                break
            elif event is proto.PAUSED:
                if not state.held_by_output:
                    break
                self.outbox.flush()  # only queued responses held it: write them (the transport may
                if state.paused:     # then pause writing), go on if it did not
                    break
            else:
                self._answer_bad_frame(cast(proto.Response, event))
        if state.close_now:
            self._close_if_idle()
        self._update_reading()

    def _answer_bad_frame(self, response: proto.Response) -> None:
        if response.status == proto.TOO_LARGE:
            log.warning("closing connection from %s: %s", self.peer, response.message)
        else:
            log.info("bad frame from %s: %s", self.peer, response.message)
        self.send(response)

    # --- output --------------------------------------------------------------------------------

    def send(self, response: proto.Response) -> None:
        """Queue a response; it is written at the end of this loop turn."""
        self._server.stats.count(response.op, response.status)
        frame = proto.encode_frame(response)
        self.outbox.put(frame)
        if self.state.response_queued(len(frame)):
            self.outbox.flush()

    def send_later(self, response: proto.Response) -> None:
        """Queue a response from a completion callback; the flush is scheduled."""
        if self.transport is not None:
            self.send_frame_later(response.op, response.status, proto.encode_frame(response))

    def send_frame_later(self, op: int, status: int, frame: bytes) -> None:
        """``send_later`` of a response framed already (``op`` and ``status`` are counted)."""
        if self.transport is None:
            return
        self._server.stats.count(op, status)
        self.outbox.send(frame)
        if self.state.response_queued(len(frame)):
            self.outbox.flush()

    def _acked(self, acks: list[bytes], exc: BaseException | None) -> None:
        """The storage's sink for this connection's adds (``submit_acked_add``): answer a run of them.

        ``acks`` are their framed OK answers (``conn.acks``), queued as they
        are once the group is durable; after a failed commit each add is
        answered with the error instead.
        """
        n = len(acks)
        if self.transport is not None:
            if exc is None:
                self._server.stats.requests[ADD_OK] = self._server.stats.requests.get(ADD_OK, 0) + n
                nbytes = sum(map(len, acks))
                self.outbox.send_all(acks, nbytes)
                if self.state.response_queued(nbytes):
                    self.outbox.flush()
            else:
                for ack in acks:
                    ok = proto.parse_response(ack[proto.PREFIX_SIZE:])
                    self.send_later(proto.add_response(ok.txn_id, ok.ledger_id, ok.entry_id, exc))
        self.finished(n)

    def flush(self) -> None:
        self.outbox.flush()

    # --- flow control ---------------------------------------------------------------------------

    def finished(self, n: int = 1) -> None:
        """``n`` requests counted by ``started`` (``state.request_started``) were answered."""
        if self.state.requests_finished(n):
            if self.state.close_now:
                self._close_if_idle()
            elif not self.state.paused and self.transport is not None:
                self._server.loop.call_soon(self._resume)

    def _resume(self) -> None:
        self._serve()
        self.outbox.flush()

    def drain(self) -> None:
        self.state.drain()
        self._update_reading()

    def _close_if_idle(self) -> None:
        """After a framing error: close once every request read before it was answered."""
        if self.transport is not None:
            self.outbox.flush()
            self.transport.close()

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None:
            return
        want = self.state.reading
        if want != self._reading:
            self._reading = want
            if want:
                transport.resume_reading()
            else:
                transport.pause_reading()


class BookieServer:
    """One bookie: storage, listener, registration and background duties."""

    def __init__(self, conf: BookieConf, *, metastore: MetaStore | None = None) -> None:
        self.conf = conf
        self.connections: set[BookieServerProtocol] = set()
        self.draining = False
        self.stats = BookieStats(read_only=lambda: self.read_only, connections=lambda: len(self.connections),
                                 disk_usage=lambda: self.last_disk_usage,
                                 write_cache_bytes=lambda: self._storage.cache_bytes if self._storage else 0,
                                 gauges=self._memory_gauges())
        self.budget = proto.FrameBudget(conf.max_partial_frame_bytes)
        # parked reads count as in flight: at most half of max_pending_requests, so they alone never
        # stop a connection from being read (the in-flight hold lifts at half)
        self.long_polls: proto.LongPolls[BookieServerProtocol] = proto.LongPolls(
            max(1, min(conf.max_long_poll_reads_per_connection, conf.max_pending_requests // 2)),
            conf.max_long_poll_reads_per_ledger)
        self._lac_risen: dict[int, None] = {}  # ledgers with parked reads whose LAC rose this loop turn
        self.last_disk_usage: DiskUsage | None = None
        self.stats_url: str | None = None
        self.http_url = ""              # base URL of the HTTP server ("" when off), named in the registration
        self._ms = metastore
        self._own_ms = metastore is None
        self._storage: EntryStorage | None = None
        self._server: asyncio.AbstractServer | None = None
        self._registration: BookieRegistration | None = None
        self._gc: GarbageCollector | None = None
        self.autorecovery: AutoRecovery | None = None
        self._disk = DiskUsageMonitor(conf.data_dir, conf.disk_usage_threshold, conf.disk_usage_lwm_threshold,
                                      conf.disk_usage_override_file, check_bytes=conf.disk_check_bytes,
                                      extra_paths=(conf.journal_dir,))
        self._keys = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._disk_wakeup = asyncio.Event()
        self._http: HttpServer | None = None
        self.operator_read_only = False   # PUT /api/v1/bookie/state/readonly
        self._address: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stopped = False

    # --- properties -----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` clients connect to (the advertised address); set by ``start``."""
        if self._address is None:
            raise RuntimeError("bookie not started")
        return self._address

    @property
    def storage(self) -> EntryStorage:
        if self._storage is None:
            raise RuntimeError("bookie not started")
        return self._storage

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("bookie not started")
        return self._loop

    @property
    def read_only(self) -> bool:
        """Adds are refused: the disk is over its threshold or the operator switched the bookie read-only."""
        return self._disk.read_only or self.operator_read_only

    @property
    def registered(self) -> bool:
        return self._registration is not None and self._registration.registered

    @property
    def metastore(self) -> MetaStore | None:
        return self._ms

    def disk_usage(self) -> DiskUsage:
        """A fresh sample of the disk usage (``OSError`` when it cannot be measured)."""
        usage = self._disk.sample()
        self.last_disk_usage = usage
        return usage

    async def set_operator_read_only(self, read_only: bool) -> None:
        """The operator's switch: turn the bookie read-only (or back) and publish the registration.

        Raises ``MetastoreError`` when the registration cannot be updated (the
        switch holds anyway; the disk check publishes it later).
        """
        if read_only != self.operator_read_only:
            log.warning("operator turns the bookie %s", "read-only" if read_only else "writable")
        self.operator_read_only = read_only
        if self._registration is not None:
            usage = self.last_disk_usage or self._disk.sample()
            await self._registration.update(read_only=self.read_only, free_disk=usage.free, total_disk=usage.total)

    # --- life cycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open storage and metastore, listen, register, start background duties.

        Raises ``OSError`` (address in use, data directory), ``BKError`` or
        ``MetastoreError``; what was opened is closed again on failure, with
        nothing logged but the reason's own line (the caller reports it).
        """
        conf = self.conf
        self._loop = loop = asyncio.get_running_loop()
        sys.setswitchinterval(SWITCH_INTERVAL)
        try:
            self._storage = storage = EntryStorage(
                conf.data_dir, map_size=conf.ledger_storage_map_size, journal_dir=conf.journal_dir,
                journal_max_size=conf.journal_max_size_mb << 20,
                journal_preallocate=conf.journal_preallocate_mb << 20,
                group_wait=conf.journal_max_group_wait_ms / 1000.0,
                write_cache_max_size=conf.write_cache_max_size_mb << 20,
                flush_interval=conf.flush_interval / 1000.0,
                max_throttle=conf.write_cache_max_throttle_ms / 1000.0)
            storage.on_commit = self._on_commit
            storage.on_checkpoint = self.stats.on_checkpoint
            storage.on_commit_error = self._on_commit_error
            storage.on_lac = self._on_lac
            storage.lac_watched = self.long_polls.watched_ledgers
            self._disk.map_usage = storage.map_usage
            usage, _ = self._disk.check()
            self.last_disk_usage = usage
            if self._ms is None:
                with _quiet_client_logs():
                    self._ms = await open_metastore(conf.metastore)
            self._server = await loop.create_server(self._new_connection, conf.bookie_host, conf.bookie_port,
                                                    reuse_address=True, backlog=1024)
            port = self._server.sockets[0].getsockname()[1]
            host = conf.advertised_address or conf.bookie_host
            if host in ("0.0.0.0", "::", ""):
                host = "127.0.0.1"
            self._address = f"{host}:{port}"
            await self._start_http()     # before registering: the registration names its URL
            self._registration = BookieRegistration(self._ms, self._address, conf.bookie_rack,
                                                    conf.session_timeout_s, http_url=self.http_url)
            await self._registration.register(read_only=self.read_only, free_disk=usage.free,
                                              total_disk=usage.total)
            self._spawn(self._disk_loop(), "disk-check")
            self._spawn(self._session_loop(), "registration-watchdog")
            if conf.gc_wait_time > 0:
                self._gc = GarbageCollector(storage, await LedgerMetadataManager.open(self._ms))
                self._spawn(self._gc_loop(), "gc")
            if conf.autorecovery_enabled:
                self.autorecovery = AutoRecovery(self._ms, conf, registry=self.stats.registry)
                await self.autorecovery.start()
        except BaseException:
            await self.stop()
            raise
        self._started = True
        log.info("bookie %s serving (data %s, metastore %s)", self._address, conf.data_dir,
                 conf.metastore_uri or conf.metastore)

    def _new_connection(self) -> BookieServerProtocol:
        return BookieServerProtocol(self, next(self._keys))

    async def _start_http(self) -> None:
        """The HTTP server (``bookie.http``, ``bookie.admin``) unless ``http_server_port`` is -1."""
        conf = self.conf
        port = resolve_http_port(conf.http_server_port, conf.stats_http_port)
        if port is None:
            return
        self._http = HttpServer(self.stats.registry, ready=lambda: bookie_readiness(self),
                                token=admin_token(conf.http_admin_token, conf.http_admin_token_file),
                                routes=bookie_routes(self))
        self.http_url = await self._http.start(conf.http_host, port)
        self.stats_url = self.http_url + "/metrics"

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        spawn(self._tasks, coro, name=f"bookie-{name}")

    async def stop(self) -> None:
        """Unregister, stop listening, finish in-flight commits (their acks are sent), close.

        Idempotent; never raises for a failing metastore (logged).
        """
        if self._stopped:
            return
        self._stopped = True
        if self.autorecovery is not None:
            await self.autorecovery.stop()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._registration is not None:
            try:
                await self._registration.unregister()
            except MetastoreError as exc:
                log.warning("could not remove the registration: %s", exc)
        if self._server is not None:
            self._server.close()
        self.draining = True
        for conn in list(self.connections):
            conn.drain()
        self._answer_all_long_polls()
        if self._storage is not None:
            await self._storage.close()
        for conn in list(self.connections):
            conn.flush()
            if conn.transport is not None:
                conn.transport.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
        if self._ms is not None and self._own_ms:
            try:
                await self._ms.close()
            except MetastoreError as exc:
                log.warning("closing the metastore failed: %s", exc)
        if self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.stop()
        if self._started:
            log.info("bookie %s stopped", self._address)

    # --- memory bounds --------------------------------------------------------------------------

    def _memory_gauges(self) -> list[tuple[str, str, Callable[[], float]]]:
        """What grows with traffic, as gauges (README "Memory"); read at scrape time."""
        def response_bytes() -> int:
            return sum(c.outbox.queued_bytes + (c.transport.get_write_buffer_size() if c.transport else 0)
                       for c in list(self.connections))

        return [
            ("bookie_long_poll_reads", "long-poll READ_LACs parked (at most max_long_poll_reads_per_connection "
                                       "per connection)", lambda: len(self.long_polls)),
            ("bookie_requests_in_flight", "requests read and not answered yet, all connections (a connection "
                                          "is not read while max_pending_requests are)",
             lambda: sum(c.state.in_flight for c in list(self.connections))),
            ("bookie_response_buffer_bytes", "answers not yet sent, all connections (a connection is not read "
                                             "while max_pending_response_bytes wait)", response_bytes),
            ("bookie_partial_frame_bytes", "bytes of incomplete request frames held, all connections (at most "
                                           "max_partial_frame_bytes)", lambda: self.budget.total),
        ]

    def charge(self, conn: BookieServerProtocol, held: int) -> None:
        """Record what ``conn`` holds unserved; close the newest offenders over the global budget."""
        victims = self.budget.update(conn.key, held)
        if not victims:
            return
        by_key = {c.key: c for c in self.connections}
        for key in victims:
            victim = by_key.get(key)
            self.budget.release(key)
            if victim is None or victim.transport is None:
                continue
            log.warning("closing connection from %s: it holds %d bytes of partial frames and all connections "
                        "together more than max_partial_frame_bytes (%d)", victim.peer, victim.state.buffered,
                        self.budget.limit)
            victim.state.decoder.clear()
            victim.transport.abort()

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
            if self._disk.read_only or self.operator_read_only:  # ``read_only``, inlined
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
        answer = _AddsAnswer(self, conn, req.txn_id, ledger_id, entries, req.op)
        if not entries:
            answer.refuse(errors.BadRequestError("ADD_ENTRIES without entries"))
        storage = self._storage
        sink = answer.settled   # one object for every add of the frame: they form one run
        master_key, recovery = req.master_key, req.recovery
        read_only = self._disk.read_only or self.operator_read_only
        header, header_size = proto.ENTRY_HEADER.unpack_from, HEADER_SIZE
        for i, payload in enumerate(entries):
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
        if self.read_only:
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

    # --- long-poll READ_LAC ---------------------------------------------------------------------

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
        parked = self.long_polls.park(conn, req, loop.time())
        if parked is None:
            conn.send(proto.response_to(
                req, proto.TOO_MANY_REQUESTS,
                f"this connection already parks {self.long_polls.parked_by(conn)} long-poll reads (limits "
                f"{self.long_polls.max_per_connection}, {self.long_polls.max_per_ledger} per ledger)"))
            return
        parked.timer = loop.call_at(parked.deadline, self._long_poll_expired, parked)
        conn.started()

    def _on_lac(self, ledger_id: int, lac: int) -> None:
        """The storage's ``on_lac``: answer the reads parked on ``ledger_id`` on the next loop turn (once per turn)."""
        if not self.long_polls.watched(ledger_id):
            return
        risen = self._lac_risen
        if not risen:
            self.loop.call_soon(self._answer_risen)
        risen[ledger_id] = None

    def _answer_risen(self) -> None:
        risen = list(self._lac_risen)
        self._lac_risen.clear()
        polls = self.long_polls
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
        if self.long_polls.expire(parked):
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
        for parked in self.long_polls.drop(conn):
            if parked.timer is not None:
                parked.timer.cancel()
            conn.finished()

    def _answer_all_long_polls(self) -> None:
        """Stopping: answer every parked read with the LAC the bookie has (storage still open)."""
        if self._storage is None:
            self.long_polls.take_all()
            return
        for parked in self.long_polls.take_all():
            self._answer_parked(parked)

    def _info(self, req: proto.Request) -> proto.Response:
        usage = self._disk.sample()
        resp = proto.response_to(req)
        resp.free_disk = usage.free
        resp.total_disk = usage.total
        resp.read_only = self.read_only
        return resp

    # --- disk -----------------------------------------------------------------------------------

    def _on_commit(self, entries: int, seconds: float) -> None:
        storage = self._storage
        self.stats.on_commit(entries, seconds, storage.last_sync_seconds if storage is not None else 0.0)
        if storage is not None and self._disk.note_written(storage.last_commit_bytes):
            self._disk_wakeup.set()  # the disk loop samples at once (one statvfs per disk_check_bytes)

    def _on_commit_error(self, reason: str, no_space: bool) -> None:
        if no_space and self._disk.force_read_only(reason):
            self._disk_wakeup.set()  # publish the read-only state

    async def _disk_loop(self) -> None:
        published_free = self.last_disk_usage.free if self.last_disk_usage else 0
        published_ro = self.read_only
        wakeup = self._disk_wakeup
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), self.conf.disk_check_interval_s)
            wakeup.clear()
            try:
                forced = self.read_only != published_ro
                usage, changed = self._disk.check()
                self.last_disk_usage = usage
                drift = abs(usage.free - published_free) > usage.total // 100
                if (changed or forced or drift) and self._registration is not None:
                    await self._registration.update(read_only=self.read_only, free_disk=usage.free,
                                                    total_disk=usage.total)
                    published_free = usage.free
                    published_ro = self.read_only
            except (OSError, MetastoreError) as exc:
                log.warning("disk check failed: %s", exc)

    # --- background duties ----------------------------------------------------------------------

    async def _session_loop(self) -> None:
        interval = max(self.conf.session_timeout_s / 2.0, 0.05)
        while True:
            await asyncio.sleep(interval)
            if self._registration is not None:
                await self._registration.ensure_alive()

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.conf.gc_wait_time_s)
            try:
                await self.collect_garbage()
            except (MetastoreError, errors.BKError) as exc:  # the next round tries again
                log.warning("garbage collection skipped: %s", exc)

    async def collect_garbage(self) -> list[int]:
        """Delete the ledgers the metastore no longer lists; returns their ids (see ``bookie.gc``)."""
        if self._gc is None:
            if self._ms is None:
                return []
            self._gc = GarbageCollector(self.storage, await LedgerMetadataManager.open(self._ms))
        return await self._gc.collect()

