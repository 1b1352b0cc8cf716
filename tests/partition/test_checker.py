"""The history checker on hand-made histories: each broken guarantee is named, a sound history passes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.partition.checker import assert_history, check


def ack(producer: str, n: int, seq: int) -> dict[str, Any]:
    return {"op": "ack", "producer": producer, "n": n, "body": f"{producer}-{n}", "seq": seq}


def deliver(seq: int, body: str, sub: str = "s0") -> dict[str, Any]:
    return {"op": "deliver", "sub": sub, "seq": seq, "body": body}


SOUND = [ack("p", 1, 1), ack("q", 1, 2), ack("p", 2, 3), deliver(1, "p-1"), deliver(2, "q-1"), deliver(3, "p-2")]


def test_a_sound_history_passes() -> None:
    v = assert_history(SOUND, ["s0"], "sound", seed=1)
    assert (v.acked, v.delivered, v.lost, v.duplicated) == (3, {"s0": 3}, 0, 0)


def test_an_unacknowledged_publish_may_be_delivered() -> None:
    ops = [*SOUND, {"op": "attempt", "producer": "p", "n": 3, "body": "p-3"}, deliver(4, "p-3")]
    assert check(ops, ["s0"]).ok


@pytest.mark.parametrize(("ops", "problem"), [
    (SOUND[:-1], "lost: 1 acknowledged publishes never reached s0: ['p-2']"),
    ([*SOUND, deliver(4, "p-2")], "duplicate: s0 received 'p-2' 2 times"),
    ([*SOUND, ack("r", 1, 3)], "split-brain: seq id 3 acknowledged for 'p-2' and 'r-1'"),
    ([*SOUND, ack("p", 2, 4)], "stored twice: producer p message 2 acknowledged as seq ids 3 and 4"),
    ([ack("p", 1, 1), ack("p", 2, 3), deliver(1, "p-1"), deliver(3, "p-2")], "not dense: s0 received seq id 3 after 1"),
    ([ack("p", 1, 2), ack("p", 2, 1), deliver(1, "p-2"), deliver(2, "p-1")],
     "order: producer p message 2 got seq id 1 <= 2 of message 1"),
    ([*SOUND, deliver(4, "x-1")], "phantom: s0 received 'x-1', which no producer published"),
    ([ack("p", 1, 1), deliver(1, "q-9")], "split-brain: s0 received seq id 1 as 'q-9', acknowledged as 'p-1'"),
])
def test_each_broken_guarantee_is_named(ops: list[dict[str, Any]], problem: str) -> None:
    v = check(ops, ["s0"])
    assert problem in v.problems, v.problems


def test_a_failure_names_the_guarantee_and_the_seed() -> None:
    with pytest.raises(AssertionError, match=r"(?s)scenario lossy seed 4242 broke the guarantee \(every "
                                             r"acknowledged publish.*QUIRE_PARTITION_SEED=4242"):
        assert_history(SOUND[:-1], ["s0"], "lossy", seed=4242)
