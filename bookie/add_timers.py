"""Timer wheels of a ledger client for its writers' add and LAC timers (issue 34: no ``TimerHandle`` per writer).

    timers = AddTimers()                  # ClientContext.add_timers: one per client
    slot = timers.arm(writer, when)       # writer._on_timer() runs at ``when``, rounded up to a tick
    writer._timer_slot = 0                # cancel: the wheel skips a writer whose slot is no longer that one
    lacs = LacTimers()                    # ClientContext.lac_timers: the explicit-LAC checks
    lacs.arm(writer, when)                # writer._on_lac_timer() at ``when`` rounded up to an eighth of the
    writer._lac_due = 0.0                 #   writer's ``_lac_interval`` (unless an add came since); cancel

A ledger writer (``bookie.writer.LedgerWriter``) watches its oldest
pending add with one timer, armed by the first add after it went idle and
looked at ``add_entry_timeout`` later. A hub writes to thousands of
ledgers, each busy for a few milliseconds every so often (one message to
each of many topics): a loop ``TimerHandle`` per writer and busy period,
and a Python call to find it idle, add up. Here the writers due in one tick
(``TICK`` seconds) share one bucket and one loop timer; an idle writer
(nothing pending, or failed) is dropped to its idle state in the wheel's
walk of the bucket (``_drop_idle``), a busy one has its ``_on_timer`` run.
A deadline is late by at most one tick: failure detection keeps its
``add_entry_timeout`` within ``TICK``.

The wheel takes the running loop at its first ``arm`` (a client's writers
share one loop); a writer of another loop (a client used from a new loop,
tests) starts it again on that loop, dropping what the old one held.

``LacTimers`` is the same for the explicit LAC (``bookie.explicit_lac``):
a writer's LAC check falls due ``explicit_lac_interval`` after its last add,
on ticks of an eighth of the interval (the LACs of the writers due in one
tick leave in one WRITE_LAC_MULTI per bookie). A writer that had an add
since it was armed (a busy one: the usual case) is moved to the bucket of
its new due time in the walk, without a Python call; the others get their
``_on_lac_timer``.
"""

from __future__ import annotations

import asyncio
import collections
import math
from typing import Any, Protocol

__all__ = ["TICK", "AddTimers", "LacTimers"]

TICK = 1 / 32
"""Seconds of one slot of the wheel: add-timer deadlines are rounded up to a multiple of it."""


class _Timed(Protocol):
    """What the wheel needs of a writer (``bookie.writer.LedgerWriter``)."""

    _timer_slot: int
    _loop: asyncio.AbstractEventLoop
    _pending: collections.deque[Any]

    @property
    def _error(self) -> BaseException | None: ...

    def _on_timer(self) -> None: ...

    def _drop_idle(self) -> None: ...


class AddTimers:
    """See the module docstring."""

    __slots__ = ("_buckets", "_loop")

    def __init__(self) -> None:
        self._buckets: dict[int, list[_Timed]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        """Writers in the wheel's buckets (a cancelled one stays until its tick)."""
        return sum(map(len, self._buckets.values()))

    def arm(self, writer: _Timed, when: float) -> float:
        """Run ``writer``'s timer at ``when`` rounded up to the next tick; set its ``_timer_slot``; return the
        time it runs at."""
        slot = math.ceil(when / TICK)
        loop = writer._loop
        if loop is not self._loop:
            self._loop, self._buckets = loop, {}
        bucket = self._buckets.get(slot)
        if bucket is None:
            bucket = self._buckets[slot] = []
            loop.call_at(slot * TICK, self._fire, slot)
        bucket.append(writer)
        writer._timer_slot = slot
        return slot * TICK

    def _fire(self, slot: int) -> None:
        for writer in self._buckets.pop(slot, ()):
            if writer._timer_slot != slot:
                continue   # cancelled, or re-armed for another tick
            writer._timer_slot = 0
            if writer._error is None and writer._pending:
                writer._on_timer()
            else:
                writer._drop_idle()


class _LacTimed(Protocol):
    """What the LAC wheel needs of a writer (``bookie.explicit_lac.ExplicitLac``)."""

    _lac_due: float
    _lac_interval: float
    _last_add_at: float
    _loop: asyncio.AbstractEventLoop
    _closing: bool
    _sealed: bool

    @property
    def _error(self) -> BaseException | None: ...

    def _on_lac_timer(self) -> None: ...


class LacTimers:
    """See the module docstring: buckets by due time (a multiple of the writer's tick), ``_lac_due`` the cancel."""

    __slots__ = ("_buckets", "_loop")

    def __init__(self) -> None:
        self._buckets: dict[float, list[_LacTimed]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return sum(map(len, self._buckets.values()))

    def arm(self, writer: _LacTimed, when: float) -> None:
        """Run ``writer``'s LAC check at ``when`` rounded up to the next eighth of its interval."""
        loop = writer._loop
        if loop is not self._loop:
            self._loop, self._buckets = loop, {}
        tick = writer._lac_interval / 8
        at = math.ceil(when / tick) * tick
        bucket = self._buckets.get(at)
        if bucket is None:
            bucket = self._buckets[at] = []
            loop.call_at(at, self._fire, at)
        bucket.append(writer)
        writer._lac_due = at

    def _fire(self, at: float) -> None:
        bucket = self._buckets.pop(at, None)
        if not bucket:
            return
        buckets = self._buckets
        loop = self._loop
        assert loop is not None
        now = loop.time()
        for writer in bucket:
            if writer._lac_due != at:
                continue   # cancelled, or armed for another time
            interval = writer._lac_interval
            due = writer._last_add_at + interval
            if now < due and writer._error is None and not writer._closing and not writer._sealed:
                tick = interval / 8   # an add since: due an interval after it (``arm`` inlined: the usual case)
                nxt = math.ceil(due / tick) * tick
                later = buckets.get(nxt)
                if later is None:
                    later = buckets[nxt] = []
                    loop.call_at(nxt, self._fire, nxt)
                later.append(writer)
                writer._lac_due = nxt
                continue
            writer._lac_due = 0.0
            writer._on_lac_timer()
