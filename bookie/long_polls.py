"""The bookie's parked long-poll READ_LACs, without I/O (``bookie.protocol``).

    polls = LongPolls(max_per_connection, max_per_ledger)
    parked = polls.park(conn, request, now)     # None: over a limit, answer TOO_MANY_REQUESTS
    polls.lac_rose(ledger_id, lac); polls.expire(parked); polls.drop(conn); polls.take_all()

Importers use ``bookie.protocol``, which hands these names on.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Generic, Protocol, TypeVar

from bookie.messages import (
    Request,
)

K = TypeVar("K")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class ParkedRead(Generic[K]):
    """A long-poll READ_LAC waiting at the bookie: its connection, request and deadline (loop time).

    ``timer`` is the shell's to use (the handle of the call that answers it at
    the deadline).
    """

    __slots__ = ("conn", "deadline", "request", "timer")

    def __init__(self, conn: K, request: Request, deadline: float) -> None:
        self.conn = conn
        self.request = request
        self.deadline = deadline
        self.timer: Cancellable | None = None

    @property
    def ledger_id(self) -> int:
        return self.request.ledger_id

    def __repr__(self) -> str:
        return (f"<ParkedRead ledger={self.request.ledger_id} after={self.request.previous_lac} "
                f"deadline={self.deadline:.3f}>")


DEFAULT_MAX_LONG_POLLS_PER_CONNECTION = 1000
DEFAULT_MAX_LONG_POLLS_PER_LEDGER = 16


class LongPolls(Generic[K]):
    """The bookie's parked long-poll READ_LACs, without I/O; ``K`` is whatever names a connection.

    ``park(conn, request, now)`` parks a request (its deadline is ``now`` plus
    its ``timeout_ms``) and returns the ``ParkedRead``, or ``None`` when the
    connection already parks ``max_per_connection`` requests, or
    ``max_per_ledger`` for that ledger (the shell answers TOO_MANY_REQUESTS).
    ``lac_rose(ledger_id, lac)`` removes and returns the reads of that ledger
    that waited for a LAC below ``lac`` (answer them); ``expire(parked)`` removes
    one at its deadline (True: it was still parked, answer it); ``drop(conn)``
    forgets a lost connection's reads; ``take_all()`` empties the set
    (shutdown). Each request parked counts as in flight on its connection
    until one of those returns it (the shell's ``request_started`` and
    ``request_finished``).
    """

    __slots__ = ("_by_conn", "_by_ledger", "_per_conn_ledger", "max_per_connection", "max_per_ledger")

    def __init__(self, max_per_connection: int = DEFAULT_MAX_LONG_POLLS_PER_CONNECTION,
                 max_per_ledger: int = DEFAULT_MAX_LONG_POLLS_PER_LEDGER) -> None:
        if max_per_connection <= 0 or max_per_ledger <= 0:
            raise ValueError("long-poll limits must be positive")
        self.max_per_connection = max_per_connection
        self.max_per_ledger = max_per_ledger
        self._by_ledger: dict[int, dict[ParkedRead[K], None]] = {}
        self._by_conn: dict[K, dict[ParkedRead[K], None]] = {}
        self._per_conn_ledger: dict[tuple[K, int], int] = {}

    def __len__(self) -> int:
        return sum(len(reads) for reads in self._by_conn.values())

    def watched(self, ledger_id: int) -> bool:
        """Whether a read waits on ``ledger_id`` (the shell's cheap test on every LAC rise)."""
        return ledger_id in self._by_ledger

    @property
    def watched_ledgers(self) -> Container[int]:
        """A live view: ``ledger_id in polls.watched_ledgers`` is ``watched(ledger_id)`` without a call."""
        return self._by_ledger.keys()

    def parked_by(self, conn: K) -> int:
        return len(self._by_conn.get(conn, ()))

    def park(self, conn: K, request: Request, now: float) -> ParkedRead[K] | None:
        """Park ``request``; ``None`` when ``conn`` is at a limit (nothing parked)."""
        ledger_id = request.ledger_id
        mine = self._by_conn.get(conn)
        if mine is not None and len(mine) >= self.max_per_connection:
            return None
        key = (conn, ledger_id)
        if self._per_conn_ledger.get(key, 0) >= self.max_per_ledger:
            return None
        parked = ParkedRead(conn, request, now + request.timeout_ms / 1000.0)
        if mine is None:
            mine = self._by_conn[conn] = {}
        mine[parked] = None
        self._by_ledger.setdefault(ledger_id, {})[parked] = None
        self._per_conn_ledger[key] = self._per_conn_ledger.get(key, 0) + 1
        return parked

    def lac_rose(self, ledger_id: int, lac: int) -> list[ParkedRead[K]]:
        """Remove and return the reads of ``ledger_id`` waiting for a LAC above theirs, now below ``lac``."""
        waiting = self._by_ledger.get(ledger_id)
        if not waiting:
            return []
        due = [p for p in waiting if p.request.previous_lac < lac]
        for p in due:
            self._forget(p)
        return due

    def expire(self, parked: ParkedRead[K]) -> bool:
        """Remove ``parked`` (its deadline passed); False when it was answered or dropped already."""
        waiting = self._by_ledger.get(parked.ledger_id)
        if waiting is None or parked not in waiting:
            return False
        self._forget(parked)
        return True

    def drop(self, conn: K) -> list[ParkedRead[K]]:
        """Forget every read of ``conn`` (the connection is gone) and return them."""
        reads = list(self._by_conn.get(conn, ()))
        for p in reads:
            self._forget(p)
        return reads

    def take_all(self) -> list[ParkedRead[K]]:
        """Remove and return every parked read (the bookie is stopping: answer them)."""
        reads = [p for waiting in self._by_ledger.values() for p in waiting]
        self._by_ledger.clear()
        self._by_conn.clear()
        self._per_conn_ledger.clear()
        return reads

    def _forget(self, p: ParkedRead[K]) -> None:
        ledger_id = p.ledger_id
        waiting = self._by_ledger[ledger_id]
        del waiting[p]
        if not waiting:
            del self._by_ledger[ledger_id]
        mine = self._by_conn[p.conn]
        del mine[p]
        if not mine:
            del self._by_conn[p.conn]
        key = (p.conn, ledger_id)
        left = self._per_conn_ledger[key] - 1
        if left:
            self._per_conn_ledger[key] = left
        else:
            del self._per_conn_ledger[key]
