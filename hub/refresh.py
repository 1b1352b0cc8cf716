"""A hub's copy of a metastore table, re-read every ``refresh_interval`` (grants, lifecycle policies).

    class PermissionCache(RefreshedCopy[dict[str, ...]]):
        async def read(self): return ...              # the table now (errors propagate)
        def install(self, value): ...                 # use the new copy (called only when it changed)

    cache = PermissionCache(..., refresh_interval=1.0, on_refresh_failure=..., on_change=...)
    await cache.start()                 # first read: errors propagate (a hub does not start without it)
    spawn(cache.refresh_forever())      # then a re-read every refresh_interval until cancelled
    await cache.refresh()               # now (the hub whose admin API changed the table)

Staleness: a change made anywhere is in force within ``refresh_interval``
plus one metastore read. Failure: a failed re-read keeps the copy read
before, logs a warning and calls ``on_refresh_failure``; the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["RefreshedCopy"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class RefreshedCopy(Generic[T]):
    """See the module docstring. Subclasses define ``read`` and ``install`` and call ``__init__``."""

    what = "table"

    def __init__(self, initial: T, refresh_interval: float, on_refresh_failure: Callable[[], None] | None = None,
                 on_change: Callable[[], None] | None = None) -> None:
        self.refresh_interval = refresh_interval
        self.generation = 0          # bumped whenever the copy read differs from the one held
        self._held = initial         # the copy before the first read (an empty table)
        self._on_failure = on_refresh_failure
        self._on_change = on_change

    async def read(self) -> T:
        """The table as it is now (raises on metastore failure)."""
        raise NotImplementedError

    def install(self, value: T) -> None:
        """Use ``value`` from now on (called after a read that differs from the last)."""
        raise NotImplementedError

    async def start(self) -> None:
        """Read the table; errors propagate. Then run ``refresh_forever``."""
        await self.refresh()

    async def refresh(self) -> None:
        """Read the table now; install it (and call ``on_change``) when it changed."""
        new = await self.read()
        if new != self._held:
            self._held = new
            self.install(new)
            self.generation += 1
            if self._on_change is not None:
                self._on_change()

    async def refresh_forever(self) -> None:
        """Re-read the table every ``refresh_interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.refresh_interval)   # the staleness bound: a periodic re-read
            try:
                await self.refresh()
            except Exception as exc:     # whatever failed, the loop goes on: it is the staleness bound
                log.warning("could not re-read the %s table (keeping the copy read before): %s", self.what, exc)
                if self._on_failure is not None:
                    self._on_failure()
