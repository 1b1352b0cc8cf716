"""The "python floor": the thinnest Python pipeline with Quire E3 W2 A2's processes, hops and syncs.

    from tools.bench.floor import FloorPeer, floor_publishers
    with FloorPeer(tmp_dir) as floor:          # 3 sink processes + 1 relay process on loopback
        floor.url                              # "127.0.0.1:PORT" (the relay)
        floor.pids                             # all four, for CPU accounting
    async with floor_publishers(floor.url, 2, body, run_id) as submits:
        await submits[0]()                     # resolved once 2 of the 3 sinks have synced it

This is a calibration peer for ``quire bench publish``, deliberately not a
product: it answers "what does the least Python can do with the same
shape of work cost on this machine?", so that a CPU-per-message target for
Quire can be judged against a floor rather than against a C server.

What it shares with Quire E3 W2 A2 (a hub forwarding each publish to two of
three bookies, each journaling it with ``O_DSYNC`` before acking):

* the processes: one relay (the hub's place) and three sinks (the bookies'),
  each a uvloop event loop on ``asyncio.Protocol`` callbacks;
* the hops: client -> relay -> 2 sinks -> relay -> client, over loopback TCP,
  with the same batching as Quire (a client read's frames are sent to each
  sink with one ``writelines``; a sink read's acks go back to each client
  with one write; the client coalesces its writes per loop turn);
* the copies: message k of the relay goes to sinks ``k % 3`` and
  ``(k + 1) % 3`` (round-robin striping, as an E3 W2 ensemble does), and the
  client is answered after both acks;
* the sync: each sink appends all complete frames of one read with a single
  ``os.write`` to a file opened ``O_APPEND | O_DSYNC``, on the loop thread,
  before it acks them. Reads pile up in the socket while it syncs, so that
  is group commit, like the bookie journal's one ``pwrite`` per group.

The stage breakdown (``--trace`` on every process, ``FloorPeer(trace=True)``,
``FloorClient.publish_traced``): a client sets ``TRACE_BIT`` in the key of a
sampled frame; the relay stamps when it read it and when it wrote it to the
sinks and marks the relay key alike; each sink answers a marked key with its
times (read, written, ack queued) after it; the relay answers the client with
all of them, the time it read each sink's ack, and the time it queued the
answer. A traced ack is ``[key | TRACE_BIT][count][count x u64]``
(``split_acks``). Without ``--trace`` none of this runs.

What it leaves out, on purpose: protobuf and any real wire protocol (frames
are ``[4-byte BE length of what follows][8-byte key][payload]``; acks are bare
8-byte keys), topics, ledgers, entry ids, metadata and ZooKeeper/LMDB,
CRCs, the write cache and checkpoints, preallocation and file rolling, flow
control, timeouts, error statuses and recovery. A sink's file holds only the
payloads, back to back. A lost sink connection ends the relay.

Run as child processes (``FloorPeer`` does this)::

    python -m tools.bench.floor sink --port 0 --file PATH          # prints "floor sink ready PORT"
    python -m tools.bench.floor relay --port 0 --sinks H:P,H:P,H:P --copies 2   # "floor relay ready PORT"

``FloorPeer.start()`` raises ``PeerStartError`` (with the log tail) when a
process exits or does not print its ready line within ``timeout``. The processes' side (wire
format, sink, relay) is ``tools.bench.floor_servers`` (its names are re-exported here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import selectors
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO, Any, Self, cast

from tools.bench.floor_servers import (  # the processes' side, re-exported here
    HEADER,
    KEY,
    TRACE_BIT,
    ClientConnection,
    Relay,
    SinkConnection,
    SinkProtocol,
    frame,
    serve_relay,
    serve_sink,
    split_acks,
    split_frames,
    split_keys,
    traced_ack,
)
from tools.bench.peers import HOST, START_TIMEOUT, STOP_TIMEOUT, PeerStartError, Started, log_tail

log = logging.getLogger(__name__)

__all__ = [
    "HEADER",
    "KEY",
    "TRACE_BIT",
    "ClientConnection",
    "FloorClient",
    "FloorPeer",
    "Relay",
    "SinkConnection",
    "SinkProtocol",
    "floor_publishers",
    "frame",
    "main",
    "serve_relay",
    "serve_sink",
    "split_acks",
    "split_frames",
    "split_keys",
    "traced_ack",
]

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.floor", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    sink = sub.add_parser("sink", help="append each read's payloads O_DSYNC, ack their keys")
    sink.add_argument("--port", type=int, default=0)
    sink.add_argument("--file", required=True)
    sink.add_argument("--trace", action="store_true", help="answer traced frames with stage times")
    relay = sub.add_parser("relay", help="forward each client message to COPIES sinks, ack after all")
    relay.add_argument("--port", type=int, default=0)
    relay.add_argument("--sinks", required=True, help="HOST:PORT,HOST:PORT,...")
    relay.add_argument("--copies", type=int, default=2)
    relay.add_argument("--trace", action="store_true", help="pass traced frames' stage times to the client")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import uvloop

    if args.role == "sink":
        uvloop.run(serve_sink(args.port, args.file, args.trace))
    else:
        uvloop.run(serve_relay(args.port, [s for s in args.sinks.split(",") if s], args.copies, args.trace))
    return 0


# -- the harness side -----------------------------------------------------------------------------


class FloorPeer(Started):
    """Three sinks and a relay as child processes, data and logs under ``data_dir/floor``.

    Like ``tools.bench.peers.Peer``: a context manager; ``start()`` returns
    when all four have printed their ready line, else stops whatever started
    and raises ``PeerStartError`` with the log tail; ``stop()`` sends SIGTERM,
    waits ``STOP_TIMEOUT``, then SIGKILLs (safe to call twice).
    """

    name = "floor"
    sinks = 3

    def __init__(self, data_dir: str | os.PathLike[str], timeout: float = START_TIMEOUT, copies: int = 2,
                 trace: bool = False) -> None:
        self.data_dir = Path(data_dir).resolve() / self.name
        self.timeout = timeout
        self.copies = copies
        self.trace = trace   # --trace on every process: traced frames get stage times
        self.port = 0
        self.version = "python " + platform.python_version()
        self._procs: list[subprocess.Popen[bytes]] = []  # the sinks, then the relay

    @property
    def durability(self) -> str:
        return (f"each read O_DSYNC-appended on {self.copies} of {self.sinks} sink processes before the ack "
                "(E3 W2 A2's copies and sync)")

    @property
    def url(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pids(self) -> list[int]:
        """The running processes (sinks and relay), for CPU accounting."""
        return [p.pid for p in self._procs if p.poll() is None]

    @property
    def pid(self) -> int | None:
        """The relay's pid while it runs, else ``None``."""
        if len(self._procs) <= self.sinks or self._procs[-1].poll() is not None:
            return None
        return self._procs[-1].pid

    def sink_file(self, i: int) -> Path:
        return self.data_dir / f"sink-{i}.journal"

    def log_path(self, role: str) -> Path:
        return self.data_dir / f"{role}.log"

    def start(self) -> Self:
        """Start the sinks, then the relay connected to them; wait for each ready line."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            tracing = ["--trace"] if self.trace else []
            sinks = [self._spawn(f"sink-{i}", ["sink", "--port", "0", "--file", str(self.sink_file(i)), *tracing])
                     for i in range(self.sinks)]
            deadline = time.monotonic() + self.timeout
            sink_ports = [self._await_ready(proc, f"sink-{i}", deadline) for i, proc in enumerate(sinks)]
            relay = self._spawn("relay", ["relay", "--port", "0", "--copies", str(self.copies), "--sinks",
                                          ",".join(f"{HOST}:{p}" for p in sink_ports), *tracing])
            self.port = self._await_ready(relay, "relay", deadline)
        except BaseException:
            self.stop()
            raise
        log.info("python floor serving on %s (sinks %s, copies %d, data %s)", self.url, sink_ports, self.copies,
                 self.data_dir)
        return self

    def _spawn(self, role: str, args: list[str]) -> subprocess.Popen[bytes]:
        with open(self.log_path(role), "ab") as logf:
            proc = subprocess.Popen([sys.executable, "-m", "tools.bench.floor", *args], cwd=_project_root(),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=logf,
                                    start_new_session=True)
        self._procs.append(proc)
        return proc

    def _await_ready(self, proc: subprocess.Popen[bytes], role: str, deadline: float) -> int:
        """The port from ``floor ROLE ready PORT`` on the child's stdout (read with a deadline, no polling)."""
        assert proc.stdout is not None
        line = _readline(proc.stdout, deadline)
        words = line.split()
        if len(words) == 4 and words[:3] == [b"floor", role.split("-")[0].encode(), b"ready"]:
            return int(words[3])
        if not line.endswith(b"\n"):   # EOF (the child is exiting: let it finish) or the deadline
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        if line.endswith(b"\n"):
            why = f"printed {line!r} instead of its ready line"
        elif proc.poll() is not None:
            why = f"exited with status {proc.returncode}"
        else:
            why = f"did not answer within {self.timeout:.0f} s"
        raise PeerStartError(f"floor {role} {why}: {self.log_tail(role)}")

    def stop(self) -> None:
        """SIGTERM to all (relay first), wait up to ``STOP_TIMEOUT``, then SIGKILL. Safe to call twice."""
        procs, self._procs = self._procs[::-1], []
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("floor process %d did not stop within %.0f s; killing it", proc.pid, STOP_TIMEOUT)
                proc.kill()
                proc.wait(STOP_TIMEOUT)
            if proc.stdout is not None:
                proc.stdout.close()

    def log_tail(self, role: str, lines: int = 20) -> str:
        return log_tail(self.log_path(role), lines)


def _project_root() -> str:
    """The directory ``tools`` is imported from, so ``-m tools.bench.floor`` resolves in the child too."""
    return str(Path(__file__).resolve().parents[2])


def _readline(stream: IO[bytes], deadline: float) -> bytes:
    """One line from a pipe, or what came before EOF or the deadline (then possibly ``b""``)."""
    fd = stream.fileno()
    got = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while not got.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                break
            chunk = os.read(fd, 1)  # byte by byte: nothing after the ready line may be consumed by us
            if not chunk:
                break
            got += chunk
    return bytes(got)


# -- the client -----------------------------------------------------------------------------------


class FloorClient(asyncio.Protocol):
    """One publisher connection to the relay: ids per connection, writes coalesced per loop turn."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._futures: dict[int, asyncio.Future[None]] = {}
        self._next_id = 0
        self._buf = bytearray()
        self._closed: Exception | None = None
        self._traced: dict[int, asyncio.Future[tuple[int, ...]]] = {}   # id -> the traced publish's times

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._closed = exc or ConnectionError("the floor relay closed the connection")
        futures, self._futures = self._futures, {}
        for fut in futures.values():
            if not fut.done():
                fut.set_exception(self._closed)
        traced, self._traced = self._traced, {}
        for waiting in traced.values():
            if not waiting.done():
                waiting.set_exception(self._closed)

    def submit(self, body: bytes, traced: bool = False) -> asyncio.Future[None]:
        """Send ``body``; the future resolves when the relay acks it (fails if the connection is lost).

        ``traced``: the frame's key carries ``TRACE_BIT`` (``publish_traced``; the floor runs ``--trace``).
        """
        fut: asyncio.Future[None] = self._loop.create_future()
        if self._closed is not None:
            fut.set_exception(self._closed)
            return fut
        cid = self._next_id
        self._next_id = cid + 1
        self._futures[cid] = fut
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(HEADER.pack(KEY.size + len(body), cid | TRACE_BIT if traced else cid))
        self._out.append(body)
        if traced:
            self._traced[cid] = self._loop.create_future()
        return fut

    async def publish_traced(self, topic: bytes, body: bytes) -> Any:
        """``submit`` of a traced frame: a ``hub.client_publish.TracedPublish`` of the floor's stage times
        (relay read and sent, each sink's read, written, ack queued and the relay's read of it, answer queued),
        so ``tools.bench.stages`` reads it as Quire's. ``topic`` is for the same signature (no topics here)."""
        from hub.client_publish import TracedPublish
        from hub.proto import pubsub_pb2 as pb

        del topic
        cid = self._next_id
        sent = time.monotonic_ns()
        done = self.submit(body, traced=True)
        times = await self._traced[cid]
        read = time.monotonic_ns()
        await done
        trace = pb.PublishTrace(hub_read_ns=times[0], add_sent_ns=times[1], answer_sent_ns=times[-1])
        copies = times[2:-1]
        for i in range(0, len(copies) - 3, 4):
            trace.bookies.add(bookie="sink", add_sent_ns=times[1], read_ns=copies[i], journal_written_ns=copies[i + 1],
                              ack_sent_ns=copies[i + 2], ack_read_ns=copies[i + 3])
        trace.hub_ack_read_ns = max((b.ack_read_ns for b in trace.bookies), default=times[-1])
        return TracedPublish(cid, trace, sent, read)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._transport is not None:
            self._transport.writelines(out)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        futures = self._futures
        if self._traced:
            for cid, times in split_acks(self._buf):
                traced = self._traced.pop(cid, None) if times is not None else None
                if traced is not None and times is not None and not traced.done():
                    traced.set_result(times)
                fut = futures.pop(cid, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            return
        for cid in split_keys(self._buf):
            fut = futures.pop(cid, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


@contextlib.asynccontextmanager
async def floor_publishers(url: str, n: int, body: bytes, run_id: str,
                           sampler: Any = None) -> AsyncIterator[list[Callable[[], Awaitable[Any]]]]:
    """``n`` connections to the relay at ``url`` (``HOST:PORT``), each one warm-up publish, then submitters.

    ``run_id`` is accepted for the same signature as the other peers' publishers; the floor has no topics.
    ``sampler`` (a ``tools.bench.stages.StageSampler``; the floor runs ``--trace``) traces some publishes.
    """
    del run_id
    host, _, port = url.rpartition(":")
    loop = asyncio.get_running_loop()
    clients: list[FloorClient] = []
    try:
        for _ in range(n):
            _, client = await loop.create_connection(FloorClient, host, int(port))
            clients.append(client)
        await asyncio.gather(*(c.submit(body) for c in clients))
        plain = [_submitter(c, body) for c in clients]
        yield plain if sampler is None else [sampler.wrap(c, b"", body, p) for c, p in zip(clients, plain, strict=True)]
    finally:
        for c in clients:
            c.close()


def _submitter(client: FloorClient, body: bytes) -> Callable[[], Awaitable[None]]:
    def submit() -> Awaitable[None]:
        return client.submit(body)

    return submit


if __name__ == "__main__":
    sys.exit(main())
