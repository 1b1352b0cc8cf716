"""Background tasks kept alive until they end: the one spawn-and-keep-a-reference helper.

asyncio keeps only a weak reference to a task, so a task nobody holds may be
garbage-collected before it finishes. Every owner of background work keeps
its tasks in a set; these two functions add a task to such a set and drop it
again when it is done::

    from metastore.tasks import keep, spawn

    self._tasks: set[asyncio.Task[Any]] = set()
    spawn(self._tasks, self._heartbeat(), name="heartbeat")   # create, keep, forget when done
    keep(self._tasks, some_task)                              # keep a task made elsewhere
    for task in list(self._tasks): task.cancel()              # the owner's stop

It lives in ``metastore`` (a leaf package) so that ``metastore``, ``bookie``
and ``hub`` share it without importing one another. Failure: none here; a
task's own exception stays with the task (retrieve it, or asyncio logs it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["keep", "spawn"]

T = TypeVar("T")


def keep(tasks: set[asyncio.Task[Any]], task: asyncio.Task[T]) -> asyncio.Task[T]:
    """Hold ``task`` in ``tasks`` until it is done; returns ``task``. Keeping a task already held does nothing
    (a write loop handed out again per request gets one done callback, not one per request)."""
    if task not in tasks:
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    return task


def spawn(tasks: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, T], *,
          name: str | None = None) -> asyncio.Task[T]:
    """Start ``coro`` as a task on the running loop and hold it in ``tasks`` until it is done.

    ``RuntimeError`` when no loop is running (as ``asyncio.create_task``).
    """
    return keep(tasks, asyncio.get_running_loop().create_task(coro, name=name))
