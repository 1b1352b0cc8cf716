"""``quire bench soak``: steady publishing for minutes; does any process's memory grow with the messages?

Starts ``LocalCluster(bookies=3, hubs=1)`` with E3 W2 A2 and publishes
``--size``-byte messages to ``--topics`` topics (one client connection each)
at ``--rate`` msg/s in all, for ``--minutes`` per case: once without a
subscriber, once with one subscriber per topic consuming everything (its
own connection, in this process), or only the case ``--subscribers 0|1``
names. ``--exactly-once`` makes every publisher a producer (its messages
carry a producer name and sequence id, so the hub's dedup windows fill).

Every ``--interval`` seconds the resident memory of every process (the hub,
each bookie, and this bench client) is read from ``/proc/PID/status``:
``VmRSS`` (``rss_bytes``) and its anonymous part ``RssAnon``
(``rss_anon_bytes``, the heap). Output, one JSON line each:

* ``"case": "sample"``: ``t_s``, ``process``, ``pid``, ``rss_bytes``,
  ``rss_anon_bytes``, ``published``, ``delivered``, ``in_flight`` (publishes
  not answered yet; with ``published - delivered``, what a step of RSS
  follows) (plottable: time, process, rss_bytes);
* ``"case": "slope"``, per process: after the warm-up (``--warmup`` seconds,
  default a third of the run, at most 2 minutes) the least-squares slope of
  RSS over the messages published (``bytes_per_msg``) and over time
  (``mb_per_hour``), the change from the first sample after the warm-up to
  the last (bytes and %), the growth from the median of the first third of
  those samples to that of the last third (``thirds_growth_bytes``, per
  message ``thirds_bytes_per_msg``: robust to one spike), the same for the
  anonymous part (``anon_*``), and
  whether the issue's targets are met (``meets_target``: a change of at most
  5 % and 20 MB, and at most 1 kept byte per message);
* ``"case": "run"``: messages published (the rate may not be reached on a
  contended machine: slopes are per message actually published), errors,
  messages delivered. With a subscriber the publishers wait while
  ``MAX_LAG`` messages are not delivered yet (a backlog is held by design,
  up to ``cache_size``: not what this measures).

Every soak runs the hub with ``zk_timeout=10000`` (``SOAK_CONF``; ``--conf``
overrides it), so that a contended machine's stalls do not cost the hub its
metastore session, and its topics, midway.

The targets are judged on the anonymous memory: a bookie's file-backed
resident pages are its LMDB entry store mapped in memory, which grows with
the data stored, as the disk does, and which the kernel reclaims under
pressure (page cache, not heap). ``rss_bytes`` is reported as well.
``--plot FILE.png`` (every bench's option, ``tools.bench.plot``) draws RSS
over time per process from the sample rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.bench import rate
from tools.bench.publish import Runner, add_conf_argument, bench_data_dir, conf_fields, conf_overrides, quire_cluster

TARGET_CHANGE_PCT = 5.0
TARGET_CHANGE_BYTES = 20 * 1024 * 1024
TARGET_BYTES_PER_MSG = 1.0
"""Issue 35: after warm-up every process changes by at most 5 % and 20 MB, and keeps at most 1 byte per message."""
MAX_IN_FLIGHT = 3_000
"""Publishes outstanding at most (over all topics, about a second at 3 000 msg/s); past it the publisher
falls behind its rate.

Both this and ``MAX_LAG`` are high-water marks of memory held by design,
not kept per message: each publish in flight is a future in this client and,
once read, a request in the hub (up to ``max_pending_requests`` per
connection), each undelivered message a read-ahead cache entry of about 1.2
KB. A contended machine's stall fills them to the bound, and CPython's small
object allocator keeps the arenas of that peak (it returns an arena only once
every object in it is freed), so the RSS after such a stall stays a step
higher. At 20 000 in flight and 10 000 undelivered that step was 7-24 MB in
the hub (a 40 MB process) and 5 MB in this client, past the issue's 5 %."""
MAX_LAG = 1_000
"""With a subscriber: messages published and not yet delivered at most; past it the publisher waits.

A subscriber that cannot keep up (a busy machine) would otherwise turn the
run into a backlog test: the hub's read-ahead cache filling up to
``cache_size`` is memory held by design, not kept per message. A thousand is
a third of a second at 3 000 msg/s, about 1.2 MB of cache."""
SOAK_CONF = {"zk_timeout": "10000"}
"""Hub keys of every soak (``--conf`` overrides them): a longer metastore session, so that a contended
machine's stalls do not cost the hub its topics midway (a memory soak, not a failover test)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of publishing per case")
    parser.add_argument("--rate", type=int, default=3000, help="messages per second over all topics")
    parser.add_argument("--subscribers", type=int, choices=(0, 1), action="append", default=None,
                        help="run only this case: 0 (no subscriber) or 1 (one per topic); default both")
    parser.add_argument("--topics", type=int, default=4, help="topics, one publisher connection each")
    parser.add_argument("--size", type=int, default=200, help="message size in bytes")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds left out of the slopes (default a third of the run, at most 120)")
    parser.add_argument("--exactly-once", action="store_true",
                        help="publish as producers (sequence ids: the hub's dedup windows fill)")
    parser.add_argument("--data", default=None, help="data directory (default: a new dir under ./data/bench)")
    add_conf_argument(parser)


def read_rss(pid: int) -> tuple[int, int]:
    """``(VmRSS, RssAnon)`` of process ``pid`` in bytes (``/proc/PID/status``); ``OSError`` if it is gone."""
    rss = anon = -1
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("RssAnon:"):
            anon = int(line.split()[1]) * 1024
    if rss < 0:
        raise OSError(f"no VmRSS for pid {pid}")
    return rss, anon if anon >= 0 else rss


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ``ys`` over ``xs`` (0.0 with fewer than two distinct ``xs``)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if not sxx:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def thirds_growth(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """``(growth of y, growth of x)`` from the median of the first third of the points to that of the last.

    Robust to a single spike or dip (a checkpoint's buffers, a burst of
    deliveries) where a slope is pulled by its end points; ``(0, 0)`` with
    fewer than three points.
    """
    n = len(xs) // 3
    if n < 1:
        return 0.0, 0.0
    median = statistics.median
    return median(ys[-n:]) - median(ys[:n]), median(xs[-n:]) - median(xs[:n])


@dataclass
class Sample:
    t_s: float
    process: str
    pid: int
    rss_bytes: int
    rss_anon_bytes: int
    published: int
    delivered: int = 0
    in_flight: int = 0


@dataclass
class Load:
    """What one case's publishers and subscriber did."""

    published: int = 0      # acknowledged
    sent: int = 0
    errors: int = 0
    first_error: str = ""
    delivered: int = 0
    in_flight: set[asyncio.Future[Any]] = field(default_factory=set)
    expected: int = 0        # deliveries that mean the subscriber has caught up (0: not known yet)
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)

    def deliver(self) -> None:
        self.delivered += 1
        if self.expected and self.delivered >= self.expected:
            self.caught_up.set()

    def done(self, fut: asyncio.Future[Any]) -> None:
        self.in_flight.discard(fut)
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None:
            self.published += 1
        else:
            self.errors += 1
            self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"


def slope_line(process: str, samples: list[Sample], warmup_s: float) -> dict[str, Any]:
    """The ``"case": "slope"`` result of one process's samples (those from ``warmup_s`` on)."""
    kept = [s for s in samples if s.t_s >= warmup_s] or samples[-1:]
    first, last = kept[0], kept[-1]
    msgs = [float(s.published) for s in kept]
    hours = [s.t_s / 3600.0 for s in kept]
    line: dict[str, Any] = {"process": process, "samples": len(kept),
                            "messages": last.published - first.published}
    for prefix, attr in (("", "rss_bytes"), ("anon_", "rss_anon_bytes")):
        ys = [float(getattr(s, attr)) for s in kept]
        start, end = int(getattr(first, attr)), int(getattr(last, attr))
        change = end - start
        line.update({
            f"{prefix}rss_start_bytes": start, f"{prefix}rss_end_bytes": end,
            f"{prefix}change_bytes": change,
            f"{prefix}change_pct": round(100.0 * change / start, 2) if start else 0.0,
            f"{prefix}bytes_per_msg": round(slope(msgs, ys), 2),
            f"{prefix}mb_per_hour": round(slope(hours, ys) / 1e6, 1),
        })
        grown, over = thirds_growth(msgs, ys)
        line[f"{prefix}thirds_growth_bytes"] = round(grown)
        line[f"{prefix}thirds_bytes_per_msg"] = round(grown / over, 2) if over else 0.0
    line["meets_target"] = (abs(line["anon_change_pct"]) <= TARGET_CHANGE_PCT
                            and abs(line["anon_change_bytes"]) <= TARGET_CHANGE_BYTES
                            and line["anon_bytes_per_msg"] <= TARGET_BYTES_PER_MSG)
    return line


def _processes(cluster: Any) -> dict[str, int]:
    """Process name -> pid: the hub, each bookie, this client."""
    procs = {"hub": cluster.hub_pid(0)}
    procs.update({f"bookie-{i}": cluster.bookie_pid(i) for i in range(len(cluster.bookie_addresses))})
    procs["client"] = os.getpid()
    return {name: int(pid) for name, pid in procs.items() if pid is not None}


async def soak(cluster: Any, args: argparse.Namespace, subscribers: int,
               on_sample: Any = None) -> tuple[Load, list[Sample], float]:
    """One case: publish at ``args.rate`` for ``args.minutes``, sampling RSS; the load, samples and seconds run."""
    from hub.client import HedwigClient

    address = cluster.hub_addresses[0]
    run_id = uuid.uuid4().hex[:8]
    topics = [f"soak-{run_id}-{i}".encode() for i in range(args.topics)]
    body = os.urandom(args.size)
    load = Load()
    window = str(max(10, MAX_IN_FLIGHT // max(1, args.topics)))
    pubs = [await HedwigClient.connect(address, conf={"max_outstanding_messages": window}) for _ in topics]
    sub: HedwigClient | None = None
    try:
        if subscribers:
            sub = await HedwigClient.connect(address, conf={"max_outstanding_messages": "1000"})

            async def handler(topic: bytes, subscriber: bytes, msg: Any) -> None:
                load.deliver()

            for t in topics:
                await sub.subscribe(t, b"soak")
                await sub.start_delivery(t, b"soak", handler)
        for c, t in zip(pubs, topics, strict=True):
            await c.publish(t, body)    # claims the topic and opens its ledger before the clock starts
        producers = [f"soak-{run_id}-p{i}".encode() if args.exactly_once else None for i in range(len(topics))]
        procs = _processes(cluster)
        samples: list[Sample] = []
        seconds = args.minutes * 60.0
        t0 = time.monotonic()
        next_sample = 0.0

        def sample(now: float) -> None:
            for name, pid in procs.items():
                with contextlib.suppress(OSError):
                    rss, anon = read_rss(pid)
                    samples.append(Sample(round(now, 2), name, pid, rss, anon, load.published, load.delivered,
                                          len(load.in_flight)))
                    if on_sample is not None:
                        on_sample(samples[-1])

        while True:
            now = time.monotonic() - t0
            if now >= next_sample:
                sample(now)
                next_sample += args.interval
            if now >= seconds:
                break
            due = min(int(now * args.rate), load.sent + MAX_IN_FLIGHT - len(load.in_flight))
            if subscribers:
                due = min(due, load.delivered + MAX_LAG)
            while load.sent < due:   # round robin over the topics, in publish order per topic
                i = load.sent % len(topics)
                fut = pubs[i].publish_async(topics[i], body, producer=producers[i])
                load.in_flight.add(fut)
                fut.add_done_callback(load.done)
                load.sent += 1
            await asyncio.sleep(0.01)
        elapsed = time.monotonic() - t0
        if load.in_flight:
            await asyncio.wait(load.in_flight, timeout=30)
        if sub is not None:   # every message stored (and the claiming ones) delivered: then close
            load.expected = load.published + len(topics)
            if load.delivered < load.expected:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(load.caught_up.wait(), 30)
    finally:
        for c in [*pubs, *([sub] if sub is not None else [])]:
            await c.close()
    return load, samples, elapsed


def run(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    overrides = conf_overrides(args)
    cluster_conf = {**SOAK_CONF, **overrides}
    cases = sorted(set(args.subscribers or [0, 1]))
    seconds = args.minutes * 60.0
    warmup = args.warmup if args.warmup is not None else min(120.0, seconds / 3)
    if not 0 <= warmup < seconds:
        raise SystemExit("quire bench soak: --warmup must be at least 0 and shorter than the run")
    common = {"bench": "soak", "rate": args.rate, "topics": args.topics, "size": args.size, "config": "E3W2A2",
              "exactly_once": args.exactly_once, **conf_fields(overrides)}
    for subscribers in cases:
        with bench_data_dir(args, "soak-") as data_dir, Runner() as loop:
            cluster = quire_cluster(data_dir, 3, 2, 2, **cluster_conf)
            loop.run(cluster.start())
            try:
                load, samples, elapsed = loop.run(soak(cluster, args, subscribers))
            finally:
                loop.run(cluster.stop())
        for s in samples:
            yield {**common, "case": "sample", "subscribers": subscribers, "t_s": s.t_s, "process": s.process,
                   "pid": s.pid, "rss_bytes": s.rss_bytes, "rss_anon_bytes": s.rss_anon_bytes,
                   "published": s.published, "delivered": s.delivered, "in_flight": s.in_flight}
        line: dict[str, Any] = {**common, "case": "run", "subscribers": subscribers, "seconds": round(elapsed, 1),
                                "published": load.published, "ops_per_sec": rate(load.published, elapsed),
                                "errors": load.errors, "delivered": load.delivered, "warmup_s": warmup,
                                "max_lag": MAX_LAG if subscribers else None}
        if load.first_error:
            line["first_error"] = load.first_error
        yield line
        for name in dict.fromkeys(s.process for s in samples):
            yield {**common, "case": "slope", "subscribers": subscribers, "warmup_s": warmup,
                   **slope_line(name, [s for s in samples if s.process == name], warmup),
                   "target_change_pct": TARGET_CHANGE_PCT, "target_change_bytes": TARGET_CHANGE_BYTES,
                   "target_bytes_per_msg": TARGET_BYTES_PER_MSG}
