"""The ledger client's add-timer wheel (``bookie.add_timers``): shared ticks, cancel, busy and idle writers."""

from __future__ import annotations

import asyncio
import collections

from bookie.add_timers import TICK, AddTimers


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
