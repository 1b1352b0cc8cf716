"""Cluster membership as the placement policies see it.

``ClusterMembership`` turns the stream of ``(writable, readonly)`` bookie
sets into a ``NetworkTopology`` and an immutable ``ClusterSnapshot`` that the
policies read without locking::

    members = ClusterMembership(dns, stabilize_seconds=10, clock=time.monotonic)
    dead = members.update(writable={"a:1", "b:1"}, readonly=set())
    snap = members.snapshot()          # expires stabilized bookies first
    snap.live.members                  # writable bookies grouped by rack

Rules:

* A bookie in both sets counts as read-only. Read-only bookies are not in
  the topology (they are never placement candidates).
* ``update`` returns the bookies now considered dead: known before (writable
  or read-only), now in neither set, and not held by stabilization.
* With ``stabilize_seconds > 0`` a writable bookie that vanishes stays in
  the topology (``snapshot().stabilizing``) until that much time has passed
  on ``clock``; if it comes back first it is never removed. Once dropped, it
  is reported in the dead set of the next ``update``.
* Locations are resolved once per bookie joining the topology; a resolver
  that raises or answers the wrong number of names yields ``DEFAULT_RACK``
  with a logged warning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from types import MappingProxyType

from placement.dns import DNSToSwitchMapping
from placement.topology import DEFAULT_RACK, NetworkTopology, normalize_location, region_of

log = logging.getLogger(__name__)

_EMPTY: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RackGroups:
    """Bookies grouped by rack location, racks and members sorted."""

    racks: tuple[str, ...] = ()
    members: tuple[tuple[str, ...], ...] = ()
    rack_index: Mapping[str, int] = field(default_factory=dict)
    bookie_index: Mapping[str, int] = field(default_factory=dict)
    size: int = 0

    @classmethod
    def build(cls, by_rack: Mapping[str, Iterable[str]]) -> RackGroups:
        """Group ``rack -> bookies``; empty racks are left out."""
        racks: list[str] = []
        members: list[tuple[str, ...]] = []
        bookie_index: dict[str, int] = {}
        for rack in sorted(by_rack):
            group = tuple(sorted(by_rack[rack]))
            if not group:
                continue
            for b in group:
                bookie_index[b] = len(racks)
            racks.append(rack)
            members.append(group)
        return cls(
            racks=tuple(racks),
            members=tuple(members),
            rack_index=MappingProxyType({r: i for i, r in enumerate(racks)}),
            bookie_index=MappingProxyType(bookie_index),
            size=len(bookie_index),
        )

    def without(self, exclude: Set[str]) -> tuple[Sequence[str], Sequence[Sequence[str]], int]:
        """``(racks, members, size)`` after dropping ``exclude``; empty racks vanish."""
        if not exclude:
            return self.racks, self.members, self.size
        index = self.bookie_index
        hit = {index[b] for b in exclude if b in index}
        if not hit:
            return self.racks, self.members, self.size
        racks: list[str] = []
        members: list[Sequence[str]] = []
        size = 0
        for i, (rack, group) in enumerate(zip(self.racks, self.members, strict=True)):
            if i in hit:
                kept = [b for b in group if b not in exclude]
                if not kept:
                    continue
                members.append(kept)
                size += len(kept)
            else:
                members.append(group)
                size += len(group)
            racks.append(rack)
        return racks, members, size


_NO_GROUPS = RackGroups()


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """An immutable view of the cluster at one moment.

    ``live`` holds the writable bookies, ``everything`` adds the ones kept by
    stabilization; ``live_regions`` / ``all_regions`` split those by region
    name. ``locations`` maps every bookie ever resolved to its last known
    ``/region/rack``.
    """

    writable: frozenset[str] = frozenset()
    readonly: frozenset[str] = frozenset()
    stabilizing: frozenset[str] = frozenset()
    locations: Mapping[str, str] = field(default_factory=dict)
    live: RackGroups = _NO_GROUPS
    everything: RackGroups = _NO_GROUPS
    live_regions: Mapping[str, RackGroups] = field(default_factory=dict)
    all_regions: Mapping[str, RackGroups] = field(default_factory=dict)

    def read_tiers(
        self,
        ensemble: Sequence[str],
        write_set: Sequence[int],
        failure_history: Mapping[str, int] | None,
    ) -> tuple[list[int], list[int], list[int], list[int]]:
        """Split ``write_set`` into (healthy writable, failed writable, read-only, gone).

        Each tier keeps the write-set order; the failed tier is stably sorted
        by failure count, fewest first. A count of 0 (or none) is no failure.
        Raises ``IndexError`` for an index outside ``ensemble``.
        """
        history = failure_history or _EMPTY
        healthy: list[int] = []
        failed: list[tuple[int, int]] = []
        readonly: list[int] = []
        gone: list[int] = []
        for idx in write_set:
            bookie = ensemble[idx]
            if bookie in self.writable:
                failures = history.get(bookie) or 0
                if failures > 0:
                    failed.append((failures, idx))
                else:
                    healthy.append(idx)
            elif bookie in self.readonly:
                readonly.append(idx)
            else:
                gone.append(idx)
        failed.sort(key=lambda item: item[0])
        return healthy, [idx for _, idx in failed], readonly, gone


def _by_region(by_rack: Mapping[str, list[str]]) -> dict[str, RackGroups]:
    regions: dict[str, dict[str, list[str]]] = {}
    for rack, bookies in by_rack.items():
        regions.setdefault(region_of(rack), {})[rack] = bookies
    return {name: RackGroups.build(racks) for name, racks in sorted(regions.items())}


class ClusterMembership:
    """Tracks writable, read-only and stabilizing bookies and their locations.

    Thread-safe: ``update`` and expiry serialize on a lock; readers take
    ``snapshot()``, which is immutable.
    """

    def __init__(
        self,
        dns: DNSToSwitchMapping,
        stabilize_seconds: float = 0.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if stabilize_seconds < 0:
            raise ValueError(f"stabilize_seconds must be >= 0, got {stabilize_seconds}")
        self.dns = dns
        self.stabilize_seconds = float(stabilize_seconds)
        self.topology = NetworkTopology()
        self._clock = clock
        self._lock = threading.Lock()
        self._locations: dict[str, str] = {}
        self._writable: frozenset[str] = frozenset()
        self._readonly: frozenset[str] = frozenset()
        self._stabilizing: dict[str, float] = {}
        self._next_deadline: float | None = None
        self._expired: set[str] = set()
        self._snapshot = ClusterSnapshot()

    # -- changes ---------------------------------------------------------

    def update(self, writable: Iterable[str], readonly: Iterable[str] = ()) -> set[str]:
        """Take the new membership; return the bookies now considered dead."""
        ro = frozenset(readonly)
        wr = frozenset(writable) - ro
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            topo = self.topology
            joining = sorted(b for b in wr if b not in topo)
            new_readonly = sorted(b for b in ro if b not in self._readonly and b not in topo)
            fresh = self._resolve([*joining, *new_readonly])
            self._locations.update(fresh)

            dead: set[str] = set()
            for bookie in self._writable - wr:
                if bookie in ro:
                    topo.remove(bookie)
                elif self.stabilize_seconds > 0:
                    self._stabilizing.setdefault(bookie, now + self.stabilize_seconds)
                    log.info("bookie %s vanished; kept for %.3gs (stabilize period)", bookie, self.stabilize_seconds)
                else:
                    topo.remove(bookie)
                    dead.add(bookie)
            dead.update(b for b in self._readonly - ro if b not in wr)
            for bookie in list(self._stabilizing):
                if bookie in wr:
                    del self._stabilizing[bookie]
                    log.info("bookie %s came back within the stabilize period", bookie)
                elif bookie in ro:
                    del self._stabilizing[bookie]
                    topo.remove(bookie)
            for bookie in joining:
                topo.add(bookie, self._locations.get(bookie, DEFAULT_RACK))
            dead.update(b for b in self._expired if b not in wr and b not in ro)
            self._expired.clear()
            self._writable, self._readonly = wr, ro
            self._next_deadline = min(self._stabilizing.values(), default=None)
            self._rebuild_locked()
        if dead:
            log.info("bookies considered dead: %s", sorted(dead))
        return dead

    def clear(self) -> None:
        """Forget every bookie (as if no update ever happened)."""
        with self._lock:
            self.topology.clear()
            self._locations.clear()
            self._writable = self._readonly = frozenset()
            self._stabilizing.clear()
            self._expired.clear()
            self._next_deadline = None
            self._snapshot = ClusterSnapshot()

    # -- reads -----------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """The current view, after dropping bookies whose stabilize period ended."""
        deadline = self._next_deadline
        if deadline is not None and self._clock() >= deadline:
            with self._lock:
                if self._expire_locked(self._clock()):
                    self._rebuild_locked()
        return self._snapshot

    def locations_of(self, bookies: Sequence[str]) -> list[str]:
        """Last known location of each bookie, resolving never-seen ones (not cached)."""
        known = self._snapshot.locations
        unknown = [b for b in dict.fromkeys(bookies) if b not in known]
        fresh = self._resolve(unknown) if unknown else {}
        return [known.get(b) or fresh.get(b) or DEFAULT_RACK for b in bookies]

    # -- internals -------------------------------------------------------

    def _expire_locked(self, now: float) -> bool:
        gone = [b for b, deadline in self._stabilizing.items() if deadline <= now]
        for bookie in gone:
            del self._stabilizing[bookie]
            self.topology.remove(bookie)
            self._expired.add(bookie)
            log.info("bookie %s dropped: stabilize period of %.3gs ended", bookie, self.stabilize_seconds)
        if gone:
            self._next_deadline = min(self._stabilizing.values(), default=None)
        return bool(gone)

    def _rebuild_locked(self) -> None:
        live: dict[str, list[str]] = {}
        everything: dict[str, list[str]] = {}
        for rack, bookies in self.topology.rack_members().items():
            everything[rack] = list(bookies)
            alive = [b for b in bookies if b in self._writable]
            if alive:
                live[rack] = alive
        self._snapshot = ClusterSnapshot(
            writable=self._writable,
            readonly=self._readonly,
            stabilizing=frozenset(self._stabilizing),
            locations=MappingProxyType(dict(self._locations)),
            live=RackGroups.build(live),
            everything=RackGroups.build(everything),
            live_regions=MappingProxyType(_by_region(live)),
            all_regions=MappingProxyType(_by_region(everything)),
        )

    def _resolve(self, names: Sequence[str]) -> dict[str, str]:
        if not names:
            return {}
        try:
            answers = list(self.dns.resolve(list(names)))
        except Exception:
            log.warning("resolver %r failed for %d names; using %s", self.dns, len(names), DEFAULT_RACK, exc_info=True)
            return dict.fromkeys(names, DEFAULT_RACK)
        if len(answers) != len(names):
            log.warning(
                "resolver %r answered %d locations for %d names; using %s",
                self.dns,
                len(answers),
                len(names),
                DEFAULT_RACK,
            )
            return dict.fromkeys(names, DEFAULT_RACK)
        out: dict[str, str] = {}
        for name, answer in zip(names, answers, strict=True):
            try:
                out[name] = normalize_location(str(answer))
            except ValueError as exc:
                log.warning("bookie %s: %s; using %s", name, exc, DEFAULT_RACK)
                out[name] = DEFAULT_RACK
        return out
