"""``quire bench metastore``: CAS put, get and cursor scan rates against the raw client.

One JSON line per result::

    quire bench metastore                         # a fresh lmdb store under ./data/bench
    quire bench metastore --zk                    # also ZooKeeper (started from the Debian jars)
    quire bench metastore --zk zk://127.0.0.1:2181/bench
    quire bench metastore --uri zk://127.0.0.1:2181/bench

* ``cas_put``, ``get``, ``cursor_scan``: operations one at a time
  (latency-bound, as a metadata client issues them) on ``--uri``, then the
  raw client (``metastore.testing.rawclients``) doing the same work in the
  same run, then a ratio line.
* ``concurrent_cas_put``: ``--concurrency`` tasks each doing CAS puts on keys
  of its own (what users of a metastore under load see); on lmdb (writer
  thread, group commit) compared with the raw sequential synced LMDB
  transaction rate, and on ZooKeeper in the same run when ``--zk`` is given
  or ``--uri`` is a ZooKeeper URI.
* ``decoded_scan`` (lmdb): a cold cursor scan of ``--scan-count`` records
  against a raw LMDB cursor decoding the same protobuf records, the best of
  ``--rounds`` interleaved rounds each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from metastore import Value, Version, open_metastore
from metastore.api import MetastoreTable
from metastore.testing.rawclients import lmdb_decoding_scan, raw_client_for
from tools.bench import percentiles, rate

START_ZK = "start"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--uri", default=None,
                        help="metastore URI (default: a fresh lmdb store under ./data/bench)")
    parser.add_argument("--count", type=int, default=2000, help="operations per measurement")
    parser.add_argument("--value-size", type=int, default=100, help="bytes per value")
    parser.add_argument("--concurrency", type=int, default=100,
                        help="tasks doing CAS puts at once in the concurrent case")
    parser.add_argument("--concurrent-count", type=int, default=None,
                        help="CAS puts in the concurrent case (default: 10 x --count)")
    parser.add_argument("--zk", nargs="?", const=START_ZK, default=None, metavar="URI",
                        help="also run the concurrent case on ZooKeeper: at URI, or (no URI) on a "
                             "server started from the system jars")
    parser.add_argument("--scan-count", type=int, default=None,
                        help="records in the decoded scan case (default: 50 x --count)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the decoded scan case (best kept)")


def _fresh_lmdb() -> str:
    os.makedirs("data/bench", exist_ok=True)
    return "lmdb://" + tempfile.mkdtemp(prefix="metastore-", dir=os.path.abspath("data/bench"))


def _is_zk(uri: str) -> bool:
    return urlsplit(uri).scheme in ("zk", "zookeeper")


@contextlib.contextmanager
def _zookeeper(want: str | None, primary: str) -> Iterator[tuple[str | None, str | None]]:
    """(ZooKeeper URI or None, why not) for the concurrent comparison; starts a server if asked."""
    if want is None or _is_zk(primary):
        yield None, None
        return
    if want != START_ZK:
        yield want, None
        return
    from tools.zookeeper import ZooKeeperNotInstalled, ZooKeeperServer

    os.makedirs("data/bench", exist_ok=True)
    data_dir = tempfile.mkdtemp(prefix="zookeeper-", dir=os.path.abspath("data/bench"))
    server = ZooKeeperServer(data_dir)
    try:
        server.start(timeout=60.0)
    except ZooKeeperNotInstalled as exc:
        yield None, f"ZooKeeper not installed: {exc}"
        return
    try:
        yield f"zk://{server.connect_string}/bench-{int(time.time())}", None
    finally:
        server.stop()


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    import uvloop

    primary = str(args.uri) if args.uri else _fresh_lmdb()
    with _zookeeper(args.zk, primary) as (zk_uri, zk_skipped):
        return uvloop.run(_run(primary, zk_uri, zk_skipped, args))


async def _run(uri: str, zk_uri: str | None, zk_skipped: str | None, args: argparse.Namespace) -> list[dict[str, Any]]:
    count, size = int(args.count), int(args.value_size)
    base = {"bench": "metastore", "uri": uri, "count": count, "value_size": size}
    out = await _sequential(uri, count, size, base)
    raw_put = next(r for r in out if r["case"] == "cas_put" and not r["client"].startswith(("quire", "ratio")))
    tasks = int(args.concurrency)
    ccount = int(args.concurrent_count or 10 * count)
    conc = {**base, "case": "concurrent_cas_put", "count": ccount, "concurrency": tasks}
    mine = await _concurrent(uri, ccount, size, tasks, conc)
    out.append(mine)
    if urlsplit(uri).scheme == "lmdb":
        out.append({**conc, "client": "ratio quire concurrent / raw sequential synced txn",
                    "raw_client": raw_put["client"], "raw_ops_per_sec": raw_put["ops_per_sec"],
                    "ratio": _ratio(mine["ops_per_sec"], raw_put["ops_per_sec"]), "target": 5.0})
    if zk_uri is not None:
        zk = await _concurrent(zk_uri, ccount, size, tasks, {**conc, "uri": zk_uri})
        out += [zk, {**conc, "client": "ratio quire lmdb / quire zookeeper (concurrent)",
                     "ratio": _ratio(mine["ops_per_sec"], zk["ops_per_sec"])}]
    elif zk_skipped is not None:
        out.append({**conc, "client": "quire zookeeper", "skipped": zk_skipped})
    if urlsplit(uri).scheme == "lmdb":
        n = int(args.scan_count or 50 * count)
        out += await _decoded_scan(n, size, int(args.rounds),
                                   {**base, "case": "decoded_scan", "count": n, "entries": n})
    return out


async def _sequential(uri: str, count: int, size: int, base: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    data = os.urandom(size)
    keys = [f"key-{i:06d}" for i in range(count)]

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


async def _concurrent(uri: str, count: int, size: int, tasks: int, base: dict[str, Any]) -> dict[str, Any]:
    """``count`` CAS puts by ``tasks`` tasks at once, each on keys of its own (read once, then CAS)."""
    data = os.urandom(size)
    ms = await open_metastore(uri)
    try:
        t = await ms.create_table(f"conc{int(time.time() * 1000)}")
        keys = [f"c-{i:06d}" for i in range(max(tasks, min(count, 10 * tasks)))]
        versions: dict[str, Version] = {}
        for i in range(0, len(keys), tasks):
            got = await asyncio.gather(*(t.put(k, Value({"v": data}), Version.NEW) for k in keys[i:i + tasks]))
            versions.update(zip(keys[i:i + tasks], got, strict=True))
        lat: list[float] = []

        async def worker(mine: list[str], ops: int) -> None:
            for j in range(ops):
                k = mine[j % len(mine)]
                s = time.perf_counter()
                versions[k] = await t.put(k, Value({"v": data}), versions[k])
                lat.append(time.perf_counter() - s)

        per = [count // tasks + (1 if i < count % tasks else 0) for i in range(tasks)]
        before = _commit_counts(ms)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(keys[i::tasks], per[i]) for i in range(tasks) if per[i]))
        secs = time.perf_counter() - t0
        result = {**base, "client": f"quire {ms.name}", "seconds": round(secs, 4),
                  "ops_per_sec": rate(len(lat), secs), **percentiles(lat)}
        after = _commit_counts(ms)
        if before is not None and after is not None and after[0] > before[0]:
            result["writes_per_commit"] = round((after[1] - before[1]) / (after[0] - before[0]), 1)
        return result
    finally:
        await ms.close()


def _commit_counts(ms: Any) -> tuple[int, int] | None:
    counts = getattr(ms, "commit_counts", None)  # lmdb only
    return counts() if callable(counts) else None


async def _decoded_scan(n: int, size: int, rounds: int, base: dict[str, Any]) -> list[dict[str, Any]]:
    """A cold Quire cursor scan of ``n`` records vs a raw LMDB cursor decoding them; best of ``rounds``."""
    uri = _fresh_lmdb()
    path = urlsplit(uri).path
    table = "ledgers"
    await _fill(uri, table, n, size)
    ours: list[float] = []
    raw: list[float] = []
    for _ in range(max(1, rounds)):  # interleaved, so a busy moment hurts both sides alike
        ms = await open_metastore(uri)  # a fresh store: nothing cached
        try:
            scanned = await ms.create_scannable_table(table)
            t0 = time.perf_counter()
            got = await _scan(scanned)
            ours.append(time.perf_counter() - t0)
        finally:
            await ms.close()
        t0 = time.perf_counter()
        raw_got = lmdb_decoding_scan(path, table)
        raw.append(time.perf_counter() - t0)
        if got != n or raw_got != n:
            raise RuntimeError(f"decoded scan saw {got} (quire) and {raw_got} (raw) records, wrote {n}")
    q = {**base, "client": "quire lmdb cursor", "rounds": rounds, "seconds": round(min(ours), 4),
         "ops_per_sec": rate(n, min(ours))}
    r = {**base, "client": "raw lmdb cursor + protobuf decode", "rounds": rounds, "seconds": round(min(raw), 4),
         "ops_per_sec": rate(n, min(raw))}
    return [q, r, {**base, "client": "ratio quire/raw", "ratio": _ratio(q["ops_per_sec"], r["ops_per_sec"]),
                   "target": 0.5}]


async def _fill(uri: str, table: str, n: int, size: int) -> None:
    data = os.urandom(size)
    ms = await open_metastore(uri)
    try:
        t = await ms.create_scannable_table(table)
        for i in range(0, n, 1000):
            await asyncio.gather(*(t.put(f"{j:020d}", Value({"data": data, "state": b"CLOSED"}), Version.NEW)
                                   for j in range(i, min(n, i + 1000))))
    finally:
        await ms.close()


async def _scan(table: MetastoreTable) -> int:
    cur = await table.open_cursor()
    n = 0
    while cur.has_more():
        n += len(await cur.read_entries(1000))
    await cur.close()
    return n


def _ratio(ours: Any, raw: Any) -> float | None:
    return round(float(ours) / float(raw), 3) if raw else None
