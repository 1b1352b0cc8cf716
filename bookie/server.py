"""The bookie server: an asyncio shell around ``bookie.protocol`` and ``bookie.storage``.

It wires the parts and decides nothing itself: each connection is a
``bookie.server_connection.BookieServerProtocol``, every request is served
by ``bookie.request_handlers.RequestHandlers``, the admin API is
``bookie.admin``.

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
from typing import Any

from bookie import errors
from bookie import protocol as proto
from bookie.admin import bookie_readiness, bookie_routes
from bookie.autorecovery import AutoRecovery
from bookie.conf import BookieConf
from bookie.disk import DiskUsage, DiskUsageMonitor
from bookie.gc import GarbageCollector
from bookie.http import HttpServer, admin_token, resolve_http_port
from bookie.metadata import LedgerMetadataManager
from bookie.registration import BookieRegistration
from bookie.request_handlers import RequestHandlers
from bookie.server_connection import BookieServerProtocol
from bookie.stats import BookieStats
from bookie.storage import EntryStorage
from metastore import MetaStore, open_metastore
from metastore.errors import MetastoreError
from metastore.tasks import spawn

log = logging.getLogger(__name__)

status_of = proto.status_of

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


class BookieServer:
    """One bookie: storage, listener, registration and background duties."""

    def __init__(self, conf: BookieConf, *, metastore: MetaStore | None = None) -> None:
        self.conf = conf
        self.connections: set[BookieServerProtocol] = set()
        self.adders = 0
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
        self.requests = RequestHandlers(self.stats, self.long_polls, self._disk,
                                        read_only=lambda: self._disk.read_only or self.operator_read_only)
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
            self.requests.attach(storage, loop)
            storage.on_commit = self._on_commit
            storage.on_checkpoint = self.stats.on_checkpoint
            storage.on_commit_error = self._on_commit_error
            storage.on_lac = self.requests.on_lac
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
        return BookieServerProtocol(self, self.requests, next(self._keys))

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
        self.requests.answer_all_long_polls()
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

    def drop_long_polls(self, conn: BookieServerProtocol) -> None:
        """Forget the long-poll reads ``conn`` parked (it is gone: nobody to answer)."""
        self.requests.drop_long_polls(conn)

    # --- disk -----------------------------------------------------------------------------------

    def _on_commit(self, entries: int, seconds: float) -> None:
        storage = self._storage
        if storage is None:
            self.stats.on_commit(entries, seconds)
            return
        journal = storage.journal   # its figures read directly: once per journal group
        self.stats.on_commit(entries, seconds, journal.last_sync_seconds)
        if self._disk.note_written(journal.last_commit_bytes):
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

