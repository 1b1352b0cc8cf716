"""The back-pressure of the write cache in the entry storage (``bookie.storage``).

Synced entries wait in a dict (and the one being checkpointed) until their
checkpoint; while a checkpoint runs and the cache is half full again, adds
wait here, unjournalled and in order, at most ``max_throttle`` seconds.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from crc32c import crc32c

from bookie import journal
from bookie.errors import (
    BookieServerError,
)
from bookie.storage_core import (
    _HEADER_PACK,
    Done,
    StorageCore,
)

__all__ = ["WriteCache"]

log = logging.getLogger(__name__)

_ADD_KIND = bytes([journal.ADD])


class WriteCache(StorageCore):
    """The write cache's back-pressure in ``EntryStorage`` (step 5 of its write path)."""

    def _throttle(self, key: bytes, payload: bytes, done: Done, ledger_id: int) -> None:
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        deadline = loop.time() + self._max_throttle
        self._throttled.append((key, payload, done, None, ledger_id, deadline))
        if self._throttle_timer is None:
            self._throttle_timer = loop.call_at(deadline, self._throttle_expired)

    def _throttle_expired(self) -> None:
        self._throttle_timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        throttled = self._throttled
        reason = (f"write cache full: no room for {self._max_throttle:g} s while a checkpoint of "
                  f"{self._flushing_bytes} bytes ran")
        flushing = self._flushing
        if flushing is not None and flushing.error is not None:
            reason += f" (the checkpoint fails: {flushing.error})"
        while throttled and throttled[0][5] <= now:
            _, _, done, fut, _, _ = throttled.popleft()
            _fail_waiter(done, fut, BookieServerError(reason))
        if throttled:
            self._throttle_timer = loop.call_at(throttled[0][5], self._throttle_expired)
        else:
            log.warning("%s; adds failed", reason)

    def _fail_throttled(self, exc: BookieServerError) -> None:
        """Fail every add waiting for room in the cache (never journalled)."""
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
            self._throttle_timer = None
        throttled, self._throttled = self._throttled, collections.deque()
        for _, _, done, fut, _, _ in throttled:
            _fail_waiter(done, fut, exc)

    def _release_throttled(self) -> None:
        """Room in the cache: the waiting adds join the open group, in order."""
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
            self._throttle_timer = None
        throttled, self._throttled = self._throttled, collections.deque()
        if not throttled:
            return
        batch = self._batch or self._open_batch()
        batch.run_sink = None
        for key, payload, done, fut, ledger_id, _ in throttled:
            head = _ADD_KIND + key
            batch.parts += (_HEADER_PACK(17 + len(payload), crc32c(payload, crc32c(head))), head, payload)
            batch.keys.append(key)
            batch.values.append(payload)
            batch.dirty.add(ledger_id)
            entry_id = int.from_bytes(key[8:], "big")
            if entry_id > batch.last.get(ledger_id, -1):
                batch.last[ledger_id] = entry_id
            if fut is None:
                batch.waiters.append(done)
            else:  # futures complete after the callbacks: keep the order with a callback of its own
                batch.waiters.append(_settle(fut))


def _fail_waiter(done: Done, fut: asyncio.Future[None] | None, exc: BookieServerError) -> None:
    """Fail one add that never reached the journal: its future if it has one, else its callback."""
    if fut is not None:
        if not fut.done():
            fut.set_exception(exc)
        return
    try:
        done(exc)
    except Exception:
        log.exception("entry storage completion callback raised")


def _settle(fut: asyncio.Future[None]) -> Done:
    def done(exc: BaseException | None) -> None:
        if not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)
    return done
