"""Test support for bookies: a real ``quire bookie`` OS process and a raw-protocol client.

    conf = BookieProcess.write_conf(tmp / "bk_server.conf", {"bookie_port": 0, "metastore_uri": uri, ...})
    bookie = BookieProcess(conf, tmp / "bookie.log").start()    # returns once it printed its ready line
    client = await RawBookieClient.connect(bookie.address)
    response = await client.call(protocol.read_lac_request(0, ledger_id))
    client.send_raw(b"garbage")                                 # malformed input, for hostile tests
    run = AddPipeline(*client.encode_adds(ledger_id, key, payloads), window=1000)   # encoded up front
    seconds = await client.pipeline(run)        # run.errors, run.latencies()
    await client.close()
    bookie.terminate()                                          # SIGTERM, returns the exit status
    bookie.rss()                                                # resident memory in bytes (Linux)

Used by the bookie tests and by ``quire bench bookie``. ``AddPipeline`` is the
benchmark's client without I/O: pre-encoded ADD_ENTRY frames kept ``window``
outstanding, each answer checked byte for byte against the OK response
protobuf encodes (one ``memcmp`` per read while answers come in order and
OK; any other answer is parsed and counted). ``BookieProcess.start``
raises ``RuntimeError`` with the log's tail when the bookie does not start;
``RawBookieClient`` fails outstanding requests with ``BookieUnavailableError``
when the connection is lost.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bookie import protocol as proto
from bookie.connection import FLUSH_BYTES, BookieConnection, ResponseCallback
from bookie.errors import BookieUnavailableError, ProtocolError

__all__ = ["READY_PREFIX", "AddPipeline", "BookieProcess", "RawBookieClient", "bookie_command", "parse_ready_line",
           "write_conf"]

READY_PREFIX = "bookie ready "
"""How the one stdout line of a ``quire bookie`` that serves and is registered starts."""


def bookie_command(conf_path: str | os.PathLike[str], *extra_args: str) -> list[str]:
    """The command line of a bookie process on ``conf_path`` (this interpreter, ``-m tools.cli``)."""
    return [sys.executable, "-m", "tools.cli", "bookie", "--conf", str(conf_path), *extra_args]


def parse_ready_line(line: str) -> tuple[str, str]:
    """``(address, stats_url)`` from ``bookie ready HOST:PORT [stats=URL]``; ``ValueError`` otherwise."""
    parts = line.split()
    if not line.startswith(READY_PREFIX) or len(parts) < 3:
        raise ValueError(f"not a bookie ready line: {line!r}")
    stats = next((p.removeprefix("stats=") for p in parts[3:] if p.startswith("stats=")), "")
    return parts[2], stats


def write_conf(path: Path, settings: Mapping[str, Any]) -> Path:
    """Write ``key=value`` lines (a ``.conf`` file) to ``path``, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


Callback = ResponseCallback
"""Receives the ``Response``, or a ``BKError`` when the connection is lost."""


class RawBookieClient:
    """A pipelined bookie connection for tests and ``quire bench bookie``: a ``BookieConnection``.

    ``submit(request, callback)`` sends without waiting (writes are batched
    per loop turn; a txn id is assigned when the request has none);
    ``await call(request)`` waits for the response. Responses that match no
    request (txn id 0: the bookie could not decode a frame) go to the
    ``orphans`` queue. ``closed`` resolves when the connection is lost;
    outstanding callbacks then get ``BookieUnavailableError``.

    ``encode_adds`` + ``await pipeline(AddPipeline(...))`` run pre-encoded
    adds (the benchmark): while it runs the pipeline reads every answer, so
    nothing else may be outstanding.
    """

    def __init__(self, conn: BookieConnection) -> None:
        self.conn = conn
        self.orphans: asyncio.Queue[proto.Response] = asyncio.Queue()
        conn.on_orphan = self.orphans.put_nowait

    @classmethod
    async def connect(cls, address: str, timeout: float = 10.0,
                      max_frame_size: int = proto.DEFAULT_MAX_FRAME_SIZE) -> RawBookieClient:
        """Connect; ``BookieUnavailableError`` when the bookie cannot be reached in ``timeout``."""
        return cls(await _TappedConnection.connect(address, timeout, max_frame_size))

    @property
    def closed(self) -> asyncio.Future[None]:
        return self.conn.done

    def submit(self, request: proto.Request, callback: Callback) -> None:
        """Send ``request`` (a txn id is assigned when it has none)."""
        self.conn.submit(request, callback)

    def send_raw(self, data: bytes) -> None:
        """Queue raw bytes (tests send malformed frames with it)."""
        self.conn.send_raw(data)

    def flush(self) -> None:
        self.conn.flush()

    async def call(self, request: proto.Request, timeout: float = 10.0) -> proto.Response:
        """Send and wait; raises ``BookieUnavailableError`` if the connection is lost."""
        if not request.txn_id:
            request.txn_id = self.conn.next_txn_id()
        return await self.conn.request(request, timeout)

    def encode_adds(self, ledger_id: int, master_key: bytes, payloads: Sequence[bytes]) -> tuple[
            list[bytes], list[bytes]]:
        """Framed ADD_ENTRYs of ``payloads`` (entry ids 0, 1, ...; txn ids of this connection) and the framed
        OK answer protobuf encodes for each: the arguments of ``AddPipeline``."""
        frames: list[bytes] = []
        expected: list[bytes] = []
        for entry_id, payload in enumerate(payloads):
            txn_id = self.conn.next_txn_id()
            frames.append(proto.encode_frame(proto.add_request(txn_id, ledger_id, entry_id, master_key, payload)))
            expected.append(proto.encode_frame(proto.add_response(txn_id, ledger_id, entry_id)))
        return frames, expected

    async def pipeline(self, run: AddPipeline | AddEntriesPipeline, timeout: float = 600.0) -> float:
        """Send ``run``'s frames, ``run.window`` outstanding, until all are answered.

        Returns the seconds from the first send to the last answer.

        Raises ``BookieUnavailableError`` when the connection is lost,
        ``ProtocolError`` for an answer that matches no add (or one answered
        twice), ``TimeoutError`` after ``timeout`` seconds. Only a connection
        made by ``connect`` can run one.
        """
        conn = self.conn
        if not isinstance(conn, _TappedConnection):
            raise TypeError("pipeline needs a connection made by RawBookieClient.connect")
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[float] = loop.create_future()
        clock = time.perf_counter
        send = conn.send_raw
        flush = conn.flush

        def received(data: bytes) -> None:
            now = clock()
            try:
                more = run.receive(data, now)
            except ProtocolError as exc:
                if not finished.done():
                    finished.set_exception(exc)
                return
            if more:
                send(b"".join(more))
                flush()
            if run.finished and not finished.done():
                finished.set_result(now)

        conn.tap = received
        try:
            t0 = clock()
            send(b"".join(run.start(t0)))
            flush()
            await asyncio.wait((finished, conn.done), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not finished.done():
                if conn.done.done():
                    raise BookieUnavailableError(f"connection to bookie {conn.address} lost during the pipeline")
                raise TimeoutError(f"{run.answered} of {len(run.frames)} adds answered in {timeout} s")
            return finished.result() - t0
        finally:
            conn.tap = None

    async def close(self) -> None:
        self.conn.close()
        await asyncio.wait_for(asyncio.shield(self.closed), 10.0)


class _TappedConnection(BookieConnection):
    """A ``BookieConnection`` whose reads go to ``tap`` while one is set (``RawBookieClient.pipeline``)."""

    tap: Callable[[bytes], None] | None = None

    def data_received(self, data: bytes) -> None:
        tap = self.tap
        if tap is None:
            super().data_received(data)
        else:
            tap(data)


class _Window:
    """What both pipelines share: ``frames`` (one per add), ``window`` of them outstanding, the times."""

    def __init__(self, frames: Sequence[bytes], window: int) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, not {window}")
        self.frames = list(frames)
        self.window = min(window, len(self.frames))
        self.sent = 0
        self.answered = 0
        self.errors = 0
        self.sent_at = [0.0] * len(self.frames)
        self.answered_at = [0.0] * len(self.frames)

    @property
    def finished(self) -> bool:
        return self.answered == len(self.frames)

    def start(self, now: float) -> list[bytes]:
        """The frames to send first (the first ``window`` adds)."""
        return self._send(self.window, now)

    def _send(self, n: int, now: float) -> list[bytes]:
        raise NotImplementedError

    def _take(self, n: int, now: float) -> tuple[int, int]:
        """The next ``n`` adds (at most) are sent at ``now``: their range ``[first, last)``."""
        first = self.sent
        last = self.sent = min(first + n, len(self.frames))
        self.sent_at[first:last] = itertools.repeat(now, last - first)
        return first, last

    def latencies(self) -> list[float]:
        """Seconds from send to answer of each add answered (in add order)."""
        return [a - s for s, a in zip(self.sent_at[:self.sent], self.answered_at[:self.sent], strict=True)
                if a]


class AddPipeline(_Window):
    """Pre-encoded adds kept ``window`` outstanding and their answers checked, without I/O.

    ``frames[i]`` is a framed ADD_ENTRY, ``expected[i]`` the framed OK answer
    to it (``RawBookieClient.encode_adds``). ``start(now)`` returns the
    frames to send first; ``receive(data, now)`` takes bytes read (any split)
    and returns the frames to send now, one per add answered. While answers
    come in order and equal ``expected``, a read costs one comparison with the
    expected byte stream, whatever it holds; from the first other byte on,
    each answer is parsed: matched by txn id, counted in ``errors`` unless it
    is the expected OK answer. ``ProtocolError`` for an answer that matches
    no add or one answered already, or an undecodable one.

    ``sent_at``/``answered_at`` hold each add's times (the ``now`` passed);
    ``latencies()`` their differences.
    """

    def __init__(self, frames: Sequence[bytes], expected: Sequence[bytes], window: int) -> None:
        if len(frames) != len(expected):
            raise ValueError("one expected answer per frame")
        super().__init__(frames, window)
        self.expected = list(expected)
        self._stream = b"".join(self.expected)
        self._ends = list(itertools.accumulate(map(len, self.expected)))
        self._pos = 0                                # bytes of ``_stream`` matched (in-order mode)
        self._decoder: proto.FrameDecoder | None = None   # set once an answer differs: parsed from then on
        self._index: dict[int, int] = {}              # txn id -> add (parsed mode)
        self._done = bytearray()                      # 1 per add answered (parsed mode)

    def _send(self, n: int, now: float) -> list[bytes]:
        first, last = self._take(n, now)
        return self.frames[first:last]

    def receive(self, data: bytes, now: float) -> list[bytes]:
        """Bytes read; the frames to send now (as many as adds were answered)."""
        if self._decoder is None and self._stream.startswith(data, self._pos):
            self._pos += len(data)
            first = self.answered
            last = bisect.bisect_right(self._ends, self._pos, first)
            if last == first:
                return []
            self.answered = last
            self.answered_at[first:last] = itertools.repeat(now, last - first)
            return self._send(last - first, now)
        return self._receive_parsed(data, now)

    def _receive_parsed(self, data: bytes, now: float) -> list[bytes]:
        decoder = self._decoder
        if decoder is None:  # first surprise: parse from the start of the answer it is in
            decoder = self._decoder = proto.FrameDecoder()
            start = self._ends[self.answered - 1] if self.answered else 0
            decoder.receive(self._stream[start:self._pos])
            self._index = {proto.parse_response(e[proto.PREFIX_SIZE:]).txn_id: i for i, e in enumerate(self.expected)}
            self._done = bytearray(len(self.frames))
            self._done[:self.answered] = b"\1" * self.answered
        try:
            frames = decoder.feed(data)
        except ProtocolError as exc:
            raise ProtocolError(f"bad answer frame: {exc}") from None
        for frame in frames:
            resp = proto.parse_response(frame)
            i = self._index.get(resp.txn_id)
            if i is None or self._done[i]:
                raise ProtocolError(f"answer with txn id {resp.txn_id} ({proto.status_name(resp.status)}) matches no "
                                    f"add outstanding")
            self._done[i] = 1
            self.answered_at[i] = now
            if self.expected[i] != proto.LENGTH_PREFIX.pack(len(frame)) + frame:
                self.errors += 1
        self.answered += len(frames)
        return self._send(len(frames), now)


class AddEntriesPipeline(_Window):
    """``AddPipeline`` with ADD_ENTRIES frames, as the ledger client's connections send adds.

    ``payloads`` are encoded entries 0, 1, ... of the ledger whose
    ``ledger_fields`` (``AddBodies.ledger_fields``) are given. The adds
    answered by one read are sent again as one frame (split at
    ``max_bytes``), the first ``window`` likewise; ``next_txn_id`` numbers
    the frames. Every answer is parsed: a non-OK one counts its failed adds
    in ``errors``. The same interface as ``AddPipeline``
    (``RawBookieClient.pipeline`` runs either).
    """

    def __init__(self, payloads: Sequence[bytes], ledger_fields: bytes, window: int, next_txn_id: Callable[[], int],
                 max_bytes: int = FLUSH_BYTES) -> None:
        super().__init__(payloads, window)
        self._ledger_fields = ledger_fields
        self._next_txn_id = next_txn_id
        self._max_bytes = max_bytes
        self._decoder = proto.FrameDecoder()
        self._spans: dict[int, tuple[int, int]] = {}   # txn id -> the adds [i, j) of its frame

    def _send(self, n: int, now: float) -> list[bytes]:
        bodies = self.frames
        first, last = self._take(n, now)
        out: list[bytes] = []
        i = first
        while i < last:
            j, size = i + 1, len(bodies[i])
            while j < last and size + len(bodies[j]) <= self._max_bytes:
                size += len(bodies[j])
                j += 1
            txn_id = self._next_txn_id()
            self._spans[txn_id] = (i, j)
            out += proto.add_entries_frame(txn_id, self._ledger_fields, bodies[i:j])[0]
            i = j
        return out

    def receive(self, data: bytes, now: float) -> list[bytes]:
        """Bytes read; the frames to send now (as many adds as were answered)."""
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            raise ProtocolError(f"bad answer frame: {exc}") from None
        n = 0
        for frame in frames:
            resp = proto.parse_response(frame)
            span = self._spans.pop(resp.txn_id, None)
            if span is None or resp.op != proto.ADD_ENTRIES:
                raise ProtocolError(f"answer with txn id {resp.txn_id} ({proto.status_name(resp.status)}) matches no "
                                    f"ADD_ENTRIES outstanding")
            i, j = span
            self.answered_at[i:j] = itertools.repeat(now, j - i)
            if resp.status != proto.OK:
                self.errors += sum(a.status != proto.OK for a in resp.adds) or j - i
            n += j - i
        self.answered += n
        return self._send(n, now)


class BookieProcess:
    """A ``python -m tools.cli bookie`` OS process; ``start`` returns once it printed its ready line."""

    def __init__(self, conf_path: Path, log_path: Path, extra_args: Sequence[str] = ()) -> None:
        self.conf_path = conf_path
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.stats_url = ""
        self.ready_line = ""

    @classmethod
    def write_conf(cls, path: Path, settings: Mapping[str, Any]) -> Path:
        return write_conf(path, settings)

    def start(self, timeout: float = 30.0) -> BookieProcess:
        """Start and wait for ``bookie ready``; ``RuntimeError`` (with the log tail) on failure."""
        cmd = bookie_command(self.conf_path, *self.extra_args)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        assert self.proc.stdout is not None
        line = _readline(self.proc, timeout)
        if not line.startswith(READY_PREFIX):
            self.kill()
            raise RuntimeError(f"bookie did not start ({line!r}); log tail:\n{self.log_tail()}")
        self.ready_line = line
        self.address, self.stats_url = parse_ready_line(line)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def rss(self) -> int:
        """Resident memory of the process in bytes (``/proc``, Linux); 0 when it is gone."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0


def _readline(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """One stdout line of ``proc`` within ``timeout`` (``""`` on exit or timeout)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                break
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    return buf.decode(errors="replace").strip()
