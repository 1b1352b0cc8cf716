"""Benchmark plots (``tools.bench.plot``) and the percentile ladder every latency summary keeps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench import LADDER, percentiles
from tools.bench.plot import _ratios, draw, label, latency_points
from tools.cli import main

pytest.importorskip("matplotlib", reason="the plot extra is missing: make bench-deps")
ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def quire(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True, timeout=240,
                          cwd=ROOT, stdin=subprocess.DEVNULL)


def test_the_ladder_is_kept_with_the_summary_and_is_monotonic() -> None:
    lat = [i / 10000 for i in range(1, 10001)]          # 0.1 ms .. 1000 ms
    got = percentiles(lat)
    ladder = got["percentiles_ms"]
    assert list(ladder) == [f"p{q:g}" for q in LADDER] == ["p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95",
                                                           "p99", "p99.9", "p99.99"]
    assert list(ladder.values()) == sorted(ladder.values())
    assert ladder["p50"] == got["p50_ms"] and ladder["p99"] == got["p99_ms"] and ladder["p99.9"] == got["p999_ms"]
    assert ladder["p1"] == pytest.approx(10.1) and ladder["p99.99"] == pytest.approx(1000.0)
    assert percentiles([])["percentiles_ms"] == {}


def test_latency_points_use_the_ladder_else_the_old_fields() -> None:
    assert latency_points({"percentiles_ms": {"p50": 2.0, "p1": 1.0, "p99.99": 9.0}}) == [(1.0, 1.0), (2.0, 50.0),
                                                                                          (9.0, 99.99)]
    assert latency_points({"p50_ms": 1.5, "p99_ms": 3.0, "p999_ms": 0.0}) == [(1.5, 50.0), (3.0, 99.0)]
    assert latency_points({"ops_per_sec": 10}) == []
    assert label({"system": "quire", "case": "quire E1W1A1", "size": 100}) == "quire E1W1A1 100 B"


def test_a_peers_bar_is_labelled_with_the_median_of_rounds_not_each_round() -> None:
    bars = [{"system": "quire", "size": 100, "ops_per_sec": 300.0},
            {"system": "redis", "size": 100, "ops_per_sec": 200.0}]
    ratio = {"case": "ratio", "quire": "quire E3W2A2", "vs": "redis", "size": 100}
    rows = [{**ratio, "ratio": 1.5, "round": 0}, {**ratio, "ratio": 0.5, "round": 1},
            {**ratio, "ratio": 2.5, "round": 2}, {**ratio, "ratio": 1.5, "stat": "median_of_rounds", "rounds": 3}]
    assert _ratios(rows, bars) == {1: "quire: E3W2A2 ×1.5"}
    assert _ratios([{**ratio, "ratio": 1.5}], bars) == {1: "quire: E3W2A2 ×1.5"}    # one round: its line


def test_draw_writes_a_png_with_cdfs_and_bars(tmp_path: Path) -> None:
    ladder = percentiles([i / 1000 for i in range(1, 500)])
    rows = [{"bench": "publish", "case": "quire E1W1A1", "system": "quire", "mode": "throughput", "size": 100,
             "ops_per_sec": 9000.0, **ladder},
            {"bench": "publish", "case": "redis", "system": "redis", "mode": "throughput", "size": 100,
             "ops_per_sec": 3000.0, "p50_ms": 5.0, "p99_ms": 9.0, "p999_ms": 12.0},
            {"bench": "publish", "case": "ratio", "quire": "quire E1W1A1", "vs": "redis", "size": 100, "ratio": 3.0},
            {"bench": "publish", "case": "nats", "system": "nats", "skipped": "nats-server not installed"}]
    out = draw(rows, tmp_path / "p.png")
    assert out.read_bytes().startswith(PNG) and out.stat().st_size > 10_000
    soak = [{"bench": "disk", "case": "sample", "cycle": c, "phase": phase, "disk_bytes": (c + 1) * 2**20,
             "journal_bytes": 2**19} for c in range(3) for phase in ("published", "deleted")]
    soak.append({"bench": "disk", "case": "plateau", "growth_bytes": 0, "plateau": True})
    assert draw(soak, tmp_path / "disk.png").read_bytes().startswith(PNG)
    with pytest.raises(ValueError, match="nothing to draw"):
        draw([{"bench": "x", "case": "ratio", "ratio": 2.0}], tmp_path / "none.png")


def test_bench_plot_command_draws_saved_results_and_names_a_bad_line(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"bench": "b", "case": "c", "ops_per_sec": 5.0, **percentiles([0.001, 0.002])})
                       + "\n\n")
    assert main(["bench", "plot", str(results), "--out", str(tmp_path / "saved.png")]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == f"quire bench plot: 1 rows drawn to {tmp_path / 'saved.png'}\n"
    assert (tmp_path / "saved.png").read_bytes().startswith(PNG)
    results.write_text('{"bench": "b"}\nnot json\n')
    with pytest.raises(SystemExit, match=f"quire bench plot: {results}:2: not a JSON line"):
        main(["bench", "plot", str(results), "--out", str(tmp_path / "bad.png")])
    assert not (tmp_path / "bad.png").exists()


def test_any_bench_with_plot_prints_its_lines_and_draws_them(tmp_path: Path) -> None:
    res = quire("bench", "placement", "--calls", "50", "--bookies", "12", "--racks", "3", "--regions", "1",
                "--policy", "rackaware", "--plot", str(tmp_path / "placement.png"))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert lines and all(len(x["percentiles_ms"]) == len(LADDER) for x in lines)
    assert (tmp_path / "placement.png").read_bytes().startswith(PNG)
    assert f"plot written to {tmp_path / 'placement.png'}" in res.stderr
