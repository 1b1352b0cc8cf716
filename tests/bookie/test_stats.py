"""The bookie's Prometheus metrics (``bookie.stats``): what one journal group's figures export."""

from __future__ import annotations

from prometheus_client import generate_latest

from bookie.stats import BookieStats


def make_stats() -> BookieStats:
    return BookieStats(read_only=lambda: False, connections=lambda: 0, disk_usage=lambda: None)


def sample(text: str, name: str) -> float:
    """The value of the one sample line ``name`` (labels included) in exposition ``text``."""
    (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
    return float(line.split()[-1])


def test_on_commit_counts_each_group_in_its_histograms() -> None:
    stats = make_stats()
    stats.on_commit(3, 0.0015, 0.0004)
    stats.on_commit(1, 0.0001, 0.00009)
    text = generate_latest(stats.registry).decode()
    for name in ("bookie_group_commit_entries", "bookie_journal_group_entries"):   # the same samples, two names
        assert sample(text, f"{name}_count") == 2
        assert sample(text, f"{name}_sum") == 4
        assert sample(text, f'{name}_bucket{{le="1.0"}}') == 1
        assert sample(text, f'{name}_bucket{{le="4.0"}}') == 2
    assert sample(text, 'bookie_group_commit_seconds_bucket{le="0.0005"}') == 1
    assert sample(text, 'bookie_group_commit_seconds_bucket{le="0.002"}') == 2
    assert sample(text, 'bookie_journal_sync_seconds_bucket{le="0.0001"}') == 1
    assert sample(text, 'bookie_journal_sync_seconds_bucket{le="0.0005"}') == 2
    assert abs(sample(text, "bookie_journal_sync_seconds_sum") - 0.00049) < 1e-12
