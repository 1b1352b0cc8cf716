"""``quire bench topics`` end to end with small counts: every case prints its JSON line, nothing fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def bench_topics(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    """``quire bench topics ARGS`` as a process: its JSON rows (it must exit 0)."""
    out = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "topics", *args,
                          "--data", str(tmp_path / "data")],
                         capture_output=True, text=True, timeout=300, cwd=str(Path(__file__).parents[2]))
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.slow
def test_topics_bench_prints_every_case(tmp_path: Path) -> None:
    rows = bench_topics(tmp_path, "--windows", "8,32", "--acquire-topics", "40", "--takeover-topics", "50",
                        "--spread-topics", "20", "--messages", "200")
    assert [r["case"] for r in rows] == ["acquire", "acquire", "idle_topic_rss", "takeover", "spread_publish",
                                         "one_topic", "ratio", "one_topic_unbatched", "fair_ratio",
                                         "one_topic_unbatched_requests", "topics_ratio"]
    assert [r["in_flight"] for r in rows[:2]] == [8, 32]
    assert all(r["errors"] == 0 and r["ok"] > 0 for r in rows if "errors" in r), rows
    assert rows[3]["topics"] == 50 and rows[3]["ok"] == 50      # 40 acquired last, 10 more made for it
    assert 0 < rows[3]["hub_main_thread_cpu_ms_per_topic"] <= rows[3]["hub_cpu_ms_per_topic"]
    assert rows[2]["topics"] == 80 and rows[6]["ratio"] > 0 and rows[8]["ratio"] > 0
    # one message per entry when the hub may not batch; one topic at depth 64 packs several
    assert rows[7]["entries_per_message"] == pytest.approx(1.0, abs=0.02)
    assert rows[5]["entries_per_message"] < rows[7]["entries_per_message"]
    assert rows[8]["entries_per_message"] == [rows[4]["entries_per_message"], rows[7]["entries_per_message"]]
    assert all(r["hub_cpu_ms_per_msg"] >= 0 <= r["bookies_cpu_ms_per_msg"] for r in (rows[4], rows[5], rows[7]))
    # one request per message (no producer batching) as well: still one message per entry
    assert rows[9]["client_batching"] is False and rows[10]["ratio"] > 0
    assert rows[9]["entries_per_message"] == pytest.approx(1.0, abs=0.02)


@pytest.mark.slow
def test_topics_bench_skips_the_takeover_and_spread_cases_at_zero(tmp_path: Path) -> None:
    """``--takeover-topics 0 --spread-topics 0``: the idle-memory measurement alone (0 used to take every
    acquired topic over, and an empty spread crashed)."""
    rows = bench_topics(tmp_path, "--windows", "16", "--acquire-topics", "30", "--takeover-topics", "0",
                        "--spread-topics", "0", "--messages", "10")
    assert [r["case"] for r in rows] == ["acquire", "idle_topic_rss"]
    assert rows[0]["errors"] == 0 and rows[0]["ok"] == 30 and rows[1]["topics"] == 30
    assert rows[1]["hub_bytes_per_topic"] is not None and rows[1]["hub_anon_bytes_per_topic"] is not None
