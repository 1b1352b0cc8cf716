"""``quire bench ledger``: durable adds through the ledger client over real bookie processes.

Runs E3 W2 A2 over three bookie processes and, as the comparison in the same
invocation, E1 W1 A1 on one of them (the single-bookie result). Adds are
pipelined with a bounded window of outstanding entries; each result reports
throughput and p50/p99/p999 add latency (submit to acknowledgement).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from bookie.client import BookKeeper
from tools.bench import percentiles, rate
from tools.cluster import LocalCluster


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--entries", type=int, default=50_000, help="adds per case")
    parser.add_argument("--size", type=int, action="append", default=None,
                        help="entry size in bytes (repeatable; default 100)")
    parser.add_argument("--window", type=int, default=2000, help="outstanding adds")
    parser.add_argument("--data", default=None, help="data directory (default: a new dir under ./data/bench)")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    return asyncio.run(_run(args))


async def _one(bk: BookKeeper, e: int, w: int, a: int, entries: int, size: int, window: int) -> dict[str, Any]:
    lh = await bk.create_ledger(e, w, a)
    body = os.urandom(size)
    await lh.add_entries([body] * min(1000, entries))  # warm up connections
    latencies: list[float] = []
    sem = asyncio.Semaphore(window)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    remaining = entries

    def finished(start: float, fut: asyncio.Future[int]) -> None:
        nonlocal remaining
        latencies.append(time.perf_counter() - start)
        sem.release()
        if fut.exception() is not None and not done.done():
            done.set_exception(fut.exception())  # type: ignore[arg-type]
        remaining -= 1
        if remaining == 0 and not done.done():
            done.set_result(None)

    t0 = time.perf_counter()
    for _ in range(entries):
        await sem.acquire()
        lh._submit_nowait(body).add_done_callback(functools.partial(finished, time.perf_counter()))
    await done
    secs = time.perf_counter() - t0
    await lh.close()
    return {"bench": "ledger", "case": f"E{e}W{w}A{a}", "entry_size": size, "entries": entries,
            "window": window, "seconds": round(secs, 3), "ops_per_sec": rate(entries, secs),
            "mb_per_sec": round(entries * size / secs / 1e6, 2), **percentiles(latencies)}


async def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.data:
        data_dir = args.data
    else:
        os.makedirs("data/bench", exist_ok=True)
        data_dir = tempfile.mkdtemp(prefix="ledger-", dir=os.path.abspath("data/bench"))
    out: list[dict[str, Any]] = []
    async with LocalCluster(bookies=3, data_dir=data_dir, conf_overrides={"gc_wait_time": "3600000"}) as c:
        bk = await BookKeeper.connect(c.metastore_uri)
        try:
            for size in args.size or [100]:
                out.append(await _one(bk, 3, 2, 2, args.entries, size, args.window))
                out.append(await _one(bk, 1, 1, 1, args.entries, size, args.window))
        finally:
            await bk.close()
    return out
