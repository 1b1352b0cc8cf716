"""Quire placement: which bookies hold a ledger, and in which order to read them.

Rack- and region-aware ensemble placement after BookKeeper's
``EnsemblePlacementPolicy`` (see ``placement.policy`` for the contract)::

    from placement import RackawareEnsemblePlacementPolicy, StaticMapping

    policy = RackawareEnsemblePlacementPolicy(StaticMapping({"10.0.0.1:3181": "/region-a/rack-1"}))
    policy.on_cluster_changed(writable={"10.0.0.1:3181", ...}, readonly=set())
    ensemble = policy.new_ensemble(3, 2, 2, exclude=set())

This package imports nothing else from Quire.
"""

from placement.config import PLACEMENT_KEYS, PlacementConf
from placement.dns import DNSToSwitchMapping, ScriptBasedMapping, StaticMapping
from placement.errors import NotEnoughBookiesError, PlacementError
from placement.factory import build_dns, build_policy, client_policy
from placement.policy import EnsemblePlacementPolicy
from placement.rackaware import RackawareEnsemblePlacementPolicy
from placement.regionaware import RegionAwareEnsemblePlacementPolicy
from placement.topology import DEFAULT_RACK, DEFAULT_REGION, NetworkTopology, normalize_location
from placement.topology_aware import TopologyAwareEnsemblePlacementPolicy

__all__ = [
    "DEFAULT_RACK",
    "DEFAULT_REGION",
    "PLACEMENT_KEYS",
    "DNSToSwitchMapping",
    "EnsemblePlacementPolicy",
    "NetworkTopology",
    "NotEnoughBookiesError",
    "PlacementConf",
    "PlacementError",
    "RackawareEnsemblePlacementPolicy",
    "RegionAwareEnsemblePlacementPolicy",
    "ScriptBasedMapping",
    "StaticMapping",
    "TopologyAwareEnsemblePlacementPolicy",
    "build_dns",
    "build_policy",
    "client_policy",
    "normalize_location",
]
