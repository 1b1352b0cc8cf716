"""``quire bench placement``: new_ensemble / replace_bookie rates.

Builds a 300-bookie cluster (3 regions x 10 racks x 10 bookies by default)
in a ``StaticMapping``, feeds it to the rack-aware and region-aware policies
and times sequential calls. Cases: ``new_ensemble``; ``replace_bookie`` of
a member whose rack has spares; ``replace_bookie_rack_down``, the same with
the victim's whole rack excluded. One result per (case, policy)::

    {"bench": "placement", "case": "new_ensemble", "policy": "rackaware",
     "ensemble_size": 6, "write_quorum": 3, "calls": 20000, "seconds": 0.11,
     "ops_per_sec": 181818.2, "p50_ms": ..., ...}
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Iterable
from typing import Any

from placement import (
    RackawareEnsemblePlacementPolicy,
    RegionAwareEnsemblePlacementPolicy,
    StaticMapping,
)
from placement.policy import EnsemblePlacementPolicy
from tools.bench import percentiles, rate, timed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bookies", type=int, default=300, help="bookies in the cluster (default 300)")
    parser.add_argument("--racks", type=int, default=30, help="racks in the cluster (default 30)")
    parser.add_argument("--regions", type=int, default=3, help="regions in the cluster (default 3)")
    parser.add_argument("--ensemble-size", type=int, default=6, help="E (default 6)")
    parser.add_argument("--write-quorum", type=int, default=3, help="W (default 3)")
    parser.add_argument("--ack-quorum", type=int, default=2, help="A (default 2)")
    parser.add_argument("--calls", type=int, default=20000, help="timed calls per case (default 20000)")
    parser.add_argument("--policy", choices=["rackaware", "regionaware", "both"], default="both")
    parser.add_argument("--seed", type=int, default=1, help="seed of the policies' random.Random")


def cluster(bookies: int, racks: int, regions: int) -> dict[str, str]:
    """``host:port -> /region/rack`` with bookies dealt evenly over racks, racks over regions."""
    if not 1 <= regions <= racks <= bookies:
        raise ValueError("need 1 <= regions <= racks <= bookies")
    locations: dict[str, str] = {}
    for b in range(bookies):
        rack = b % racks
        region = rack % regions
        locations[f"10.{region}.{rack}.{b}:3181"] = f"/region-{region}/rack-{rack}"
    return locations


def _policies(locations: dict[str, str], which: str, seed: int) -> list[tuple[str, EnsemblePlacementPolicy]]:
    out: list[tuple[str, EnsemblePlacementPolicy]] = []
    if which in ("rackaware", "both"):
        out.append(("rackaware", RackawareEnsemblePlacementPolicy(StaticMapping(locations), rng=random.Random(seed))))
    if which in ("regionaware", "both"):
        out.append(
            (
                "regionaware",
                RegionAwareEnsemblePlacementPolicy(StaticMapping(locations), "region-0", rng=random.Random(seed)),
            )
        )
    for _, policy in out:
        policy.on_cluster_changed(set(locations), set())
    return out


def _cases(
    policy: EnsemblePlacementPolicy, locations: dict[str, str], e: int, w: int, a: int
) -> list[tuple[str, Callable[[], object]]]:
    ensemble = policy.new_ensemble(e, w, a)
    victim = ensemble[0]
    rack_down = {b for b, loc in locations.items() if loc == locations[victim]}

    def new_ensemble() -> object:
        return policy.new_ensemble(e, w, a)

    def replace_bookie() -> object:
        return policy.replace_bookie(e, w, a, ensemble, victim)

    def replace_bookie_rack_down() -> object:
        # the victim's whole rack is excluded: the replacement scans the other racks
        return policy.replace_bookie(e, w, a, ensemble, victim, rack_down)

    return [
        ("new_ensemble", new_ensemble),
        ("replace_bookie", replace_bookie),
        ("replace_bookie_rack_down", replace_bookie_rack_down),
    ]


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    locations = cluster(args.bookies, args.racks, args.regions)
    e, w, a = args.ensemble_size, args.write_quorum, args.ack_quorum
    for name, policy in _policies(locations, args.policy, args.seed):
        for case, call in _cases(policy, locations, e, w, a):
            for _ in range(min(1000, args.calls)):  # warm up
                call()
            seconds, latencies = timed(call, args.calls)
            yield {
                "bench": "placement",
                "case": case,
                "policy": name,
                "bookies": args.bookies,
                "racks": args.racks,
                "regions": args.regions,
                "ensemble_size": e,
                "write_quorum": w,
                "ack_quorum": a,
                "calls": args.calls,
                "seconds": round(seconds, 4),
                "ops_per_sec": rate(args.calls, seconds),
                **percentiles(latencies),
            }
