"""What the rack-aware and region-aware policies share.

``TopologyAwareEnsemblePlacementPolicy`` keeps the cluster membership
(``placement.membership``), validates arguments, applies the stabilization
fallback and computes the read order tiers. Subclasses only decide *which*
bookies to pick from a ``ClusterSnapshot``:

* ``_choose_ensemble(snap, ensemble_size, write_quorum, exclude, fallback)``
* ``_choose_replacement(snap, write_quorum, ensemble, victim, skip, fallback)``

Both are first called with ``fallback=False`` (writable bookies only); only
when that raises ``NotEnoughBookiesError`` and some bookies are kept by
stabilization are they called again with ``fallback=True``.
"""

from __future__ import annotations

import abc
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any, Protocol, TypeVar

from placement.dns import DNSToSwitchMapping
from placement.errors import NotEnoughBookiesError
from placement.membership import ClusterMembership, ClusterSnapshot, RackGroups
from placement.policy import EnsemblePlacementPolicy, check_quorums
from placement.topology import NetworkTopology

log = logging.getLogger(__name__)


class _Comparable(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


RankT = TypeVar("RankT", bound=_Comparable)


def as_set(bookies: Iterable[str] | None) -> Set[str]:
    """``bookies`` as a set (no copy when it already is one)."""
    if bookies is None:
        return frozenset()
    if isinstance(bookies, (set, frozenset)):
        return bookies
    return frozenset(bookies)


def pick_ranked(
    groups: RackGroups,
    skip: Set[str],
    rank: Callable[[str], RankT | None],
    rng: random.Random,
) -> str | None:
    """A random bookie among those of the best-ranked racks, or ``None``.

    ``rank(rack)`` returns ``None`` for racks that must not be used; lower
    ranks win; bookies in ``skip`` never qualify.
    """
    best_rank: RankT | None = None
    best: list[str] = []
    for rack, members in zip(groups.racks, groups.members, strict=True):
        r = rank(rack)
        if r is None or (best_rank is not None and best_rank < r):
            continue
        candidates = [b for b in members if b not in skip]
        if not candidates:
            continue
        if best_rank is None or r < best_rank:
            best_rank, best = r, candidates
        else:
            best.extend(candidates)
    return rng.choice(best) if best else None


class TopologyAwareEnsemblePlacementPolicy(EnsemblePlacementPolicy):
    """Base of the policies that place by network topology.

    ``rng`` (a ``random.Random``) is the only source of randomness and
    ``clock`` (seconds, monotonic) the only source of time, so both can be
    fixed in tests.
    """

    def __init__(
        self,
        dns: DNSToSwitchMapping,
        stabilize_seconds: float = 0,
        rng: random.Random | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._membership = ClusterMembership(dns, stabilize_seconds, clock=clock)
        self._rng = rng if rng is not None else random.Random()

    @property
    def dns(self) -> DNSToSwitchMapping:
        """The resolver that places new bookies."""
        return self._membership.dns

    @property
    def stabilize_seconds(self) -> float:
        """How long a vanished bookie stays in the topology."""
        return self._membership.stabilize_seconds

    @property
    def topology(self) -> NetworkTopology:
        """The live topology (writable plus stabilizing bookies); treat it as read-only."""
        return self._membership.topology

    def snapshot(self) -> ClusterSnapshot:
        """The current immutable view of the cluster."""
        return self._membership.snapshot()

    def uninitialize(self) -> None:
        self._membership.clear()

    def on_cluster_changed(self, writable: Iterable[str], readonly: Iterable[str] = ()) -> set[str]:
        return self._membership.update(writable, readonly)

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        exclude: Iterable[str] | None = None,
    ) -> list[str]:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        excluded = as_set(exclude)
        snap = self._membership.snapshot()
        try:
            return self._choose_ensemble(snap, ensemble_size, write_quorum, excluded, False)
        except NotEnoughBookiesError:
            if not snap.stabilizing:
                raise
        log.info(
            "writable bookies cannot form an ensemble of %d; also using %d bookies in their stabilize period",
            ensemble_size,
            len(snap.stabilizing),
        )
        return self._choose_ensemble(snap, ensemble_size, write_quorum, excluded, True)

    def replace_bookie(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        current_ensemble: Sequence[str],
        bookie_to_replace: str,
        exclude: Iterable[str] | None = None,
    ) -> str:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        ensemble = list(current_ensemble)
        skip = {*as_set(exclude), *ensemble, bookie_to_replace}
        snap = self._membership.snapshot()
        try:
            return self._choose_replacement(snap, write_quorum, ensemble, bookie_to_replace, skip, False)
        except NotEnoughBookiesError:
            if not snap.stabilizing:
                raise
        log.info("no writable bookie can replace %s; also using bookies in their stabilize period", bookie_to_replace)
        return self._choose_replacement(snap, write_quorum, ensemble, bookie_to_replace, skip, True)

    def reorder_read_sequence(
        self,
        ensemble: Sequence[str],
        write_set: Sequence[int],
        failure_history: Mapping[str, int] | None = None,
    ) -> list[int]:
        healthy, failed, readonly, gone = self._membership.snapshot().read_tiers(ensemble, write_set, failure_history)
        return [*self._order_healthy(ensemble, healthy), *failed, *readonly, *gone]

    def _order_healthy(self, ensemble: Sequence[str], healthy: list[int]) -> list[int]:
        """Order of the healthy writable tier; default: write-set order."""
        return healthy

    def _victim_context(self, ensemble: list[str], victim: str) -> tuple[list[str], int | None, str]:
        """Locations of the ensemble, the victim's index (``None`` if absent) and its location."""
        labels = self._membership.locations_of(ensemble)
        if victim in ensemble:
            pos = ensemble.index(victim)
            return labels, pos, labels[pos]
        return labels, None, self._membership.locations_of([victim])[0]

    @abc.abstractmethod
    def _choose_ensemble(
        self,
        snap: ClusterSnapshot,
        ensemble_size: int,
        write_quorum: int,
        exclude: Set[str],
        fallback: bool,
    ) -> list[str]:
        """Pick the ensemble from ``snap``; ``NotEnoughBookiesError`` when impossible."""

    @abc.abstractmethod
    def _choose_replacement(
        self,
        snap: ClusterSnapshot,
        write_quorum: int,
        ensemble: list[str],
        victim: str,
        skip: Set[str],
        fallback: bool,
    ) -> str:
        """Pick a replacement not in ``skip``; ``NotEnoughBookiesError`` when none qualifies."""
