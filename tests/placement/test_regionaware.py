"""RegionAwareEnsemblePlacementPolicy: region shares, feature switch, replacement, reads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import pytest

from placement import NotEnoughBookiesError, RegionAwareEnsemblePlacementPolicy, StaticMapping
from tests.placement.placement_testing import FakeClock, every_window_spans, grid, layout, seeded


def policy_for(
    locations: Mapping[str, str],
    local_region: str | None = "region-0",
    *,
    readonly: set[str] | None = None,
    disabled: Iterable[str] = (),
    stabilize: float = 0,
    clock: FakeClock | None = None,
    seed: int = 11,
) -> RegionAwareEnsemblePlacementPolicy:
    policy = RegionAwareEnsemblePlacementPolicy(
        StaticMapping(locations),
        local_region,
        stabilize_seconds=stabilize,
        disabled_regions=disabled,
        rng=seeded(seed),
        clock=clock or FakeClock(),
    )
    ro = readonly or set()
    policy.on_cluster_changed(set(locations) - ro, ro)
    return policy


def regions_of(ensemble: list[str], locations: Mapping[str, str]) -> Counter[str]:
    return Counter(locations[b].split("/")[1] for b in ensemble)


GRID = grid(regions=3, racks_per_region=3, bookies_per_rack=3)  # 27 bookies


def test_equal_share_per_region() -> None:
    policy = policy_for(GRID)
    for _ in range(30):
        ensemble = policy.new_ensemble(6, 3, 2)
        assert len(set(ensemble)) == 6
        assert regions_of(ensemble, GRID) == {"region-0": 2, "region-1": 2, "region-2": 2}


@pytest.mark.parametrize(
    ("size", "shares"),
    [(7, [3, 2, 2]), (8, [3, 3, 2]), (5, [2, 2, 1]), (1, [1, 0, 0]), (2, [1, 1, 0])],
)
def test_remainder_goes_to_the_first_regions_by_name(size: int, shares: list[int]) -> None:
    policy = policy_for(GRID)
    for _ in range(10):
        counts = regions_of(policy.new_ensemble(size, 1, 1), GRID)
        assert [counts[f"region-{i}"] for i in range(3)] == shares


def test_rack_aware_inside_each_region() -> None:
    policy = policy_for(GRID)
    for _ in range(30):
        ensemble = policy.new_ensemble(9, 3, 2)
        assert len({GRID[b] for b in ensemble}) == 9  # three racks in each region


def test_every_write_quorum_spans_regions() -> None:
    policy = policy_for(GRID)
    for _ in range(30):
        ensemble = policy.new_ensemble(6, 3, 2)
        # equal shares are dealt round-robin: each quorum of 3 sees all three regions
        assert every_window_spans(ensemble, GRID, 3, level="region", at_least=3)
        assert every_window_spans(ensemble, GRID, 2, level="region")


def test_short_region_gives_what_it_has() -> None:
    locations = layout({"/r1/a": 1, "/r2/b": 5, "/r2/c": 5, "/r3/d": 5, "/r3/e": 5})
    policy = policy_for(locations, "r1")
    for _ in range(20):
        counts = regions_of(policy.new_ensemble(7, 2, 2), locations)
        assert counts == {"r1": 1, "r2": 3, "r3": 3}


def test_single_region_is_rack_aware() -> None:
    locations = layout({"/only/a": 3, "/only/b": 3})
    policy = policy_for(locations, "only")
    for _ in range(30):
        ensemble = policy.new_ensemble(6, 2, 2)
        assert every_window_spans(ensemble, locations, 2)


def test_dominant_region_keeps_racks_apart() -> None:
    locations = layout({"/r1/a": 5, "/r1/b": 5, "/r2/c": 1})
    policy = policy_for(locations, "r1")
    for _ in range(30):
        ensemble = policy.new_ensemble(5, 3, 2)  # r1 gives 4, r2 only 1
        assert regions_of(ensemble, locations) == {"r1": 4, "r2": 1}
        assert every_window_spans(ensemble, locations, 3)


def test_not_enough_bookies() -> None:
    with pytest.raises(NotEnoughBookiesError):
        policy_for(GRID).new_ensemble(28, 2, 2)


def test_readonly_and_excluded_are_never_chosen() -> None:
    readonly = {b for b in GRID if b.endswith(".0:3181")}
    exclude = {b for b in GRID if b.endswith(".1:3181")}
    policy = policy_for(GRID, readonly=readonly)
    for _ in range(30):
        ensemble = policy.new_ensemble(9, 3, 2, exclude=exclude)
        assert not set(ensemble) & (readonly | exclude)
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(10, 3, 2, exclude=exclude)


# -- the feature switch: disabled regions ---------------------------------------


def test_regions_disabled_at_construction() -> None:
    policy = policy_for(GRID, disabled=["region-2"])
    assert policy.disabled_regions == {"region-2"}
    for _ in range(20):
        assert regions_of(policy.new_ensemble(6, 3, 2), GRID) == {"region-0": 3, "region-1": 3}


def test_disable_and_enable_at_run_time() -> None:
    policy = policy_for(GRID)
    policy.disable_region("region-1")
    assert not policy.is_region_enabled("region-1")
    assert "region-1" not in regions_of(policy.new_ensemble(6, 3, 2), GRID)
    policy.disable_region("/region-0")  # slashes are accepted
    assert regions_of(policy.new_ensemble(6, 3, 2), GRID) == {"region-2": 6}
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(10, 3, 2)
    policy.enable_region("region-1")
    policy.enable_region("region-1")
    assert regions_of(policy.new_ensemble(6, 3, 2), GRID) == {"region-1": 3, "region-2": 3}


def test_all_regions_disabled() -> None:
    policy = policy_for(GRID, disabled=["region-0", "region-1", "region-2"])
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(1, 1, 1)


def test_bad_region_names() -> None:
    with pytest.raises(ValueError):
        RegionAwareEnsemblePlacementPolicy(StaticMapping(), "a/b")
    with pytest.raises(ValueError):
        RegionAwareEnsemblePlacementPolicy(StaticMapping(), "r", disabled_regions=["/"])
    with pytest.raises(ValueError):
        policy_for(GRID).disable_region("")


# -- replace_bookie ---------------------------------------------------------------


def test_replace_stays_in_the_victims_region() -> None:
    policy = policy_for(GRID)
    ensemble = policy.new_ensemble(6, 3, 2)
    for victim in ensemble:
        for _ in range(5):
            spare = policy.replace_bookie(6, 3, 2, ensemble, victim)
            assert spare not in ensemble
            assert GRID[spare].split("/")[1] == GRID[victim].split("/")[1]
            assert GRID[spare] == GRID[victim]  # the victim's rack has spares too


def test_replace_goes_to_the_least_represented_region_when_the_victims_is_full() -> None:
    locations = layout({"/r1/a": 2, "/r2/b": 3, "/r3/c": 3})
    policy = policy_for(locations, "r1")
    ensemble = ["a.r1.0:3181", "b.r2.0:3181", "a.r1.1:3181", "c.r3.0:3181", "b.r2.1:3181"]
    for _ in range(20):
        spare = policy.replace_bookie(5, 2, 2, ensemble, "a.r1.0:3181")
        assert locations[spare] == "/r3/c"  # r2 already holds two, r3 one


def test_replace_avoids_disabled_regions() -> None:
    policy = policy_for(GRID)
    ensemble = policy.new_ensemble(6, 3, 2)
    victim = next(b for b in ensemble if GRID[b].startswith("/region-2/"))
    policy.disable_region("region-2")
    for _ in range(20):
        spare = policy.replace_bookie(6, 3, 2, ensemble, victim)
        assert not GRID[spare].startswith("/region-2/")


def test_replace_keeps_write_quorums_on_two_racks() -> None:
    locations = layout({"/r1/a": 3, "/r1/b": 1, "/r2/c": 3})
    policy = policy_for(locations, "r1")
    # r1 members around the victim are all on rack a, rack b has nobody spare
    ensemble = ["a.r1.0:3181", "b.r1.0:3181", "a.r1.1:3181"]
    spare = policy.replace_bookie(3, 2, 2, ensemble, "b.r1.0:3181")
    assert locations[spare] == "/r2/c"
    # both write quorums through the replaced slot now span two racks
    assert locations[spare] not in {locations["a.r1.0:3181"], locations["a.r1.1:3181"]}


def test_replace_without_candidates() -> None:
    locations = layout({"/r1/a": 1, "/r2/b": 1})
    policy = policy_for(locations, "r1")
    with pytest.raises(NotEnoughBookiesError):
        policy.replace_bookie(2, 2, 2, sorted(locations), sorted(locations)[0])


# -- read order ---------------------------------------------------------------------


def test_read_order_two_local_then_one_remote() -> None:
    locations = layout({"/local/a": 4, "/remote/b": 4})
    policy = policy_for(locations, "local")
    loc = sorted(b for b in locations if b.startswith("a."))
    rem = sorted(b for b in locations if b.startswith("b."))
    ensemble = [rem[0], loc[0], rem[1], loc[1], loc[2], rem[2], loc[3]]
    order = policy.reorder_read_sequence(ensemble, list(range(7)))
    assert order == [1, 3, 0, 4, 6, 2, 5]


def test_read_order_interleaves_only_the_healthy_tier() -> None:
    locations = layout({"/local/a": 3, "/remote/b": 3})
    loc = sorted(b for b in locations if b.startswith("a."))
    rem = sorted(b for b in locations if b.startswith("b."))
    policy = policy_for(locations, "local", readonly={loc[2]})
    ensemble = [rem[0], rem[1], loc[0], loc[1], loc[2]]
    failures = {loc[1]: 4, rem[1]: 0}
    # healthy: rem0, rem1, loc0 -> loc0 first, then remotes; failed: loc1; read-only: loc2
    assert policy.reorder_read_sequence(ensemble, [0, 1, 2, 3, 4], failures) == [2, 0, 1, 3, 4]
    assert policy.reorder_read_lac_sequence(ensemble, [3, 0], failures) == [0, 3, 1, 2, 4]


def test_read_order_without_local_region_keeps_write_set_order() -> None:
    locations = layout({"/x/a": 2, "/y/b": 2})
    policy = policy_for(locations, None)
    ensemble = sorted(locations, reverse=True)
    assert policy.reorder_read_sequence(ensemble, [0, 1, 2, 3]) == [0, 1, 2, 3]


def test_stabilized_bookies_fill_in_only_when_needed() -> None:
    clock = FakeClock()
    locations = layout({"/r1/a": 1, "/r2/b": 1, "/r2/c": 1})
    policy = policy_for(locations, "r1", stabilize=30, clock=clock)
    assert policy.on_cluster_changed(set(locations) - {"a.r1.0:3181"}, set()) == set()
    for _ in range(10):
        assert "a.r1.0:3181" not in policy.new_ensemble(2, 2, 2)
    assert sorted(policy.new_ensemble(3, 2, 2)) == sorted(locations)
    clock.advance(30)
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(3, 2, 2)
