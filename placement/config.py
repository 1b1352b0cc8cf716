"""Configuration keys read by the placement package, with their defaults.

All values come from a ``key=value`` configuration as strings:

* ``ensemble_placement_policy`` (default ``rackaware``): ``rackaware``,
  ``regionaware`` or the dotted path of an ``EnsemblePlacementPolicy`` class.
* ``network_topology_script_file`` (default none): executable that prints one
  ``/region/rack`` per name; with neither it nor ``dns_resolver_class`` set, a
  ``StaticMapping`` (filled from bookie registrations) resolves names.
* ``network_topology_stabilize_period_seconds`` (default ``0``): keep a
  vanished bookie in the topology this long; ``0`` drops it at once.
* ``dns_resolver_class`` (default none): dotted path of a ``DNSToSwitchMapping``.
* ``local_region`` (default none): this client's region, for region-aware reads.

Parsing helpers raise ``ValueError`` naming the key and the bad value.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping

POLICY_KEY = "ensemble_placement_policy"
SCRIPT_FILE_KEY = "network_topology_script_file"
STABILIZE_KEY = "network_topology_stabilize_period_seconds"
DNS_RESOLVER_KEY = "dns_resolver_class"
LOCAL_REGION_KEY = "local_region"

DEFAULT_POLICY = "rackaware"


def get_str(conf: Mapping[str, str], key: str) -> str | None:
    """The stripped value of ``key``, or ``None`` when missing or blank."""
    raw = conf.get(key)
    if raw is None:
        return None
    text = str(raw).strip()
    return text or None


def stabilize_seconds(conf: Mapping[str, str]) -> float:
    """``network_topology_stabilize_period_seconds`` as a float >= 0 (default 0).

    Raises ``ValueError`` for a value that is not a finite, non-negative number.
    """
    text = get_str(conf, STABILIZE_KEY)
    if text is None:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{STABILIZE_KEY}={text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{STABILIZE_KEY}={text!r} must be a finite number >= 0")
    return value


def local_region(conf: Mapping[str, str]) -> str | None:
    """``local_region`` without surrounding slashes, or ``None`` when unset.

    Raises ``ValueError`` when the value contains an inner ``/``.
    """
    text = get_str(conf, LOCAL_REGION_KEY)
    if text is None:
        return None
    name = text.strip("/")
    if not name or "/" in name:
        raise ValueError(f"{LOCAL_REGION_KEY}={text!r} must be a region name such as 'region-a'")
    return name


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
