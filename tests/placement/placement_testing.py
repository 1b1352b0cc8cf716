"""Helpers shared by the placement tests (not a test module)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from placement import StaticMapping
from placement.dns import DNSToSwitchMapping


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class CountingMapping(DNSToSwitchMapping):
    """A StaticMapping that records every name it was asked about."""

    def __init__(self, table: Mapping[str, str]) -> None:
        self.inner = StaticMapping(table)
        self.asked: list[str] = []

    def resolve(self, names: Sequence[str]) -> list[str]:
        self.asked.extend(names)
        return self.inner.resolve(names)

    def reload_cached_mappings(self) -> None:
        self.inner.reload_cached_mappings()


def layout(racks: Mapping[str, int]) -> dict[str, str]:
    """``{"/region/rack": count}`` -> ``{"rack.region.i:3181": "/region/rack"}``."""
    out: dict[str, str] = {}
    for location, count in racks.items():
        _, region, rack = location.split("/")
        for i in range(count):
            out[f"{rack}.{region}.{i}:3181"] = location
    return out


def grid(regions: int, racks_per_region: int, bookies_per_rack: int) -> dict[str, str]:
    return layout(
        {f"/region-{g}/rack-{g}{r}": bookies_per_rack for g in range(regions) for r in range(racks_per_region)}
    )


def windows(ensemble: Sequence[str], write_quorum: int) -> list[list[str]]:
    n = len(ensemble)
    return [[ensemble[(s + k) % n] for k in range(write_quorum)] for s in range(n)]


def every_window_spans(
    ensemble: Sequence[str], locations: Mapping[str, str], write_quorum: int, level: str = "rack", at_least: int = 2
) -> bool:
    def key(b: str) -> str:
        loc = locations[b]
        return loc if level == "rack" else loc.split("/")[1]

    return all(len({key(b) for b in w}) >= at_least for w in windows(ensemble, write_quorum))


def seeded(seed: int = 7) -> random.Random:
    return random.Random(seed)
