"""NetworkTopology: the /region/rack/bookie tree."""

from __future__ import annotations

import pytest

from placement import DEFAULT_RACK, NetworkTopology
from placement.topology import DEFAULT_REGION, normalize_location, region_of


@pytest.fixture
def topo() -> NetworkTopology:
    t = NetworkTopology()
    t.add("bk1:3181", "/region-a/rack-1")
    t.add("bk2:3181", "/region-a/rack-1")
    t.add("bk3:3181", "/region-a/rack-2")
    t.add("bk4:3181", "/region-b/rack-3")
    return t


def test_default_rack_constant() -> None:
    assert DEFAULT_RACK == "/default-region/default-rack"
    assert DEFAULT_REGION == "/default-region"


def test_counts(topo: NetworkTopology) -> None:
    assert len(topo) == 4
    assert topo.num_racks() == 3
    assert topo.num_regions() == 2
    assert topo.num_racks("/region-a") == 2
    assert topo.regions() == ["region-a", "region-b"]
    assert topo.racks() == ["/region-a/rack-1", "/region-a/rack-2", "/region-b/rack-3"]


def test_leaves_under_scopes(topo: NetworkTopology) -> None:
    assert topo.get_leaves("/") == {"bk1:3181", "bk2:3181", "bk3:3181", "bk4:3181"}
    assert topo.get_leaves("/region-a") == {"bk1:3181", "bk2:3181", "bk3:3181"}
    assert topo.get_leaves("/region-a/rack-1") == {"bk1:3181", "bk2:3181"}
    assert topo.get_leaves("/region-a/rack-1/bk2:3181") == {"bk2:3181"}
    assert topo.get_leaves("/region-a/rack-2/bk2:3181") == frozenset()
    assert topo.get_leaves("/nowhere") == frozenset()


def test_leaves_outside_a_scope(topo: NetworkTopology) -> None:
    assert topo.get_leaves("~/region-a/rack-1") == {"bk3:3181", "bk4:3181"}
    assert topo.get_leaves("~/region-b") == {"bk1:3181", "bk2:3181", "bk3:3181"}
    assert topo.count_leaves("~/region-b", excluded={"bk1:3181"}) == 2
    assert topo.count_leaves("/", excluded={"bk1:3181", "other"}) == 3


def test_lookup_by_bookie_and_location(topo: NetworkTopology) -> None:
    assert topo.get_location("bk3:3181") == "/region-a/rack-2"
    assert topo.get_location("missing:1") is None
    assert "bk1:3181" in topo and topo.contains("bk4:3181")
    assert "missing:1" not in topo
    assert topo.has_scope("/region-a/rack-2")
    assert topo.has_scope("/region-b/rack-3/bk4:3181")
    assert not topo.has_scope("/region-b/rack-1")


def test_remove_prunes_empty_racks_and_regions(topo: NetworkTopology) -> None:
    assert topo.remove("bk4:3181") is True
    assert topo.remove("bk4:3181") is False
    assert topo.num_regions() == 1
    assert not topo.has_scope("/region-b")
    assert topo.remove("bk3:3181")
    assert topo.racks() == ["/region-a/rack-1"]


def test_add_moves_a_bookie(topo: NetworkTopology) -> None:
    topo.add("bk3:3181", "/region-b/rack-3")
    assert topo.get_location("bk3:3181") == "/region-b/rack-3"
    assert topo.racks() == ["/region-a/rack-1", "/region-b/rack-3"]
    assert len(topo) == 4


def test_rack_members_is_sorted_copy(topo: NetworkTopology) -> None:
    members = topo.rack_members()
    assert members["/region-a/rack-1"] == ("bk1:3181", "bk2:3181")
    members.clear()
    assert topo.num_racks() == 3


def test_add_defaults_to_default_rack() -> None:
    t = NetworkTopology()
    t.add("x:1")
    assert t.get_location("x:1") == DEFAULT_RACK
    assert t.regions() == ["default-region"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/r/k", "/r/k"),
        (" /r/k/ ", "/r/k"),
        ("/rack-7", "/default-region/rack-7"),
    ],
)
def test_normalize_location(raw: str, expected: str) -> None:
    assert normalize_location(raw) == expected
    assert region_of(expected) == expected.split("/")[1]


@pytest.mark.parametrize("bad", ["", "r/k", "/", "/a//b", "/a/b/c", "   "])
def test_bad_locations_are_rejected(bad: str) -> None:
    t = NetworkTopology()
    with pytest.raises(ValueError):
        t.add("x:1", bad)
    assert len(t) == 0


@pytest.mark.parametrize("bad", ["", "a/b"])
def test_bad_bookie_names_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        NetworkTopology().add(bad, "/r/k")


def test_bad_scope_is_rejected(topo: NetworkTopology) -> None:
    with pytest.raises(ValueError):
        topo.get_leaves("region-a")
    with pytest.raises(ValueError):
        topo.racks("/region-a/rack-1")
