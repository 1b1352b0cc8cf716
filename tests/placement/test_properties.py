"""Hypothesis properties of both policies over random topologies.

The rack oracle below is a brute-force search over rack sequences, written
independently of ``placement.spread``, so the policies are checked against
"could *any* ensemble do it?" rather than against their own arithmetic.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement import (
    NotEnoughBookiesError,
    RackawareEnsemblePlacementPolicy,
    RegionAwareEnsemblePlacementPolicy,
    StaticMapping,
)
from tests.placement.placement_testing import FakeClock, layout

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def windows_ok(labels: Sequence[str], write_quorum: int) -> bool:
    n = len(labels)
    if write_quorum < 2:
        return True
    return all(len({labels[(s + k) % n] for k in range(write_quorum)}) >= 2 for s in range(n))


def window_through_ok(labels: Sequence[str], pos: int, write_quorum: int) -> bool:
    n = len(labels)
    if write_quorum < 2:
        return True
    return all(
        len({labels[(s + k) % n] for k in range(write_quorum)}) >= 2 for s in range(pos - write_quorum + 1, pos + 1)
    )


def any_arrangement(capacities: Mapping[str, int], size: int, write_quorum: int) -> bool:
    """Brute force: can ``size`` members drawn from the racks put every window on two racks?"""
    if sum(capacities.values()) < size:
        return False
    if write_quorum < 2:
        return True
    racks = sorted(capacities)
    left = dict(capacities)
    seq: list[str] = []

    def search() -> bool:
        if len(seq) == size:
            return windows_ok(seq, write_quorum)
        for rack in racks:
            if left[rack] == 0:
                continue
            seq.append(rack)
            left[rack] -= 1
            linear_ok = len(seq) < write_quorum or len(set(seq[-write_quorum:])) >= 2
            found = linear_ok and search()
            seq.pop()
            left[rack] += 1
            if found:
                return True
        return False

    return search()


@st.composite
def rack_cluster(draw: st.DrawFn, max_racks: int = 4, max_per_rack: int = 3) -> dict[str, str]:
    sizes = draw(st.lists(st.integers(1, max_per_rack), min_size=1, max_size=max_racks))
    regions = draw(st.lists(st.integers(0, 1), min_size=len(sizes), max_size=len(sizes)))
    return layout({f"/g{g}/k{i}": n for i, (n, g) in enumerate(zip(sizes, regions, strict=True))})


@st.composite
def quorums(draw: st.DrawFn, max_size: int = 6) -> tuple[int, int, int]:
    e = draw(st.integers(1, max_size))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    return e, w, a


def subset(data: st.DataObject, items: Sequence[str], max_size: int = 3) -> set[str]:
    return data.draw(st.sets(st.sampled_from(sorted(items)), max_size=max_size)) if items else set()


# -- rack-aware -------------------------------------------------------------------


@SETTINGS
@given(
    data=st.data(),
    locations=rack_cluster(),
    sizes=quorums(),
    enforce=st.sampled_from([0, 2]),
    seed=st.integers(0, 2**32),
)
def test_rackaware_new_ensemble(
    data: st.DataObject, locations: dict[str, str], sizes: tuple[int, int, int], enforce: int, seed: int
) -> None:
    e, w, a = sizes
    readonly = subset(data, list(locations), 2)
    exclude = subset(data, list(locations), 2)
    policy = RackawareEnsemblePlacementPolicy(
        StaticMapping(locations), enforce_min_racks=enforce, rng=random.Random(seed)
    )
    policy.on_cluster_changed(set(locations) - readonly, readonly)
    usable = set(locations) - readonly - exclude
    caps = Counter(locations[b] for b in usable)
    reachable = any_arrangement(caps, e, w)
    if len(usable) < e or (enforce == 2 and w >= 2 and not reachable):
        with pytest.raises(NotEnoughBookiesError):
            policy.new_ensemble(e, w, a, exclude)
        return
    ensemble = policy.new_ensemble(e, w, a, exclude)
    assert len(ensemble) == e == len(set(ensemble))
    assert set(ensemble) <= usable  # never read-only, excluded or unknown
    if reachable:
        assert windows_ok([locations[b] for b in ensemble], w)


@SETTINGS
@given(
    data=st.data(),
    locations=rack_cluster(max_per_rack=4),
    sizes=quorums(),
    enforce=st.sampled_from([0, 2]),
    seed=st.integers(0, 2**32),
)
def test_rackaware_replace_bookie(
    data: st.DataObject, locations: dict[str, str], sizes: tuple[int, int, int], enforce: int, seed: int
) -> None:
    e, w, a = sizes
    if len(locations) < e:
        return
    policy = RackawareEnsemblePlacementPolicy(
        StaticMapping(locations), enforce_min_racks=enforce, rng=random.Random(seed)
    )
    policy.on_cluster_changed(set(locations), set())
    ensemble = data.draw(st.permutations(sorted(locations)))[:e]  # any ensemble, possibly a poor one
    pos = data.draw(st.integers(0, e - 1))
    victim = ensemble[pos]
    readonly = subset(data, list(locations), 2)
    exclude = subset(data, list(locations), 2)
    policy.on_cluster_changed(set(locations) - readonly, readonly)
    candidates = set(locations) - readonly - exclude - set(ensemble)
    labels = [locations[b] for b in ensemble]

    def keeps_windows(bookie: str) -> bool:
        return window_through_ok([*labels[:pos], locations[bookie], *labels[pos + 1 :]], pos, w)

    good = {c for c in candidates if keeps_windows(c)}
    if not candidates or (enforce == 2 and w >= 2 and not good):
        with pytest.raises(NotEnoughBookiesError):
            policy.replace_bookie(e, w, a, ensemble, victim, exclude)
        return
    spare = policy.replace_bookie(e, w, a, ensemble, victim, exclude)
    assert spare in candidates
    if good:
        assert spare in good


# -- region-aware ----------------------------------------------------------------


@st.composite
def region_cluster(draw: st.DrawFn) -> dict[str, str]:
    racks: dict[str, int] = {}
    for g in range(draw(st.integers(1, 3))):
        for k in range(draw(st.integers(1, 2))):
            racks[f"/region-{g}/rack-{k}"] = draw(st.integers(1, 3))
    return layout(racks)


def region(location: str) -> str:
    return location.split("/")[1]


@SETTINGS
@given(data=st.data(), locations=region_cluster(), sizes=quorums(), seed=st.integers(0, 2**32))
def test_regionaware_new_ensemble(
    data: st.DataObject, locations: dict[str, str], sizes: tuple[int, int, int], seed: int
) -> None:
    e, w, a = sizes
    all_regions = sorted({region(loc) for loc in locations.values()})
    disabled = data.draw(st.sets(st.sampled_from(all_regions), max_size=len(all_regions) - 1))
    readonly = subset(data, list(locations), 2)
    exclude = subset(data, list(locations), 2)

    def make(seed: int) -> RegionAwareEnsemblePlacementPolicy:
        p = RegionAwareEnsemblePlacementPolicy(
            StaticMapping(locations), "region-0", disabled_regions=disabled, rng=random.Random(seed), clock=FakeClock()
        )
        p.on_cluster_changed(set(locations) - readonly, readonly)
        return p

    policy = make(seed)
    usable = {b for b in set(locations) - readonly - exclude if region(locations[b]) not in disabled}
    if len(usable) < e:
        with pytest.raises(NotEnoughBookiesError):
            policy.new_ensemble(e, w, a, exclude)
        return
    ensemble = policy.new_ensemble(e, w, a, exclude)
    assert len(ensemble) == e == len(set(ensemble))
    assert set(ensemble) <= usable
    caps = Counter(region(locations[b]) for b in usable)
    counts = Counter(region(locations[b]) for b in ensemble)
    for r in caps:
        for other in caps:
            # shares differ by at most one, unless the smaller region gave all it had
            assert counts[r] <= counts[other] + 1 or counts[other] == caps[other]
    if min(caps.values()) * len(caps) >= e:
        assert max(counts[r] for r in caps) - min(counts[r] for r in caps) <= 1
    # the split is deterministic: another seed gives the same shares
    assert Counter(region(locations[b]) for b in make(seed + 1).new_ensemble(e, w, a, exclude)) == counts
    if w >= 2 and max(counts.values()) <= e // 2:
        assert windows_ok([region(locations[b]) for b in ensemble], w)
    if any_arrangement(Counter(locations[b] for b in ensemble), e, w):
        assert windows_ok([locations[b] for b in ensemble], w)


@SETTINGS
@given(data=st.data(), locations=region_cluster(), sizes=quorums(), seed=st.integers(0, 2**32))
def test_regionaware_replace_bookie(
    data: st.DataObject, locations: dict[str, str], sizes: tuple[int, int, int], seed: int
) -> None:
    e, w, a = sizes
    if len(locations) < e:
        return
    policy = RegionAwareEnsemblePlacementPolicy(StaticMapping(locations), "region-0", rng=random.Random(seed))
    policy.on_cluster_changed(set(locations), set())
    ensemble = data.draw(
        st.sampled_from([policy.new_ensemble(e, w, a), data.draw(st.permutations(sorted(locations)))[:e]])
    )
    pos = data.draw(st.integers(0, e - 1))
    victim = ensemble[pos]
    readonly = subset(data, list(locations), 2)
    exclude = subset(data, list(locations), 2)
    policy.on_cluster_changed(set(locations) - readonly, readonly)
    candidates = set(locations) - readonly - exclude - set(ensemble)
    if not candidates:
        with pytest.raises(NotEnoughBookiesError):
            policy.replace_bookie(e, w, a, ensemble, victim, exclude)
        return
    spare = policy.replace_bookie(e, w, a, ensemble, victim, exclude)
    assert spare in candidates
    labels = [locations[b] for b in ensemble]
    good = {c for c in candidates if window_through_ok([*labels[:pos], locations[c], *labels[pos + 1 :]], pos, w)}
    home = region(locations[victim])
    if good:
        assert spare in good
        if any(region(locations[c]) == home for c in good):
            assert region(locations[spare]) == home  # region balance kept
    elif any(region(locations[c]) == home for c in candidates):
        assert region(locations[spare]) == home
