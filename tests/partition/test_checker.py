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


def test_the_work_queue_checker_states_its_guarantee() -> None:
    from tests.partition.checker import check_queue

    base = [{"op": "ack", "seq": s} for s in (1, 2, 3)]
    ok = [
        *base,
        {"op": "recv", "consumer": "a", "seq": 1, "t": 1.0}, {"op": "acked", "consumer": "a", "seq": 1, "t": 1.1},
        {"op": "recv", "consumer": "a", "seq": 2, "t": 1.2},
        {"op": "fault", "kind": "consumer", "consumer": "a", "t": 1.5},
        {"op": "recv", "consumer": "b", "seq": 2, "t": 2.0}, {"op": "acked", "consumer": "b", "seq": 2, "t": 2.1},
        {"op": "recv", "consumer": "b", "seq": 3, "t": 2.2}, {"op": "dlq", "seq": 3},
    ]
    assert check_queue(ok).ok and check_queue(ok).redelivered == 1
    # an acknowledged message handed out again with no fault in between
    again = [*ok, {"op": "recv", "consumer": "b", "seq": 1, "t": 3.0}]
    assert any("without cause" in p for p in check_queue(again).problems)
    # an owner fault excuses acks within the slack only
    owner = [*ok, {"op": "fault", "kind": "owner", "t": 1.5}, {"op": "recv", "consumer": "b", "seq": 1, "t": 3.0}]
    assert check_queue(owner, ack_slack=1.0).ok and not check_queue(owner, ack_slack=0.1).ok
    lost = [o for o in ok if not (o["op"] in ("recv", "dlq") and o["seq"] == 3)]
    assert any(p.startswith("lost") for p in check_queue(lost).problems)
    assert any("dead-lettered twice" in p for p in check_queue([*ok, {"op": "dlq", "seq": 3}]).problems)


def test_check_queue_excuses_a_cut_consumer_taking_from_its_own_queue_during_the_fault() -> None:
    from tests.partition.checker import check_queue

    ops = [{"op": "ack", "seq": 1}, {"op": "fault", "kind": "consumer", "consumer": "c1", "t": 1.0, "until": 5.0},
           {"op": "recv", "consumer": "c0", "seq": 1, "t": 3.0}, {"op": "acked", "consumer": "c0", "seq": 1, "t": 3.1},
           {"op": "recv", "consumer": "c1", "seq": 1, "t": 3.5}]      # c1's app took it late, during its cut
    assert check_queue(ops).ok
    after = [*ops[:-1], {"op": "recv", "consumer": "c1", "seq": 1, "t": 6.0}]   # after the fault: no excuse
    assert not check_queue(after).ok
