"""The pure spreading arithmetic in placement.spread."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.spread import (
    arrange,
    choose_spread,
    even_shares,
    fill_level,
    labels_to_avoid,
    longest_cyclic_run,
    two_racks_reachable,
    windows_span_two,
)

caps_st = st.lists(st.integers(0, 6), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(caps=caps_st, data=st.data())
def test_fill_level_is_the_smallest_level(caps: list[int], data: st.DataObject) -> None:
    count = data.draw(st.integers(1, max(1, sum(caps))))
    if sum(caps) < count:
        with pytest.raises(ValueError):
            fill_level(caps, count)
        return
    level = fill_level(caps, count)
    assert sum(min(c, level) for c in caps) >= count
    assert sum(min(c, level - 1) for c in caps) < count


@settings(max_examples=200, deadline=None)
@given(caps=caps_st, data=st.data())
def test_even_shares(caps: list[int], data: st.DataObject) -> None:
    count = data.draw(st.integers(0, sum(caps)))
    shares = even_shares(caps, count)
    assert sum(shares) == count
    assert all(0 <= s <= c for s, c in zip(shares, caps, strict=True))
    for si in shares:
        for j, sj in enumerate(shares):
            assert si <= sj + 1 or sj == caps[j]
    # extra ones go to the earliest uncapped groups
    level = max(shares, default=0)
    below = [i for i, s in enumerate(shares) if s == level - 1 and caps[i] >= level]
    at = [i for i, s in enumerate(shares) if s == level]
    assert not below or not at or max(at) < min(below)


def test_even_shares_examples() -> None:
    assert even_shares([9, 9, 9], 7) == [3, 2, 2]
    assert even_shares([1, 9, 9], 7) == [1, 3, 3]
    assert even_shares([9, 9], 0) == [0, 0]


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=6), data=st.data(), seed=st.integers())
def test_choose_spread(sizes: list[int], data: st.DataObject, seed: int) -> None:
    groups = [[f"g{i}m{k}" for k in range(n)] for i, n in enumerate(sizes)]
    count = data.draw(st.integers(1, sum(sizes)))
    prefer = data.draw(st.sets(st.sampled_from([m for g in groups for m in g]))) or None
    chosen = choose_spread(groups, count, random.Random(seed), prefer)
    flat = [m for g in chosen for m in g]
    assert len(flat) == len(set(flat)) == count
    assert max(len(g) for g in chosen) == fill_level(sizes, count)
    for g in chosen:
        home = next(grp for grp in groups if g[0] in grp)
        assert set(g) <= set(home)
        if prefer is not None:
            # preferred members of a group are used up before the others
            preferred_left = set(home) & prefer - set(g)
            assert not preferred_left or set(g) <= prefer


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5), seed=st.integers())
def test_arrange_spreads_groups(sizes: list[int], seed: int) -> None:
    groups = [[f"g{i}m{k}" for k in range(n)] for i, n in enumerate(sizes)]
    out = arrange(groups, random.Random(seed))
    assert sorted(out) == sorted(m for g in groups for m in g)
    label = {m: i for i, g in enumerate(groups) for m in g}
    for g in groups:  # order inside a group is kept (up to the cyclic rotation)
        positions = [out.index(m) for m in g]
        assert sum(1 for a, b in zip(positions, positions[1:] + positions[:1], strict=True) if b < a) <= 1
    labels = [str(label[m]) for m in out]
    total, biggest = len(out), max(sizes)
    if len(sizes) == 1:
        assert longest_cyclic_run(labels) == total
    elif biggest <= total // 2:
        assert longest_cyclic_run(labels) == 1
    else:
        assert longest_cyclic_run(labels) == -(-biggest // (total - biggest))
    # the run bound means: every quorum spans two groups exactly when reachable
    for w in range(1, total + 1):
        assert windows_span_two(labels, w) == ((len(sizes) > 1 and two_racks_reachable(biggest, total, w)) or w == 1)


def test_equal_groups_are_dealt_round_robin() -> None:
    out = arrange([["a1", "a2"], ["b1", "b2"], ["c1", "c2"]], random.Random(1))
    labels = [m[0] for m in out]
    assert all(len(set(labels[i : i + 3])) == 3 for i in range(4))


@settings(max_examples=200, deadline=None)
@given(labels=st.lists(st.sampled_from("abc"), min_size=1, max_size=7), data=st.data())
def test_labels_to_avoid_matches_brute_force(labels: list[str], data: st.DataObject) -> None:
    n = len(labels)
    pos = data.draw(st.integers(0, n - 1))
    w = data.draw(st.integers(1, n))

    def through_ok(label: str) -> bool:
        seq = [*labels[:pos], label, *labels[pos + 1 :]]
        return all(len({seq[(s + k) % n] for k in range(w)}) >= 2 for s in range(pos - w + 1, pos + 1))

    avoid = labels_to_avoid(labels, pos, w)
    for candidate in "abcd":
        if w >= 2 and n >= 2:
            assert (candidate in avoid) == (not through_ok(candidate))
        else:
            assert not avoid


@pytest.mark.parametrize(
    ("labels", "run"),
    [("a", 1), ("aaa", 3), ("aab", 2), ("abaa", 3), ("abab", 1), ("baab", 2)],
)
def test_longest_cyclic_run(labels: str, run: int) -> None:
    assert longest_cyclic_run(list(labels)) == run
