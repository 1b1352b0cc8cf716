"""The bookie server: an asyncio shell around ``bookie.protocol`` and ``bookie.storage``.

    server = BookieServer(BookieConf.from_file("conf/bk_server.conf"))
    await server.start()          # storage open, listening, registered
    server.address                # "127.0.0.1:3181"
    await server.stop()           # unregister, finish in-flight commits, close

Each connection is an ``asyncio.Protocol``: frames are split by a
``FrameDecoder``, requests handled in arrival order, responses written in
completion order with one ``writelines`` per loop turn. Adds are acknowledged
after their group commit (``EntryStorage``). Bad input never stops the
process: an undecodable frame is answered ``BAD_REQUEST`` (txn id 0), an
unknown op ``UNKNOWN_OP``, an oversized frame ``TOO_LARGE`` and the
connection is then closed (the stream is out of step).

Background duties, each a task of its own:

* disk check every ``disk_check_interval``: at ``disk_usage_threshold`` the
  bookie turns read-only (adds get ``READ_ONLY``, reads go on), below
  ``disk_usage_lwm_threshold`` writable again; the registration follows.
  ``disk_usage_override_file`` (a file holding a used fraction such as
  ``0.97``) stands in for the real filesystem in tests;
* registration watchdog: re-registers if the metastore session expired;
* garbage collection every ``gc_wait_time``: ledgers this bookie stores but
  the metastore table ``ledgers`` no longer lists are deleted.

Fencing reads are accepted on a read-only bookie (fencing must reach every
bookie of an ensemble for recovery to be safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import struct
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any, NamedTuple, cast

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bookie import errors
from bookie import protocol as proto
from bookie.conf import BookieConf
from bookie.digest import HEADER_SIZE
from bookie.proto import bookie_pb2 as pb
from bookie.registration import BookieRegistration
from bookie.storage import EntryStorage
from metastore import MetaStore, open_metastore
from metastore.errors import MetastoreError

log = logging.getLogger(__name__)

LEDGERS_TABLE = "ledgers"
_HEADER = struct.Struct(">qqq")  # ledger id, entry id, LAC at the start of a payload

_STATUS_OF: dict[type[BaseException], pb.StatusCode] = {
    errors.NoSuchLedgerError: proto.NO_LEDGER,
    errors.NoSuchEntryError: proto.NO_ENTRY,
    errors.LedgerFencedError: proto.FENCED,
    errors.UnauthorizedError: proto.UNAUTHORIZED,
    errors.BadRequestError: proto.BAD_REQUEST,
    errors.BookieReadOnlyError: proto.READ_ONLY,
}


def status_of(exc: BaseException) -> pb.StatusCode:
    """The wire status for an error raised while serving a request (``ERROR`` by default)."""
    return _STATUS_OF.get(type(exc), proto.ERROR)


class DiskUsage(NamedTuple):
    used_fraction: float
    free: int
    total: int


class DiskUsageMonitor:
    """Samples the usage of the ledger directory's filesystem.

    When ``override_file`` names an existing file, its content (a fraction
    such as ``0.97``) replaces the measured fraction, and free space is
    derived from it: tests turn a bookie read-only without filling a disk.
    """

    def __init__(self, path: Path, threshold: float, lwm_threshold: float,
                 override_file: str = "") -> None:
        self.path = path
        self.threshold = threshold
        self.lwm_threshold = lwm_threshold
        self.override_file = Path(override_file) if override_file else None
        self.read_only = False

    def sample(self) -> DiskUsage:
        du = shutil.disk_usage(self.path)
        total = max(du.total, 1)
        used = (total - du.free) / total
        if self.override_file is not None:
            try:
                text = self.override_file.read_text().strip()
            except FileNotFoundError:
                text = ""
            except OSError as exc:
                log.warning("cannot read disk usage override %s: %s", self.override_file, exc)
                text = ""
            if text:
                try:
                    used = min(max(float(text), 0.0), 1.0)
                except ValueError:
                    log.warning("ignoring disk usage override %r (not a fraction)", text)
                else:
                    return DiskUsage(used, int(total * (1.0 - used)), total)
        return DiskUsage(used, du.free, total)

    def check(self) -> tuple[DiskUsage, bool]:
        """Sample and apply the thresholds; returns the sample and whether the state changed."""
        usage = self.sample()
        was = self.read_only
        if not was and usage.used_fraction >= self.threshold:
            self.read_only = True
            log.warning("disk usage %.3f >= %.3f: bookie turns read-only", usage.used_fraction,
                        self.threshold)
        elif was and usage.used_fraction < self.lwm_threshold:
            self.read_only = False
            log.info("disk usage %.3f < %.3f: bookie is writable again", usage.used_fraction,
                     self.lwm_threshold)
        return usage, self.read_only != was


class BookieStats(Collector):
    """Prometheus metrics of one bookie, in a registry of its own.

    Request counts are plain integers on the hot path, exported at scrape
    time; commit sizes and latencies are histograms observed per commit.
    """

    def __init__(self, server: BookieServer) -> None:
        self._server = server
        self.requests: dict[tuple[int, int], int] = {}
        self.registry = CollectorRegistry()
        self.commit_entries = Histogram(
            "bookie_group_commit_entries", "entries written per group commit", registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384))
        self.commit_seconds = Histogram(
            "bookie_group_commit_seconds", "time from a group's first write to its durable commit",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0))
        self.registry.register(self)

    def count(self, op: int, status: int) -> None:
        key = (op, status)
        self.requests[key] = self.requests.get(key, 0) + 1

    def on_commit(self, entries: int, seconds: float) -> None:
        self.commit_entries.observe(entries)
        self.commit_seconds.observe(seconds)

    def collect(self) -> Iterable[Metric]:
        c = CounterMetricFamily("bookie_requests", "requests served, by op and status",
                                labels=["op", "status"])
        for (op, status), n in sorted(self.requests.items()):
            c.add_metric([proto.op_name(op), proto.status_name(status)], n)
        yield c
        srv = self._server
        yield GaugeMetricFamily("bookie_read_only", "1 when the bookie refuses adds",
                                value=1.0 if srv.read_only else 0.0)
        yield GaugeMetricFamily("bookie_connections", "open client connections",
                                value=len(srv.connections))
        usage = srv.last_disk_usage
        if usage is not None:
            yield GaugeMetricFamily("bookie_disk_free_bytes", "free bytes on the ledger directory",
                                    value=usage.free)
            yield GaugeMetricFamily("bookie_disk_used_fraction", "used fraction of the ledger directory",
                                    value=usage.used_fraction)


class BookieServerProtocol(asyncio.Protocol):
    """One client connection; see the module docstring."""

    def __init__(self, server: BookieServer) -> None:
        self._server = server
        self._decoder = proto.FrameDecoder(server.conf.max_frame_size)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._outstanding = 0
        self._paused_reading = False
        self._write_paused = False
        self._close_when_idle = False
        self.transport: asyncio.Transport | None = None
        self.peer = "?"

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._server.connections.add(self)
        if self._server.draining:
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._out.clear()
        self.transport = None

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        close_after: proto.Response | None = None
        try:
            frames = self._decoder.feed(data)
        except errors.FrameTooLargeError as exc:
            frames = exc.frames
            close_after = proto.error_response(proto.TOO_LARGE, str(exc))
            log.warning("closing connection from %s: %s", self.peer, exc)
        handle = self._server.handle
        for frame in frames:
            try:
                request = proto.parse_request(frame)
            except errors.MalformedFrameError as exc:
                log.info("bad frame from %s: %s", self.peer, exc)
                self._server.stats.count(0, proto.BAD_REQUEST)
                self.send(proto.error_response(proto.BAD_REQUEST, str(exc)))
                continue
            handle(request, self)
        if close_after is not None:
            self._server.stats.count(0, proto.TOO_LARGE)
            self.send(close_after)
            self._close_when_idle = True
            self._update_reading()
            self._close_if_idle()
        self.flush()

    # --- output --------------------------------------------------------------------------------

    def send(self, response: proto.Response) -> None:
        """Queue a response; it is written at the end of this loop turn."""
        self._server.stats.count(response.op, response.status)
        self._out.append(proto.encode_frame(response))

    def send_later(self, response: proto.Response) -> None:
        """Queue a response from a completion callback and schedule the flush."""
        if self.transport is None:
            return
        self.send(response)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(self._out)
        self._out.clear()

    # --- flow control ---------------------------------------------------------------------------

    def started(self) -> None:
        self._outstanding += 1
        if self._outstanding >= self._server.conf.max_pending_requests:
            self._update_reading()

    def finished(self) -> None:
        self._outstanding -= 1
        if self._close_when_idle:
            self._close_if_idle()
        elif self._paused_reading:
            self._update_reading()

    def _close_if_idle(self) -> None:
        """After a framing error: close once every request read before it was answered."""
        if self._outstanding == 0 and self.transport is not None:
            self.flush()
            self.transport.close()

    def _update_reading(self) -> None:
        if self.transport is None:
            return
        limit = self._server.conf.max_pending_requests
        want_pause = (self._write_paused or self._server.draining or self._close_when_idle
                      or self._outstanding >= limit
                      or (self._paused_reading and self._outstanding > limit // 2))
        if want_pause and not self._paused_reading:
            self._paused_reading = True
            self.transport.pause_reading()
        elif not want_pause and self._paused_reading:
            self._paused_reading = False
            self.transport.resume_reading()


class BookieServer:
    """One bookie: storage, listener, registration and background duties."""

    def __init__(self, conf: BookieConf, *, metastore: MetaStore | None = None) -> None:
        self.conf = conf
        self.connections: set[BookieServerProtocol] = set()
        self.draining = False
        self.stats = BookieStats(self)
        self.last_disk_usage: DiskUsage | None = None
        self.stats_url: str | None = None
        self._ms = metastore
        self._own_ms = metastore is None
        self._storage: EntryStorage | None = None
        self._server: asyncio.AbstractServer | None = None
        self._registration: BookieRegistration | None = None
        self._disk = DiskUsageMonitor(conf.data_dir, conf.disk_usage_threshold,
                                      conf.disk_usage_lwm_threshold, conf.disk_usage_override_file)
        self._tasks: list[asyncio.Task[None]] = []
        self._httpd: Any = None
        self._address: str | None = None
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
    def read_only(self) -> bool:
        return self._disk.read_only

    # --- life cycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open storage and metastore, listen, register, start background duties.

        Raises ``OSError`` (address in use, data directory), ``BKError`` or
        ``MetastoreError``; what was opened is closed again on failure.
        """
        conf = self.conf
        try:
            self._storage = EntryStorage(conf.data_dir, map_size=conf.ledger_storage_map_size)
            self._storage.on_commit = self.stats.on_commit
            usage, _ = self._disk.check()
            self.last_disk_usage = usage
            if self._ms is None:
                self._ms = await open_metastore(conf.metastore)
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(lambda: BookieServerProtocol(self), conf.bookie_host,
                                                    conf.bookie_port, reuse_address=True, backlog=1024)
            port = self._server.sockets[0].getsockname()[1]
            host = conf.advertised_address or conf.bookie_host
            if host in ("0.0.0.0", "::", ""):
                host = "127.0.0.1"
            self._address = f"{host}:{port}"
            self._registration = BookieRegistration(self._ms, self._address, conf.bookie_rack,
                                                    conf.session_timeout_s)
            await self._registration.register(read_only=self.read_only, free_disk=usage.free,
                                              total_disk=usage.total)
            if conf.stats_http_port:
                self._start_stats()
            self._spawn(self._disk_loop(), "disk-check")
            self._spawn(self._session_loop(), "registration-watchdog")
            if conf.gc_wait_time > 0:
                self._spawn(self._gc_loop(), "gc")
        except BaseException:
            await self.stop()
            raise
        log.info("bookie %s serving (data %s, metastore %s)", self._address, conf.data_dir,
                 conf.metastore_uri or conf.metastore)

    def _start_stats(self) -> None:
        port = max(self.conf.stats_http_port, 0)
        httpd, _ = start_http_server(port, addr=self.conf.stats_http_host, registry=self.stats.registry)
        self._httpd = httpd
        self.stats_url = f"http://{self.conf.stats_http_host}:{httpd.server_port}/metrics"
        log.info("bookie stats at %s", self.stats_url)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coro, name=f"bookie-{name}"))

    async def stop(self) -> None:
        """Unregister, stop listening, finish in-flight commits (their acks are sent), close.

        Idempotent; never raises for a failing metastore (logged).
        """
        if self._stopped:
            return
        self._stopped = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self._registration is not None:
            try:
                await self._registration.unregister()
            except MetastoreError as exc:
                log.warning("could not remove the registration: %s", exc)
        if self._server is not None:
            self._server.close()
        self.draining = True
        for conn in list(self.connections):
            conn._update_reading()
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
        if self._httpd is not None:
            await asyncio.to_thread(self._httpd.shutdown)
            self._httpd.server_close()
        log.info("bookie %s stopped", self._address)

    # --- requests -------------------------------------------------------------------------------

    def handle(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        """Serve one decoded request; the response goes to ``conn`` now or on completion."""
        op = req.op
        try:
            if op == proto.ADD_ENTRY:
                self._add(req, conn)
            elif op == proto.READ_ENTRY:
                self._read(req, conn)
            elif op == proto.READ_LAC:
                resp = proto.response_to(req)
                resp.lac = self.storage.read_lac(req.ledger_id)
                resp.entry_id = self.storage.last_entry_id(req.ledger_id)
                conn.send(resp)
            elif op == proto.GET_BOOKIE_INFO:
                conn.send(self._info(req))
            else:
                conn.send(proto.response_to(req, proto.UNKNOWN_OP, f"unknown op {op}"))
        except errors.BKError as exc:
            conn.send(proto.response_to(req, status_of(exc), str(exc)))
        except Exception as exc:
            log.exception("error serving %s from %s", proto.op_name(op), conn.peer)
            conn.send(proto.response_to(req, proto.ERROR, f"internal error: {exc}"))

    def _add(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        if self._disk.read_only:
            conn.send(proto.response_to(req, proto.READ_ONLY, "bookie is read-only"))
            return
        payload = req.body
        if len(payload) < HEADER_SIZE:
            conn.send(proto.response_to(req, proto.BAD_REQUEST, "entry payload shorter than its header"))
            return
        ledger_id, entry_id, lac = _HEADER.unpack_from(payload)
        if ledger_id != req.ledger_id or entry_id != req.entry_id:
            conn.send(proto.response_to(req, proto.BAD_REQUEST,
                                        f"payload is of entry {ledger_id}:{entry_id}"))
            return
        txn_id = req.txn_id

        def done(exc: BaseException | None) -> None:
            if exc is None:
                conn.send_later(proto.Response(txn_id=txn_id, op=proto.ADD_ENTRY, status=proto.OK,
                                               ledger_id=ledger_id, entry_id=entry_id))
            else:
                conn.send_later(proto.Response(txn_id=txn_id, op=proto.ADD_ENTRY, status=status_of(exc),
                                               ledger_id=ledger_id, entry_id=entry_id, message=str(exc)))
            conn.finished()

        self.storage.submit_add(ledger_id, entry_id, req.master_key, payload, lac, done,
                                recovery=req.recovery)
        conn.started()

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

    def _info(self, req: proto.Request) -> proto.Response:
        usage = self._disk.sample()
        resp = proto.response_to(req)
        resp.free_disk = usage.free
        resp.total_disk = usage.total
        resp.read_only = self.read_only
        return resp

    # --- background duties ----------------------------------------------------------------------

    async def _disk_loop(self) -> None:
        published_free = self.last_disk_usage.free if self.last_disk_usage else 0
        while True:
            await asyncio.sleep(self.conf.disk_check_interval_s)
            try:
                usage, changed = self._disk.check()
                self.last_disk_usage = usage
                drift = abs(usage.free - published_free) > usage.total // 100
                if (changed or drift) and self._registration is not None:
                    await self._registration.update(read_only=self.read_only, free_disk=usage.free,
                                                    total_disk=usage.total)
                    published_free = usage.free
            except (OSError, MetastoreError) as exc:
                log.warning("disk check failed: %s", exc)

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
            except MetastoreError as exc:
                log.warning("garbage collection skipped: %s", exc)

    async def collect_garbage(self) -> list[int]:
        """Delete the ledgers the metastore no longer lists; returns their ids.

        The bookie's own ledger list is taken before the metastore is read, so
        a ledger created meanwhile (metadata first, then adds) is never taken
        for garbage. Raises ``MetastoreError`` when the metastore cannot be read.
        """
        local = self.storage.ledger_ids()
        if not local or self._ms is None:
            return []
        table = await self._ms.create_scannable_table(LEDGERS_TABLE)
        live: set[int] = set()
        cur = await table.open_cursor(fields=())
        try:
            while cur.has_more():
                for key, _ in await cur.read_entries(1024):
                    if key.isdigit():
                        live.add(int(key))
        finally:
            await cur.close()
        dead = sorted(local - live)
        for lid in dead:
            await self.storage.delete_ledger(lid)
        if dead:
            log.info("garbage collected %d ledger(s): %s", len(dead), dead[:20])
        return dead


__all__ = ["BookieServer", "BookieServerProtocol", "DiskUsageMonitor", "status_of"]
