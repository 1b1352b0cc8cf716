"""One empty deque for every idle queue of a process (the hub's topics, the ledger client's writers).

    from metastore.idle import IDLE
    self._queue: collections.deque[Item] = IDLE        # idle: nothing of its own
    if self._queue is IDLE:                            # before the first append
        self._queue = collections.deque()
    ...
    if not self._queue:                                # drained: give it back
        self._queue = IDLE

A ``collections.deque`` holds about 700 bytes even when empty (a block of
64 slots); a hub owns a queue or two per topic, and most topics are idle
(issue 34). Only appending needs the check: reading, ``popleft`` guarded
by a length check and ``clear`` work on ``IDLE`` as on any empty deque.
Appending to ``IDLE`` itself raises ``AssertionError`` (a missed check would
otherwise share one queue between every idle owner).

``IDLE_DICT`` is the same for a table that is mostly empty (an empty dict
holds 64 bytes, one with an entry 180): reading, ``pop`` with a default and
``clear`` work on it; storing into it raises ``AssertionError``, so an owner
checks ``if self._table is IDLE_DICT: self._table = {}`` before its first
store.

``kept_version(v)`` is what to keep of a ``Version`` held for as long as a
topic is owned (the version of its owner record, of its ranges, of its
ledger): a concrete version as its int, a sentinel as itself (a ``Version``
object is 48 bytes besides its int); ``version_of(kept)`` gives the
``Version`` back.
"""

from __future__ import annotations

import collections
from typing import Any, overload

from metastore.api import Version

__all__ = ["IDLE", "IDLE_DICT", "KeptVersion", "kept_version", "version_of"]


class _IdleDeque(collections.deque):  # type: ignore[type-arg]
    __slots__ = ()

    def append(self, item: Any) -> None:
        raise AssertionError("appended to the shared idle deque (metastore.idle.IDLE)")

    appendleft = extend = extendleft = append


IDLE: collections.deque[Any] = _IdleDeque()
"""The shared empty deque (see the module docstring)."""


class _IdleDict(dict):  # type: ignore[type-arg]
    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        raise AssertionError("stored into the shared idle dict (metastore.idle.IDLE_DICT)")

    def setdefault(self, key: Any, default: Any = None) -> Any:
        raise AssertionError("stored into the shared idle dict (metastore.idle.IDLE_DICT)")

    def update(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("stored into the shared idle dict (metastore.idle.IDLE_DICT)")

    __ior__ = update  # type: ignore[assignment]


IDLE_DICT: dict[Any, Any] = _IdleDict()
"""The shared empty dict (see the module docstring)."""


KeptVersion = int | Version
"""A version as ``kept_version`` keeps it."""


def kept_version(version: Version) -> KeptVersion:
    """``version`` to keep: its int when concrete, itself when a sentinel (see the module docstring)."""
    return version if version.is_sentinel else version.value


def version_of(kept: KeptVersion) -> Version:
    """The ``Version`` ``kept_version`` kept."""
    return kept if isinstance(kept, Version) else Version(kept)


class VersionSlot:
    """A ``Version`` attribute kept as ``kept_version`` in its owner's ``_version`` slot (48 bytes fewer a
    topic than a ``Version``): ``version = VersionSlot()`` in the class body."""

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> VersionSlot: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Version: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Version | VersionSlot:
        if obj is None:
            return self
        return version_of(obj._version)  # type: ignore[attr-defined]

    def __set__(self, obj: object, version: Version) -> None:
        obj._version = kept_version(version)  # type: ignore[attr-defined]
