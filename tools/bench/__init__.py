"""``quire bench NAME``: benchmarks that print one JSON line per result.

Each benchmark is a module ``tools.bench.<name>`` with
``add_arguments(parser)`` and ``run(args) -> Iterable[dict]``; every dict is
printed as one JSON line. A result holds at least ``bench``, ``case``, the
configuration it ran with, and ``ops_per_sec`` and/or latency percentiles
(``p50_ms``, ``p99_ms``, ``p999_ms`` and the ladder ``percentiles_ms``,
p1 ... p99.99) where they apply.

``--plot FILE.png`` after any benchmark's name draws what the run printed
(``tools.bench.plot``: latency CDFs, throughput bars with ratios);
``quire bench plot RESULTS.jsonl --out FILE.png`` draws saved lines. Both
need the ``plot`` extra (matplotlib; ``make bench-deps``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

BENCHMARKS = {
    "metastore": "CAS put / get / cursor scan per backend against the raw client",
    "placement": "new_ensemble / replace_bookie rates on 300 bookies, 30 racks, 3 regions",
    "storage": "bookie entry-storage group-commit write path against raw batched LMDB puts",
    "bookie": "one bookie process, one pipelined client, durable adds",
    "ledger": "E3 W2 A2 over three bookie processes",
    "publish": "durable publishes through one hub (E1W1A1, E3W2A2) vs Redis Streams, NATS JetStream, a python floor",
    "fanout": "1/10/100 subscribers on one topic against Redis consumer groups",
    "queue": "a SHARED work queue with 1/4/16 consumers acking each message vs Redis consumer groups, NATS JetStream",
    "subscribe": "10 000 topics with one subscriber each over one connection: subscribes/s, hub memory",
    "topics": "many topics: acquisition at 64/512 in flight, takeover after kill -9, idle RSS, spread publishing",
    "disk": "disk usage of a bookie over publish / consume / delete cycles of about 1 GB (does LMDB reuse pages?)",
    "soak": "steady publishing for minutes: RSS of the hub, bookies and client per message and per hour",
    "scan": "Spark scan of 1M ledger rows (quire-metastore DataSource) against the one-process cursor scan",
}


def configure(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    sub = parser.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, help_text in BENCHMARKS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            module = importlib.import_module(f"tools.bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"tools.bench.{name}":
                sub._name_parser_map.pop(name, None)
                continue
            raise
        module.add_arguments(p)
        p.add_argument("--plot", metavar="FILE.png", default="",
                       help="also draw the results (latency CDFs, throughput bars) to this PNG (needs matplotlib)")
        p.set_defaults(bench_run=module.run)
    from tools.bench import plot

    p = sub.add_parser("plot", help=plot.HELP, description=plot.HELP)
    plot.add_arguments(p)
    p.set_defaults(bench_run=plot.run, plot="")
    return _run


def _run(args: argparse.Namespace) -> int:
    if args.plot:
        from tools.bench.plot import PlotUnavailable, require_matplotlib

        try:
            require_matplotlib()       # before the run, not after minutes of it
        except PlotUnavailable as exc:
            sys.stderr.write(f"quire bench: {exc}\n")
            return 2
    rows = []
    for result in args.bench_run(args):
        emit(result)
        rows.append(result)
    if args.plot:
        from tools.bench.plot import draw

        draw(rows, args.plot)
        sys.stderr.write(f"quire bench: plot written to {args.plot}\n")
    return 0


def emit(result: dict[str, Any]) -> None:
    """Print one result as a JSON line (the CLI prints; libraries never do)."""
    sys.stdout.write(json.dumps(result, sort_keys=False) + "\n")
    sys.stdout.flush()


LADDER = (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 99.99)
"""The percentiles every latency summary keeps (``percentiles_ms``): enough to draw a CDF."""


def percentiles(latencies_s: Sequence[float]) -> dict[str, Any]:
    """p50/p99/p999 in milliseconds of a list of latencies in seconds, and the ladder ``percentiles_ms``.

    ``percentiles_ms`` maps ``"p1"`` ... ``"p99.99"`` (``LADDER``) to
    milliseconds (``{}`` without samples), so ``quire bench plot`` can draw a
    latency CDF from the JSON line alone; a percentile is the sample at rank
    ``floor(q * n)`` of the sorted samples.
    """
    if not latencies_s:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "p999_ms": 0.0, "percentiles_ms": {}}
    xs = sorted(latencies_s)

    def pick(q: float) -> float:
        return round(xs[min(len(xs) - 1, int(round(q * len(xs), 9)))] * 1000.0, 4)   # 0.9999 * 10000 is 9998.99...

    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "p999_ms": pick(0.999),
            "percentiles_ms": {f"p{q:g}": pick(q / 100) for q in LADDER}}


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def timed(fn: Callable[[], Any], count: int) -> tuple[float, list[float]]:
    """Call ``fn`` ``count`` times; return (total seconds, per-call latencies)."""
    lat: list[float] = []
    t0 = time.perf_counter()
    for _ in range(count):
        s = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - s)
    return time.perf_counter() - t0, lat


@contextlib.contextmanager
def readonly_lmdb(path: str, max_dbs: int = 0) -> Iterator[Any]:
    """A read-only LMDB environment at ``path`` that another process writes (a bookie's storage, the lmdb
    metastore), closed on exit. Only where this process has no environment of its own open on ``path``
    (LMDB allows one per path and process)."""
    import lmdb

    env = lmdb.open(path, readonly=True, subdir=True, max_dbs=max_dbs, lock=True)
    try:
        yield env
    finally:
        env.close()
