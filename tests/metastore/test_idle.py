"""metastore.idle: the one empty deque (and dict) idle owners share, and versions kept as ints."""

from __future__ import annotations

import collections

import pytest

from metastore.idle import IDLE, IDLE_DICT


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


def test_the_shared_idle_dict_reads_as_empty_and_refuses_stores() -> None:
    assert not IDLE_DICT and IDLE_DICT.get(1) is None and 1 not in IDLE_DICT and list(IDLE_DICT.values()) == []
    assert IDLE_DICT.pop(1, None) is None          # harmless, as on any empty dict
    IDLE_DICT.clear()

    def store(key: int) -> None:
        IDLE_DICT[key] = 1

    for add in (store, lambda k: IDLE_DICT.setdefault(k, 1), lambda k: IDLE_DICT.update({k: 1})):
        with pytest.raises(AssertionError, match="shared idle dict"):
            add(1)
    assert not IDLE_DICT
    table: dict[int, int] = IDLE_DICT
    if table is IDLE_DICT:                         # an owner's first store takes a dict of its own
        table = {}
    table[1] = 2
    assert table == {1: 2} and not IDLE_DICT


def test_a_kept_version_is_its_int_and_gives_the_version_back() -> None:
    from metastore import Version
    from metastore.idle import kept_version, version_of

    v = Version(1796659779416479482)
    kept = kept_version(v)
    assert type(kept) is int and version_of(kept) == v and not version_of(kept) < v
    for sentinel in (Version.NEW, Version.ANY):     # kept as themselves: never confused with a concrete one
        assert kept_version(sentinel) is sentinel and version_of(kept_version(sentinel)) is sentinel
    assert version_of(kept_version(Version(5))) != Version.NEW
