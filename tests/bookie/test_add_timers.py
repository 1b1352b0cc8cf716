"""The ledger client's add-timer wheel (``bookie.add_timers``): shared ticks, cancel, busy and idle writers."""

from __future__ import annotations

import asyncio
import collections

from bookie.add_timers import TICK, AddTimers, LacTimers


class _Writer:
    def __init__(self, busy: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._timer_slot = 0
        self._pending: collections.deque[int] = collections.deque([1] if busy else [])
        self._error: BaseException | None = None
        self.looks: list[tuple[str, float]] = []
        self.seen = asyncio.Event()

    def _on_timer(self) -> None:
        self.looks.append(("busy", self._loop.time()))
        self.seen.set()

    def _drop_idle(self) -> None:
        self.looks.append(("idle", self._loop.time()))
        self.seen.set()


async def test_writers_due_in_one_tick_share_it_and_each_gets_its_look_once_not_before_its_deadline() -> None:
    timers = AddTimers()
    busy, idle, cancelled = _Writer(True), _Writer(False), _Writer(True)
    when = asyncio.get_running_loop().time() + 0.05
    runs_at = timers.arm(busy, when)
    assert when <= runs_at < when + TICK
    assert timers.arm(idle, when) == runs_at and timers.arm(cancelled, when) == runs_at
    assert len(timers._buckets) == 1 and len(timers) == 3    # one bucket, one loop timer
    cancelled._timer_slot = 0
    async with asyncio.timeout(5):
        await busy.seen.wait()
        await idle.seen.wait()
    assert [k for k, _ in busy.looks] == ["busy"] and [k for k, _ in idle.looks] == ["idle"]
    assert busy.looks[0][1] >= when - 0.002   # the loop's timers are of millisecond resolution
    assert not cancelled.looks and not busy._timer_slot and not idle._timer_slot
    assert len(timers) == 0


async def test_a_failed_writer_is_dropped_idle_and_a_rearm_for_a_later_tick_skips_the_earlier() -> None:
    timers = AddTimers()
    failed, moved = _Writer(True), _Writer(True)
    failed._error = RuntimeError("x")
    now = asyncio.get_running_loop().time()
    timers.arm(failed, now + 0.01)
    first = timers.arm(moved, now + 0.01)
    later = timers.arm(moved, now + 0.01 + 3 * TICK)   # re-armed: only the later slot counts
    assert later > first
    async with asyncio.timeout(5):
        await failed.seen.wait()
        await moved.seen.wait()
    assert [k for k, _ in failed.looks] == ["idle"]
    assert len(moved.looks) == 1 and moved.looks[0][1] >= later - 0.002


class _LacWriter:
    def __init__(self, interval: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._lac_due = 0.0
        self._lac_interval = interval
        self._last_add_at = self._loop.time()
        self._closing = self._sealed = False
        self._error: BaseException | None = None
        self.checks: list[float] = []
        self.checked = asyncio.Event()

    def _on_lac_timer(self) -> None:
        self.checks.append(self._loop.time())
        self.checked.set()


async def test_a_lac_check_is_moved_past_a_later_add_without_a_call_and_runs_on_an_eighth_of_the_interval() -> None:
    timers = LacTimers()
    busy, quiet, stopped = _LacWriter(0.4), _LacWriter(0.4), _LacWriter(0.4)
    start = busy._last_add_at
    for w in (busy, quiet, stopped):
        timers.arm(w, start + 0.4)
    assert len(timers._buckets) == 1 and busy._lac_due == quiet._lac_due
    assert start + 0.4 <= busy._lac_due < start + 0.4 + 0.05 + 1e-6   # rounded up to an eighth of 0.4 s
    stopped._lac_due = 0.0   # cancelled (``_stop_lac_timer``)
    first = busy._lac_due
    busy._last_add_at = start + 0.2   # an add since it was armed: due an interval after that add
    async with asyncio.timeout(5):
        await quiet.checked.wait()
    assert not busy.checks and busy._lac_due >= start + 0.6 and busy._lac_due > first
    async with asyncio.timeout(5):
        await busy.checked.wait()
    assert busy.checks[0] >= start + 0.6 - 0.002 and len(quiet.checks) == 1
    assert not stopped.checks and len(timers) == 0
