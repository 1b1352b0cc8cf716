"""Region-aware placement: equal shares per region, rack-aware inside each.

::

    policy = RegionAwareEnsemblePlacementPolicy(dns, local_region="region-a")
    policy.on_cluster_changed(writable=bookies, readonly=set())
    policy.new_ensemble(6, 3, 2)          # two bookies from each of three regions
    policy.disable_region("region-c")     # the seed's feature switch, at run time
    policy.new_ensemble(6, 3, 2)          # three from each of the two others

``new_ensemble``: the enabled regions that have usable bookies split the
ensemble equally; the remainder goes one each to the first regions in name
order; a region short of bookies gives all it has and the others share the
rest equally. Inside a region bookies are spread over racks like the
rack-aware policy. The members are ordered so consecutive members come from
different regions whenever possible (and from different racks inside a
region), so every write quorum spans two regions -- or at least two racks --
whenever the shares allow it. Rack coverage is a best effort here;
``NotEnoughBookiesError`` only means too few usable bookies in enabled regions.

``replace_bookie``, first tier with a candidate wins: the victim's region
(its rack, then a rack unused by the ensemble, then any rack) provided the
write quorums through the slot keep two racks; then the least represented
other enabled region under the same proviso; then the victim's region on
any rack; then anywhere enabled.

Reads: like the rack-aware policy, except that among healthy writable
bookies two of the local region are tried, then one remote, and so on.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set

from placement.config import local_region, stabilize_seconds
from placement.dns import DNSToSwitchMapping, StaticMapping
from placement.errors import NotEnoughBookiesError
from placement.membership import ClusterSnapshot
from placement.policy import EnsemblePlacementPolicy
from placement.spread import arrange, choose_spread, even_shares, labels_to_avoid, windows_span_two
from placement.topology import region_of
from placement.topology_aware import TopologyAwareEnsemblePlacementPolicy, pick_ranked

log = logging.getLogger(__name__)


def _region_name(name: str) -> str:
    region = name.strip().strip("/")
    if not region or "/" in region:
        raise ValueError(f"{name!r} is not a region name (like 'region-a')")
    return region


class RegionAwareEnsemblePlacementPolicy(TopologyAwareEnsemblePlacementPolicy):
    """Places ensembles across regions, then across racks inside each region.

    ``local_region`` is this client's region (``None``: no local preference
    for reads). ``disabled_regions`` start disabled; ``disable_region`` /
    ``enable_region`` change that at run time. Raises ``ValueError`` for a
    malformed region name or a negative ``stabilize_seconds``.
    """

    def __init__(
        self,
        dns: DNSToSwitchMapping,
        local_region: str | None,
        stabilize_seconds: float = 0,
        disabled_regions: Iterable[str] = (),
        rng: random.Random | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(dns, stabilize_seconds, rng, clock=clock)
        self.local_region = None if local_region is None else _region_name(local_region)
        self._disabled = frozenset(_region_name(r) for r in disabled_regions)
        self._regions_lock = threading.Lock()

    @classmethod
    def from_conf(cls, conf: Mapping[str, str], dns: DNSToSwitchMapping | None = None) -> EnsemblePlacementPolicy:
        """Read ``local_region`` and ``network_topology_stabilize_period_seconds``; ``ValueError`` when bad."""
        return cls(
            dns if dns is not None else StaticMapping(),
            local_region(conf),
            stabilize_seconds=stabilize_seconds(conf),
        )

    # -- the feature switch ------------------------------------------------

    @property
    def disabled_regions(self) -> frozenset[str]:
        """Regions that new ensembles and replacements currently avoid."""
        return self._disabled

    def disable_region(self, name: str) -> None:
        """Stop placing data in region ``name`` (reads are unaffected)."""
        region = _region_name(name)
        with self._regions_lock:
            self._disabled = self._disabled | {region}
        log.info("region %s disabled for placement", region)

    def enable_region(self, name: str) -> None:
        """Allow placing data in region ``name`` again (no error if it was enabled)."""
        region = _region_name(name)
        with self._regions_lock:
            self._disabled = self._disabled - {region}
        log.info("region %s enabled for placement", region)

    def is_region_enabled(self, name: str) -> bool:
        """Whether region ``name`` may receive new data."""
        return _region_name(name) not in self._disabled

    # -- placement -----------------------------------------------------------

    def _choose_ensemble(
        self,
        snap: ClusterSnapshot,
        ensemble_size: int,
        write_quorum: int,
        exclude: Set[str],
        fallback: bool,
    ) -> list[str]:
        disabled = self._disabled
        regions = snap.all_regions if fallback else snap.live_regions
        names: list[str] = []
        pools: list[Sequence[Sequence[str]]] = []
        capacities: list[int] = []
        for name, groups in regions.items():  # sorted by name
            if name in disabled:
                continue
            _, members, size = groups.without(exclude)
            if size:
                names.append(name)
                pools.append(members)
                capacities.append(size)
        available = sum(capacities)
        if available < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} bookies, {available} available in enabled regions "
                f"({len(exclude)} excluded, {len(snap.readonly)} read-only, disabled: {sorted(disabled)})"
            )
        prefer = snap.writable if fallback else None
        rng = self._rng
        per_region: list[list[str]] = []
        per_rack: list[list[str]] = []
        for pool, share in zip(pools, even_shares(capacities, ensemble_size), strict=True):
            if share:
                chosen = choose_spread(pool, share, rng, prefer)
                per_rack.extend(chosen)
                per_region.append(arrange(chosen, rng))
        ensemble = arrange(per_region, rng)
        if write_quorum >= 2 and len(per_rack) > 1:
            locations = snap.locations
            if not windows_span_two([locations[b] for b in ensemble], write_quorum):
                by_rack = arrange(per_rack, rng)
                if windows_span_two([locations[b] for b in by_rack], write_quorum):
                    ensemble = by_rack
        return ensemble

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
        disabled = self._disabled
        labels, pos, victim_rack = self._victim_context(ensemble, victim)
        victim_region = region_of(victim_rack)
        avoid = labels_to_avoid(labels, pos, write_quorum) if pos is not None else set()
        used = {label for i, label in enumerate(labels) if i != pos}
        counts: dict[str, int] = {}
        for i, label in enumerate(labels):
            if i != pos:
                region = region_of(label)
                counts[region] = counts.get(region, 0) + 1

        def rank(rack: str) -> tuple[int, int, int] | None:
            region = region_of(rack)
            if region in disabled:
                return None
            if region == victim_region:
                if rack in avoid:
                    return (4, 0, 0)
                return (0 if rack == victim_rack else 1 if rack not in used else 2, 0, 0)
            if rack in avoid:
                return (5, counts.get(region, 0), 0)
            return (3, counts.get(region, 0), 1 if rack in used else 0)

        pick = pick_ranked(groups, skip, rank, self._rng)
        if pick is None:
            raise NotEnoughBookiesError(
                f"no bookie in an enabled region can replace {victim}: {groups.size} candidates, "
                f"{len(skip)} excluded or in the ensemble, disabled regions {sorted(disabled)}"
            )
        return pick

    # -- reads ---------------------------------------------------------------

    def _order_healthy(self, ensemble: Sequence[str], healthy: list[int]) -> list[int]:
        """Two local bookies, then one remote, repeated; leftovers keep their order."""
        local_name = self.local_region
        if local_name is None or len(healthy) < 2:
            return healthy
        locations = self._membership.snapshot().locations
        local: list[int] = []
        remote: list[int] = []
        for idx in healthy:
            location = locations.get(ensemble[idx])
            (local if location is not None and region_of(location) == local_name else remote).append(idx)
        out: list[int] = []
        li = ri = 0
        while li < len(local) or ri < len(remote):
            out.extend(local[li : li + 2])
            li += 2
            if ri < len(remote):
                out.append(remote[ri])
                ri += 1
        return out
