"""``quire bench disk``: does the bookies' disk space come back once a topic's ledgers are deleted?

    quire bench disk --gb 1 --cycles 3            # about 1 GB through one topic, three times
    quire bench disk --gb 0.1 --cycles 3 --message-size 16384

Quire runs as ``LocalCluster(bookies=1, hubs=1)`` (E1 W1 A1: every byte
lands on the one bookie). Each cycle publishes ``--gb`` of messages through
one topic with one subscription (``--window`` publishes in flight), samples
the bookie's disk, moves the subscription's consume pointer to the last
message, waits until the hub has deleted the consumed ledgers
(``messages_consumed_thread_run_interval``, the topic's stats list only its
last ledger) and for the bookie's garbage collection and checkpoint to
apply the deletes (``gc_wait_time`` + ``flush_interval``, three times over,
then until two samples agree), and samples again.

A sample (one JSON line, ``"case": "sample"``) names the cycle and phase
(``published`` or ``deleted``) and the bytes of the bookie's LMDB files
(``lmdb_file_bytes``: their size; ``lmdb_allocated_bytes``: the blocks the
file system holds for them) and of its journal directory
(``journal_bytes``, allocated), with ``disk_bytes`` their sum. The last line
(``"case": "plateau"``) compares the usage after the first cycle's
deletion with the usage after the last one: ``growth_bytes`` and
``plateau`` (growth within ``--slack-mb``). LMDB never shrinks its file; if
the pages of deleted ledgers are reused (its free list), the file stops
growing after the first cycle.

The ledgers roll every ``max_entries_per_ledger`` (64) entries of up to
``max_batch_bytes`` so most of a cycle's data is deletable once consumed
(the topic's last ledger always stays), and journal files roll every
``journal_max_size_mb`` (64: the journal's own plateau is one file plus the
preallocation; the default 2048 would hold up to 2 GB of journal before the
first file can go). ``zk_timeout`` is 10 s: a hub whose metastore session
lapses under the load of a shared machine gives its topic up, which the
client rides out but which is not what is measured. ``--conf KEY=VALUE``
overrides any hub or bookie key.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.bench import readonly_lmdb
from tools.bench.publish import add_conf_argument, bench_data_dir, conf_fields, conf_overrides

__all__ = ["DiskSample", "add_arguments", "disk_sample", "run", "soak"]

MIB = 1024 * 1024
BENCH_CONF = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1",
              "max_entries_per_ledger": "64", "messages_consumed_thread_run_interval": "500",
              "gc_wait_time": "500", "flush_interval": "500", "journal_max_size_mb": "64",
              "rebalance_interval_sec": "0", "zk_timeout": "10000"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gb", type=float, default=1.0, help="gigabytes (1e9 bytes) of message bodies per cycle")
    parser.add_argument("--cycles", type=int, default=3, help="publish / consume / delete cycles")
    parser.add_argument("--message-size", type=int, default=65536, help="message body bytes")
    parser.add_argument("--window", type=int, default=64, help="publishes in flight")
    parser.add_argument("--slack-mb", type=float, default=32.0,
                        help="growth after the first cycle still counted as a plateau (MiB)")
    parser.add_argument("--data", default=None, help="data directory (default: a new dir under ./data/bench)")
    add_conf_argument(parser)


DiskSample = dict[str, int]


def _allocated(path: Path) -> int:
    st = path.stat()
    return int(st.st_blocks) * 512


def disk_sample(bookie_dir: Path) -> DiskSample:
    """Bytes a bookie's storage holds on disk: its LMDB files (size and allocated) and its journal."""
    lmdb_size = lmdb_alloc = journal = 0
    for p in bookie_dir.rglob("*"):
        if not p.is_file():
            continue
        try:
            if "journal" in p.relative_to(bookie_dir).parts:
                journal += _allocated(p)
            elif p.suffix == ".mdb":
                lmdb_size += p.stat().st_size
                lmdb_alloc += _allocated(p)
        except FileNotFoundError:     # a journal file deleted meanwhile
            continue
    return {"lmdb_file_bytes": lmdb_size, "lmdb_allocated_bytes": lmdb_alloc, "journal_bytes": journal,
            "disk_bytes": lmdb_alloc + journal}


async def _publish(c: Any, topic: bytes, body: bytes, count: int, window: int) -> int:
    """Publish ``count`` messages with ``window`` in flight; the last seq id."""
    sem = asyncio.Semaphore(window)
    last = 0
    errors: list[BaseException] = []

    def done(fut: asyncio.Future[int]) -> None:
        nonlocal last
        sem.release()
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            errors.append(exc)
        else:
            last = max(last, fut.result())

    pending = []
    for _ in range(count):
        if errors:
            raise errors[0]
        await sem.acquire()
        fut = c.publish_async(topic, body)
        fut.add_done_callback(done)
        pending.append(fut)
        if len(pending) > 4 * window:
            pending = [f for f in pending if not f.done()]
    await asyncio.gather(*pending)
    if errors:
        raise errors[0]
    return last


async def _ledgers(http: Any, stats_url: str) -> list[Any]:
    async with http.get(stats_url) as resp:
        body = await resp.json(content_type=None)
        return list(body.get("ledgers", [])) if resp.status == 200 else []


def stored_ledgers(bookie_dir: Path) -> int:
    """Ledger records the bookie's entry storage at ``bookie_dir`` holds (its LMDB ``ledgers`` database), read
    from this process through a read-only environment of its own (the bookie runs in another process)."""
    with readonly_lmdb(str(bookie_dir), max_dbs=4) as env:
        db = env.open_db(b"ledgers", create=False)
        with env.begin(db=db) as txn:
            return int(txn.stat(db)["entries"])


async def _deleted(bookie_dir: Path, keep: int, timeout: float) -> None:
    """Until the bookie's storage holds at most ``keep`` ledgers: its garbage collection and the checkpoint after
    it removed the deleted ledgers' entries, so their pages are free for the next cycle (under load that can
    take longer than any fixed wait)."""
    deadline = time.monotonic() + timeout
    while (held := await asyncio.to_thread(stored_ledgers, bookie_dir)) > keep:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the bookie still holds {held} ledgers (at most {keep} expected) after {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def _settled(bookie_dir: Path, wait: float, timeout: float) -> DiskSample:
    """A sample once the bookie's deletes had ``wait`` seconds and two samples ``wait`` apart agree."""
    await asyncio.sleep(wait)
    deadline = time.monotonic() + timeout
    before = disk_sample(bookie_dir)
    while True:
        await asyncio.sleep(wait / 3)
        now = disk_sample(bookie_dir)
        if now["lmdb_file_bytes"] == before["lmdb_file_bytes"] or time.monotonic() > deadline:
            return now
        before = now


async def soak(cluster: Any, gb: float, cycles: int, message_size: int, window: int,
               wait: float) -> list[dict[str, Any]]:
    """Run the cycles on a started cluster (one bookie, one hub); the sample rows."""
    import aiohttp

    from hub.client import HedwigClient

    bookie_dir = Path(cluster.data_dir) / "bookie-0" / "data"
    hub_http = cluster.stats_urls[0].removesuffix("/metrics")
    topic = b"disk-soak-" + uuid.uuid4().hex[:8].encode()
    stats_url = f"{hub_http}/admin/v1/topics/{topic.decode()}/stats"
    count = max(1, int(gb * 1e9) // message_size)
    body = os.urandom(message_size)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as http, \
            await HedwigClient.connect(cluster.hub_addresses[0], {"auto_send_consume_message_enabled": "false"}) as c:
        await c.subscribe(topic, b"soak")
        rows.append({"cycle": 0, "phase": "start", **disk_sample(bookie_dir), "seconds": 0.0})
        for cycle in range(1, cycles + 1):
            last = await _publish(c, topic, body, count, window)
            rows.append({"cycle": cycle, "phase": "published", "last_seq_id": last,
                         "published_bytes": cycle * count * message_size, **disk_sample(bookie_dir),
                         "seconds": round(time.monotonic() - t0, 1)})
            await c.consume(topic, b"soak", last)
            deadline = time.monotonic() + 120
            while len(kept := await _ledgers(http, stats_url)) > 1:
                if time.monotonic() > deadline:
                    raise TimeoutError("the hub did not delete the consumed ledgers within 120 s")
                await asyncio.sleep(0.2)
            await _deleted(bookie_dir, len(kept), timeout=120)
            sample = await _settled(bookie_dir, wait, timeout=60)
            rows.append({"cycle": cycle, "phase": "deleted", "last_seq_id": last, **sample,
                         "seconds": round(time.monotonic() - t0, 1)})
    return rows


def plateau(rows: list[dict[str, Any]], slack_bytes: int) -> dict[str, Any]:
    """The verdict: disk usage after the last cycle's deletion against the first's."""
    deleted = [r for r in rows if r["phase"] == "deleted"]
    first, last = deleted[0], deleted[-1]
    growth = last["disk_bytes"] - first["disk_bytes"]
    lmdb_growth = last["lmdb_file_bytes"] - first["lmdb_file_bytes"]
    return {"after_first_cycle_bytes": first["disk_bytes"], "after_last_cycle_bytes": last["disk_bytes"],
            "growth_bytes": growth, "lmdb_file_growth_bytes": lmdb_growth,
            "peak_lmdb_file_bytes": max(r["lmdb_file_bytes"] for r in rows),
            "plateau": growth <= slack_bytes}


def run(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    from tools.cluster import LocalCluster

    overrides = conf_overrides(args)
    conf = {**BENCH_CONF, **overrides}
    wait = 3 * (int(conf["gc_wait_time"]) + int(conf["flush_interval"])) / 1000.0
    common = {"bench": "disk", "gb": args.gb, "message_size": args.message_size, "cycles": args.cycles,
              **conf_fields(overrides)}
    with bench_data_dir(args, "disk-") as data:
        async def go() -> list[dict[str, Any]]:
            async with LocalCluster(bookies=1, hubs=1, data_dir=os.path.join(data, "quire"),
                                    conf_overrides=conf) as cluster:
                return await soak(cluster, args.gb, args.cycles, args.message_size, args.window, wait)

        rows = asyncio.run(go())
    for row in rows:
        yield {**common, "case": "sample", **row}
    yield {**common, "case": "plateau", **plateau(rows, int(args.slack_mb * MIB))}
