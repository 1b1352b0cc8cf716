"""``quire bench storage``: the entry-storage group-commit write path against raw batched LMDB puts.

    quire bench storage [--count 100000] [--sizes 100,1024] [--concurrency 1000]

For each entry size, in the same run and on the same filesystem:

* ``group_commit``: ``--concurrency`` tasks each awaiting
  ``EntryStorage.add_entry`` one after another (on uvloop), so every add
  rides a shared durable commit; throughput, per-add latency percentiles,
  commits and the mean group size;
* ``group_commit_server_path``: the path the bookie server takes —
  ``EntryStorage.submit_add`` with a completion callback per add, ``--concurrency``
  adds kept outstanding, no task per add (what the ratio is judged on);
* ``raw_lmdb``: the same number of entries written by plain ``putmulti``
  transactions of the mean group size observed above, each committed with
  sync (the local limit);
* ``ratio``: group-commit ops/s over raw ops/s (target >= 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lmdb

from bookie.digest import encode_entry, master_key
from bookie.storage import EntryStorage, entry_key
from tools.bench import percentiles, rate

MAP_SIZE = 16 << 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=100_000, help="entries per run")
    parser.add_argument("--sizes", default="100,1024", help="entry body sizes in bytes, comma-separated")
    parser.add_argument("--concurrency", type=int, default=1000, help="tasks adding concurrently")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir under ./data/bench)")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    import uvloop

    if args.dir:
        root = Path(args.dir)
        root.mkdir(parents=True, exist_ok=True)
    else:
        os.makedirs("data/bench", exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="storage-", dir=os.path.abspath("data/bench")))
    for size in (int(s) for s in str(args.sizes).split(",") if s):
        payloads = [encode_entry(1, i, i - 1, (i + 1) * size, os.urandom(size)) for i in range(args.count)]
        base = {"bench": "storage", "entry_size": size, "count": args.count}
        group = uvloop.run(_group_commit(root / f"group-{size}", payloads, args.concurrency))
        group.update(base)
        yield group
        server = uvloop.run(_server_path(root / f"server-{size}", payloads, args.concurrency))
        server.update(base)
        yield server
        batch = max(1, round(server["mean_batch"]))
        raw = _raw_lmdb(root / f"raw-{size}", payloads, batch)
        raw.update(base)
        yield raw
        yield {**base, "case": "ratio", "ratio": round(server["ops_per_sec"] / raw["ops_per_sec"], 3),
               "tasks_ratio": round(group["ops_per_sec"] / raw["ops_per_sec"], 3), "target": 0.5}
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


async def _group_commit(path: Path, payloads: list[bytes], concurrency: int) -> dict[str, Any]:
    storage = EntryStorage(path, map_size=MAP_SIZE)
    key = master_key(b"bench")
    lat: list[float] = []
    next_id = 0
    clock = time.perf_counter

    async def worker() -> None:
        nonlocal next_id
        while next_id < len(payloads):
            eid = next_id
            next_id += 1
            t = clock()
            await storage.add_entry(1, eid, key, payloads[eid], eid - 1)
            lat.append(clock() - t)

    t0 = clock()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    secs = clock() - t0
    commits = storage.commits
    await storage.close()
    return {"case": "group_commit", "concurrency": concurrency, "seconds": round(secs, 4),
            "ops_per_sec": rate(len(payloads), secs), "commits": commits,
            "mean_batch": round(len(payloads) / max(commits, 1), 1), **percentiles(lat)}


async def _server_path(path: Path, payloads: list[bytes], window: int) -> dict[str, Any]:
    storage = EntryStorage(path, map_size=MAP_SIZE)
    key = master_key(b"bench")
    lat = [0.0] * len(payloads)
    clock = time.perf_counter
    finished = asyncio.get_running_loop().create_future()
    state = {"next": 0, "done": 0}

    def submit() -> None:
        eid = state["next"]
        state["next"] = eid + 1
        start = clock()

        def done(exc: BaseException | None) -> None:
            lat[eid] = clock() - start
            state["done"] += 1
            if exc is not None and not finished.done():
                finished.set_exception(exc)
            elif state["next"] < len(payloads):
                submit()
            elif state["done"] == len(payloads) and not finished.done():
                finished.set_result(None)

        storage.submit_add(1, eid, key, payloads[eid], eid - 1, done)

    t0 = clock()
    for _ in range(min(window, len(payloads))):
        submit()
    await finished
    secs = clock() - t0
    commits = storage.commits
    await storage.close()
    return {"case": "group_commit_server_path", "window": window, "seconds": round(secs, 4),
            "ops_per_sec": rate(len(payloads), secs), "commits": commits,
            "mean_batch": round(len(payloads) / max(commits, 1), 1), **percentiles(lat)}


def _raw_lmdb(path: Path, payloads: list[bytes], batch: int) -> dict[str, Any]:
    path.mkdir(parents=True, exist_ok=True)
    env = lmdb.open(str(path), map_size=MAP_SIZE, max_dbs=2, sync=True, metasync=True, readahead=False)
    db = env.open_db(b"entries")
    items = [(entry_key(1, i), p) for i, p in enumerate(payloads)]
    lat: list[float] = []
    t0 = time.perf_counter()
    for start in range(0, len(items), batch):
        t = time.perf_counter()
        with env.begin(write=True) as txn:
            txn.cursor(db=db).putmulti(items[start:start + batch])
        lat.append(time.perf_counter() - t)
    secs = time.perf_counter() - t0
    env.close()
    return {"case": "raw_lmdb", "batch": batch, "seconds": round(secs, 4),
            "ops_per_sec": rate(len(items), secs), "commits": len(lat), **percentiles(lat)}
