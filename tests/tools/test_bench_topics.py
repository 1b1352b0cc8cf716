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
                                         "spread_publish_no_multi", "one_topic", "ratio", "multi_ratio",
                                         "one_topic_unbatched", "fair_ratio", "one_topic_unbatched_requests",
                                         "topics_ratio"]
    assert [r["in_flight"] for r in rows[:2]] == [8, 32]
    assert all(r["errors"] == 0 and r["ok"] > 0 for r in rows if "errors" in r), rows
    case = {r["case"]: r for r in rows[2:]}
    assert case["takeover"]["topics"] == 50 and case["takeover"]["ok"] == 50   # 40 acquired last, 10 more made
    assert 0 < case["takeover"]["hub_main_thread_cpu_ms_per_topic"] <= case["takeover"]["hub_cpu_ms_per_topic"]
    assert case["idle_topic_rss"]["topics"] == 80
    assert case["ratio"]["ratio"] > 0 and case["fair_ratio"]["ratio"] > 0 and case["multi_ratio"]["ratio"] > 0
    # one message per entry when the hub may not batch; one topic at depth 64 packs several
    spread, apart = case["spread_publish"], case["spread_publish_no_multi"]
    one, flat = case["one_topic"], case["one_topic_unbatched"]
    assert flat["entries_per_message"] == pytest.approx(1.0, abs=0.02)
    assert one["entries_per_message"] < flat["entries_per_message"]
    # PUBLISH_MULTI or not, each topic's messages are entries of its own ledger (20 topics at depth 64: some
    # topics get several messages a turn, which may share an entry)
    assert 0 < apart["entries_per_message"] <= 1.02 and 0 < spread["entries_per_message"] <= 1.02
    assert case["fair_ratio"]["entries_per_message"] == [spread["entries_per_message"], flat["entries_per_message"]]
    assert all(r["hub_cpu_ms_per_msg"] >= 0 <= r["bookies_cpu_ms_per_msg"] for r in (spread, apart, one, flat))
    # the bench client's CPU is counted too; the bookies' journal groups hold the case's adds
    for r in (spread, apart, one, flat):
        assert r["client_cpu_ms_per_msg"] > 0 and set(r["cores_busy"]) == {"hub", "bookies", "client"}
        assert r["journal_group"]["entries"] >= 1 and r["journal_group"]["sync_ms"] > 0
        assert r["journal_group"]["commit_ms"] >= r["journal_group"]["sync_ms"]
        assert r["checkpoints"] >= 0 <= r["checkpoint_ms"]
    # one request per message (no producer batching) as well: still one message per entry
    lone = case["one_topic_unbatched_requests"]
    assert lone["client_batching"] is False and case["topics_ratio"]["ratio"] > 0
    assert lone["entries_per_message"] == pytest.approx(1.0, abs=0.02)


@pytest.mark.slow
def test_topics_bench_skips_the_takeover_and_spread_cases_at_zero(tmp_path: Path) -> None:
    """``--takeover-topics 0 --spread-topics 0``: the idle-memory measurement alone (0 used to take every
    acquired topic over, and an empty spread crashed)."""
    rows = bench_topics(tmp_path, "--windows", "16", "--acquire-topics", "30", "--takeover-topics", "0",
                        "--spread-topics", "0", "--messages", "10")
    assert [r["case"] for r in rows] == ["acquire", "idle_topic_rss"]
    assert rows[0]["errors"] == 0 and rows[0]["ok"] == 30 and rows[1]["topics"] == 30
    assert rows[1]["hub_bytes_per_topic"] is not None and rows[1]["hub_anon_bytes_per_topic"] is not None
