"""build_policy / build_dns: configuration keys and their errors."""

from __future__ import annotations

import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from placement import (
    DEFAULT_RACK,
    DNSToSwitchMapping,
    RackawareEnsemblePlacementPolicy,
    RegionAwareEnsemblePlacementPolicy,
    ScriptBasedMapping,
    StaticMapping,
    build_dns,
    build_policy,
    client_policy,
)
from placement.policy import EnsemblePlacementPolicy


class EverythingInRackX(DNSToSwitchMapping):
    """A resolver loaded by class path in these tests."""

    def __init__(self, rack: str = "/x/x") -> None:
        self.rack = rack

    @classmethod
    def from_conf(cls, conf: Mapping[str, str]) -> EverythingInRackX:
        return cls(conf.get("test_rack", "/x/x"))

    def resolve(self, names: Sequence[str]) -> list[str]:
        return [self.rack] * len(names)

    def reload_cached_mappings(self) -> None:
        pass


class NotAResolver:
    pass


class FirstBookiesPolicy(RackawareEnsemblePlacementPolicy):
    """A custom policy loaded by class path."""


HERE = "tests.placement.test_factory"


def test_default_is_rackaware_with_static_mapping() -> None:
    policy = build_policy({})
    assert type(policy) is RackawareEnsemblePlacementPolicy
    assert isinstance(policy.dns, StaticMapping)
    assert policy.stabilize_seconds == 0


@pytest.mark.parametrize(
    "name", ["rackaware", " RackAware ", "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy"]
)
def test_rackaware_names(name: str) -> None:
    assert type(build_policy({"ensemble_placement_policy": name})) is RackawareEnsemblePlacementPolicy


def test_regionaware_reads_its_keys() -> None:
    policy = build_policy(
        {
            "ensemble_placement_policy": "regionaware",
            "local_region": "/region-a/",
            "network_topology_stabilize_period_seconds": "2.5",
        }
    )
    assert isinstance(policy, RegionAwareEnsemblePlacementPolicy)
    assert policy.local_region == "region-a"
    assert policy.stabilize_seconds == 2.5


def test_regionaware_without_local_region() -> None:
    policy = build_policy({"ensemble_placement_policy": "regionaware"})
    assert isinstance(policy, RegionAwareEnsemblePlacementPolicy)
    assert policy.local_region is None


def test_dotted_class_path() -> None:
    for path in (f"{HERE}.FirstBookiesPolicy", f"{HERE}:FirstBookiesPolicy"):
        assert type(build_policy({"ensemble_placement_policy": path})) is FirstBookiesPolicy
    policy = build_policy({"ensemble_placement_policy": "placement.RegionAwareEnsemblePlacementPolicy"})
    assert isinstance(policy, RegionAwareEnsemblePlacementPolicy)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("roundrobin", "is not one of"),
        ("no.such.module.Policy", "cannot import module"),
        (f"{HERE}.Missing", "has no attribute"),
        (f"{HERE}.NotAResolver", "not an EnsemblePlacementPolicy"),
        (f"{HERE}.HERE", "not an EnsemblePlacementPolicy"),
    ],
)
def test_bad_policy_names(value: str, message: str) -> None:
    with pytest.raises(ValueError, match="ensemble_placement_policy") as info:
        build_policy({"ensemble_placement_policy": value})
    assert message in str(info.value)


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_bad_stabilize_period(value: str) -> None:
    with pytest.raises(ValueError, match="network_topology_stabilize_period_seconds"):
        build_policy({"network_topology_stabilize_period_seconds": value})


def test_bad_local_region() -> None:
    with pytest.raises(ValueError, match="local_region"):
        build_policy({"ensemble_placement_policy": "regionaware", "local_region": "a/b"})


def test_dns_resolver_class() -> None:
    dns = build_dns({"dns_resolver_class": f"{HERE}.EverythingInRackX", "test_rack": "/r/q"})
    assert isinstance(dns, EverythingInRackX)
    assert dns.resolve(["a:1"]) == ["/r/q"]
    policy = build_policy({"dns_resolver_class": f"{HERE}.EverythingInRackX"})
    policy.on_cluster_changed({"a:1"}, set())
    assert isinstance(policy, RackawareEnsemblePlacementPolicy)
    assert policy.topology.get_location("a:1") == "/x/x"


@pytest.mark.parametrize("value", [f"{HERE}.NotAResolver", "nothing.here.Resolver", "NoDots"])
def test_bad_dns_resolver_class(value: str) -> None:
    with pytest.raises(ValueError, match="dns_resolver_class"):
        build_policy({"dns_resolver_class": value})


@pytest.mark.processes  # the policy runs the script (a conf key names it, no process starter does)
def test_script_file(tmp_path: Path) -> None:
    script = tmp_path / "topo.sh"
    script.write_text('#!/bin/sh\nfor n in "$@"; do echo /s/t; done\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    policy = build_policy({"network_topology_script_file": str(script)})
    assert isinstance(policy, RackawareEnsemblePlacementPolicy)
    assert isinstance(policy.dns, ScriptBasedMapping)
    policy.on_cluster_changed({"a:1", "b:1"}, set())
    assert policy.topology.get_leaves("/s/t") == {"a:1", "b:1"}


def test_bad_script_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        build_policy({"network_topology_script_file": str(tmp_path / "missing.sh")})
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    with pytest.raises(ValueError, match="not executable"):
        build_policy({"network_topology_script_file": str(plain)})


def test_explicit_dns_wins() -> None:
    dns = StaticMapping({"a:1": "/given/rack"})
    policy = build_policy({"network_topology_script_file": "/does/not/matter"}, dns=dns)
    assert isinstance(policy, RackawareEnsemblePlacementPolicy)
    assert policy.dns is dns


def test_blank_values_mean_defaults() -> None:
    policy = build_policy(
        {
            "ensemble_placement_policy": " ",
            "network_topology_script_file": "",
            "network_topology_stabilize_period_seconds": "",
        }
    )
    assert type(policy) is RackawareEnsemblePlacementPolicy
    assert policy.dns.resolve(["a:1"]) == [DEFAULT_RACK]


def test_default_from_conf_builds_and_initializes() -> None:
    seen: list[Mapping[str, str]] = []

    class NoArgPolicy(FirstBookiesPolicy):
        def __init__(self) -> None:
            super().__init__(StaticMapping())

        def initialize(self, conf: Mapping[str, str], dns: DNSToSwitchMapping | None = None) -> EnsemblePlacementPolicy:
            seen.append(conf)
            return self

        from_conf = EnsemblePlacementPolicy.__dict__["from_conf"]

    policy = NoArgPolicy.from_conf({"k": "v"})
    assert isinstance(policy, NoArgPolicy)
    assert seen == [{"k": "v"}]


# -- PlacementConf ------------------------------------------------------------------------------


def test_placement_conf_defaults_and_build_policy() -> None:
    from placement import PlacementConf

    conf = PlacementConf()
    assert (conf.ensemble_placement_policy, conf.network_topology_stabilize_period_seconds) == ("rackaware", 0.0)
    assert conf.as_mapping() == {"ensemble_placement_policy": "rackaware",
                                 "network_topology_stabilize_period_seconds": "0.0"}
    assert type(build_policy(conf)) is RackawareEnsemblePlacementPolicy
    region = build_policy(PlacementConf(ensemble_placement_policy="regionaware", local_region="/region-a/",
                                        network_topology_stabilize_period_seconds=5))
    assert isinstance(region, RegionAwareEnsemblePlacementPolicy)
    assert (region.local_region, region.stabilize_seconds) == ("region-a", 5.0)


def test_placement_conf_from_a_client_mapping_ignores_other_keys() -> None:
    from placement import PlacementConf

    conf = PlacementConf.from_mapping({"ensemble_placement_policy": "regionaware", "local_region": "r1",
                                       "network_topology_stabilize_period_seconds": "2.5", "add_timeout": "3"})
    assert conf == PlacementConf(ensemble_placement_policy="regionaware", local_region="r1",
                                 network_topology_stabilize_period_seconds=2.5)
    assert PlacementConf.from_mapping(None) == PlacementConf()


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"network_topology_stabilize_period_seconds": -1}, "network_topology_stabilize_period_seconds"),
    ({"network_topology_stabilize_period_seconds": "soon"}, "network_topology_stabilize_period_seconds"),
    ({"network_topology_stabilize_period_seconds": True}, "network_topology_stabilize_period_seconds"),
    ({"local_region": "a/b"}, "local_region"),
    ({"dns_resolver_class": 3}, "dns_resolver_class"),
])
def test_placement_conf_bad_value_names_the_key(kwargs: dict[str, object], key: str) -> None:
    from placement import PlacementConf

    with pytest.raises(ValueError, match=key) as info:
        PlacementConf(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_placement_conf_parses_through_the_one_configuration_layer(tmp_path: Path) -> None:
    from metastore.conf import ConfError, check_conf_file, load_conf, parse_conf, render_conf
    from placement import PlacementConf

    path = tmp_path / "placement.conf"
    path.write_text(render_conf(PlacementConf))
    assert check_conf_file(PlacementConf, path) == []
    assert load_conf(PlacementConf, path) == PlacementConf()
    conf = parse_conf(PlacementConf, {"ensemble_placement_policy": "regionaware",
                                      "network_topology_stabilize_period_seconds": "3"})
    assert conf.network_topology_stabilize_period_seconds == 3.0
    with pytest.raises(ConfError, match="unknown key 'ensemble_policy'"):
        parse_conf(PlacementConf, {"ensemble_policy": "x"})
    with pytest.raises(ConfError, match="bad value for network_topology_stabilize_period_seconds"):
        parse_conf(PlacementConf, {"network_topology_stabilize_period_seconds": "-2"})


def test_custom_resolver_gets_the_conf_keys_from_a_placement_conf() -> None:
    from placement import PlacementConf

    policy = build_policy(PlacementConf(dns_resolver_class=f"{HERE}.EverythingInRackX"))
    assert isinstance(policy.dns, EverythingInRackX) and policy.dns.rack == "/x/x"


def test_placement_keys_are_the_fields_of_placement_conf() -> None:
    import dataclasses

    from placement import PLACEMENT_KEYS, PlacementConf

    assert {f.name for f in dataclasses.fields(PlacementConf)} == PLACEMENT_KEYS
    assert "local_region" in PLACEMENT_KEYS and len(PLACEMENT_KEYS) == 5


def test_client_policy_hands_back_the_static_mapping_it_resolves_through() -> None:
    policy, mapping = client_policy({"ensemble_placement_policy": "", "bookie_watch_interval_ms": 5})
    assert type(policy) is RackawareEnsemblePlacementPolicy     # empty means unset; client keys pass
    assert isinstance(mapping, StaticMapping) and policy.dns is mapping
    policy, mapping = client_policy({"ensemble_placement_policy": "regionaware", "local_region": "r1"})
    assert isinstance(policy, RegionAwareEnsemblePlacementPolicy) and policy.dns is mapping


def test_client_policy_with_its_own_resolver_has_no_mapping() -> None:
    policy, mapping = client_policy({"dns_resolver_class": f"{HERE}.EverythingInRackX", "test_rack": "/r/q"})
    assert mapping is None
    policy.on_cluster_changed({"a:1"}, set())
    assert policy.topology.get_location("a:1") == "/r/q"      # the whole conf reached the resolver

