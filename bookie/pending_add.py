"""What a ledger writer keeps per add in flight, and what writers of one shape share.

``_PendingAdd`` is one add of ``bookie.writer.LedgerWriter`` not yet
completed (the payload and the bit masks of the bookies it was sent to and
acknowledged by); the caches below hold what derives from a ledger's shape
and password only, so a client's many writers (a hub's topics) share one
copy: the master key, the entry encoder, an ensemble's index and each
entry's write set.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Protocol

from bookie import digest as digests
from bookie import protocol
from bookie.errors import BKError
from bookie.frame_answers import AddAcks

__all__ = ["AddCallback"]

AddCallback = Callable[[int, BKError | None], None]
"""``callback(entry_id, error)``: ``error`` is ``None`` once the entry is acknowledged."""


class _PendingAdd:
    """One add in flight: masks are over indexes of the current ensemble."""

    __slots__ = ("acked", "callback", "data_length", "done", "entry_id", "future", "ledger_length",
                 "payload", "request", "sent", "started")

    def __init__(self, entry_id: int, payload: bytes, ledger_length: int, data_length: int, started: float,
                 future: asyncio.Future[int] | None, callback: AddCallback | None) -> None:
        self.entry_id = entry_id
        self.payload = payload
        self.ledger_length = ledger_length
        self.data_length = data_length
        self.started = started
        self.future = future
        self.callback = callback
        self.request = b""  # a large add's ADD_ENTRY, encoded once for every bookie (``_send``)
        self.acked = 0
        self.sent = 0
        self.done = False


class _Acked(Protocol):
    """What ``_BookieAcks`` needs of its writer (``bookie.writer.LedgerWriter``)."""

    _index_of: dict[str, int]

    def _acked(self, idx: int, entry_id: int) -> None: ...

    def _on_response(self, addr: str, result: protocol.Response | BKError) -> None: ...


class _BookieAcks(AddAcks):
    """A writer's callback for the answers of one bookie, by address (a replaced bookie's answers are ignored)."""

    __slots__ = ("addr", "writer")

    def __init__(self, writer: _Acked, addr: str) -> None:
        self.writer = writer
        self.addr = addr

    def __call__(self, result: protocol.Response | BKError) -> None:
        self.writer._on_response(self.addr, result)

    def ok(self, entry_id: int) -> None:
        """An OK answer to the add of ``entry_id`` (from a frame's all-OK answer: no ``Response``)."""
        writer = self.writer
        idx = writer._index_of.get(self.addr)
        if idx is not None:
            writer._acked(idx, entry_id)


_NO_BOOKIES: frozenset[str] = frozenset()


# a client's ledgers mostly share their shape and password: their writers share what derives from them
_master_key = functools.lru_cache(maxsize=64)(digests.master_key)
_encoder = functools.lru_cache(maxsize=64)(digests.entry_encoder)


@functools.lru_cache(maxsize=256)
def _ensemble_index(ensemble: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, int]]:
    """An ensemble and each bookie's index in it: shared by the writers of that ensemble (never changed)."""
    return ensemble, {addr: i for i, addr in enumerate(ensemble)}


@functools.lru_cache(maxsize=64)
def _write_sets(ensemble_size: int, write_quorum: int) -> tuple[tuple[int, ...], ...]:
    """The write set of each entry id modulo ``ensemble_size`` (shared by every writer of that shape)."""
    return tuple(tuple((e + i) % ensemble_size for i in range(write_quorum)) for e in range(ensemble_size))
