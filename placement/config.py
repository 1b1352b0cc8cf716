"""Configuration keys read by the placement package: ``PlacementConf``.

::

    from placement import PlacementConf, build_policy

    conf = PlacementConf(ensemble_placement_policy="regionaware", local_region="region-a")
    policy = build_policy(conf)
    conf = PlacementConf.from_mapping(client_conf)   # picks the keys below, ignores the rest

The keys, with their defaults:

* ``ensemble_placement_policy`` (default ``rackaware``): ``rackaware``,
  ``regionaware`` or the dotted path of an ``EnsemblePlacementPolicy`` class.
* ``network_topology_script_file`` (default none): executable that prints one
  ``/region/rack`` per name; with neither it nor ``dns_resolver_class`` set, a
  ``StaticMapping`` (filled from bookie registrations) resolves names.
* ``network_topology_stabilize_period_seconds`` (default ``0``): keep a
  vanished bookie in the topology this long; ``0`` drops it at once.
* ``dns_resolver_class`` (default none): dotted path of a ``DNSToSwitchMapping``.
* ``local_region`` (default none): this client's region, for region-aware reads.

``PlacementConf`` is a frozen dataclass declared with plain
``dataclasses.field(default=..., metadata={"doc": ...})`` (this package
imports nothing from Quire), so ``metastore.conf.parse_conf(PlacementConf,
...)`` parses it from ``.conf`` files and strings like any other
configuration. Failure: a bad value raises ``ValueError`` naming the key
and the value (a blank string means "unset" for the optional keys).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Mapping
from typing import Any

POLICY_KEY = "ensemble_placement_policy"
SCRIPT_FILE_KEY = "network_topology_script_file"
STABILIZE_KEY = "network_topology_stabilize_period_seconds"
DNS_RESOLVER_KEY = "dns_resolver_class"
LOCAL_REGION_KEY = "local_region"

DEFAULT_POLICY = "rackaware"


@dataclasses.dataclass(frozen=True)
class PlacementConf:
    """The placement keys (see the module docstring); ``ValueError`` naming a bad one."""

    ensemble_placement_policy: str = dataclasses.field(default=DEFAULT_POLICY, metadata={
        "doc": "rackaware, regionaware or the dotted path of an EnsemblePlacementPolicy class"})
    network_topology_script_file: str = dataclasses.field(default="", metadata={
        "doc": "executable printing one /region/rack per bookie name (empty: none)"})
    network_topology_stabilize_period_seconds: float = dataclasses.field(default=0.0, metadata={
        "doc": "seconds a vanished bookie stays in the topology (0: dropped at once)", "min": 0.0})
    dns_resolver_class: str = dataclasses.field(default="", metadata={
        "doc": "dotted path of a DNSToSwitchMapping class (empty: none)"})
    local_region: str = dataclasses.field(default="", metadata={
        "doc": "this client's region, preferred for reads by regionaware (empty: none)"})

    def __post_init__(self) -> None:
        for key in (POLICY_KEY, SCRIPT_FILE_KEY, DNS_RESOLVER_KEY, LOCAL_REGION_KEY):
            value = getattr(self, key)
            if value is None:
                value = ""
            if not isinstance(value, str):
                raise ValueError(f"{key}={value!r} must be a string")
            object.__setattr__(self, key, value.strip())
        if not self.ensemble_placement_policy:
            object.__setattr__(self, POLICY_KEY, DEFAULT_POLICY)
        period: object = self.network_topology_stabilize_period_seconds
        object.__setattr__(self, STABILIZE_KEY, 0.0 if isinstance(period, str) and not period.strip()
                           else _seconds(period))
        if self.local_region:
            name = self.local_region.strip("/")
            if not name or "/" in name:
                raise ValueError(f"{LOCAL_REGION_KEY}={self.local_region!r} must be a region name such as 'region-a'")
            object.__setattr__(self, LOCAL_REGION_KEY, name)

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any] | None) -> PlacementConf:
        """The placement keys of ``conf`` (values as strings or typed); other keys are ignored.

        A client's conf holds many other keys, so they are not errors here;
        ``metastore.conf.parse_conf`` refuses unknown keys where a file holds
        only these. Raises ``ValueError`` naming a bad key.
        """
        if isinstance(conf, PlacementConf):
            return conf
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{k: conf[k] for k in names if conf is not None and k in conf and conf[k] is not None})

    def as_mapping(self) -> dict[str, str]:
        """The set keys as strings (what policies' and resolvers' ``from_conf`` read)."""
        out = {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return {k: v for k, v in out.items() if v != ""}


PLACEMENT_KEYS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(PlacementConf))
"""The configuration keys ``PlacementConf`` reads (for callers that split a larger conf)."""


def _seconds(raw: object) -> float:
    if isinstance(raw, bool):
        raise ValueError(f"{STABILIZE_KEY}={raw!r} is not a number of seconds")
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{STABILIZE_KEY}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{STABILIZE_KEY}={raw!r} must be a finite number >= 0")
    return value


def get_str(conf: Mapping[str, Any], key: str) -> str | None:
    """The stripped value of ``key``, or ``None`` when missing or blank."""
    raw = conf.get(key)
    if raw is None:
        return None
    text = str(raw).strip()
    return text or None


def stabilize_seconds(conf: Mapping[str, Any]) -> float:
    """``network_topology_stabilize_period_seconds`` as a float >= 0 (default 0).

    Raises ``ValueError`` for a value that is not a finite, non-negative number.
    """
    text = get_str(conf, STABILIZE_KEY)
    return 0.0 if text is None else _seconds(text)


def local_region(conf: Mapping[str, Any]) -> str | None:
    """``local_region`` without surrounding slashes, or ``None`` when unset.

    Raises ``ValueError`` when the value contains an inner ``/``.
    """
    text = get_str(conf, LOCAL_REGION_KEY)
    return PlacementConf(local_region=text).local_region if text is not None else None


def import_object(path: str, key: str) -> object:
    """Import ``package.module.Name`` (or ``package.module:Name``).

    Raises ``ValueError`` naming ``key`` when the module or name cannot be found.
    """
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{key}={path!r} is not a dotted path like 'package.module.ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{key}={path!r}: cannot import module {module_name!r}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{key}={path!r}: module {module_name!r} has no attribute {attr!r}") from None
