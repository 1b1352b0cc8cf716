"""The bench's event loop (tools.bench.load.Runner): what a run returns is never printed on the way out; its load
window (``Window``): a bound on submissions in flight, shared by every system."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tools.bench.load import Outcome, Runner, Window


class Unprintable:
    """A result whose repr is an error: asyncio.Runner.run (3.11) would build it twice after each run."""

    reprs = 0

    def __repr__(self) -> str:
        Unprintable.reprs += 1
        raise AssertionError("the run's result was printed")


def test_a_run_returns_its_value_without_printing_it() -> None:
    async def measured() -> Unprintable:
        return Unprintable()

    async def outcome() -> Outcome:
        return Outcome(seconds=1.0, latencies=[0.5] * 1000)

    with Runner() as loop:
        got = loop.run(measured())
        out = loop.run(outcome())
    assert isinstance(got, Unprintable) and Unprintable.reprs == 0
    assert out.seconds == 1.0 and len(out.latencies) == 1000


def test_a_run_that_fails_raises_its_error() -> None:
    async def fails() -> None:
        raise ValueError("no")

    with Runner() as loop, pytest.raises(ValueError, match="no"):
        loop.run(fails())


async def test_a_window_keeps_at_most_its_size_in_flight_and_records_each() -> None:
    out = Outcome()
    w = Window(3, out)
    loop = asyncio.get_running_loop()
    flying: list[asyncio.Future[Any]] = []
    most = 0

    def submit() -> asyncio.Future[Any]:
        nonlocal most
        fut = loop.create_future()
        flying.append(fut)
        most = max(most, sum(not f.done() for f in flying))
        loop.call_later(0.001, fut.set_result, None)
        return fut

    async def submitter() -> None:
        for _ in range(20):
            await w.submit(submit)

    await asyncio.wait_for(asyncio.gather(submitter(), submitter()), 10.0)   # two submitters share it
    await asyncio.wait_for(w.drain(), 10.0)
    assert most == 3 and len(out.latencies) == 40 and out.errors == 0


@pytest.mark.parametrize("handed_first", [False, True])
async def test_a_cancelled_waiting_submitter_leaves_its_slot_to_the_others(handed_first: bool) -> None:
    """Cancelled while it waits, or after the slot was handed to it but before it ran: the slot goes on."""
    out = Outcome()
    w = Window(1, out)
    loop = asyncio.get_running_loop()
    first: asyncio.Future[Any] = loop.create_future()
    await w.submit(lambda: first)                        # the one slot is taken
    waiting = asyncio.ensure_future(w.submit(lambda: loop.create_future()))
    await asyncio.sleep(0)
    first.set_result(None)                               # frees the slot (its callback runs next turn)
    if handed_first:
        await asyncio.sleep(0)                           # the slot went to the waiting submitter...
    waiting.cancel()                                     # ...which is cancelled before it runs
    await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 10.0)
    assert waiting.cancelled()
    started: asyncio.Future[Any] = loop.create_future()
    await asyncio.wait_for(w.submit(lambda: started), 10.0)   # it gets the slot: nothing leaked
    started.set_result(None)
    await asyncio.wait_for(w.drain(), 10.0)
    assert len(out.latencies) == 2
