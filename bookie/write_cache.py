"""The write cache of the entry storage (``bookie.storage``, steps 3 to 5 of its write path).

Synced entries wait in a dict keyed by their 16-byte storage key until a
checkpoint swaps it for an empty one (the swapped one stays readable until
the checkpoint is in LMDB); a checkpoint starts every ``flush_interval`` and once it holds
``CHECKPOINT_BYTES``. While a checkpoint runs and the cache is half
full again, the cache is full: adds wait here, unjournalled and in order,
at most ``max_throttle`` seconds, then fail with ``BookieServerError``.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from bookie.errors import BookieServerError
from bookie.journal import Position
from bookie.storage_core import Done

__all__ = ["CHECKPOINT_BYTES", "Throttled", "WriteCache"]

log = logging.getLogger(__name__)

CHECKPOINT_BYTES = 1 << 20
"""Cached payload bytes that start a checkpoint (at most half the cache): a burst of adds is checkpointed in
parts of ~8 000 small entries (~10 ms of the flush thread's CPU each) while it comes in, not in one part of
hundreds of thousands after it, whose CPU (on a busy machine, everybody's) stalls the adds of the next
second by tens of ms (issue 32). At a steady few thousand adds/s the ``flush_interval`` comes first."""

Throttled = tuple[bytes, bytes, Done, "asyncio.Future[None] | None", int, float]
"""An add waiting for room: (key, payload, done, future or ``None``, ledger id, deadline on the loop clock)."""


class WriteCache:
    """Synced entries not yet in LMDB, the part being checkpointed, and the adds waiting for room.

    ``nbytes`` counts the payloads in the cache, ``flushing_bytes`` those
    being checkpointed; ``position`` is the end of the journal the cache
    covers (a checkpoint of it may delete the journal files before).
    """

    def __init__(self, max_size: int, max_throttle: float, position: Position) -> None:
        self.half = max(max_size // 2, 1)
        self.checkpoint_bytes = min(self.half, CHECKPOINT_BYTES)
        """A checkpoint starts once the cache holds this much (``add_group`` says so)."""
        self.max_throttle = max_throttle
        self.entries: dict[bytes, bytes] = {}
        self.nbytes = 0
        self.position = position
        self.flushing: dict[bytes, bytes] | None = None
        self.flushing_bytes = 0
        self.flush_error: BaseException | None = None
        """Why the running checkpoint failed (it is retried), named when throttled adds fail."""
        self.throttled: collections.deque[Throttled] = collections.deque()
        self._throttle_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- entries -----------------------------------------------------------------------------

    def add_group(self, keys: list[bytes], values: list[bytes], nbytes: int, position: Position) -> bool:
        """A synced group's entries (journal up to ``position``); whether a checkpoint is due (``checkpoint_bytes``)."""
        self.entries.update(zip(keys, values, strict=True))
        self.nbytes += nbytes
        self.position = position
        return self.nbytes >= self.checkpoint_bytes

    def get(self, key: bytes) -> bytes | None:
        """The payload of a cached entry: the cache first, then the part being checkpointed."""
        found = self.entries.get(key)
        if found is None and self.flushing is not None:
            found = self.flushing.get(key)
        return found

    def keys(self) -> set[bytes]:
        """Every cached key (both parts)."""
        keys = set(self.entries)
        if self.flushing is not None:
            keys |= set(self.flushing)
        return keys

    @property
    def pending_bytes(self) -> int:
        """Payload bytes the next checkpoints will write."""
        return self.nbytes + self.flushing_bytes

    @property
    def full(self) -> bool:
        """Adds must wait: some already do, or a checkpoint runs and the cache is half full again."""
        return bool(self.throttled) or (self.flushing is not None and self.nbytes >= self.half)

    def swap(self) -> tuple[dict[bytes, bytes], Position]:
        """Start a checkpoint: the cache (and the journal position it covers) for an empty one."""
        assert self.flushing is None
        cache = self.flushing = self.entries
        self.flushing_bytes = self.nbytes
        self.entries = {}
        self.nbytes = 0
        return cache, self.position

    def flushed(self) -> None:
        """The swapped part is in LMDB."""
        self.flushing = None
        self.flushing_bytes = 0
        self.flush_error = None

    def corrupt_for_test(self, key: bytes) -> bool:
        """Flip the last byte of a cached entry (test hook); whether it was cached."""
        for cache in (self.entries, self.flushing or {}):
            payload = cache.get(key)
            if payload:
                cache[key] = payload[:-1] + bytes([payload[-1] ^ 0xFF])
                return True
        return False

    # --- back-pressure -----------------------------------------------------------------------

    def throttle(self, key: bytes, payload: bytes, done: Done, ledger_id: int,
                 fut: asyncio.Future[None] | None = None) -> None:
        """Hold an add until there is room (``take_throttled``) or ``max_throttle`` passes (it fails)."""
        loop = self._loop = self._loop or asyncio.get_running_loop()
        deadline = loop.time() + self.max_throttle
        self.throttled.append((key, payload, done, fut, ledger_id, deadline))
        if self._throttle_timer is None:
            self._throttle_timer = loop.call_at(deadline, self._throttle_expired)

    def _throttle_expired(self) -> None:
        self._throttle_timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        throttled = self.throttled
        reason = (f"write cache full: no room for {self.max_throttle:g} s while a checkpoint of "
                  f"{self.flushing_bytes} bytes ran")
        if self.flushing is not None and self.flush_error is not None:
            reason += f" (the checkpoint fails: {self.flush_error})"
        while throttled and throttled[0][5] <= now:
            _, _, done, fut, _, _ = throttled.popleft()
            _fail_waiter(done, fut, BookieServerError(reason))
        if throttled:
            self._throttle_timer = loop.call_at(throttled[0][5], self._throttle_expired)
        else:
            log.warning("%s; adds failed", reason)

    def take_throttled(self) -> collections.deque[Throttled]:
        """The adds waiting for room, in order (they are the caller's now)."""
        self._cancel_timer()
        throttled, self.throttled = self.throttled, collections.deque()
        return throttled

    def fail_throttled(self, exc: BookieServerError) -> None:
        """Fail every add waiting for room in the cache (never journalled)."""
        for _, _, done, fut, _, _ in self.take_throttled():
            _fail_waiter(done, fut, exc)

    def close(self) -> None:
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
            self._throttle_timer = None


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


def settle(fut: asyncio.Future[None]) -> Done:
    """A completion callback that completes ``fut`` (a throttled ``add_entry`` once it joins a group)."""
    def done(exc: BaseException | None) -> None:
        if not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)
    return done
