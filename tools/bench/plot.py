"""Drawing benchmark results (``quire bench ... --plot FILE.png``, ``quire bench plot RESULTS.jsonl --out FILE.png``).

    draw(rows, "publish.png")        # rows: the dicts a benchmark printed as JSON lines

One PNG with up to two panels, from whatever the rows hold:

* **Latency CDFs** (log x axis, percentile on y): one line per row with
  latencies: its ladder ``percentiles_ms`` (``tools.bench.percentiles``,
  p1 ... p99.99), else the points it has (``p50_ms``, ``p99_ms``,
  ``p999_ms``; results saved before the ladder existed).
* **Throughput bars**: one bar per row with ``ops_per_sec`` (best round per
  label when a bench repeats rounds), each labelled with its rate; a peer's
  bar also says Quire's ratio to it, from the run's ratio lines
  (``"case": "ratio"``) when it printed them, else computed against the best
  Quire bar of the same size.
* **Disk usage** (MiB over the run's samples): the soak of ``quire bench
  disk`` (issue 30), rows ``"case": "sample"`` with ``disk_bytes`` (and
  ``lmdb_file_bytes``, ``lmdb_allocated_bytes``, ``journal_bytes`` where
  present), each point named by its ``cycle`` and ``phase``.
* **Resident memory** (MiB over seconds): the samples of ``quire bench
  soak`` (issue 35), rows ``"case": "sample"`` with ``t_s``, ``process``
  and ``rss_bytes``, one line per process (and per ``subscribers`` case).

A row's label is its ``system`` (when not ``quire`` only by name), ``case``,
``config``, ``mode`` and ``size`` — the fields that tell rows apart.
Skipped rows (``skipped``) are left out. Rows with neither latencies nor a
rate draw nothing; no drawable row at all is ``ValueError``. matplotlib is
the ``plot`` extra (``make bench-deps``): without it ``PlotUnavailable``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["HELP", "PlotUnavailable", "add_arguments", "draw", "label", "latency_points", "read_rows",
           "require_matplotlib", "run"]

HELP = "draw saved results (JSON lines) as latency CDFs and throughput bars into a PNG"
LABEL_FIELDS = ("system", "case", "config", "mode", "size", "subscribers", "publishers")
RATIO_CASES = ("ratio", "p99 ratio", "cpu ratio")
LADDER_TICKS = (0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
DISK_FIELDS = ("disk_bytes", "lmdb_file_bytes", "lmdb_allocated_bytes", "journal_bytes")


class PlotUnavailable(RuntimeError):
    """matplotlib (the ``plot`` extra) is not installed."""


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("--plot needs the 'plot' extra (matplotlib): `make bench-deps`, or "
                              "`pip install -e '.[plot]'` in the source tree") from None


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a results file, one per line (blank lines skipped); ``ValueError`` naming a bad line."""
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: not a JSON line: {exc}") from None
        if isinstance(row, dict):
            rows.append(row)
    return rows


def label(row: dict[str, Any], varying: Iterable[str] = LABEL_FIELDS) -> str:
    """What tells ``row`` apart from the others: the ``LABEL_FIELDS`` among ``varying``, ``case`` once."""
    parts: list[str] = []
    for key in LABEL_FIELDS:
        if key not in varying or row.get(key) in (None, ""):
            continue
        value = f"{row[key]} B" if key == "size" else f"{key} {row[key]}" if key in ("subscribers", "publishers") \
            else str(row[key])
        if value in " ".join(parts).split() or any(value in p for p in parts):
            continue                                    # "quire E1W1A1" already says "quire" and "E1W1A1"
        parts = [p for p in parts if p not in value.split()] + [value]
    return " ".join(parts) or str(row.get("bench", "?"))


def _varying(rows: list[dict[str, Any]]) -> list[str]:
    """The label fields whose values differ between rows (all of them for a single row but ``mode``)."""
    if len(rows) == 1:
        return [k for k in LABEL_FIELDS if k != "mode"]
    return [k for k in LABEL_FIELDS if len({json.dumps(r.get(k), sort_keys=True) for r in rows}) > 1]


def latency_points(row: dict[str, Any]) -> list[tuple[float, float]]:
    """``(milliseconds, percentile)`` pairs of a row, in percentile order; ``[]`` without latencies."""
    ladder = row.get("percentiles_ms")
    points: list[tuple[float, float]] = []
    if isinstance(ladder, dict) and ladder:
        for key, ms in ladder.items():
            try:
                points.append((float(ms), float(str(key).removeprefix("p"))))
            except (TypeError, ValueError):
                continue
    else:
        for key, q in (("p50_ms", 50.0), ("p99_ms", 99.0), ("p999_ms", 99.9)):
            if isinstance(row.get(key), int | float):
                points.append((float(row[key]), q))
    points = [(ms, q) for ms, q in points if ms > 0]       # a log axis; 0 means "no samples"
    return sorted(points, key=lambda p: p[1])


def _rate_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with a throughput, the best of each label's rounds."""
    varying = _varying([r for r in rows if r.get("ops_per_sec") and r.get("mode", "throughput") == "throughput"
                        and r.get("case") not in RATIO_CASES])
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.get("ops_per_sec") and r.get("case") not in RATIO_CASES and r.get("mode", "throughput") == "throughput":
            key = label(r, varying)
            if key not in best or r["ops_per_sec"] > best[key]["ops_per_sec"]:
                best[key] = r
    return list(best.values())


def _ratios(rows: list[dict[str, Any]], bars: list[dict[str, Any]]) -> dict[int, str]:
    """Bar index -> "quire ×R" for the peers' bars."""
    printed: dict[tuple[Any, Any], list[str]] = {}
    for r in rows:
        if r.get("case") == "ratio" and isinstance(r.get("ratio"), int | float) and (
                "stat" in r or "round" not in r):   # with rounds, their median, not each round's
            who = str(r.get("quire") or "quire").removeprefix("quire ") or "quire"
            printed.setdefault((r.get("vs"), r.get("size")), []).append(f"{who} ×{r['ratio']:g}")
    out: dict[int, str] = {}
    quire = [b for b in bars if b.get("system", "quire") == "quire"]
    for i, b in enumerate(bars):
        system = b.get("system")
        if system in (None, "quire"):
            continue
        said = printed.get((system, b.get("size")))
        if said:
            out[i] = "quire: " + ", ".join(said)
            continue
        same = [q["ops_per_sec"] for q in quire if q.get("size") == b.get("size")]
        if same:
            out[i] = f"quire ×{max(same) / b['ops_per_sec']:.3g}"
    return out


def _title(rows: list[dict[str, Any]]) -> str:
    benches = sorted({str(r.get("bench")) for r in rows if r.get("bench")})
    return "quire bench " + ", ".join(benches) if benches else "quire bench"


def draw(rows: list[dict[str, Any]], out: str | Path) -> Path:
    """Write the PNG of ``rows`` to ``out``; see the module docstring."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [r for r in rows if not r.get("skipped")]
    with_latency = [r for r in rows if r.get("case") not in RATIO_CASES and latency_points(r)]
    bars = _rate_rows(rows)
    disk = [r for r in rows if r.get("case") == "sample" and isinstance(r.get("disk_bytes"), int | float)]
    rss = [r for r in rows if r.get("case") == "sample" and isinstance(r.get("rss_bytes"), int | float)
           and isinstance(r.get("t_s"), int | float)]
    if not with_latency and not bars and not disk and not rss:
        raise ValueError("nothing to draw: no row has latencies (p50_ms, percentiles_ms), ops_per_sec, "
                         "disk_bytes or rss_bytes")
    panels = int(bool(with_latency)) + int(bool(bars)) + int(bool(disk)) + int(bool(rss))
    height = max(5.0, 0.4 * len(bars) + 1.5, 0.2 * len(with_latency) + 2.0)
    fig, axes = plt.subplots(1, panels, figsize=(7.0 * panels, height), squeeze=False)
    ax_iter: Iterator[Any] = iter(axes[0])
    if with_latency:
        ax = next(ax_iter)
        varying = _varying(with_latency)
        palette = plt.get_cmap("tab20")          # pairs of shades: 20 lines before a colour repeats
        for n, r in enumerate(with_latency):
            pts = latency_points(r)
            ax.plot([p[0] for p in pts], [p[1] / 100 for p in pts], marker="o", markersize=3,
                    color=palette(((2 * n) % 20 + (n // 10) % 2) / 19),
                    linestyle="--" if r.get("mode") == "throughput" else "-", label=label(r, varying))
        ax.set_xscale("log")
        ax.set_yscale("logit")                 # the tail (p99, p99.9, p99.99) gets as much room as the median
        ax.set_yticks(LADDER_TICKS, [f"p{100 * t:g}" for t in LADDER_TICKS])
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylim(0.005, 0.99995)
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("percentile")
        ax.grid(True, which="both", alpha=0.3)
        modes = {r.get("mode") for r in with_latency}
        ax.set_title("latency CDF" + (" (dashed: throughput runs, solid: fixed rate)"
                                      if {"throughput", "fixed_rate"} <= modes else ""), fontsize="medium")
        ax.legend(fontsize="x-small", loc="upper left")
    if bars:
        ax = next(ax_iter)
        varying = _varying(bars)
        names = [label(b, varying) for b in bars]
        values = [float(b["ops_per_sec"]) for b in bars]
        ratios = _ratios(rows, bars)
        colors = ["#2857a4" if b.get("system", "quire") == "quire" else "#9aa6bb" for b in bars]
        ax.barh(range(len(bars)), values, color=colors)
        ax.set_yticks(range(len(bars)), names, fontsize="small")
        ax.invert_yaxis()
        top = max(values) if values else 1.0
        for i, v in enumerate(values):
            text = f"{v:,.0f}/s" + (f"  ({ratios[i]})" if i in ratios else "")
            ax.text(v + top * 0.01, i, text, va="center", fontsize="small")
        ax.set_xlim(0, top * 1.8 if math.isfinite(top) and top > 0 else 1)   # room for the labels
        ax.set_xlabel("operations per second")
        ax.set_title("throughput")
    if disk:
        ax = next(ax_iter)
        xs = range(len(disk))
        for key in DISK_FIELDS:
            if any(isinstance(r.get(key), int | float) for r in disk):
                ax.plot(xs, [(r.get(key) or 0) / 2**20 for r in disk], marker="o", markersize=3, label=key)
        ax.set_xticks(xs, [f"{r.get('cycle', i)} {r.get('phase', '')}".strip() for i, r in enumerate(disk)],
                      rotation=45, ha="right", fontsize="small")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.set_title("disk usage (cycle, phase)", fontsize="medium")
        ax.legend(fontsize="x-small")
    if rss:
        ax = next(ax_iter)
        cases = sorted({json.dumps(r.get("subscribers")) for r in rss})
        lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in rss:
            lines.setdefault((json.dumps(r.get("subscribers")), str(r.get("process", "?"))), []).append(r)
        for (case, process), series in lines.items():
            name = process if len(cases) == 1 else f"{process}, subscribers {case}"
            ax.plot([s["t_s"] for s in series], [s["rss_bytes"] / 2**20 for s in series], label=name,
                    linestyle="-" if case == cases[0] else "--")
        ax.set_xlabel("seconds")
        ax.set_ylabel("RSS (MiB)")
        ax.grid(True, alpha=0.3)
        ax.set_title("resident memory per process", fontsize="medium")
        ax.legend(fontsize="x-small")
    fig.suptitle(_title(rows))
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="a file of JSON lines that quire bench printed")
    parser.add_argument("--out", required=True, metavar="FILE.png", help="the PNG to write")


def run(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """``quire bench plot``: prints nothing on stdout (no results of its own); the PNG's path on stderr."""
    try:
        rows = read_rows(args.results)
        require_matplotlib()
        draw(rows, args.out)
    except (OSError, ValueError, PlotUnavailable) as exc:
        raise SystemExit(f"quire bench plot: {exc}") from None
    sys.stderr.write(f"quire bench plot: {len(rows)} rows drawn to {args.out}\n")
    return iter(())
