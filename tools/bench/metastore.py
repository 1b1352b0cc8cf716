"""``quire bench metastore --uri URI``: CAS put, get and cursor scan rates against the raw client.

For each operation one JSON line for Quire's store and one for the raw
client (``metastore.testing.rawclients``) doing the same work in the same
run, plus a ratio line. Operations run one at a time (latency-bound), as a
metadata client issues them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from metastore import Value, Version, open_metastore
from metastore.testing.rawclients import raw_client_for
from tools.bench import percentiles, rate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--uri", default=None,
                        help="metastore URI (default: a fresh lmdb store under ./data/bench)")
    parser.add_argument("--count", type=int, default=2000, help="operations per measurement")
    parser.add_argument("--value-size", type=int, default=100, help="bytes per value")


def _uri(args: argparse.Namespace) -> str:
    if args.uri:
        return str(args.uri)
    os.makedirs("data/bench", exist_ok=True)
    return "lmdb://" + tempfile.mkdtemp(prefix="metastore-", dir=os.path.abspath("data/bench"))


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    import uvloop

    return uvloop.run(_run(_uri(args), args.count, args.value_size))


async def _run(uri: str, count: int, size: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    data = os.urandom(size)
    keys = [f"key-{i:06d}" for i in range(count)]
    base = {"bench": "metastore", "uri": uri, "count": count, "value_size": size}

    def line(op: str, client: str, seconds: float, lat: list[float]) -> dict[str, Any]:
        return {**base, "case": op, "client": client, "seconds": round(seconds, 4),
                "ops_per_sec": rate(len(lat), seconds), **percentiles(lat)}

    ms = await open_metastore(uri)
    t = await ms.create_scannable_table(f"bench{int(time.time())}")
    for k in keys:
        await t.put(k, Value({"v": data}), Version.NEW)
    versions = {k: (await t.get(k, fields=())).version for k in keys}

    lat: list[float] = []
    t0 = time.perf_counter()
    for k in keys:
        s = time.perf_counter()
        versions[k] = await t.put(k, Value({"v": data}), versions[k])
        lat.append(time.perf_counter() - s)
    quire_put = line("cas_put", f"quire {ms.name}", time.perf_counter() - t0, lat)

    lat = []
    t0 = time.perf_counter()
    for k in keys:
        s = time.perf_counter()
        await t.get(k)
        lat.append(time.perf_counter() - s)
    quire_get = line("get", f"quire {ms.name}", time.perf_counter() - t0, lat)

    t0 = time.perf_counter()
    cur = await t.open_cursor()
    n = 0
    while cur.has_more():
        n += len(await cur.read_entries(1000))
    await cur.close()
    secs = time.perf_counter() - t0
    quire_scan = {**base, "case": "cursor_scan", "client": f"quire {ms.name}", "entries": n,
                  "seconds": round(secs, 4), "ops_per_sec": rate(n, secs)}
    await ms.close()

    raw = await asyncio.to_thread(raw_client_for, uri)
    try:
        for k in keys:
            await asyncio.to_thread(raw.put, k, data)

        def loop(fn: Any, *extra: Any) -> tuple[float, list[float]]:
            lat: list[float] = []
            t0 = time.perf_counter()
            for k in keys:
                s = time.perf_counter()
                fn(k, *extra)
                lat.append(time.perf_counter() - s)
            return time.perf_counter() - t0, lat

        secs, lat = await asyncio.to_thread(loop, raw.put, data)
        raw_put = line("cas_put", raw.name, secs, lat)
        secs, lat = await asyncio.to_thread(loop, raw.get)
        raw_get = line("get", raw.name, secs, lat)
        t0 = time.perf_counter()
        n = await asyncio.to_thread(raw.scan)
        secs = time.perf_counter() - t0
        raw_scan = {**base, "case": "cursor_scan", "client": raw.name, "entries": n,
                    "seconds": round(secs, 4), "ops_per_sec": rate(n, secs)}
    finally:
        await asyncio.to_thread(raw.close)

    for q, r in ((quire_put, raw_put), (quire_get, raw_get), (quire_scan, raw_scan)):
        out += [q, r, {**base, "case": q["case"], "client": "ratio quire/raw",
                       "ratio": _ratio(q["ops_per_sec"], r["ops_per_sec"])}]
    return out


def _ratio(ours: Any, raw: Any) -> float | None:
    return round(float(ours) / float(raw), 3) if raw else None
