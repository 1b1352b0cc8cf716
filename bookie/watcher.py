"""The bookie watcher: keeps a placement policy's view of the cluster current from the ``bookies`` table.

    watcher = BookieWatcher(store, policy, mapping, interval=1.0)
    await watcher.refresh()       # read the registrations now
    watcher.start()               # and again every ``interval`` seconds
    watcher.writable, watcher.readonly
    await watcher.stop()

    writable, readonly = apply_registrations(await list_bookies(store), policy, mapping)   # one-off

Each refresh reads every registration (``bookie.registration.list_bookies``),
teaches ``mapping`` (when given) the location each bookie registered, and
calls ``policy.on_cluster_changed(writable, readonly)``. A failed periodic
refresh is logged and retried at the next interval; ``refresh`` itself
raises the metastore's error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from bookie.proto.bookie_pb2 import BookieRegistrationRecord
from bookie.registration import READ_ONLY, list_bookies
from metastore import MetaStore
from placement import EnsemblePlacementPolicy, StaticMapping

log = logging.getLogger(__name__)

__all__ = ["BookieWatcher", "apply_registrations"]


def apply_registrations(regs: Mapping[str, BookieRegistrationRecord], policy: EnsemblePlacementPolicy,
                        mapping: StaticMapping | None) -> tuple[set[str], set[str]]:
    """Teach ``mapping`` the registered locations and ``policy`` who is writable; return (writable, read-only)."""
    writable: set[str] = set()
    readonly: set[str] = set()
    for addr, rec in regs.items():
        if mapping is not None and rec.network_location:
            mapping.set_location(addr, rec.network_location)
        (readonly if rec.state == READ_ONLY else writable).add(addr)
    policy.on_cluster_changed(writable, readonly)
    return writable, readonly


class BookieWatcher:
    """See the module docstring."""

    def __init__(self, store: MetaStore, policy: EnsemblePlacementPolicy, mapping: StaticMapping | None,
                 interval: float) -> None:
        self._store = store
        self._policy = policy
        self._mapping = mapping
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self.writable: set[str] = set()
        self.readonly: set[str] = set()

    async def refresh(self) -> None:
        """Read the registrations and update the policy (raises the metastore's error)."""
        writable, readonly = apply_registrations(await list_bookies(self._store), self._policy, self._mapping)
        if (writable, readonly) != (self.writable, self.readonly):
            log.info("bookies: %d writable, %d read-only", len(writable), len(readonly))
        self.writable, self.readonly = writable, readonly

    def start(self) -> None:
        """Refresh every ``interval`` seconds until ``stop``."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="bookie-watcher")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
            except Exception as exc:  # keep watching through metastore hiccups
                log.warning("cannot refresh bookie registrations: %s", exc)

    async def stop(self) -> None:
        """Stop watching and wait for the task to end."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
