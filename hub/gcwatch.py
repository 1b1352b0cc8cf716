"""The garbage collector of a hub: its long pauses counted and logged, the start-up heap frozen.

    watch = GcWatch(stats, slow_seconds=0.1)   # hub.server: once the hub has started
    watch.start()        # gc.freeze() what start-up built; time every collection from now on
    server.spawn(watch.run())   # lets full collections start again once acquisitions are over
    watch.stop()         # the hub stops: stop timing, unfreeze
    with watch.deferring():   # hub.server: each topic acquisition (a takeover makes thousands at once)
        ...                   # no full collection starts meanwhile (young ones do)

A hub owning thousands of topics holds a million objects or more; a full
collection walks all of them while the event loop waits, and a loop that
waits longer than its metastore session's heartbeat allows loses the
session and with it every topic (issue 34: takeovers of 10 000 topics).
So:

* what exists once the hub has started (modules, classes, the
  configuration, the clients) is frozen (``gc.freeze``): no collection
  walks it again;
* while topics are being acquired, no full (generation 2) collection
  starts: CPython starts one each time the objects that survived the
  younger generations reach a quarter of the old ones, so a hub growing
  from 0 to 10 000 topics walked its whole heap some ten times during the
  takeover, each walk longer than the last. The young generations are still
  collected (the garbage an acquisition makes is mostly young);
* once no acquisition started or ended for ``QUIET_SECONDS`` (or after
  ``MAX_DEFER_SECONDS`` of acquisitions without such a pause), after a run
  of at least ``FREEZE_AFTER`` acquisitions (a failover, a cold start, a
  burst), the young generations are collected and everything that survived
  is frozen too, instead of the one full collection that used to follow:
  that walk of a heap holding 10 000 topics took 2-3 s on a loaded 2-core
  machine, longer than a 2 s lease. A shorter run is followed by
  the full collection as before (its walk is short: what earlier freezes
  hold is not walked), so what a freeze holds is what bursts built.
  Frozen objects are still freed by reference counting; only a reference
  cycle among them would never be collected (until ``stop``). An acquisition
  leaves no cyclic garbage, and a topic given up breaks its own cycles
  (``hub.topic.Topic.detach``; ``tests/hub/test_many_topics.py`` checks
  both), so what a freeze keeps from the collector is what the hub still
  holds. Freezes are counted (``gc_freezes``:
  ``hub_events_total{event="gc_freezes"}``);
* within such a burst, once it reaches ``FREEZE_AFTER`` acquisitions, a
  young collection runs every ``BURST_YOUNG_THRESHOLD`` allocations
  instead of every 700, and what survives it is frozen at once: each object
  a burst builds is walked once, not again in every older generation's
  collections. Without this, collections took a quarter of the hub's CPU in
  a takeover (in process, 3 000 topics: 2.0 of 7.9 s), and a takeover with
  none at all ran 1.5 times as fast. A cycle among objects alive at such a
  moment that becomes garbage later stays (the same bound as above: what
  bursts built; acquisitions themselves leave no cyclic garbage);
* every collection is timed; one longer than ``slow_seconds`` is counted
  (``gc_slow_pauses``: ``hub_events_total{event="gc_slow_pauses"}``) and
  logged with its generation and length, so an operator sees
  whether the collector is why a hub missed its lease.

Failure: nothing here raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub.stats import HubStats

log = logging.getLogger(__name__)

__all__ = ["BURST_YOUNG_THRESHOLD", "FREEZE_AFTER", "MAX_DEFER_SECONDS", "PROCESS_GC_THRESHOLD", "QUIET_SECONDS",
           "GcWatch", "tune_gc"]

PROCESS_GC_THRESHOLD = (20_000, 10, 10)
"""Cyclic GC thresholds of a hub process (``tune_gc``; CPython's default is (700, 10, 10), a bookie's
``bookie.server.GC_THRESHOLD`` is the same as this).

A publish holds a few container objects (its request, a completion partial, its queue slot) until its
entry is acknowledged, and a delivered one stays in the read-ahead cache, so at 700 a 5 000 msg/s
publish run started a young collection every hundred or so publishes, and their survivors climbed to
the older generations to be walked again: about 6 % of the hub's CPU went to the collector (``perf``
on the hub at 5 000 msg/s, issue 32). Short-lived objects die by reference count long before 20 000
of them accumulate, so a young collection now walks a few live objects where it walked them ten times."""

BURST_YOUNG_THRESHOLD = 20_000
"""In a burst, allocations between young collections (CPython's default is 700; see the module docstring)."""

FREEZE_AFTER = 500
"""Acquisitions in one run after which what the run built is frozen rather than walked (see the module docstring)."""

QUIET_SECONDS = 1.0
"""Full collections start again once no acquisition started or ended for this long."""

MAX_DEFER_SECONDS = 120.0
"""Longest a stream of acquisitions keeps full collections from starting (a takeover of 10 000 topics on a
loaded 2-core machine took over 30 s; the garbage that reaches the oldest generation meanwhile is small)."""
_NEVER = 1 << 30


def tune_gc() -> None:
    """Process-wide GC thresholds of a hub process (``PROCESS_GC_THRESHOLD``); the launcher calls it once.

    ``GcWatch`` keeps them: it restores the young threshold it found after a burst of acquisitions.
    """
    gc.set_threshold(*PROCESS_GC_THRESHOLD)


class GcWatch:
    """See the module docstring."""

    def __init__(self, stats: HubStats, slow_seconds: float = 0.1) -> None:
        self.stats = stats
        self.slow_seconds = slow_seconds
        self.longest = 0.0
        self._started_at = 0.0
        self._deferring = 0              # acquisitions under way
        self._deferred_since = 0.0       # when the current run of acquisitions began
        self._last_change = 0.0          # when an acquisition last started or ended
        self._threshold2: int | None = None   # the full-collection threshold while deferred (restored after)
        self._run_acquisitions = 0       # acquisitions started in the current run
        self._threshold0 = 0             # the young threshold before a burst (restored after)
        self._bursting = False           # this run reached FREEZE_AFTER: survivors of young collections frozen

    def start(self) -> None:
        gc.collect()
        gc.freeze()
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        """Stop timing; unfreeze (what the hub held may now be garbage, cycles too)."""
        self._resume(freeze=False)
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        gc.unfreeze()

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        """No full collection starts inside (see the module docstring); nests, and counts across tasks."""
        now = time.monotonic()
        if self._threshold2 is None and now - self._last_change >= QUIET_SECONDS:
            self._deferred_since = now   # a new run of acquisitions
            self._run_acquisitions = 0
        self._deferring += 1
        self._run_acquisitions += 1
        self._last_change = now
        if self._threshold2 is None and now - self._deferred_since < MAX_DEFER_SECONDS:
            self._threshold0, t1, self._threshold2 = gc.get_threshold()
            gc.set_threshold(self._threshold0, t1, _NEVER)
        if self._run_acquisitions >= FREEZE_AFTER and self._threshold2 is not None and not self._bursting:
            self._bursting = True        # a burst: fewer young collections, each one's survivors frozen (_on_gc)
            _, t1, t2 = gc.get_threshold()
            gc.set_threshold(max(self._threshold0, BURST_YOUNG_THRESHOLD), t1, t2)
        try:
            yield
        finally:
            self._deferring -= 1
            self._last_change = time.monotonic()

    def check(self) -> None:
        """Let full collections start again if the acquisitions are over (or went on too long)."""
        if self._threshold2 is None:
            return
        now = time.monotonic()
        if (not self._deferring and now - self._last_change >= QUIET_SECONDS) or \
                now - self._deferred_since >= MAX_DEFER_SECONDS:
            self._resume()

    async def run(self) -> None:
        """``check`` twice per ``QUIET_SECONDS``, until cancelled (the hub's stop)."""
        while True:
            await asyncio.sleep(QUIET_SECONDS / 2)
            self.check()

    def _resume(self, freeze: bool = True) -> None:
        if self._threshold2 is not None:
            if freeze and self._run_acquisitions >= FREEZE_AFTER:   # a burst's objects: walked by no collection
                gc.collect(1)
                gc.freeze()
                self.stats.incr("gc_freezes")
            _, t1, _ = gc.get_threshold()
            gc.set_threshold(self._threshold0, t1, self._threshold2)
            self._threshold2 = None
            self._bursting = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_at = time.perf_counter()
            return
        if self._bursting and info.get("generation") != 2:
            gc.freeze()   # what survived this young collection: no later collection walks it again
            self.stats.incr("gc_freezes")
        took = time.perf_counter() - self._started_at
        if took < self.slow_seconds:
            return
        self.stats.incr("gc_slow_pauses")
        self.longest = max(self.longest, took)
        log.warning("garbage collection of generation %s paused the hub for %.0f ms (%s unreachable objects "
                    "collected; the longest pause so far %.0f ms)", info.get("generation"), took * 1000,
                    info.get("collected"), self.longest * 1000)
