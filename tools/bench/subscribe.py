"""``quire bench subscribe``: 10 000 topics, one subscriber each, all over one client connection.

Starts ``LocalCluster(bookies=3, hubs=1)``, connects one HedwigClient, and
subscribes ``--topics`` topics (CREATE_OR_ATTACH, subscriber ``sub``), with
``--window`` subscribes in flight. Each subscribe claims a new topic for the
hub (ownership record and subscription record in the MetaStore). Reports
subscribes/s with p50/p99/p999 subscribe latency, and the hub process's
resident memory (``VmRSS`` in ``/proc/PID/status``) before and after, divided
by the number of subscriptions. No peer runs: the issue asks for the figures.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.bench import percentiles, rate
from tools.bench.publish import Outcome, Runner, bench_data_dir, client_conf, closed_loop, quire_cluster


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topics", type=int, default=10_000, help="topics, one subscription each")
    parser.add_argument("--window", type=int, default=500, help="subscribes in flight on the connection")
    parser.add_argument("--data", default=None, help="data directory (default: a new dir under ./data/bench)")


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` from ``/proc/PID/status``; ``OSError`` if it is gone."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no VmRSS for pid {pid}")


def hub_pid(cluster: Any) -> int:
    """The pid of the cluster's first hub process (``LocalCluster.hub_pid``)."""
    pid = cluster.hub_pid(0)
    if pid is None:
        raise RuntimeError("the hub process is not running")
    return int(pid)


async def subscribe_all(cluster: Any, topics: int, window: int) -> tuple[Outcome, int, int]:
    """Subscribe ``topics`` topics over one connection; return the outcome and hub RSS before and after."""
    from hub.client import HedwigClient

    pid = hub_pid(cluster)
    client = await HedwigClient.connect(cluster.hub_addresses[0], conf=client_conf(window))
    try:
        prefix = f"subs-{uuid.uuid4().hex[:8]}"
        await client.subscribe(f"{prefix}-warmup".encode(), b"sub", create_or_attach="CREATE_OR_ATTACH")
        before = rss_bytes(pid)
        names = iter(range(topics))

        def submit() -> Any:
            return client.subscribe(f"{prefix}-{next(names)}".encode(), b"sub", create_or_attach="CREATE_OR_ATTACH")

        out = await closed_loop([submit], topics, window)
        after = rss_bytes(pid)
    finally:
        await client.close()
    return out, before, after


def run(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    with bench_data_dir(args, "subscribe-") as data_dir, Runner() as loop:
        cluster = quire_cluster(data_dir, 3, 2, 2)
        loop.run(cluster.start())
        try:
            out, before, after = loop.run(subscribe_all(cluster, args.topics, args.window))
        finally:
            loop.run(cluster.stop())
    ok = len(out.latencies) - out.errors
    line: dict[str, Any] = {
        "bench": "subscribe", "case": "quire one connection", "system": "quire", "topics": args.topics,
        "window": args.window, "subscribed": ok, "seconds": round(out.seconds, 3),
        "ops_per_sec": rate(ok, out.seconds), **percentiles(out.latencies), "errors": out.errors,
        "hub_rss_before_mb": round(before / 2**20, 1), "hub_rss_after_mb": round(after / 2**20, 1),
        "hub_bytes_per_subscription": round((after - before) / ok) if ok else None,
    }
    if out.first_error:
        line["first_error"] = out.first_error
    yield line
