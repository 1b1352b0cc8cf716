"""metastore.idle: the one empty deque idle queues share."""

from __future__ import annotations

import collections

import pytest

from metastore.idle import IDLE


def test_the_shared_idle_deque_reads_as_empty_and_refuses_appends() -> None:
    assert not IDLE and len(IDLE) == 0 and list(IDLE) == []
    IDLE.clear()                                   # harmless, as on any empty deque
    for add in (IDLE.append, IDLE.appendleft, lambda x: IDLE.extend([x]), lambda x: IDLE.extendleft([x])):
        with pytest.raises(AssertionError, match="shared idle deque"):
            add(1)
    assert not IDLE


def test_an_owner_takes_a_deque_of_its_own_and_gives_it_back() -> None:
    queue: collections.deque[int] = IDLE
    if queue is IDLE:
        queue = collections.deque()
    queue.append(1)
    assert queue.popleft() == 1 and not IDLE
    if not queue:
        queue = IDLE
    assert queue is IDLE
