"""RackawareEnsemblePlacementPolicy: ensembles, replacements, membership, read order."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest

from placement import (
    DEFAULT_RACK,
    NotEnoughBookiesError,
    RackawareEnsemblePlacementPolicy,
    StaticMapping,
)
from placement.dns import DNSToSwitchMapping
from placement.errors import PlacementError
from tests.placement.placement_testing import CountingMapping, FakeClock, every_window_spans, layout, seeded


def policy_for(
    locations: Mapping[str, str],
    *,
    readonly: set[str] | None = None,
    enforce: int = 0,
    stabilize: float = 0,
    clock: FakeClock | None = None,
    seed: int = 7,
) -> RackawareEnsemblePlacementPolicy:
    policy = RackawareEnsemblePlacementPolicy(
        StaticMapping(locations),
        stabilize_seconds=stabilize,
        enforce_min_racks=enforce,
        rng=seeded(seed),
        clock=clock or FakeClock(),
    )
    ro = readonly or set()
    policy.on_cluster_changed(writable=set(locations) - ro, readonly=ro)
    return policy


TWO_RACKS = layout({"/dc/a": 3, "/dc/b": 3})
SIX_RACKS = layout({f"/dc/r{i}": 2 for i in range(6)})


# -- new_ensemble ------------------------------------------------------------


def test_new_ensemble_returns_distinct_writable_bookies() -> None:
    policy = policy_for(SIX_RACKS)
    ensemble = policy.new_ensemble(ensemble_size=5, write_quorum=3, ack_quorum=2, exclude=set())
    assert isinstance(ensemble, list) and len(ensemble) == 5
    assert len(set(ensemble)) == 5
    assert set(ensemble) <= set(SIX_RACKS)


def test_new_ensemble_uses_as_many_racks_as_possible() -> None:
    policy = policy_for(SIX_RACKS)
    for _ in range(50):
        ensemble = policy.new_ensemble(6, 2, 2)
        assert len({SIX_RACKS[b] for b in ensemble}) == 6


@pytest.mark.parametrize(("size", "quorum"), [(6, 2), (6, 3), (4, 2), (3, 3), (5, 3)])
def test_every_write_quorum_spans_two_racks(size: int, quorum: int) -> None:
    policy = policy_for(TWO_RACKS)
    for _ in range(50):
        ensemble = policy.new_ensemble(size, quorum, 1)
        assert every_window_spans(ensemble, TWO_RACKS, quorum), ensemble


def test_uneven_racks_still_cover_every_quorum() -> None:
    locations = layout({"/dc/a": 10, "/dc/b": 2})
    policy = policy_for(locations, enforce=2)
    for _ in range(50):
        ensemble = policy.new_ensemble(6, 3, 2)  # a:4 b:2 -> runs a a b a a b
        assert every_window_spans(ensemble, locations, 3), ensemble
        assert Counter(locations[b] for b in ensemble) == {"/dc/a": 4, "/dc/b": 2}


def test_odd_ensemble_cannot_alternate_two_racks() -> None:
    # five members on two racks: some neighbours share a rack, whatever the order
    with pytest.raises(NotEnoughBookiesError):
        policy_for(TWO_RACKS, enforce=2).new_ensemble(5, 2, 2)
    three = layout({"/dc/a": 3, "/dc/b": 3, "/dc/c": 3})
    ensemble = policy_for(three, enforce=2).new_ensemble(5, 2, 2)
    assert every_window_spans(ensemble, three, 2)


def test_whole_ensemble_quorum_needs_only_two_racks() -> None:
    locations = layout({"/dc/a": 2, "/dc/b": 1})
    ensemble = policy_for(locations, enforce=2).new_ensemble(3, 3, 2)
    assert sorted(ensemble) == sorted(locations)


def test_best_effort_when_racks_cannot_cover() -> None:
    locations = layout({"/dc/a": 5, "/dc/b": 1})
    ensemble = policy_for(locations).new_ensemble(6, 3, 2)
    assert sorted(ensemble) == sorted(locations)
    # the lone rack-b bookie still splits the rack-a run as well as possible
    assert sum(1 for w in range(6) if len({locations[ensemble[(w + k) % 6]] for k in range(3)}) == 2) == 3


def test_enforced_minimum_raises_instead_of_falling_back() -> None:
    locations = layout({"/dc/a": 5, "/dc/b": 1})
    with pytest.raises(NotEnoughBookiesError, match="two racks"):
        policy_for(locations, enforce=2).new_ensemble(6, 3, 2)


def test_single_rack_best_effort_and_enforced() -> None:
    locations = layout({"/dc/a": 4})
    assert len(policy_for(locations).new_ensemble(3, 2, 2)) == 3
    with pytest.raises(NotEnoughBookiesError):
        policy_for(locations, enforce=2).new_ensemble(3, 2, 2)
    # a write quorum of one bookie cannot span two racks, so nothing to enforce
    assert len(policy_for(locations, enforce=2).new_ensemble(3, 1, 1)) == 3


def test_not_enough_bookies() -> None:
    policy = policy_for(TWO_RACKS)
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(7, 2, 2)
    assert issubclass(NotEnoughBookiesError, PlacementError)
    assert NotEnoughBookiesError.code == "NotEnoughBookiesException"


def test_empty_cluster_has_not_enough_bookies() -> None:
    policy = RackawareEnsemblePlacementPolicy(StaticMapping())
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(1, 1, 1)


def test_excluded_bookies_are_never_returned() -> None:
    policy = policy_for(TWO_RACKS)
    exclude = {b for b in TWO_RACKS if b.endswith(".0:3181")}
    for _ in range(50):
        ensemble = policy.new_ensemble(4, 2, 2, exclude=exclude)
        assert not set(ensemble) & exclude
        assert every_window_spans(ensemble, TWO_RACKS, 2)
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(5, 2, 2, exclude=exclude)


def test_exclude_accepts_any_iterable() -> None:
    policy = policy_for(TWO_RACKS)
    excluded = sorted(TWO_RACKS)[:2]
    assert not set(policy.new_ensemble(4, 2, 2, exclude=excluded)) & set(excluded)


def test_readonly_bookies_are_never_chosen() -> None:
    readonly = {b for b in SIX_RACKS if b.endswith(".1:3181")}
    policy = policy_for(SIX_RACKS, readonly=readonly)
    for _ in range(50):
        assert not set(policy.new_ensemble(6, 3, 2)) & readonly
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(7, 3, 2)


def test_bookie_in_both_sets_counts_as_readonly() -> None:
    policy = RackawareEnsemblePlacementPolicy(StaticMapping(TWO_RACKS), rng=seeded())
    both = sorted(TWO_RACKS)[0]
    policy.on_cluster_changed(writable=set(TWO_RACKS), readonly={both})
    for _ in range(30):
        assert both not in policy.new_ensemble(5, 2, 2)


@pytest.mark.parametrize(("e", "w", "a"), [(0, 0, 0), (3, 4, 2), (3, 2, 3), (3, 2, 0)])
def test_impossible_sizes_raise_value_error(e: int, w: int, a: int) -> None:
    policy = policy_for(TWO_RACKS)
    with pytest.raises(ValueError):
        policy.new_ensemble(e, w, a)
    with pytest.raises(ValueError):
        policy.replace_bookie(e, w, a, sorted(TWO_RACKS)[:3], sorted(TWO_RACKS)[0])


def test_bad_enforce_value() -> None:
    with pytest.raises(ValueError):
        RackawareEnsemblePlacementPolicy(StaticMapping(), enforce_min_racks=3)
    with pytest.raises(ValueError):
        RackawareEnsemblePlacementPolicy(StaticMapping(), stabilize_seconds=-1)


def test_seeded_rng_is_deterministic() -> None:
    a = [policy_for(SIX_RACKS, seed=3).new_ensemble(4, 2, 2) for _ in range(3)]
    b = [policy_for(SIX_RACKS, seed=3).new_ensemble(4, 2, 2) for _ in range(3)]
    c = [policy_for(SIX_RACKS, seed=4).new_ensemble(4, 2, 2) for _ in range(3)]
    assert a == b
    assert a != c


# -- replace_bookie -----------------------------------------------------------


def test_replace_prefers_the_victims_rack() -> None:
    policy = policy_for(SIX_RACKS)
    ensemble = policy.new_ensemble(4, 2, 2)
    for victim in ensemble:
        spare = policy.replace_bookie(4, 2, 2, current_ensemble=ensemble, bookie_to_replace=victim, exclude=set())
        assert isinstance(spare, str)
        assert spare not in ensemble
        assert SIX_RACKS[spare] == SIX_RACKS[victim]


def test_replace_moves_to_an_unused_rack_when_the_victims_rack_is_empty() -> None:
    policy = policy_for(SIX_RACKS)
    ensemble = policy.new_ensemble(4, 2, 2)
    victim = ensemble[1]
    rack_mates = {b for b in SIX_RACKS if SIX_RACKS[b] == SIX_RACKS[victim]} - {victim}
    used = {SIX_RACKS[b] for b in ensemble}
    for _ in range(30):
        spare = policy.replace_bookie(4, 2, 2, ensemble, victim, exclude=rack_mates)
        assert SIX_RACKS[spare] not in used


def test_replace_keeps_every_window_on_two_racks() -> None:
    locations = layout({"/dc/a": 4, "/dc/b": 4, "/dc/c": 1})
    a = sorted(b for b in locations if locations[b] == "/dc/a")
    b = sorted(b for b in locations if locations[b] == "/dc/b")
    c = sorted(b for b in locations if locations[b] == "/dc/c")
    ensemble = [a[0], b[0], a[1], b[1]]
    policy = policy_for(locations)
    # replacing b[0] (rack b) when rack b has no spare: neighbours are both on rack a,
    # so rack a is out and rack c is the only rack that keeps both windows on two racks
    spare = policy.replace_bookie(4, 2, 2, ensemble, b[0], exclude=set(b[2:]))
    assert spare == c[0]
    new = [a[0], spare, a[1], b[1]]
    assert every_window_spans(new, locations, 2)


def test_replace_leaves_the_victims_rack_when_a_window_needs_it() -> None:
    locations = layout({"/dc/a": 4, "/dc/b": 2})
    a = sorted(b for b in locations if locations[b] == "/dc/a")
    b = sorted(b for b in locations if locations[b] == "/dc/b")
    ensemble = [a[0], a[1], a[2], b[0]]
    # the quorum (a0, a1, a2) already needs another rack where a1 sits
    for _ in range(20):
        assert policy_for(locations).replace_bookie(4, 3, 2, ensemble, a[1]) == b[1]


def test_replace_falls_back_to_any_rack_unless_enforced() -> None:
    locations = layout({"/dc/a": 4, "/dc/b": 2})
    a = sorted(b for b in locations if locations[b] == "/dc/a")
    b = sorted(b for b in locations if locations[b] == "/dc/b")
    ensemble = [a[0], b[0], a[1], b[1]]
    exclude = {b[1]}  # (b[1] is in the ensemble anyway) no spare left on rack b
    spare = policy_for(locations).replace_bookie(4, 2, 2, ensemble, b[0], exclude=exclude)
    assert spare in a[2:]
    with pytest.raises(NotEnoughBookiesError):
        policy_for(locations, enforce=2).replace_bookie(4, 2, 2, ensemble, b[0], exclude=exclude)


def test_replace_never_returns_excluded_readonly_or_members() -> None:
    readonly = {b for b in SIX_RACKS if b.startswith("r0.")}
    policy = policy_for(SIX_RACKS, readonly=readonly)
    ensemble = policy.new_ensemble(4, 2, 2)
    exclude = {b for b in SIX_RACKS if b.startswith("r1.")}
    for victim in ensemble:
        for _ in range(10):
            spare = policy.replace_bookie(4, 2, 2, ensemble, victim, exclude)
            assert spare not in readonly | exclude | set(ensemble)


def test_replace_without_candidates_raises() -> None:
    locations = layout({"/dc/a": 1, "/dc/b": 1})
    policy = policy_for(locations)
    ensemble = sorted(locations)
    with pytest.raises(NotEnoughBookiesError):
        policy.replace_bookie(2, 2, 2, ensemble, ensemble[0])


def test_replace_a_bookie_that_is_not_a_member() -> None:
    policy = policy_for(SIX_RACKS)
    ensemble = policy.new_ensemble(3, 2, 2)
    outsider = next(b for b in SIX_RACKS if b not in ensemble)
    spare = policy.replace_bookie(3, 2, 2, ensemble, outsider)
    assert spare not in ensemble and spare != outsider


def test_replace_a_dead_bookie_uses_its_last_known_rack() -> None:
    policy = policy_for(SIX_RACKS)
    ensemble = policy.new_ensemble(4, 2, 2)
    victim = ensemble[0]
    assert policy.on_cluster_changed(set(SIX_RACKS) - {victim}, set()) == {victim}
    spare = policy.replace_bookie(4, 2, 2, ensemble, victim)
    assert SIX_RACKS[spare] == SIX_RACKS[victim]


# -- membership -----------------------------------------------------------------


def test_dead_bookies_are_reported() -> None:
    policy = policy_for(TWO_RACKS)
    gone = sorted(TWO_RACKS)[:2]
    assert policy.on_cluster_changed(set(TWO_RACKS) - set(gone), set()) == set(gone)
    assert policy.on_cluster_changed(set(TWO_RACKS) - set(gone), set()) == set()
    assert set(gone).isdisjoint(policy.topology.get_leaves())


def test_readonly_transitions_are_not_dead() -> None:
    policy = policy_for(TWO_RACKS)
    bookie = sorted(TWO_RACKS)[0]
    rest = set(TWO_RACKS) - {bookie}
    assert policy.on_cluster_changed(rest, {bookie}) == set()
    assert bookie not in policy.topology
    assert policy.on_cluster_changed(set(TWO_RACKS), set()) == set()
    assert bookie in policy.topology
    policy.on_cluster_changed(rest, {bookie})
    assert policy.on_cluster_changed(rest, set()) == {bookie}  # a read-only bookie that vanishes


def test_topology_follows_membership() -> None:
    policy = policy_for(TWO_RACKS)
    assert policy.topology.num_racks() == 2
    assert policy.topology.get_leaves("/dc/a") == {b for b in TWO_RACKS if TWO_RACKS[b] == "/dc/a"}


def test_new_bookies_are_resolved_once() -> None:
    dns = CountingMapping(TWO_RACKS)
    policy = RackawareEnsemblePlacementPolicy(dns, rng=seeded())
    first = sorted(TWO_RACKS)[:3]
    policy.on_cluster_changed(set(first), set())
    policy.on_cluster_changed(set(TWO_RACKS), set())
    policy.on_cluster_changed(set(TWO_RACKS), set())
    assert sorted(dns.asked) == sorted(TWO_RACKS)


class BrokenMapping(DNSToSwitchMapping):
    def __init__(self, answer: list[str] | None) -> None:
        self.answer = answer

    def resolve(self, names: Sequence[str]) -> list[str]:
        if self.answer is None:
            raise RuntimeError("resolver down")
        return self.answer

    def reload_cached_mappings(self) -> None:
        pass


@pytest.mark.parametrize("answer", [None, [], ["not-a-path", "/r/k"]])
def test_broken_resolver_means_default_rack(answer: list[str] | None, caplog: pytest.LogCaptureFixture) -> None:
    policy = RackawareEnsemblePlacementPolicy(BrokenMapping(answer), rng=seeded())
    with caplog.at_level(logging.WARNING, logger="placement"):
        assert policy.on_cluster_changed({"a:1", "b:1"}, set()) == set()
    assert policy.topology.get_location("a:1") == DEFAULT_RACK
    assert "using /default-region/default-rack" in caplog.text
    assert sorted(policy.new_ensemble(2, 2, 2)) == ["a:1", "b:1"]


def test_uninitialize_forgets_the_cluster() -> None:
    policy = policy_for(TWO_RACKS)
    assert policy.initialize({}) is policy
    policy.uninitialize()
    assert len(policy.topology) == 0
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(1, 1, 1)


# -- stabilization -----------------------------------------------------------------


def test_vanished_bookie_is_kept_for_the_stabilize_period() -> None:
    clock = FakeClock()
    locations = layout({"/dc/a": 2, "/dc/b": 1})
    policy = policy_for(locations, stabilize=10, clock=clock)
    flapping = "b.dc.0:3181"
    rest = set(locations) - {flapping}
    assert policy.on_cluster_changed(rest, set()) == set()
    assert flapping in policy.topology
    # live bookies suffice: the flapping one is not used
    for _ in range(20):
        assert flapping not in policy.new_ensemble(2, 2, 2)
    # live bookies do not suffice: it is used
    assert sorted(policy.new_ensemble(3, 2, 2)) == sorted(locations)
    clock.advance(9.5)
    assert sorted(policy.new_ensemble(3, 2, 2)) == sorted(locations)
    clock.advance(0.5)
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(3, 2, 2)
    assert flapping not in policy.topology
    assert policy.on_cluster_changed(rest, set()) == {flapping}
    assert policy.on_cluster_changed(rest, set()) == set()


def test_bookie_back_within_the_period_is_never_removed() -> None:
    clock = FakeClock()
    dns = CountingMapping(TWO_RACKS)
    policy = RackawareEnsemblePlacementPolicy(dns, stabilize_seconds=5, rng=seeded(), clock=clock)
    policy.on_cluster_changed(set(TWO_RACKS), set())
    flapping = sorted(TWO_RACKS)[0]
    assert policy.on_cluster_changed(set(TWO_RACKS) - {flapping}, set()) == set()
    clock.advance(4)
    assert policy.on_cluster_changed(set(TWO_RACKS), set()) == set()
    clock.advance(100)
    assert policy.on_cluster_changed(set(TWO_RACKS), set()) == set()
    assert flapping in policy.topology
    assert dns.asked.count(flapping) == 1
    assert flapping in policy.snapshot().writable


def test_expiry_is_reported_at_the_next_change() -> None:
    clock = FakeClock()
    policy = policy_for(TWO_RACKS, stabilize=3, clock=clock)
    gone = sorted(TWO_RACKS)[0]
    policy.on_cluster_changed(set(TWO_RACKS) - {gone}, set())
    clock.advance(3)
    assert policy.on_cluster_changed(set(TWO_RACKS) - {gone}, set()) == {gone}
    assert gone not in policy.topology


def test_stabilizing_bookie_that_turns_readonly_is_dropped() -> None:
    clock = FakeClock()
    policy = policy_for(TWO_RACKS, stabilize=10, clock=clock)
    bookie = sorted(TWO_RACKS)[0]
    policy.on_cluster_changed(set(TWO_RACKS) - {bookie}, set())
    assert policy.on_cluster_changed(set(TWO_RACKS) - {bookie}, {bookie}) == set()
    assert bookie not in policy.topology
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(6, 2, 2)


def test_without_stabilization_vanished_bookies_are_dead_at_once() -> None:
    policy = policy_for(TWO_RACKS)
    gone = sorted(TWO_RACKS)[0]
    assert policy.on_cluster_changed(set(TWO_RACKS) - {gone}, set()) == {gone}
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(6, 2, 2)


def test_stabilizing_bookie_can_replace_when_nothing_else_can() -> None:
    clock = FakeClock()
    locations = layout({"/dc/a": 2, "/dc/b": 2})
    policy = policy_for(locations, stabilize=10, clock=clock)
    ensemble = ["a.dc.0:3181", "b.dc.0:3181", "a.dc.1:3181"]
    policy.on_cluster_changed(set(locations) - {"b.dc.1:3181"}, set())
    assert policy.replace_bookie(3, 2, 2, ensemble, "b.dc.0:3181") == "b.dc.1:3181"
    clock.advance(10)
    with pytest.raises(NotEnoughBookiesError):
        policy.replace_bookie(3, 2, 2, ensemble, "b.dc.0:3181")


# -- read order -------------------------------------------------------------------


def test_read_order_tiers() -> None:
    locations = layout({"/dc/a": 3, "/dc/b": 3})
    names = sorted(locations)  # a.dc.0 a.dc.1 a.dc.2 b.dc.0 b.dc.1 b.dc.2
    readonly = {names[1]}
    policy = policy_for(locations, readonly=readonly)
    policy.on_cluster_changed(set(names) - readonly - {names[4]}, readonly)  # names[4] gone
    ensemble = [names[4], names[1], names[0], names[2], names[3], "never-seen:1"]
    failures = {names[0]: 5, names[2]: 0, names[3]: 2}
    order = policy.reorder_read_sequence(ensemble, [0, 1, 2, 3, 4, 5], failures)
    # healthy writable: idx 3 (0 failures); failed: idx 4 (2) then idx 2 (5);
    # read-only: idx 1; gone: idx 0 and idx 5 in write-set order
    assert order == [3, 4, 2, 1, 0, 5]


def test_read_order_is_stable_and_keeps_write_set_order() -> None:
    policy = policy_for(SIX_RACKS)
    ensemble = sorted(SIX_RACKS)[:5]
    assert policy.reorder_read_sequence(ensemble, [3, 1, 4]) == [3, 1, 4]
    failures = {ensemble[3]: 1, ensemble[1]: 1, ensemble[4]: 0}
    assert policy.reorder_read_sequence(ensemble, [3, 1, 4], failures) == [4, 3, 1]
    assert policy.reorder_read_sequence(ensemble, [3, 1, 4], {}) == [3, 1, 4]


def test_read_lac_order_appends_the_other_members() -> None:
    policy = policy_for(SIX_RACKS)
    ensemble = sorted(SIX_RACKS)[:5]
    failures = {ensemble[2]: 3}
    assert policy.reorder_read_lac_sequence(ensemble, [2, 3], failures) == [3, 2, 0, 1, 4]
    assert policy.reorder_read_lac_sequence(ensemble, [0, 1, 2, 3, 4]) == [0, 1, 2, 3, 4]
