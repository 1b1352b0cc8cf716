"""The bench's event loop (tools.bench.load.Runner): what a run returns is never printed on the way out."""

from __future__ import annotations

import pytest

from tools.bench.load import Outcome, Runner


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
