"""The add pipeline of one ledger: quorum tracking, in-order completion, ensemble change, close.

    writer = LedgerWriter(ctx, ledger_id, metadata, version, password)
    entry_id = await writer.add(b"payload")                  # a future per add
    last_id = await writer.add_many([b"a", b"b"])            # one future for the batch
    writer.submit(b"payload", callback)                      # callback(entry_id, error): no future at all
    metadata, version = await writer.close()                 # drain, then close by CAS

Entry ``e`` goes to the ``write_quorum`` bookies ``e, e+1, ... mod E`` of
the current ensemble and completes once ``quorum`` of them acknowledged it
(``ack_quorum``; ``write_quorum`` for a recovery writer), in entry-id order:
``last_add_confirmed`` is the highest entry below which everything is
acknowledged. Sends to one bookie in one loop turn leave in one
``writelines`` (``BookieConnection.submit``).

Cost per add: the entry (payload and one small record with bit masks for
the bookies it was sent to and acknowledged by), one request per bookie,
and the caller's future if it asked for one. There is no timer per add: one
timer per ledger watches the oldest pending add, a place in the client's
wheel (``bookie.add_timers``: no loop timer of its own; an idle writer holds
none).

Failure detection (BookKeeper's two add timeouts): a bookie this writer
waits on counts as failed once its connection has had adds outstanding for
``add_entry_timeout`` without answering any (of any ledger;
``BookieConnection.add_silence``): a bookie that stopped answering (a
cut-off host, a stopped or hung process) is noticed in about
``add_entry_timeout``, one that answers slowly (fsync or link latency, a
queue under load) is waited for. The timer looks again (to a tick of the wheel) when a
bookie would have been silent that long. Its connection is dropped
from the pool (``BookieConnectionPool.drop``), so every other user fails
over at once and the next ledger opens a fresh connection. An add that has
not reached its ack quorum after ``add_entry_quorum_timeout`` (ensemble
changes included) fails with ``bookie.errors.TimeoutError``, and so does
every later add. When this process's own loop was stalled past the
timer's deadline (replies may sit unread in the socket), the check is made
again shortly after, once they were read.

A failed bookie (error status, lost connection, timeout) is replaced: the
placement policy picks a replacement, the new segment starting after
``last_add_confirmed`` is recorded in the ledger metadata by
compare-and-set (``LedgerMetadataManager.update``), and what is pending is
re-sent. Adds fail only when no replacement exists
(``NotEnoughBookiesError``; but see below), when the ledger was fenced
(``LedgerFencedError``) or the password is wrong (``UnauthorizedError``);
every pending and later add then fails with that error. An entry larger
than ``max_entry_size`` is refused up front (``EntryTooLargeError``) and
the writer stays usable.

Delayed ensemble change (client key ``delay_ensemble_change``): adds go on
to the rest of the ensemble while no replacement exists, as long as the ack
quorum holds (see ``bookie.ensemble_change``).

Explicit LAC (BookKeeper's ``explicitLacInterval``): see ``bookie.explicit_lac``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Sequence

from bookie import digest as digests
from bookie import errors, protocol, tracing
from bookie.connection import FLUSH_BYTES, BookieConnection
from bookie.context import ClientContext
from bookie.ensemble_change import new_segment, quorum_reachable, write_new_segment
from bookie.errors import (
    BKError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    NotEnoughBookiesError,
)
from bookie.explicit_lac import ExplicitLac
from bookie.metadata import LedgerMetadata, close_ledger
from bookie.pending_add import (
    _NO_BOOKIES,
    AddCallback,
    _BookieAcks,
    _encoder,
    _ensemble_index,
    _master_key,
    _PendingAdd,
    _write_sets,
)
from metastore import Version
from metastore.idle import IDLE, IDLE_DICT, VersionSlot

log = logging.getLogger(__name__)

__all__ = ["AddCallback", "LedgerWriter"]

_OK = protocol.OK
_FATAL = frozenset({protocol.FENCED, protocol.UNAUTHORIZED})
_LARGE_ADD = FLUSH_BYTES
"""An add this large goes alone as an ADD_ENTRY (``BookieConnection.submit_entry``): encoded here, once."""
_LOOP_LAG = 0.1  # seconds a timer may run late before the add timeout check waits for unread replies


@functools.lru_cache(maxsize=16)
def _seconds(ms: int) -> float:
    """``ms`` in seconds, one float shared by every writer of a client (issue 34: 24 bytes a writer)."""
    return ms / 1000.0


class LedgerWriter(ExplicitLac):
    """See the module docstring. ``recovery=True`` writes recovery adds (they pass a fence).

    Slots, immutable (shared) sets of bookies being replaced, no queue of adds or callbacks once idle
    (dropped at the add timer's next look) and the metadata kept serialized (``metadata`` decodes a copy: a
    parsed ``LedgerMetadata`` with its lists and properties held about 600 bytes, its encoding about 170): a
    hub keeps a writer open per topic, most of them idle (issue 34).
    """

    __slots__ = ("_blocked", "_callbacks", "_change_task", "_closing", "_connecting", "_conns", "_ctx", "_delay",
                 "_delayed", "_digest", "_encode", "_ensemble", "_error", "_index_of", "_lag_rechecked", "_ledger",
                 "_loop", "_master_key", "_max_entry", "_md", "_password", "_pending", "_quorum", "_quorum_timeout",
                 "_recovery", "_replacing", "_retry_timer", "_sealed", "_timeout", "_timer_due", "_timer_slot",
                 "_to_replace", "_version", "_write_sets", "last_add_confirmed", "ledger_id", "length",
                 "next_entry_id")

    def __init__(self, ctx: ClientContext, ledger_id: int, metadata: LedgerMetadata, version: Version,
                 password: bytes, *, recovery: bool = False, last_add_confirmed: int = -1, length: int = 0,
                 encoded: bytes | None = None) -> None:
        self._ctx = ctx
        self.ledger_id = ledger_id
        if encoded is None:
            self.metadata = metadata      # kept serialized (``_md``), its CLOSED state in ``_sealed``
        else:                             # ``metadata.encode()``, which the caller has already
            self._md = encoded
            self._sealed = metadata.is_closed
        self.version = version
        self._password = bytes(password)
        self._master_key = _master_key(self._password)
        self._digest = digests.digest_type_of(metadata.digest)
        self._encode = _encoder(self._digest, self._password)
        self._ledger = protocol.AddBodies(ledger_id, self._master_key, recovery=recovery)
        self._recovery = recovery
        self._quorum = metadata.write_quorum if recovery else metadata.ack_quorum
        self._timeout = ctx.conf.add_entry_timeout
        self._quorum_timeout = ctx.conf.add_entry_quorum_timeout
        self._max_entry = ctx.conf.max_entry_size
        self.last_add_confirmed = last_add_confirmed
        self.length = length
        self.next_entry_id = last_add_confirmed + 1
        self._pending: collections.deque[_PendingAdd] = IDLE   # a deque of its own while adds are pending
        self._to_replace: frozenset[str] = _NO_BOOKIES
        self._replacing: frozenset[str] = _NO_BOOKIES
        self._delayed: frozenset[str] = _NO_BOOKIES  # failed, no replacement, ack quorum reachable without
        self._delay = ctx.conf.delay_ensemble_change and not recovery
        self._retry_timer: asyncio.TimerHandle | None = None
        self._blocked = 0  # ensemble indexes being replaced: no sends, acks ignored
        self._change_task: asyncio.Task[None] | None = None
        self._connecting: dict[str, asyncio.Task[None]] = IDLE_DICT   # a dict of its own while connecting
        self._timer_slot = 0   # the slot of the add timer in the client's wheel (``ctx.add_timers``); 0: none
        self._timer_due = 0.0
        self._lag_rechecked = False
        self._error: BKError | None = None
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self._lac_interval = 0.0 if recovery else _seconds(ctx.conf.explicit_lac_interval)
        self._lac_sent = last_add_confirmed  # the highest LAC the bookies were sent (piggybacked or explicit)
        self._last_add_at = 0.0               # loop time of the last add submitted
        self._lac_due = 0.0   # the LAC check's time in the client's wheel (``ctx.lac_timers``); 0.0: none
        self._use_ensemble(metadata)

    # --- state ------------------------------------------------------------------------------------
    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger's metadata as this writer last wrote or was given it: a copy, decoded at each read."""
        return LedgerMetadata.decode(self._md)

    @metadata.setter
    def metadata(self, md: LedgerMetadata) -> None:
        self._md = md.encode()
        self._sealed = md.is_closed

    version = VersionSlot()
    """The metadata record's version (the CAS of the writer's next metadata write)."""

    @property
    def metadata_wire(self) -> bytes:
        """``metadata`` serialized (``LedgerMetadata.encode``): the same bytes object until it changes."""
        return self._md

    @property
    def is_closed(self) -> bool:
        """Whether the metadata says CLOSED (no decoding)."""
        return self._sealed
    @property
    def error(self) -> BKError | None:
        """The error that ended this writer, if one did."""
        return self._error

    @property
    def pending(self) -> int:
        """Adds submitted and not yet completed."""
        return len(self._pending)

    def acked_length(self) -> int:
        """The ledger length up to ``last_add_confirmed``."""
        return self.length - sum(p.data_length for p in self._pending)

    def _use_ensemble(self, md: LedgerMetadata | None = None) -> None:
        md = md if md is not None else self.metadata
        size = md.ensemble_size
        self._ensemble, self._index_of = _ensemble_index(tuple(md.current_ensemble))
        self._write_sets = _write_sets(size, md.write_quorum)
        self._conns: list[BookieConnection | None] = [None] * size
        self._callbacks: list[_BookieAcks] | None = None   # built by _send
        self._blocked = 0
        for addr in self._replacing | self._to_replace | self._delayed:
            idx = self._index_of.get(addr)
            if idx is not None:
                self._blocked |= 1 << idx

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._sealed or self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed for adds")

    def _check_size(self, data: bytes) -> None:
        if len(data) > self._max_entry:
            raise EntryTooLargeError(f"entry of {len(data)} bytes for ledger {self.ledger_id} exceeds "
                                     f"max_entry_size {self._max_entry}")

    # --- adding -----------------------------------------------------------------------------------
    def submit(self, data: bytes, callback: AddCallback | None = None,
               future: asyncio.Future[int] | None = None) -> int:
        """Start adding ``data``; return its entry id. ``callback``/``future`` learn the outcome.

        Raises at once (nothing sent): ``EntryTooLargeError`` over
        ``max_entry_size``, ``LedgerClosedError`` when closed or closing,
        the writer's error once it failed.
        """
        if self._error is not None or self._closing or self._sealed:
            self._check_writable()
        size = len(data)
        if size > self._max_entry:
            self._check_size(data)
        entry_id = self.next_entry_id
        self.next_entry_id = entry_id + 1
        length = self.length = self.length + size
        lac = self._lac_sent = self.last_add_confirmed  # piggybacked on this add
        payload = self._encode(self.ledger_id, entry_id, lac, length, data)
        now = self._last_add_at = self._loop.time()
        if not self._lac_due and self._lac_interval:
            self._ctx.lac_timers.arm(self, now + self._lac_interval)
        p = _PendingAdd(entry_id, payload, length, size, now, future, callback)
        pending = self._pending
        if pending is IDLE:
            pending = self._pending = collections.deque()
        pending.append(p)  # ``_enqueue`` inlined: the add path
        if not self._timer_slot:
            self._arm_timer(now + min(self._timeout, self._quorum_timeout or self._timeout))
        self._send(p)
        return entry_id

    def add(self, data: bytes) -> asyncio.Future[int]:
        """``submit`` with a future for the entry id (raises as ``submit`` does)."""
        fut: asyncio.Future[int] = self._loop.create_future()
        self.submit(data, future=fut)
        return fut

    def add_many(self, items: Sequence[bytes]) -> asyncio.Future[int]:
        """Submit every item, pipelined; one future for the id of the last (-1 for none).

        Sizes are checked first: an oversized item refuses the whole batch.
        """
        self._check_writable()
        for data in items:
            self._check_size(data)
        fut: asyncio.Future[int] = self._loop.create_future()
        if not items:
            fut.set_result(self.last_add_confirmed)
            return fut
        for data in items[:-1]:
            self.submit(data)
        self.submit(items[-1], future=fut)
        return fut

    def resend(self, entry_id: int, payload: bytes, ledger_length: int) -> asyncio.Future[int]:
        """Re-write an already encoded entry (recovery): it must be the next entry id."""
        self._check_writable()
        if entry_id != self.next_entry_id:
            raise ValueError(f"ledger {self.ledger_id}: resend of {entry_id}, expected {self.next_entry_id}")
        self.next_entry_id = entry_id + 1
        self.length = ledger_length
        fut: asyncio.Future[int] = self._loop.create_future()
        self._enqueue(_PendingAdd(entry_id, payload, ledger_length, len(payload), self._loop.time(), fut, None))
        return fut

    def _enqueue(self, p: _PendingAdd) -> None:
        if self._pending is IDLE:
            self._pending = collections.deque()
        self._pending.append(p)
        if not self._timer_slot:
            self._arm_timer(p.started + min(self._timeout, self._quorum_timeout or self._timeout))
        self._send(p)

    def _send(self, p: _PendingAdd) -> None:
        callbacks = self._callbacks
        if callbacks is None:   # one per bookie of the ensemble while adds are pending (dropped when idle)
            callbacks = self._callbacks = [_BookieAcks(self, addr) for addr in self._ensemble]
        skip = p.acked | p.sent | self._blocked
        conns, ledger, entry_id, payload = self._conns, self._ledger, p.entry_id, p.payload
        small = len(payload) < _LARGE_ADD or (tracing.WATCHED and (self.ledger_id, entry_id) in tracing.WATCHED)
        for idx in self._write_sets[entry_id % len(conns)]:
            bit = 1 << idx
            if skip & bit:
                continue
            conn = conns[idx]
            if conn is None or conn.is_closed:
                conn = conns[idx] = self._ctx.pool.connected(self._ensemble[idx])
                if conn is None:
                    self._connect(idx)
                    continue
            p.sent |= bit
            if small:
                conn.submit_entry(ledger, entry_id, payload, callbacks[idx])
                continue
            if not p.request:   # goes alone anyway: one body shared by every bookie, not one copy each
                p.request = ledger.body(entry_id, payload)
            conn.submit_add(p.request, callbacks[idx])

    def _connect(self, idx: int) -> None:
        addr = self._ensemble[idx]
        if addr in self._connecting:
            return
        task = self._loop.create_task(self._connect_and_resend(addr))
        if self._connecting is IDLE_DICT:
            self._connecting = {}
        self._connecting[addr] = task
        task.add_done_callback(lambda _: self._connecting.pop(addr, None))

    async def _connect_and_resend(self, addr: str) -> None:
        try:
            await self._ctx.pool.get(addr)
        except BKError as exc:
            self._bookie_failed(addr, exc)
            return
        for p in list(self._pending):
            if not p.done:
                self._send(p)

    def _on_response(self, addr: str, result: protocol.Response | BKError) -> None:
        """A bookie's answer other than OK, or its lost connection (``_BookieAcks``; an OK is counted there)."""
        idx = self._index_of.get(addr)
        if idx is None:
            return  # a reply from a bookie replaced since
        if isinstance(result, BKError):
            self._bookie_failed(addr, result)
            return
        if result.status == _OK:   # (``_BookieAcks`` counts it)
            _BookieAcks(self, addr).ok(result.entry_id)
            return
        err = protocol.error_for(result)
        assert err is not None
        if result.status in _FATAL:
            self.fail_all(err)
        else:
            self._bookie_failed(addr, err)

    def _drop_idle(self) -> None:
        """Idle: drop the queue of adds, the per-bookie callbacks (kept while adds come, made again after) and
        the add timer (an idle writer keeps no timer, nor a float of its own for it)."""
        self._pending, self._callbacks = IDLE, None
        self._timer_slot, self._timer_due, self._lag_rechecked = 0, 0.0, False

    def _arm_timer(self, when: float) -> None:
        self._timer_due = self._ctx.add_timers.arm(self, when)

    def _on_timer(self) -> None:
        """The add timer (``AddTimers`` runs it while adds are pending; ``_drop_idle`` once none is)."""
        if self._error is not None or not self._pending:
            self._drop_idle()
            return
        now = self._loop.time()
        if now - self._timer_due > _LOOP_LAG and not self._lag_rechecked:
            # this loop ran late: answers may wait unread in the sockets; judge after they were read
            self._lag_rechecked = True
            self._arm_timer(now + _LOOP_LAG)
            return
        self._lag_rechecked = False
        timeout = self._timeout
        quorum_timeout = self._quorum_timeout
        nxt = now + timeout
        late = 0
        for p in self._pending:
            if p.done:
                continue
            if quorum_timeout:
                if now - p.started >= quorum_timeout:
                    self.fail_all(errors.BKTimeoutError(
                        f"add of entry {p.entry_id} to ledger {self.ledger_id} did not reach its ack quorum within "
                        f"add_entry_quorum_timeout {quorum_timeout:g} s"))
                    return
                quorum_timeout = 0.0  # adds are in start order: the oldest decides
                nxt = min(nxt, p.started + self._quorum_timeout)
            late |= p.sent & ~p.acked
        silent: list[tuple[str, BookieConnection, float]] = []
        for idx, addr in enumerate(self._ensemble):
            if not late >> idx & 1:
                continue
            conn = self._conns[idx]
            if conn is None or conn.is_closed:
                continue  # its requests failed with the connection: that failure is handled already
            quiet = conn.add_silence(now)
            if quiet >= timeout:
                silent.append((addr, conn, quiet))
            else:  # answering, however slowly: look again when it would have been silent long enough
                nxt = min(nxt, now + timeout - quiet)
        self._arm_timer(nxt)
        for addr, conn, quiet in silent:
            self._bookie_failed(addr, errors.BKTimeoutError(
                f"add to ledger {self.ledger_id} timed out on {addr}: no add answered for {quiet:.1f} s"))
            self._ctx.pool.drop(conn, f"no add answered for {quiet:.1f} s")

    # --- ensemble change --------------------------------------------------------------------------
    def _bookie_failed(self, addr: str, exc: BaseException | None) -> None:
        if self._error is not None or addr in self._replacing or addr in self._to_replace or addr in self._delayed:
            return
        idx = self._index_of.get(addr)
        if idx is None:
            return
        log.warning("ledger %d: bookie %s failed (%s); changing ensemble", self.ledger_id, addr, exc)
        self._ctx.failures.note(addr)
        self._to_replace = self._to_replace | {addr}
        self._blocked |= 1 << idx
        if self._change_task is None or self._change_task.done():
            self._change_task = self._loop.create_task(self._change_ensemble())

    async def _change_ensemble(self) -> None:
        while self._to_replace and self._error is None:
            failed = set(self._to_replace)
            self._replacing |= failed
            self._to_replace -= failed
            old = self._ensemble
            try:
                await self._write_new_segment(failed)
            except NotEnoughBookiesError as exc:
                self._replacing -= failed
                if not (self._delay and self._quorum_reachable(failed | self._delayed | self._to_replace)):
                    self.fail_all(exc)
                    return
                if not failed <= self._delayed:
                    log.warning("ledger %d: no replacement for %s (%s); writing to the rest of the ensemble "
                                "(delay_ensemble_change)", self.ledger_id, sorted(failed), exc)
                self._delayed |= failed
                self._arm_replace_retry()
                continue
            except BKError as exc:
                self.fail_all(exc)
                return
            finally:
                self._replacing -= failed
            new = self.metadata.current_ensemble
            changed = 0
            for i, addr in enumerate(old):
                if addr in failed or i >= len(new) or new[i] != addr:
                    changed |= 1 << i
            self._delayed -= failed
            self._use_ensemble()
            keep = ~changed
            for p in list(self._pending):
                p.acked &= keep
                p.sent &= keep
                if not p.done:
                    self._send(p)

    def _quorum_reachable(self, down: set[str]) -> bool:
        """Whether every write set of the current ensemble keeps ``ack_quorum`` bookies outside ``down``."""
        return quorum_reachable(self._index_of, self._write_sets, self._quorum, down)

    def _arm_replace_retry(self) -> None:
        if self._retry_timer is None and self._error is None:
            self._retry_timer = self._loop.call_later(self._ctx.conf.bookie_watch_interval_ms / 1000.0,
                                                      self._retry_replace)

    def _retry_replace(self) -> None:
        """Delayed bookies: ask placement for replacements again (they stay out of the write sets meanwhile)."""
        self._retry_timer = None
        if self._error is not None or self._closing or self._sealed or not self._delayed:
            return
        self._to_replace |= self._delayed
        self._delayed = _NO_BOOKIES
        if self._change_task is None or self._change_task.done():
            self._change_task = self._loop.create_task(self._change_ensemble())

    def _stop_replace_retry(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None

    async def _write_new_segment(self, failed: set[str]) -> None:
        policy = self._ctx.policy

        def replace(md: LedgerMetadata) -> LedgerMetadata:
            return new_segment(md, failed, set(self._to_replace), policy, self._ctx.quarantined(),
                               self.last_add_confirmed + 1, ledger_id=self.ledger_id, recovery=self._recovery)

        self.metadata, self.version = await write_new_segment(self._ctx, self.ledger_id, replace,
                                                              current=(self.metadata, self.version))

    # --- ending -----------------------------------------------------------------------------------
    def fail_all(self, exc: BKError) -> None:
        """Fail every pending add with ``exc``; later adds raise it."""
        if self._error is None:
            self._error = exc
        self._stop_lac_timer()
        self._stop_replace_retry()
        self._timer_slot = 0   # the wheel skips this writer at that tick
        for task in list(self._connecting.values()):
            task.cancel()
        pending = self._pending
        while pending:
            p = pending.popleft()
            fut = p.future
            if fut is not None and not fut.done():
                fut.set_exception(exc)
            if p.callback is not None:
                p.callback(p.entry_id, exc)
        self._drop_idle()

    async def drain(self) -> None:
        """Wait until no add is pending (each completed or failed) and no ensemble change runs."""
        if self._pending:
            last = self._pending[-1]
            if last.future is None:
                last.future = self._loop.create_future()
            await asyncio.gather(last.future, return_exceptions=True)
        if self._change_task is not None:
            await asyncio.gather(self._change_task, return_exceptions=True)

    async def close(self) -> tuple[LedgerMetadata, Version]:
        """Refuse new adds, wait for pending ones, close the ledger by CAS; return its metadata.

        ``LedgerFencedError`` when the ledger was recovered under this writer
        with a different end (or is being recovered).
        """
        if self._sealed:
            return self.metadata, self.version
        self._closing = True
        self._stop_lac_timer()
        self._stop_replace_retry()
        await self.drain()
        for task in list(self._connecting.values()):
            task.cancel()
        await asyncio.gather(*self._connecting.values(), return_exceptions=True)
        self._timer_slot = 0   # the wheel skips this writer at that tick
        self._drop_idle()   # drained
        md, version = await close_ledger(self._ctx.ledgers, self.ledger_id, self.last_add_confirmed,
                                         self.acked_length(), current=(self.metadata, self.version),
                                         recovering=self._recovery)
        self.metadata, self.version = md, version
        if md.last_entry_id != self.last_add_confirmed:
            raise LedgerFencedError(f"ledger {self.ledger_id} was recovered with last entry {md.last_entry_id}, "
                                    f"writer had {self.last_add_confirmed}")
        if self._error is not None and not isinstance(self._error, LedgerClosedError):
            log.info("ledger %d closed after error %s", self.ledger_id, self._error)
        return md, version

