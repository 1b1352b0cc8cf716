"""``hub.dedup.ProducerDedup`` on its own: admit, settle, window, snapshot and restore (no I/O)."""

from __future__ import annotations

import pytest

from hub.dedup import ProducerDedup
from hub.errors import DuplicatePublishError


class Answers(list[tuple[int, BaseException | None]]):
    def __call__(self, seq: int, error: BaseException | None) -> None:
        self.append((seq, error))


def test_a_duplicate_gets_the_original_seq_id_and_an_older_one_is_refused() -> None:
    d = ProducerDedup(window=3)
    for sid, seq in [(10, 1), (11, 2), (12, 3), (13, 4)]:
        assert d.admit(b"p", sid, Answers())
        d.settle(b"p", sid, seq, None)
    dup = Answers()
    assert not d.admit(b"p", 12, dup) and dup == [(3, None)]
    old = Answers()
    assert not d.admit(b"p", 10, old)                    # out of the window of 3
    assert old[0][0] == 0 and isinstance(old[0][1], DuplicatePublishError)
    assert d.admit(b"other", 10, Answers())              # producers are independent


def test_a_retry_racing_its_original_shares_its_outcome_and_a_failure_can_be_retried() -> None:
    d = ProducerDedup(window=10)
    assert d.admit(b"p", 1, Answers())
    racing = Answers()
    assert not d.admit(b"p", 1, racing) and racing == []
    failure = RuntimeError("not durable")
    d.settle(b"p", 1, 0, failure)
    assert racing == [(0, failure)]
    assert d.admit(b"p", 1, Answers())                   # not stored: may be stored now
    d.settle(b"p", 1, 7, None)
    again = Answers()
    assert not d.admit(b"p", 1, again) and again == [(7, None)]


def test_retries_out_of_order_within_the_window_are_stored_once() -> None:
    d = ProducerDedup(window=3)
    for sid, seq in [(1, 1), (5, 2)]:                  # 2, 3, 4 in flight when an owner died: retried late
        assert d.admit(b"p", sid, Answers())
        d.settle(b"p", sid, seq, None)
    assert d.admit(b"p", 3, Answers())                  # never stored: new, although below 5
    d.settle(b"p", 3, 3, None)
    assert d.admit(b"p", 4, Answers())                  # the window (1, 5, 3) is full: 1 falls out
    d.settle(b"p", 4, 4, None)
    got = Answers()
    assert not d.admit(b"p", 1, got) and isinstance(got[0][1], DuplicatePublishError)
    got = Answers()
    assert not d.admit(b"p", 5, got) and got == [(2, None)]


def test_snapshot_and_restore_keep_the_window() -> None:
    d = ProducerDedup(window=2)
    for sid, seq in [(1, 1), (2, 2), (3, 5)]:
        d.admit(b"p", sid, Answers())
        d.settle(b"p", sid, seq, None)
    d.admit(b"q", 9, Answers())                          # in flight: not in a snapshot
    snap = d.snapshot(at_seq=5)
    e = ProducerDedup(window=2)
    e.restore(snap)
    got = Answers()
    assert not e.admit(b"p", 3, got) and got == [(5, None)]
    got = Answers()
    assert not e.admit(b"p", 1, got) and isinstance(got[0][1], DuplicatePublishError)
    assert e.admit(b"q", 9, Answers())


@pytest.mark.parametrize("window", [1, 5])
def test_the_window_is_bounded(window: int) -> None:
    d = ProducerDedup(window=window)
    for sid in range(100):
        d.admit(b"p", sid, Answers())
        d.settle(b"p", sid, sid + 1, None)
    assert len(d.snapshot(100).producers[0].sequenceIds) == window
