"""The network topology: a tree of ``/region/rack/bookie``.

Leaves are bookies (``"host:port"`` strings), inner nodes are regions and
racks. A *location* is the ``/region/rack`` path of a bookie's rack; a
*scope* is any path in the tree (``/``, ``/region``, ``/region/rack`` or
``/region/rack/bookie``)::

    topo = NetworkTopology()
    topo.add("10.0.0.1:3181", "/region-a/rack-1")
    topo.add("10.0.0.2:3181", "/region-a/rack-2")
    topo.num_racks()                  # 2
    topo.get_leaves("/region-a")      # frozenset({"10.0.0.1:3181", "10.0.0.2:3181"})
    topo.get_leaves("~/region-a/rack-1")  # everything outside that rack
    topo.get_location("10.0.0.1:3181")    # "/region-a/rack-1"

A one-component location such as ``/rack-7`` (what Hadoop-style rack
scripts print) is a rack in the default region: ``/default-region/rack-7``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

DEFAULT_REGION = "/default-region"
"""Region of bookies whose location names only a rack."""

DEFAULT_RACK = "/default-region/default-rack"
"""Location of every bookie that cannot be resolved."""


def normalize_location(location: str) -> str:
    """Return ``location`` as a canonical ``/region/rack`` path.

    Surrounding whitespace and trailing slashes are dropped and a lone rack
    (``/rack-1``) is placed in the default region. Raises ``ValueError`` when
    the location is not an absolute path of one or two non-empty components.
    """
    text = location.strip()
    if not text.startswith("/"):
        raise ValueError(f"network location {location!r} must start with '/' (like /region/rack)")
    parts = text.strip("/").split("/")
    if any(not p or p.isspace() for p in parts) or len(parts) > 2:
        raise ValueError(f"network location {location!r} is not of the form /region/rack")
    if len(parts) == 1:
        return f"{DEFAULT_REGION}/{parts[0]}"
    return f"/{parts[0]}/{parts[1]}"


def region_of(location: str) -> str:
    """Return the region name (without slashes) of a normalized location."""
    return location.split("/", 2)[1]


def _scope_parts(scope: str) -> list[str]:
    text = scope.strip()
    if not text.startswith("/"):
        raise ValueError(f"scope {scope!r} must start with '/'")
    stripped = text.strip("/")
    parts = stripped.split("/") if stripped else []
    if any(not p for p in parts) or len(parts) > 3:
        raise ValueError(f"scope {scope!r} is not a path in /region/rack/bookie")
    return parts


class NetworkTopology:
    """A mutable ``/region/rack/bookie`` tree.

    Not thread-safe on its own: placement policies mutate it under their
    lock and read immutable snapshots instead.
    """

    def __init__(self) -> None:
        # region -> rack -> bookies (dicts used as insertion-ordered sets)
        self._tree: dict[str, dict[str, dict[str, None]]] = {}
        self._where: dict[str, tuple[str, str]] = {}

    # -- changes ---------------------------------------------------------

    def add(self, bookie: str, location: str = DEFAULT_RACK) -> None:
        """Place ``bookie`` at ``location``, moving it if it sits elsewhere.

        Raises ``ValueError`` for an empty bookie name, one containing ``/``,
        or a location that :func:`normalize_location` rejects; the tree is
        unchanged then.
        """
        if not bookie or "/" in bookie:
            raise ValueError(f"bookie name {bookie!r} must be non-empty and contain no '/'")
        loc = normalize_location(location)
        _, region, rack = loc.split("/")
        if self._where.get(bookie) == (region, rack):
            return
        self.remove(bookie)
        self._tree.setdefault(region, {}).setdefault(rack, {})[bookie] = None
        self._where[bookie] = (region, rack)

    def remove(self, bookie: str) -> bool:
        """Remove ``bookie``; empty racks and regions go with it.

        Returns ``False`` (and changes nothing) when the bookie is not present.
        """
        where = self._where.pop(bookie, None)
        if where is None:
            return False
        region, rack = where
        racks = self._tree[region]
        members = racks[rack]
        del members[bookie]
        if not members:
            del racks[rack]
            if not racks:
                del self._tree[region]
        return True

    def clear(self) -> None:
        """Remove every bookie."""
        self._tree.clear()
        self._where.clear()

    # -- lookups ---------------------------------------------------------

    def __contains__(self, bookie: object) -> bool:
        return bookie in self._where

    def contains(self, bookie: str) -> bool:
        """Whether ``bookie`` is a leaf of the tree."""
        return bookie in self._where

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._where))

    def get_location(self, bookie: str) -> str | None:
        """The ``/region/rack`` location of ``bookie``, or ``None`` if absent."""
        where = self._where.get(bookie)
        return None if where is None else f"/{where[0]}/{where[1]}"

    def has_scope(self, scope: str) -> bool:
        """Whether ``scope`` names a node (root, region, rack or bookie) in the tree.

        Raises ``ValueError`` when ``scope`` is not a path.
        """
        parts = _scope_parts(scope)
        node: object = self._tree
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    def get_leaves(self, scope: str = "/") -> frozenset[str]:
        """Bookies under ``scope``; a scope starting with ``~`` means outside it.

        An unknown scope has no leaves (so ``~unknown`` is every bookie).
        Raises ``ValueError`` when ``scope`` is not a path.
        """
        if scope.startswith("~"):
            inside = self.get_leaves(scope[1:])
            return frozenset(b for b in self._where if b not in inside)
        parts = _scope_parts(scope)
        if not parts:
            return frozenset(self._where)
        racks = self._tree.get(parts[0], {})
        if len(parts) == 1:
            return frozenset(b for members in racks.values() for b in members)
        members = racks.get(parts[1], {})
        if len(parts) == 2:
            return frozenset(members)
        return frozenset(parts[2:3]) if parts[2] in members else frozenset()

    def count_leaves(self, scope: str = "/", excluded: Iterable[str] = ()) -> int:
        """Number of bookies under ``scope`` (``~`` allowed) not in ``excluded``."""
        leaves = self.get_leaves(scope)
        return len(leaves.difference(excluded))

    def regions(self) -> list[str]:
        """Region names (no slashes), sorted."""
        return sorted(self._tree)

    def racks(self, scope: str = "/") -> list[str]:
        """Rack locations (``/region/rack``) under ``scope``, sorted.

        ``scope`` may be the root or a region; raises ``ValueError`` otherwise.
        """
        parts = _scope_parts(scope)
        if len(parts) > 1:
            raise ValueError(f"scope {scope!r} must be the root or a region")
        regions = parts if parts else list(self._tree)
        return sorted(f"/{r}/{k}" for r in regions for k in self._tree.get(r, {}))

    def num_racks(self, scope: str = "/") -> int:
        """Number of non-empty racks under the root or a region."""
        return len(self.racks(scope))

    def num_regions(self) -> int:
        """Number of non-empty regions."""
        return len(self._tree)

    def rack_members(self) -> dict[str, tuple[str, ...]]:
        """Every rack location mapped to its bookies, sorted (a fresh copy)."""
        return {
            f"/{region}/{rack}": tuple(sorted(members))
            for region, racks in sorted(self._tree.items())
            for rack, members in sorted(racks.items())
        }

    def __repr__(self) -> str:
        return f"NetworkTopology(bookies={len(self._where)}, racks={self.num_racks()}, regions={len(self._tree)})"
