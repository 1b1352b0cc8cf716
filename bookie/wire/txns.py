"""``TxnTable``: one connection's outstanding requests, keyed by txn id.

Both clients number their requests the same way (1, 2, ... wrapping at
2**64, never 0: a server answers an undecodable frame with txn id 0) and
keep a value per outstanding request until its response, timeout or the
connection's end. The protocols differ only in what they do with a
response: ``bookie.protocol.PendingRequests`` checks the op and treats a
stray response as a protocol error, ``hub.protocol.ClientConnection``
ignores answers to requests it gave up on. Both build on this table.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["TXN_ID_MASK", "TxnTable"]

V = TypeVar("V")

TXN_ID_MASK = 0xFFFFFFFFFFFFFFFF    # txn ids are uint64 on both wires


class TxnTable(Generic[V]):
    """Outstanding requests: ``txn id -> value``."""

    __slots__ = ("_next", "_pending")

    def __init__(self) -> None:
        self._pending: dict[int, V] = {}
        self._next = 0

    def next_txn_id(self) -> int:
        """The next txn id (1 .. 2**64-1, then 1 again); not remembered."""
        self._next = (self._next + 1) & TXN_ID_MASK or 1
        return self._next

    def take(self, value: V) -> int:
        """Remember ``value`` under the next txn id not outstanding; return that id."""
        pending = self._pending
        txn_id = self.next_txn_id()
        while txn_id in pending:      # after 2**64 requests: skip ids still outstanding
            txn_id = self.next_txn_id()
        pending[txn_id] = value
        return txn_id

    def forget(self, txn_id: int) -> V | None:
        """Drop one request (answered, or given up on); its value, or ``None`` when not outstanding."""
        return self._pending.pop(txn_id, None)

    def drain_values(self) -> list[V]:
        """Forget every request (the connection is gone) and return their values."""
        values = list(self._pending.values())
        self._pending.clear()
        return values

    def values(self) -> list[V]:
        """The values of the requests outstanding (still remembered)."""
        return list(self._pending.values())

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, txn_id: object) -> bool:
        return txn_id in self._pending

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._pending))
