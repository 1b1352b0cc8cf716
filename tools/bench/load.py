"""Load drivers of the benchmarks: closed-loop and fixed-rate publishing, the CPU a run costs, one event loop.

    with Runner() as loop:
        out = loop.run(closed_loop(submits, per_publisher, window))   # an Outcome: seconds, latencies, errors
        out, cpu = with_cpu(pids, loop, fixed_rate(submits, rate, seconds, window))

A ``Submit`` is one publish of a prepared body returning an awaitable
acknowledgement; the systems under load (``tools.bench.publish``,
``tools.bench.floor``...) make them.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = ["Outcome", "Runner", "Submit", "Window", "closed_loop", "cpu_seconds", "fixed_rate", "with_cpu"]

# One publish of the prepared body: returns an awaitable acknowledgement.
Submit = Callable[[], Awaitable[Any]]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (``/proc/PID/stat``); ``OSError`` if it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


T = TypeVar("T")


def with_cpu(pids: list[int], loop: asyncio.Runner, coro: Coroutine[Any, Any, T]) -> tuple[T, dict[str, float]]:
    """Run ``coro`` on ``loop``; also return the CPU seconds the server ``pids`` and this client process spent."""
    server0, client0 = sum(map(cpu_seconds, pids)), time.process_time()
    value = loop.run(coro)
    server = sum(map(cpu_seconds, pids)) - server0
    return value, {"server_cpu_s": round(server, 2), "client_cpu_s": round(time.process_time() - client0, 2)}


@dataclass
class Outcome:
    """What one run measured: wall time, per-message latencies, failures."""

    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""

    def record(self, start: float, fut: asyncio.Future[Any]) -> None:
        self.latencies.append(time.perf_counter() - start)
        exc = fut.exception()
        if exc is not None:
            self.errors += 1
            self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"


class Window:
    """At most ``size`` submissions in flight; each completion is recorded in ``out`` with its start time.

    A count and the waiting submitters' futures, not an ``asyncio.Semaphore``: the harness's share of a
    client's CPU is every system's (``quire bench queue``: a semaphore's acquire and release were about a
    microsecond of each message's, the same for every peer). Waiting submitters go on in arrival order.
    """

    def __init__(self, size: int, out: Outcome) -> None:
        self._free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._pending: set[asyncio.Future[Any]] = set()
        self._out = out

    async def submit(self, submit: Submit, start: float | None = None) -> None:
        """Wait for a free slot, then start ``submit()``; latency counts from ``start`` (default: now)."""
        if self._free <= 0 or self._waiters:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter          # _done handed this submitter its slot
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._release()   # the slot came with the cancellation: pass it on
                elif waiter in self._waiters:   # (a release may have passed over it already)
                    self._waiters.remove(waiter)
                raise
        else:
            self._free -= 1
        fut = asyncio.ensure_future(submit())
        self._pending.add(fut)
        fut.add_done_callback(functools.partial(self._done, time.perf_counter() if start is None else start))

    def _done(self, start: float, fut: asyncio.Future[Any]) -> None:
        self._out.record(start, fut)
        self._pending.discard(fut)
        self._release()

    def _release(self) -> None:
        """A slot is free: the first waiting submitter takes it, else it is counted free."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def drain(self) -> None:
        if self._pending:
            await asyncio.wait(self._pending)


async def closed_loop(submits: list[Submit], per_publisher: int, window: int) -> Outcome:
    """Each publisher keeps ``window`` publishes in flight until it has made ``per_publisher``."""
    out = Outcome()

    async def publisher(submit: Submit) -> None:
        w = Window(window, out)
        for _ in range(per_publisher):
            await w.submit(submit)
        await w.drain()

    t0 = time.perf_counter()
    await asyncio.gather(*(publisher(s) for s in submits))
    out.seconds = time.perf_counter() - t0
    return out


async def fixed_rate(submits: list[Submit], total_rate: float, seconds: float, window: int) -> Outcome:
    """Publish at ``total_rate`` msg/s split over the publishers; latency from each scheduled time.

    A publisher whose window is full waits, and the wait counts in the
    latency of the messages behind it (no coordinated omission).
    """
    out = Outcome()
    interval = len(submits) / total_rate
    per_publisher = max(1, int(total_rate * seconds / len(submits)))

    async def publisher(i: int, submit: Submit, t0: float) -> None:
        w = Window(window, out)
        first = t0 + i * interval / len(submits)  # spread the publishers over one interval
        for k in range(per_publisher):
            scheduled = first + k * interval
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await w.submit(submit, scheduled)
        await w.drain()

    t0 = time.perf_counter() + 0.01
    await asyncio.gather(*(publisher(i, s, t0) for i, s in enumerate(submits)))
    out.seconds = time.perf_counter() - t0
    return out


class Runner:
    """One uvloop event loop for the whole invocation, so results print as they are measured."""

    def __init__(self) -> None:
        try:
            import uvloop

            self._runner = _BoxedRunner(loop_factory=uvloop.new_event_loop)
        except ImportError:  # pragma: no cover - uvloop is a dependency
            self._runner = _BoxedRunner()

    def __enter__(self) -> asyncio.Runner:
        return self._runner.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._runner.close()


class _BoxedRunner(asyncio.Runner):  # type: ignore[misc]  # final in typeshed; only run is wrapped
    """``asyncio.Runner`` whose task's result is a box, not the coroutine's value.

    On the main thread ``asyncio.Runner.run`` (3.11) checks its SIGINT
    handler after the task ends, and ``signal.getsignal`` builds (and drops)
    the text of a ``ValueError`` that holds the repr of that handler, a
    ``functools.partial`` bound to the task, so the repr of the task's
    result: twice per run. An ``Outcome`` of 300 000 latencies cost half a
    second of the bench's CPU that way, outside any measured window. A box's
    repr is short.
    """

    def run(self, coro: Coroutine[Any, Any, T], *, context: contextvars.Context | None = None) -> T:
        return super().run(_boxed(coro), context=context).value


class _Box(Generic[T]):
    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value


async def _boxed(coro: Coroutine[Any, Any, T]) -> _Box[T]:
    return _Box(await coro)
