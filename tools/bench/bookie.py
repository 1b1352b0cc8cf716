"""``quire bench bookie``: one real bookie process, one pipelined client, durable adds.

    quire bench bookie [--count 100000] [--sizes 100,1024] [--window 1000] [--rate 5000]

Starts ``python -m tools.cli bookie`` on a temporary directory with an lmdb
metastore, connects one raw-protocol client (``RawBookieClient``, an
``asyncio.Protocol`` on uvloop) and reports, one JSON line each:

* ``fsync``: the disk's fsync rate (``os.fsync`` loop on a temp file in the
  same directory), the comparison a durable add is bound by;
* ``throughput``: adds/s and p50/p99/p999 with ``--window`` adds
  outstanding, per entry size: once with one ADD_ENTRY frame per add
  (``"frames": "ADD_ENTRY"``), once as the ledger client sends them, the
  adds answered by one read sent again as one ADD_ENTRIES frame
  (``"frames": "ADD_ENTRIES"``, ``bookie.testing.AddEntriesPipeline``);
* ``fixed_rate``: latency percentiles at ``--rate`` adds/s, measured after
  one second of warm-up at the same rate.

Payloads are encoded (``encode_entry``, crc32c) before the clock starts, so
the figures are the bookie's, not the client's encoder's. The throughput
run goes further (``bookie.testing.AddPipeline``): whole request frames are
encoded before the clock too, with the OK answer protobuf encodes for each,
and a read of answers that equal them in order costs the client one
comparison; any other answer is parsed, and a non-OK one counts in
``errors``.

``RawBookieClient`` and ``BookieProcess`` live in ``bookie.testing`` (the
bookie tests use them too).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bookie import protocol as proto
from bookie.digest import encode_entry, master_key
from bookie.testing import AddEntriesPipeline, AddPipeline, BookieProcess, Callback, RawBookieClient
from tools.bench import percentiles, rate

__all__ = ["BookieProcess", "RawBookieClient", "add_arguments", "run"]

# --- the benchmark ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=100_000, help="adds per throughput run")
    parser.add_argument("--sizes", default="100,1024", help="entry body sizes in bytes, comma-separated")
    parser.add_argument("--window", type=int, default=1000, help="adds outstanding in the throughput run")
    parser.add_argument("--rate", type=int, default=5000, help="adds/s of the fixed-rate run (0 skips it)")
    parser.add_argument("--rate-seconds", type=float, default=5.0, help="length of the fixed-rate run")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir under ./data/bench)")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    sizes = [int(s) for s in str(args.sizes).split(",") if s]
    root = Path(args.dir) if args.dir else None
    if root is None:
        os.makedirs("data/bench", exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="bookie-", dir=os.path.abspath("data/bench")))
    root.mkdir(parents=True, exist_ok=True)
    yield fsync_rate(root)
    conf = BookieProcess.write_conf(root / "bk_server.conf", {
        "bookie_port": 0, "ledger_directories": root / "data",
        "metastore_uri": f"lmdb://{(root / 'meta').resolve()}", "gc_wait_time": 0})
    bookie = BookieProcess(conf, root / "bookie.log").start()
    try:
        import uvloop

        yield from uvloop.run(_bench(bookie.address, sizes, args.count, args.window, args.rate,
                                     args.rate_seconds))
    finally:
        bookie.terminate()
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


def fsync_rate(root: Path, seconds: float = 2.0) -> dict[str, Any]:
    """fsyncs/s of small appends to a file in ``root`` (what one durable commit costs)."""
    path = root / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    lat: list[float] = []
    try:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            s = time.perf_counter()
            os.write(fd, b"x" * 100)
            os.fsync(fd)
            lat.append(time.perf_counter() - s)
        total = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return {"bench": "bookie", "case": "fsync", "dir": str(root), "count": len(lat),
            "ops_per_sec": rate(len(lat), total), **percentiles(lat)}


def _payloads(ledger_id: int, count: int, size: int) -> list[bytes]:
    body = os.urandom(size)
    return [encode_entry(ledger_id, i, i - 1, (i + 1) * size, body) for i in range(count)]


async def _bench(address: str, sizes: list[int], count: int, window: int, fixed_rate: int,
                 rate_seconds: float) -> list[dict[str, Any]]:
    client = await RawBookieClient.connect(address)
    key = master_key(b"bench")
    out: list[dict[str, Any]] = []
    ledger = 1
    try:
        for size in sizes:
            ledger += 1
            secs, lat, errors = await _pipelined(client, ledger, key, _payloads(ledger, count, size), window)
            out.append({"bench": "bookie", "case": "throughput", "frames": "ADD_ENTRY", "entry_size": size,
                        "count": count, "window": window, "errors": errors, "seconds": round(secs, 4),
                        "ops_per_sec": rate(count, secs), **percentiles(lat)})
            ledger += 1
            secs, lat, errors = await _pipelined_entries(client, ledger, key, _payloads(ledger, count, size), window)
            out.append({"bench": "bookie", "case": "throughput", "frames": "ADD_ENTRIES", "entry_size": size,
                        "count": count, "window": window, "errors": errors, "seconds": round(secs, 4),
                        "ops_per_sec": rate(count, secs), **percentiles(lat)})
        if fixed_rate > 0:
            ledger += 1  # warm-up at the same rate, not measured
            await _fixed_rate(client, ledger, key, _payloads(ledger, fixed_rate, sizes[0]), fixed_rate)
            ledger += 1
            n = int(fixed_rate * rate_seconds)
            secs, lat, errors = await _fixed_rate(client, ledger, key, _payloads(ledger, n, sizes[0]),
                                                  fixed_rate)
            out.append({"bench": "bookie", "case": "fixed_rate", "entry_size": sizes[0],
                        "target_rate": fixed_rate, "warmup_seconds": 1.0, "count": n, "errors": errors,
                        "seconds": round(secs, 4),
                        "ops_per_sec": rate(n, secs), **percentiles(lat)})
    finally:
        await client.close()
    return out


async def _pipelined(client: RawBookieClient, ledger: int, key: bytes, payloads: list[bytes],
                     window: int) -> tuple[float, list[float], int]:
    run = AddPipeline(*client.encode_adds(ledger, key, payloads), window=window)   # before the clock
    seconds = await client.pipeline(run)
    return seconds, run.latencies(), run.errors


async def _pipelined_entries(client: RawBookieClient, ledger: int, key: bytes, payloads: list[bytes],
                             window: int) -> tuple[float, list[float], int]:
    run = AddEntriesPipeline(payloads, proto.AddBodies(ledger, key).ledger_fields, window, client.conn.next_txn_id)
    seconds = await client.pipeline(run)
    return seconds, run.latencies(), run.errors


def _bind(fn: Callable[[Any, float], None], sent: float) -> Callback:
    return lambda resp: fn(resp, sent)


async def _fixed_rate(client: RawBookieClient, ledger: int, key: bytes, payloads: list[bytes],
                      ops_per_sec: int) -> tuple[float, list[float], int]:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    lat: list[float] = []
    errors = 0
    total = len(payloads)
    clock = time.perf_counter

    def answered(resp: Any, sent: float) -> None:
        nonlocal errors
        lat.append(clock() - sent)
        if not isinstance(resp, proto.Response) or resp.status != proto.OK:
            errors += 1
        if len(lat) == total and not done.done():
            done.set_result(None)

    t0 = clock()
    sent = 0
    while sent < total:
        due = min(total, int((clock() - t0) * ops_per_sec) + 1)
        while sent < due:
            t = clock()
            client.submit(proto.add_request(0, ledger, sent, key, payloads[sent]), _bind(answered, t))
            sent += 1
        client.flush()
        await asyncio.sleep(0.001)
    await asyncio.wait_for(done, 60)
    return clock() - t0, lat, errors
