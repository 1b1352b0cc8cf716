"""``quire bench queue``: a work queue, one SHARED subscription with 1/4/16 consumers, against Redis and NATS.

Quire runs as ``LocalCluster(bookies=3, hubs=1)`` (E3 W2 A2). For each
consumer count N, N consumers (``HedwigClient.consumer``, SHARED, one client
connection each, ``receiver_queue_size`` = ``--window``) attach to one
subscription of a fresh topic; one publisher publishes M messages of
``--size`` bytes with ``--window`` in flight; every consumer acknowledges each
message it receives (``ack``). The run ends when M messages were handled;
``ops_per_sec`` is M over that time and p50/p99/p999 are publish-to-handling
latencies (each body carries its send time). M is ``--messages``, 60 000 by
default: at 20 000 a case lasted about half a second on the 2-core machine,
and three quiet runs gave medians of 1.37, 1.41 and 1.90 against Redis
(rounds 1.15-1.98); at 60 000, 1.51, 1.60 and 1.82.

Peers in the same invocation, with the same consumers, window and size:

* Redis (``tools.bench.peers``, ``appendfsync always``, hiredis when
  installed): one stream, one consumer group, N consumers each on its own
  connection looping ``XREADGROUP COUNT window BLOCK`` then one ``XACK`` of
  what it read; the publisher pipelines XADDs.
* NATS JetStream: a work-queue stream (file storage) and one durable pull
  consumer shared by N subscriptions, each on its own connection, fetching
  ``window`` messages and acknowledging each.

Each peer's case runs next to Quire's with the same N, so all see the
same background load; ``--rounds N`` runs every case N times, each round
every system once in an order rotated per round (``tools.bench.rounds``,
rows tagged with their ``round``; default ``ROUNDS``, 3, with peers). Ratio lines divide Quire's handled msg/s
by each peer's (with several rounds: per round, then the median of the
rounds' ratios, ``"stat": "median_of_rounds"``); the one with a target is issue
29's, at least 1.5x Redis at 4 consumers (``queue_target``). A case that does
not finish within ``--timeout`` reports what it handled and ``"errors"``.
After each Quire case, ``"case": "cpu"`` rows give each process's CPU (hub,
bookies, and this client) in all and per handled message. With the lmdb
metastore, Quire's line also has ``metastore_commits``, the write
transactions of the case (every process's; nearly all are the subscription's
acked-state writes, DESIGN 6b), and ``acks_per_commit``, handled messages per
commit: at most about ``consume_interval`` (50) when every ack interval gets
its write, more when commits are slow enough that the writes coalesce.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import struct
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from tools.bench import percentiles, rate, readonly_lmdb
from tools.bench.peers import NatsPeer, PeerNotInstalled, RedisPeer
from tools.bench.publish import (
    Outcome,
    RedisPipe,
    Runner,
    add_conf_argument,
    bench_data_dir,
    client_conf,
    closed_loop,
    conf_fields,
    conf_overrides,
    quire_cluster,
    quire_pids,
    quire_processes,
    ratio_lines,
    with_cpu,
)
from tools.bench.rounds import by_round, rotated
from tools.bench.stages import cpu_rows, process_cpu

STAMP = struct.Struct("<d")
TARGET_QUEUE_RATIO = 1.5
"""Quire's handled msg/s over Redis consumer groups' at 4 consumers (issues 29 and 32)."""
TARGET_CONSUMERS = 4
ROUNDS = 3
"""Rounds without ``--rounds`` when peers run: the ratios are the median of 3 per-round ratios."""


def queue_target(q: dict[str, Any], p: dict[str, Any]) -> float | None:
    """The target of a ratio line: issue 29's, against Redis at 4 consumers; the others are reported only."""
    return TARGET_QUEUE_RATIO if p["system"] == "redis" and q.get("consumers") == TARGET_CONSUMERS else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--consumers", type=int, action="append", default=None,
                        help="consumer count (repeatable; default 1, 4 and 16)")
    parser.add_argument("--messages", type=int, default=60_000,
                        help="messages published per case (60 000: a case lasts about 2 s, so start and drain do "
                             "not weigh on the ratio and the cpu rows resolve about 0.2 us/msg)")
    parser.add_argument("--size", type=int, default=100, help="message size in bytes (>= 8)")
    parser.add_argument("--window", type=int, default=100,
                        help="publishes in flight, receiver queue, XREADGROUP COUNT and fetch batch")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up a case after this many seconds")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of every case, each system once per round in a rotated order; ratios per "
                             f"round and their median (default {ROUNDS} with peers, 1 without)")
    parser.add_argument("--peer", action="append", choices=["redis", "nats"], default=None,
                        help="peers to run (repeatable; default both)")
    parser.add_argument("--quire-only", action="store_true", help="run Quire alone, without peers")
    parser.add_argument("--data", default=None, help="data directory (default: a new dir under ./data/bench)")
    add_conf_argument(parser)


class Handled:
    """Counts handled messages of one case; ``done`` once ``expected`` were handled."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.total = 0
        self.latencies: list[float] = []
        self.done = asyncio.Event()

    def got(self, body: bytes) -> None:
        self.latencies.append(time.perf_counter() - STAMP.unpack_from(body)[0])
        self.total += 1
        if self.total >= self.expected:
            self.done.set()


def _body(size: int) -> Callable[[], bytes]:
    pad = os.urandom(max(0, size - STAMP.size))
    return lambda: STAMP.pack(time.perf_counter()) + pad


async def _run(handled: Handled, submit: Callable[[bytes], Awaitable[Any]], m: int,
               args: argparse.Namespace) -> tuple[float, Outcome]:
    body = _body(args.size)
    t0 = time.perf_counter()
    pub = await closed_loop([lambda: submit(body())], m, args.window)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(handled.done.wait(), args.timeout)
    return time.perf_counter() - t0, pub


async def quire_case(cluster: Any, n: int, m: int, args: argparse.Namespace) -> tuple[float, Handled, Outcome]:
    from hub.client import HedwigClient

    topic = f"queue-{uuid.uuid4().hex[:8]}".encode()
    conf = client_conf(args.window, getattr(args, "conf_overrides", None))
    address = cluster.hub_addresses[0]
    publisher = await HedwigClient.connect(address, conf=conf)
    clients = [await HedwigClient.connect(address, conf=conf) for _ in range(n)]
    handled = Handled(m)
    workers: list[asyncio.Task[None]] = []
    try:
        await publisher.publish(topic, _body(args.size)())   # claims the topic; the subscription starts after it
        consumers = [await c.consumer(topic, b"workers", subscription_type="SHARED", receiver_queue_size=args.window)
                     for c in clients]

        async def work(consumer: Any) -> None:
            async for msg in consumer:
                handled.got(msg.body)
                await consumer.ack(msg)

        workers = [asyncio.create_task(work(c)) for c in consumers]
        secs, pub = await _run(handled, lambda b: publisher.publish_async(topic, b), m, args)
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for c in [*clients, publisher]:
            await c.close()
    return secs, handled, pub


async def redis_case(url: str, n: int, m: int, args: argparse.Namespace) -> tuple[float, Handled, Outcome]:
    import redis.asyncio as aioredis

    key = f"queue-{uuid.uuid4().hex[:8]}"
    admin = aioredis.from_url(url)
    await admin.xgroup_create(key, "workers", id="$", mkstream=True)
    handled = Handled(m)
    clients = [aioredis.from_url(url, single_connection_client=True) for _ in range(n)]

    async def consume(i: int, r: Any) -> None:
        # each ends by itself once the case is done: cancelling a blocked XREADGROUP can hang redis-py on uvloop
        while not handled.done.is_set() and not stop.is_set():
            reply = await r.xreadgroup("workers", f"c{i}", {key: ">"}, count=args.window, block=100)
            for _stream, entries in reply or ():
                for _id, fields in entries:
                    handled.got(fields[b"b"])
                if entries:
                    await r.xack(key, "workers", *(entry_id for entry_id, _ in entries))

    stop = asyncio.Event()
    consumers = [asyncio.create_task(consume(i, r)) for i, r in enumerate(clients)]
    pipe = await RedisPipe(url, key).open()
    try:
        secs, pub = await _run(handled, pipe.xadd, m, args)
    finally:
        stop.set()
        await asyncio.wait(consumers, timeout=5.0)
        for t in consumers:
            t.cancel()
        await pipe.close()
        for r in clients:
            await r.aclose()
        await admin.delete(key)
        await admin.aclose()
    return secs, handled, pub


async def nats_case(url: str, n: int, m: int, args: argparse.Namespace) -> tuple[float, Handled, Outcome]:
    import nats
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import RetentionPolicy, StorageType

    run_id = uuid.uuid4().hex[:8]
    stream, subject = f"QUEUE_{run_id}", f"queue.{run_id}"
    publisher = await nats.connect(url)
    conns = [await nats.connect(url) for _ in range(n)]
    js = publisher.jetstream()
    await js.add_stream(name=stream, subjects=[subject], storage=StorageType.FILE,
                        retention=RetentionPolicy.WORK_QUEUE)
    handled = Handled(m)

    async def consume(c: Any) -> None:
        sub = await c.jetstream().pull_subscribe(subject, durable="workers", stream=stream)
        while not handled.done.is_set():
            try:
                msgs = await sub.fetch(args.window, timeout=0.2)
            except NatsTimeout:
                continue
            for msg in msgs:
                handled.got(msg.data)
                await msg.ack()

    consumers = [asyncio.create_task(consume(c)) for c in conns]
    try:
        secs, pub = await _run(handled, lambda b: js.publish(subject, b), m, args)
    finally:
        handled.done.set()
        await asyncio.wait(consumers, timeout=5.0)
        for t in consumers:
            t.cancel()
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
        for c in [*conns, publisher]:
            await c.close()
    return secs, handled, pub


def metastore_commits(uri: str) -> int | None:
    """Write transactions committed so far in the lmdb metastore at ``uri`` (LMDB's last transaction id), or
    None for another backend. Opened read-only for the call: this process has no store of its own open on it
    (LMDB allows one environment per path and process)."""
    if not uri.startswith("lmdb://"):
        return None
    with readonly_lmdb(uri.removeprefix("lmdb://").split("?", 1)[0]) as env:
        return int(env.info()["last_txnid"])


def _line(system: str, n: int, m: int, measured: tuple[float, Handled, Outcome], args: argparse.Namespace,
          **extra: Any) -> dict[str, Any]:
    secs, h, pub = measured
    missing = m - h.total
    line: dict[str, Any] = {
        "bench": "queue", "case": f"{system} {n} consumers", "system": system, "mode": "throughput",
        "consumers": n, "messages": m, "size": args.size, "window": args.window, "handled": h.total,
        "seconds": round(secs, 3), "ops_per_sec": rate(h.total, secs),
        "publish_ops_per_sec": rate(len(pub.latencies), pub.seconds), **percentiles(h.latencies),
        "errors": pub.errors + (1 if missing > 0 else 0),
    }
    if missing > 0:
        line["first_error"] = f"{missing} messages not handled after {args.timeout:.0f} s"
    elif pub.first_error:
        line["first_error"] = pub.first_error
    line.update(extra)
    return line


def run(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    if args.size < STAMP.size:
        raise SystemExit(f"quire bench queue: --size must be at least {STAMP.size}")
    overrides = args.conf_overrides = conf_overrides(args)   # a bad --conf stops here, before anything starts
    counts = args.consumers or [1, 4, 16]
    lines: list[dict[str, Any]] = []
    with bench_data_dir(args, "queue-") as data_dir, Runner() as loop, contextlib.ExitStack() as stack:
        peers: list[RedisPeer | NatsPeer] = []
        for name in [] if args.quire_only else (args.peer or ["redis", "nats"]):
            try:
                peer: RedisPeer | NatsPeer = RedisPeer(data_dir) if name == "redis" else NatsPeer(data_dir)
                stack.enter_context(peer)
                peers.append(peer)
            except PeerNotInstalled as exc:
                yield {"bench": "queue", "case": name, "system": name, "skipped": str(exc)}
        cluster = quire_cluster(data_dir, 3, 2, 2, **overrides)
        loop.run(cluster.start())
        try:
            for r in range(args.rounds or (ROUNDS if peers else 1)):
                for n in counts:   # interleaved, in an order rotated per round (tools.bench.rounds)
                    for where in rotated([cluster, *peers], r):
                        for row in _case(where, loop, n, args):
                            row = {**row, "round": r}
                            if row["case"] != "cpu":
                                lines.append(row)
                            yield row
        finally:
            loop.run(cluster.stop())
    yield from by_round(lambda xs: ratio_lines("queue", xs, ("consumers",), target=queue_target), lines, True)


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """What this process holds before a case (every client library, the cluster's handles, earlier cases' rows)
    is frozen for the case (``gc.freeze``): the collector's full walks of it are not counted as any system's
    client CPU. Every system's case runs under it alike (as the hub freezes its own start-up heap,
    ``hub.gcwatch``); on ``--consumers 4`` they were about 0.7 us of Quire's client CPU per message."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _case(where: Any, loop: asyncio.Runner, n: int, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """One system's case with ``n`` consumers (``where``: the Quire cluster or a peer): its result line, and
    after Quire's the per-process ``cpu`` rows. Each case runs with this process's heap frozen (``_frozen_heap``)."""
    with _frozen_heap():
        yield from _measured_case(where, loop, n, args)


def _measured_case(where: Any, loop: asyncio.Runner, n: int, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    if isinstance(where, RedisPeer | NatsPeer):
        case = redis_case if isinstance(where, RedisPeer) else nats_case
        measured, cpu = with_cpu([where.pid or 0], loop, case(where.url, n, args.messages, args))
        yield _line(where.name, n, args.messages, measured, args, version=where.version,
                    durability=where.durability, **cpu)
        return
    overrides = args.conf_overrides
    named = quire_processes(where)
    before, commits = process_cpu(named), metastore_commits(where.metastore_uri)
    measured, cpu = with_cpu(quire_pids(where), loop, quire_case(where, n, args.messages, args))
    after = process_cpu(named)
    writes: dict[str, Any] = {}
    if commits is not None:
        done = (metastore_commits(where.metastore_uri) or commits) - commits
        writes = {"metastore_commits": done, "acks_per_commit": round(measured[1].total / done, 1) if done else None}
    yield _line("quire", n, args.messages, measured, args, config="E3W2A2", **conf_fields(overrides), **cpu,
                **writes)
    for row in cpu_rows(before, after, measured[1].total, system="quire", consumers=n):
        yield {**row, "bench": "queue"}
