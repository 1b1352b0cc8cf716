"""Rack-aware placement: every write quorum spans at least two racks.

::

    policy = RackawareEnsemblePlacementPolicy(StaticMapping({...}), enforce_min_racks=2)
    policy.on_cluster_changed(writable=bookies, readonly=set())
    ensemble = policy.new_ensemble(6, 3, 2)

How ``new_ensemble`` picks: bookies are spread over as many racks as
possible (water-filling: the most used rack gets as few members as the
cluster allows), then ordered so members of one rack sit as far apart as
possible. Every write quorum (each window of ``write_quorum`` consecutive
members, wrapping) then spans two racks whenever any choice could achieve
it; otherwise the result is the best effort, or -- with
``enforce_min_racks=2`` -- ``NotEnoughBookiesError``.

How ``replace_bookie`` picks, first tier with a candidate wins (random inside
the tier): the victim's rack; a rack no other member uses; any other rack
that keeps every write quorum through the victim's slot on two racks; with
no enforcement, any rack.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Set

from placement.config import stabilize_seconds
from placement.dns import DNSToSwitchMapping, StaticMapping
from placement.errors import NotEnoughBookiesError
from placement.membership import ClusterSnapshot
from placement.policy import EnsemblePlacementPolicy
from placement.spread import arrange, choose_spread, labels_to_avoid, two_racks_reachable
from placement.topology_aware import TopologyAwareEnsemblePlacementPolicy, pick_ranked


class RackawareEnsemblePlacementPolicy(TopologyAwareEnsemblePlacementPolicy):
    """Places ensembles so that losing one rack never loses a write quorum.

    ``enforce_min_racks``: 0 or 1 make two racks per write quorum a best
    effort; 2 makes it a hard requirement (``NotEnoughBookiesError``
    instead of a fallback). A write quorum of 1 never needs two racks.
    Raises ``ValueError`` for other values or a negative ``stabilize_seconds``.
    """

    def __init__(
        self,
        dns: DNSToSwitchMapping,
        stabilize_seconds: float = 0,
        enforce_min_racks: int = 0,
        rng: random.Random | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if enforce_min_racks not in (0, 1, 2):
            raise ValueError(f"enforce_min_racks must be 0, 1 or 2, got {enforce_min_racks!r}")
        super().__init__(dns, stabilize_seconds, rng, clock=clock)
        self.enforce_min_racks = enforce_min_racks

    @classmethod
    def from_conf(cls, conf: Mapping[str, str], dns: DNSToSwitchMapping | None = None) -> EnsemblePlacementPolicy:
        """Read ``network_topology_stabilize_period_seconds``; ``ValueError`` when bad."""
        return cls(dns if dns is not None else StaticMapping(), stabilize_seconds=stabilize_seconds(conf))

    def _enforced(self, write_quorum: int) -> bool:
        return min(self.enforce_min_racks, write_quorum) >= 2

    def _choose_ensemble(
        self,
        snap: ClusterSnapshot,
        ensemble_size: int,
        write_quorum: int,
        exclude: Set[str],
        fallback: bool,
    ) -> list[str]:
        groups = snap.everything if fallback else snap.live
        _, members, available = groups.without(exclude)
        if available < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} bookies, {available} available "
                f"({len(exclude)} excluded, {len(snap.readonly)} read-only)"
            )
        chosen = choose_spread(members, ensemble_size, self._rng, snap.writable if fallback else None)
        if len(chosen) == ensemble_size:  # one bookie per rack: any order works
            return [group[0] for group in chosen]
        if self._enforced(write_quorum):
            most_used = max(len(group) for group in chosen)
            if not two_racks_reachable(most_used, ensemble_size, write_quorum):
                raise NotEnoughBookiesError(
                    f"cannot put every write quorum of {write_quorum} on two racks: "
                    f"{len(members)} racks hold the {available} available bookies"
                )
        return arrange(chosen, self._rng)

    def _choose_replacement(
        self,
        snap: ClusterSnapshot,
        write_quorum: int,
        ensemble: list[str],
        victim: str,
        skip: Set[str],
        fallback: bool,
    ) -> str:
        groups = snap.everything if fallback else snap.live
        labels, pos, victim_rack = self._victim_context(ensemble, victim)
        avoid = labels_to_avoid(labels, pos, write_quorum) if pos is not None else set()
        if victim_rack not in avoid:
            i = groups.rack_index.get(victim_rack)
            if i is not None:
                same_rack = [b for b in groups.members[i] if b not in skip]
                if same_rack:
                    return self._rng.choice(same_rack)
        used = {label for i, label in enumerate(labels) if i != pos}
        forbid = self._enforced(write_quorum)

        def rank(rack: str) -> int | None:
            if rack in avoid:
                return None if forbid else 2
            return 1 if rack in used else 0

        pick = pick_ranked(groups, skip, rank, self._rng)
        if pick is None:
            raise NotEnoughBookiesError(
                f"no bookie can replace {victim}: {groups.size} candidates, "
                f"{len(skip)} excluded or in the ensemble"
                + (f", racks {sorted(avoid)} would leave a write quorum on one rack" if forbid else "")
            )
        return pick
