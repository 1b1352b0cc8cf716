"""Compare-and-set retries: the one helper for every read-modify-write of metadata.

A read-modify-write reads a record, computes the new one and writes it with
the version it read; when another writer got there first the write fails with
``BadVersionError`` (or ``KeyExistsError`` for a create) and the whole step
is tried again after a short, jittered, growing pause::

    from metastore.cas import cas_retry, update_record

    async def bump() -> int:
        cur = await table.get("ledger")
        n = int(cur.value["next"]) + 1
        await table.put("ledger", Value({"next": str(n).encode()}), cur.version)
        return n

    n = await cas_retry(bump)                  # bounded attempts, jittered backoff

    # or, for one record: ``update`` gets the current record (None if missing)
    # and returns the fields to write (None: leave the record as it is)
    versioned = await update_record(table, "k", lambda cur: Value({"n": b"1"}))

Failure: after ``attempts`` conflicting tries the last ``BadVersionError`` /
``KeyExistsError`` is raised; any other error is raised at once.
``cas_retry_sync`` is the same for code that runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from metastore.api import MetastoreTable, Value, Version, Versioned
from metastore.errors import BadVersionError, KeyExistsError, NoKeyError

__all__ = ["ANY_ATTEMPTS", "CAS_CONFLICTS", "DEFAULT_ATTEMPTS", "cas_retry", "cas_retry_sync", "update_record"]

T = TypeVar("T")

#: The errors that mean "someone else wrote first": worth reading again and retrying.
CAS_CONFLICTS: tuple[type[Exception], ...] = (BadVersionError, KeyExistsError)
DEFAULT_ATTEMPTS = 50
#: Tries for an unconditional (``Version.ANY``) put that a backend implements as read-then-CAS.
#: The caller asked for no version check, so the put must win eventually: jittered backoff
#: spreads the contenders out, and this count (with ``DEFAULT_MAX_DELAY`` between tries, over
#: a minute of solid contention) is never what ends it in practice; the backend's operation
#: timeout is. Never use it for a caller's own read-modify-write.
ANY_ATTEMPTS = 1000
DEFAULT_FIRST_DELAY = 0.001
DEFAULT_MAX_DELAY = 0.1


def _check(attempts: int) -> None:
    if attempts < 1:
        raise ValueError("attempts must be >= 1")


def _pause(attempt: int, first_delay: float, max_delay: float) -> float:
    """Seconds to wait after failed try number ``attempt`` (1, 2, ...): uniform in [0, first_delay * 2^(n-1)],
    capped at ``max_delay`` (full jitter)."""
    return random.uniform(0, min(max_delay, first_delay * 2 ** min(attempt - 1, 60)))


async def cas_retry(step: Callable[[], Awaitable[T]], *, attempts: int = DEFAULT_ATTEMPTS,
                    first_delay: float = DEFAULT_FIRST_DELAY, max_delay: float = DEFAULT_MAX_DELAY,
                    retry_on: tuple[type[Exception], ...] = CAS_CONFLICTS) -> T:
    """Run ``step`` until it returns without a CAS conflict; at most ``attempts`` times.

    ``step`` must do the whole read-modify-write (read again on every try).
    Raises the last conflict after ``attempts`` tries, any other error at once.
    A plain loop, not a retry library: a hub runs one per topic it acquires,
    and each retry object left a reference cycle for the collector (issue 34).
    """
    _check(attempts)
    attempt = 1
    while True:
        try:
            return await step()
        except retry_on:
            if attempt >= attempts:
                raise
        await asyncio.sleep(_pause(attempt, first_delay, max_delay))
        attempt += 1


def cas_retry_sync(step: Callable[[], T], *, attempts: int = DEFAULT_ATTEMPTS,
                   first_delay: float = DEFAULT_FIRST_DELAY, max_delay: float = DEFAULT_MAX_DELAY,
                   retry_on: tuple[type[Exception], ...] = CAS_CONFLICTS) -> T:
    """``cas_retry`` for blocking code (backends that talk to their store from a worker thread)."""
    _check(attempts)
    attempt = 1
    while True:
        try:
            return step()
        except retry_on:
            if attempt >= attempts:
                raise
        time.sleep(_pause(attempt, first_delay, max_delay))
        attempt += 1


async def update_record(table: MetastoreTable, key: str,
                        update: Callable[[Versioned | None], Value | None], *,
                        attempts: int = DEFAULT_ATTEMPTS) -> Versioned | None:
    """Read ``key``, apply ``update`` and write the result by CAS, retrying on conflicts.

    ``update(current)`` gets the current record (``None`` when the key is
    missing) and returns the fields to write (merged as ``put`` merges) or
    ``None`` to leave the record alone. Returns the record as written (the
    merged fields and the new version), the unchanged current record when
    ``update`` returned ``None``, or ``None`` when the key is missing and
    stays so. ``update`` may run several times; keep it free of side effects.
    """

    async def step() -> Versioned | None:
        try:
            current: Versioned | None = await table.get(key)
        except NoKeyError:
            current = None
        fields = update(current)
        if fields is None:
            return current
        version = await table.put(key, fields, Version.NEW if current is None else current.version)
        base = current.value if current is not None else Value()
        return Versioned(base.merged(fields), version)

    return await cas_retry(step, attempts=attempts)
