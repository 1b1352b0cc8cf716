"""hub.gcwatch: full collections deferred while topics are acquired, long pauses counted (issue 34)."""

from __future__ import annotations

import gc
import logging

import pytest

import hub.gcwatch
from hub.gcwatch import GcWatch
from hub.stats import HubStats


def test_no_full_collection_starts_while_acquiring_and_the_threshold_returns_once_quiet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    watch = GcWatch(HubStats())
    before = gc.get_threshold()
    try:
        with watch.deferring():
            with watch.deferring():          # nested (two acquisitions at once)
                assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 1_000_000
            watch.check()
            assert gc.get_threshold()[2] > 1_000_000    # one still under way
        watch.check()
        assert gc.get_threshold()[2] > 1_000_000        # over, but the next may follow at once
        monkeypatch.setattr(hub.gcwatch, "QUIET_SECONDS", 0.0)   # quiet long enough
        watch.check()
        assert gc.get_threshold() == before
    finally:
        watch.stop()


class _Built:
    """Something an acquisition built (a container the collector tracks)."""

    def __init__(self) -> None:
        self.parts: list[object] = [[], {}]


def test_what_the_acquisitions_built_is_frozen_once_quiet_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = HubStats()
    watch = GcWatch(stats)
    gc.unfreeze()
    try:
        monkeypatch.setattr(hub.gcwatch, "FREEZE_AFTER", 3)
        for _ in range(3):                    # a burst (three acquisitions here)
            with watch.deferring():
                built = [_Built() for _ in range(1000)]
        assert gc.get_freeze_count() == 0 and not stats.counters["gc_freezes"]   # not yet quiet
        monkeypatch.setattr(hub.gcwatch, "QUIET_SECONDS", 0.0)
        watch.check()
        assert stats.counters["gc_freezes"] == 1
        assert gc.get_freeze_count() >= 3 * len(built)        # the acquisitions' objects: no walk sees them
        assert not any(o is built for o in gc.get_objects(2))
        watch.check()
        assert stats.counters["gc_freezes"] == 1             # once per run of acquisitions
        with watch.deferring():               # a short run: the full collection follows as before
            pass
        watch.check()
        assert stats.counters["gc_freezes"] == 1 and gc.get_threshold()[2] < 1_000_000
    finally:
        watch.stop()
    assert gc.get_freeze_count() == 0                         # the hub stopped: unfrozen


def test_a_stream_of_acquisitions_defers_no_longer_than_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    watch = GcWatch(HubStats())
    before = gc.get_threshold()
    try:
        with watch.deferring():
            assert gc.get_threshold()[2] > 1_000_000
            monkeypatch.setattr(hub.gcwatch, "MAX_DEFER_SECONDS", 0.0)   # the bound has passed
            watch.check()
            assert gc.get_threshold() == before      # full collections may start again
            with watch.deferring():
                assert gc.get_threshold() == before  # and the run goes on without deferring
    finally:
        watch.stop()
    assert gc.get_threshold() == before


def test_a_long_collection_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    stats = HubStats()
    watch = GcWatch(stats, slow_seconds=0.0)     # every collection counts as long
    watch.start()
    try:
        with caplog.at_level(logging.WARNING, logger="hub.gcwatch"):
            gc.collect()
    finally:
        watch.stop()
    assert stats.counters["gc_slow_pauses"] >= 1
    assert "garbage collection of generation 2 paused the hub" in caplog.text
    assert gc.get_freeze_count() == 0 and watch._on_gc not in gc.callbacks
    n = stats.counters["gc_slow_pauses"]
    gc.collect()
    assert stats.counters["gc_slow_pauses"] == n  # stopped: no longer timed


def test_in_a_burst_young_collections_are_rarer_and_what_survives_them_is_frozen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stats = HubStats()
    watch = GcWatch(stats)
    before = gc.get_threshold()
    monkeypatch.setattr(hub.gcwatch, "FREEZE_AFTER", 3)
    watch.start()
    gc.unfreeze()
    try:
        with watch.deferring(), watch.deferring():
            assert gc.get_threshold()[0] == before[0]            # two acquisitions: not a burst yet
            with watch.deferring():                            # the third: a burst
                assert gc.get_threshold()[0] == hub.gcwatch.BURST_YOUNG_THRESHOLD
                built = [_Built() for _ in range(1000)]
                gc.collect(0)                                  # a young collection, as the allocations start one
                assert stats.counters["gc_freezes"] == 1
                assert gc.get_freeze_count() >= 3 * len(built)   # its survivors: no later walk sees them
        monkeypatch.setattr(hub.gcwatch, "QUIET_SECONDS", 0.0)
        watch.check()
        assert gc.get_threshold() == before                    # the burst is over: CPython's thresholds again
        n = stats.counters["gc_freezes"]
        gc.collect(0)
        assert stats.counters["gc_freezes"] == n               # young collections no longer freeze
    finally:
        watch.stop()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
