"""``quire bench ledger``: durable adds through the ledger client over real bookie processes.

Runs E3 W2 A2 over three bookie processes and, as the comparison in the same
invocation, E1 W1 A1 on one of them (the single-bookie result). Adds are
pipelined with a bounded window of outstanding entries (``async_add_entry``,
BookKeeper's asyncAddEntry: a callback, no future per add); each result
reports throughput and p50/p99/p999 add latency (submit to acknowledgement).
``--profile FILE`` writes the client's cProfile of the E3W2A2 runs
(``python -m pstats FILE``). The client runs on uvloop, as the bookies do; ``client_cpu_us_per_add`` is
the client process's CPU time per add (a figure that holds on a busy machine).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from bookie.client import BookKeeper
from bookie.errors import BKError
from tools.bench import percentiles, rate
from tools.cluster import LocalCluster


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--entries", type=int, default=50_000, help="adds per case")
    parser.add_argument("--size", type=int, action="append", default=None,
                        help="entry size in bytes (repeatable; default 100)")
    parser.add_argument("--window", type=int, default=2000, help="outstanding adds")
    parser.add_argument("--data", default=None,
                        help="data directory, kept (default: a new dir under ./data/bench, removed after)")
    parser.add_argument("--profile", default=None, metavar="FILE",
                        help="cProfile the client during the E3W2A2 runs; write pstats to FILE")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    import uvloop

    return uvloop.run(_run(args))


async def _one(bk: BookKeeper, e: int, w: int, a: int, entries: int, size: int, window: int,
               profiler: cProfile.Profile | None = None) -> dict[str, Any]:
    lh = await bk.create_ledger(e, w, a)
    body = os.urandom(size)
    await lh.add_entries([body] * min(1000, entries))  # warm up connections
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    clock = time.perf_counter
    started: dict[int, float] = {}
    submitted = 0

    def submit() -> None:
        nonlocal submitted
        submitted += 1
        now = clock()
        started[lh.async_add_entry(body, finished)] = now

    def finished(entry_id: int, error: BKError | None) -> None:
        latencies.append(clock() - started.pop(entry_id))
        if error is not None:
            if not done.done():
                done.set_exception(error)
            return
        if submitted < entries:
            submit()  # keep ``window`` adds outstanding: the next one starts as one completes
        elif len(latencies) == entries and not done.done():
            done.set_result(None)

    if profiler is not None:
        profiler.enable()
    t0, cpu0 = clock(), time.process_time()
    for _ in range(min(window, entries)):
        submit()
    await asyncio.wait_for(done, 600)
    secs = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    if profiler is not None:
        profiler.disable()
    await lh.close()
    return {"bench": "ledger", "case": f"E{e}W{w}A{a}", "entry_size": size, "entries": entries,
            "window": window, "seconds": round(secs, 3), "ops_per_sec": rate(entries, secs),
            "mb_per_sec": round(entries * size / secs / 1e6, 2),
            "client_cpu_us_per_add": round(cpu / entries * 1e6, 2), **percentiles(latencies)}


async def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.data:
        data_dir = args.data
    else:
        os.makedirs("data/bench", exist_ok=True)
        data_dir = tempfile.mkdtemp(prefix="ledger-", dir=os.path.abspath("data/bench"))
    out: list[dict[str, Any]] = []
    profiler = cProfile.Profile() if args.profile else None
    try:
        async with LocalCluster(bookies=3, data_dir=data_dir, conf_overrides={"gc_wait_time": "3600000"}) as c:
            bk = await BookKeeper.connect(c.metastore_uri)
            try:
                for size in args.size or [100]:
                    out.append(await _one(bk, 3, 2, 2, args.entries, size, args.window, profiler))
                    out.append(await _one(bk, 1, 1, 1, args.entries, size, args.window))
            finally:
                await bk.close()
    finally:
        if not args.data:
            shutil.rmtree(data_dir, ignore_errors=True)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    return out
