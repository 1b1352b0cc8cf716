"""Building a placement policy from configuration.

::

    policy = build_policy(PlacementConf(ensemble_placement_policy="regionaware", local_region="region-a"))
    policy = build_policy(conf, dns=StaticMapping(locations_from_registrations))
    policy = build_policy({"ensemble_placement_policy": "regionaware"})   # a plain mapping works too
    policy, mapping = client_policy(conf)   # a client's: and the StaticMapping its bookie watcher fills

Keys and defaults are ``placement.config.PlacementConf``. A mapping may hold
other keys (a whole client conf): they are ignored here, and handed on to a
custom policy's or resolver's ``from_conf`` as they are.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from placement.config import (
    DNS_RESOLVER_KEY,
    POLICY_KEY,
    SCRIPT_FILE_KEY,
    PlacementConf,
    import_object,
)
from placement.dns import DNSToSwitchMapping, ScriptBasedMapping, StaticMapping
from placement.policy import EnsemblePlacementPolicy
from placement.rackaware import RackawareEnsemblePlacementPolicy
from placement.regionaware import RegionAwareEnsemblePlacementPolicy

_JAVA_PACKAGE = "org.apache.bookkeeper.client."

POLICIES: Mapping[str, type[EnsemblePlacementPolicy]] = {
    "rackaware": RackawareEnsemblePlacementPolicy,
    "regionaware": RegionAwareEnsemblePlacementPolicy,
}
"""Short names accepted for ``ensemble_placement_policy``."""

_BY_CLASS_NAME = {cls.__name__.lower(): cls for cls in POLICIES.values()}


def _policy_class(name: str) -> type[EnsemblePlacementPolicy]:
    lowered = name.lower()
    if lowered.startswith(_JAVA_PACKAGE.lower()):  # the seed's Java class names
        lowered = lowered[len(_JAVA_PACKAGE) :]
    cls = POLICIES.get(lowered) or _BY_CLASS_NAME.get(lowered)
    if cls is not None:
        return cls
    if "." not in name and ":" not in name:
        raise ValueError(f"{POLICY_KEY}={name!r} is not one of {sorted(POLICIES)} nor a dotted class path")
    found = import_object(name, POLICY_KEY)
    if not isinstance(found, type) or not issubclass(found, EnsemblePlacementPolicy):
        raise ValueError(f"{POLICY_KEY}={name!r} is not an EnsemblePlacementPolicy subclass")
    return found


def _both(conf: PlacementConf | Mapping[str, Any] | None) -> tuple[PlacementConf, Mapping[str, Any]]:
    """The parsed keys, and the mapping custom ``from_conf`` methods get (the caller's own if given)."""
    if isinstance(conf, PlacementConf):
        return conf, conf.as_mapping()
    parsed = PlacementConf.from_mapping(conf)
    return parsed, conf if conf is not None else {}


def build_dns(conf: PlacementConf | Mapping[str, Any] | None = None) -> DNSToSwitchMapping:
    """The resolver the configuration asks for.

    ``dns_resolver_class`` wins (built with its ``from_conf(conf)``); else
    ``network_topology_script_file`` gives a ``ScriptBasedMapping``; else an
    empty ``StaticMapping`` (every bookie in ``DEFAULT_RACK`` until filled).
    Raises ``ValueError`` for a class that cannot be imported or is not a
    ``DNSToSwitchMapping``, and for a script that is not an executable file.
    """
    pconf, mapping = _both(conf)
    class_path = pconf.dns_resolver_class
    if class_path:
        found = import_object(class_path, DNS_RESOLVER_KEY)
        if not isinstance(found, type) or not issubclass(found, DNSToSwitchMapping):
            raise ValueError(f"{DNS_RESOLVER_KEY}={class_path!r} is not a DNSToSwitchMapping subclass")
        return found.from_conf(mapping)
    script = pconf.network_topology_script_file
    if script:
        if not os.path.isfile(script):
            raise ValueError(f"{SCRIPT_FILE_KEY}={script!r} does not exist or is not a file")
        if not os.access(script, os.X_OK):
            raise ValueError(f"{SCRIPT_FILE_KEY}={script!r} is not executable")
        return ScriptBasedMapping(script)
    return StaticMapping()


def build_policy(conf: PlacementConf | Mapping[str, Any] | None = None,
                 dns: DNSToSwitchMapping | None = None) -> EnsemblePlacementPolicy:
    """The placement policy the configuration (a ``PlacementConf`` or a mapping) asks for.

    ``dns`` overrides the resolver the configuration would build. Raises
    ``ValueError`` with the offending key and value for an unknown policy
    name, a class path that cannot be imported or is not a policy, a bad
    resolver or script, a bad stabilize period or a bad ``local_region``.
    """
    pconf, mapping = _both(conf)
    cls = _policy_class(pconf.ensemble_placement_policy)
    resolver = dns if dns is not None else build_dns(pconf if isinstance(conf, PlacementConf) else mapping)
    return cls.from_conf(mapping, resolver)


def client_policy(conf: Mapping[str, Any] | None = None) -> tuple[EnsemblePlacementPolicy, StaticMapping | None]:
    """The policy a ledger client (or a tool) places ensembles with, and the mapping it resolves through.

    ``build_policy`` of ``conf`` (a whole client conf may be passed; keys
    with an empty value count as unset; rack-aware when no policy is named).
    Unless ``conf`` names its own resolver (``dns_resolver_class`` or
    ``network_topology_script_file``), the policy resolves bookie locations
    through a ``StaticMapping``, returned for the caller's bookie watcher to
    fill from the bookies' registrations; else the mapping is ``None``.
    Raises ``ValueError`` as ``build_policy`` does.
    """
    items = {k: str(v) for k, v in (conf or {}).items() if str(v) != ""}
    own_dns = bool(items.get(DNS_RESOLVER_KEY) or items.get(SCRIPT_FILE_KEY))
    mapping = None if own_dns else StaticMapping({})
    return build_policy(items, dns=mapping), mapping
