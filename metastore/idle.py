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
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["IDLE"]


class _IdleDeque(collections.deque):  # type: ignore[type-arg]
    __slots__ = ()

    def append(self, item: Any) -> None:
        raise AssertionError("appended to the shared idle deque (metastore.idle.IDLE)")

    appendleft = extend = extendleft = append


IDLE: collections.deque[Any] = _IdleDeque()
"""The shared empty deque (see the module docstring)."""
