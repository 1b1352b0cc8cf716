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
import collections
import functools
from collections.abc import Callable
from typing import Protocol

from bookie import digest as digests
from bookie import protocol
from bookie.errors import BKError
from bookie.frame_answers import AddAcks

__all__ = ["AddCallback"]

_OK = protocol.OK

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
    _blocked: int
    _pending: collections.deque[_PendingAdd]
    _quorum: int
    last_add_confirmed: int

    def _on_response(self, addr: str, result: protocol.Response | BKError) -> None: ...


class _BookieAcks(AddAcks):
    """A writer's callback for the answers of one bookie, by address (a replaced bookie's answers are ignored).

    An OK answer is counted here, in one call per bookie answer (``ok``: the
    ack, the quorum, the in-order completion), the hot path of every add; any
    other answer or a lost connection goes to the writer's ``_on_response``.
    """

    __slots__ = ("addr", "writer")

    def __init__(self, writer: _Acked, addr: str) -> None:
        self.writer = writer
        self.addr = addr

    def __call__(self, result: protocol.Response | BKError) -> None:
        if isinstance(result, BKError) or result.status != _OK:
            self.writer._on_response(self.addr, result)
        else:
            self.ok(result.entry_id)

    def ok(self, entry_id: int) -> None:
        """An OK answer to the add of ``entry_id``: it counts if the bookie is still in the ensemble at an index
        not being replaced and the add was sent there; once ``quorum`` acknowledged it and every earlier add
        completed, it completes (then the later ones already done), in entry-id order."""
        writer = self.writer
        idx = writer._index_of.get(self.addr)
        if idx is None:
            return  # a bookie replaced since
        bit = 1 << idx
        if writer._blocked & bit:
            return
        pending = writer._pending
        if not pending:
            return
        head = pending[0]
        i = entry_id - head.entry_id
        if i < 0 or i >= len(pending):
            return
        p = pending[i] if i else head
        if not p.sent & bit:
            return
        p.acked |= bit
        if p.done or p.acked.bit_count() < writer._quorum:
            return
        p.done = True
        if p is not head:
            return
        while True:   # complete in order (a callback may add, or fail the writer: that empties ``pending``)
            pending.popleft()
            writer.last_add_confirmed = entry_id = p.entry_id
            fut = p.future
            if fut is not None and not fut.done():
                fut.set_result(entry_id)
            if p.callback is not None:
                p.callback(entry_id, None)
            if not pending:
                return
            p = pending[0]
            if not p.done:
                return


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
