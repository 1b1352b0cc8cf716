"""Writing a topic's subscriptions to the metastore: a mixin of ``TopicSubscriptions``.

    await subs.persist(sub_id)      # the consume pointer (and acked ranges) as it is now, stored
    subs.persist_soon(sub_id)       # the same in the background (the write loop in flight, or None)

A subscription has at most one pointer write in flight: persists asked for
meanwhile coalesce into one write of the newest pointer once it is done, and
a write that finds the record changed (``BadVersionError``) reads it again
and never writes a pointer older than the stored one. The writes of one
subscription (pointer and preferences, ``_write``) never overlap. The rules
are in ``hub.subscriptions``' module docstring.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

from hub import errors
from hub.conf import HubConf
from hub.proto import pubsub_pb2 as pb
from metastore import Version
from metastore.cas import cas_retry

if TYPE_CHECKING:
    from hub.metadata import SubscriptionDataManager
    from hub.substate import SubState

log = logging.getLogger("hub.subscriptions")

__all__ = ["SubscriptionPersistence"]


class SubscriptionPersistence:
    """Pointer and preference writes of ``TopicSubscriptions`` (its ``topic``, ``subs``, ``mgr``... are declared
    here)."""

    if not TYPE_CHECKING:    # the state is TopicSubscriptions' slots
        __slots__ = ()

    topic: bytes
    conf: HubConf
    mgr: SubscriptionDataManager
    subs: dict[bytes, SubState]

    if TYPE_CHECKING:
        def _arm_ack_timer(self, state: SubState) -> None: ...

    async def _write(self, state: SubState, data: pb.SubscriptionData) -> Version:
        """Write the preferences in ``data`` (a partial update) by CAS, after any pointer write."""
        version: Version = Version.ANY   # set under the lock: the version the last write left

        async def step() -> Version:
            nonlocal version
            try:
                new: Version = await self.mgr.update_subscription_data(self.topic, state.subscriber, data, version)
                return new
            except errors.BadVersionError:
                version = await self._current_version(state)
                raise

        async with state.writing:
            version = state.version
            return await cas_retry(step, retry_on=(errors.BadVersionError,))

    async def _current_version(self, state: SubState) -> Version:
        got = await self.mgr.read_subscription_data(self.topic, state.subscriber)
        if got is None:
            raise errors.ClientNotSubscribedError(f"{state.subscriber!r} vanished") from None
        current: Version = got[1]
        return current

    async def _write_pointer(self, state: SubState, target: int) -> None:
        """CAS-write consume pointer ``target``, unless the stored pointer is already at or past it."""
        data = pb.SubscriptionData()
        data.state.msgId.localComponent = target
        ranges = state.dispatcher.cursor.persisted_ranges() if state.dispatcher is not None else \
            [r for r in state.ranges if r[1] > target]
        for first, last in ranges:
            if last > target:
                data.state.ackedRanges.add(first=max(first, target + 1), last=last)
        version: Version = Version.ANY   # set under the lock: the version the last write left

        async def step() -> Version:
            nonlocal version
            try:
                new: Version = await self.mgr.update_subscription_data(self.topic, state.subscriber, data, version)
                return new
            except errors.BadVersionError:
                got = await self.mgr.read_subscription_data(self.topic, state.subscriber)
                if got is None:
                    raise errors.ClientNotSubscribedError(f"{state.subscriber!r} vanished") from None
                stored: int = got[0].state.msgId.localComponent
                current: Version = got[1]
                version = current
                if stored >= target:
                    log.info("consume pointer of %r/%r: stored %d is not older than %d; kept",
                             self.topic, state.subscriber, stored, target)
                    return current
                raise

        async with state.writing:
            version = state.version
            state.version = await cas_retry(step, retry_on=(errors.BadVersionError,))

    def persist_soon(self, sub: bytes) -> asyncio.Task[None] | None:
        """Persist ``sub``'s pointer in the background; the write loop in flight (None: nothing to write).

        A failure is logged (the task's exception is always retrieved); the
        pointer is written again at the next ``consume_interval`` or detach.
        """
        state = self.subs.get(sub)
        if state is None or (state.consumed <= state.persisted and not state.acks_dirty):
            return None
        return self._persister(state)

    async def persist(self, sub: bytes) -> None:
        """Persist ``sub``'s pointer as it is now; returns once it is stored. Metastore errors propagate."""
        state = self.subs.get(sub)
        if state is None:
            return
        while True:
            task = state.persisting            # a write in flight may be of an older pointer: wait for it
            if task is None or task.done():
                if state.consumed <= state.persisted and not state.acks_dirty:
                    return
                task = self._persister(state)
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise                      # this caller was cancelled
                # the background write was cancelled (the server is stopping): write from here

    def _persister(self, state: SubState) -> asyncio.Task[None]:
        task = state.persisting
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._persist_loop(state))
            state.persisting = task
            task.add_done_callback(functools.partial(self._persist_done, state))
        return task

    async def _persist_loop(self, state: SubState) -> None:
        """Write the newest pointer until the stored one has caught up with ``state.consumed``.

        A subscription with consumers writes again right after a write only
        when ``consume_interval`` more acks came meanwhile; fewer are left to
        the ack timer (``ack_persist_interval_ms``), so a steady stream of
        acks costs a write per ``consume_interval`` acks, not one per commit
        (``persist`` still writes everything: it asks again until clean).
        """
        first = True
        while state.consumed > state.persisted or state.acks_dirty:
            if not first and state.dispatcher is not None \
                    and state.consumes_since_persist < self.conf.consume_interval:
                self._arm_ack_timer(state)
                return
            first = False
            target = state.consumed
            state.consumes_since_persist = 0
            state.acks_dirty = False
            await self._write_pointer(state, target)
            state.persisted = max(state.persisted, target)

    def _persist_done(self, state: SubState, task: asyncio.Task[None]) -> None:
        if state.persisting is task:
            state.persisting = None
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.warning("could not persist consume pointer of %r/%r: %s", self.topic, state.subscriber, exc)
            d = state.dispatcher
            if d is not None and d.consumers and self.subs.get(state.subscriber) is state:
                # consumers still attached (not a release's or detach's last write): the acks it carried and
                # those that came meanwhile are tried again within ack_persist_interval_ms
                self._arm_ack_timer(state)
