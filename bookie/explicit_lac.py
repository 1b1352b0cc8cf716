"""The explicit LAC of a ledger writer (BookKeeper's ``explicitLacInterval``): ``LedgerWriter``'s LAC timer.

Every add carries the
LAC of its time, so the bookies learn of an entry's confirmation only from
a later add. After ``explicit_lac_interval`` ms without an add (checked on
ticks of an eighth of the interval, so the LACs of many idle ledgers leave
together: one WRITE_LAC_MULTI per bookie), if the LAC
advanced past the last one sent (piggybacked or explicit), the writer sends
it in a WRITE_LAC to the write set of that entry in the current ensemble, so
tailing readers (``LedgerHandle.wait_last_add_confirmed``) see the last
entry of an idle ledger. A timer per writer, armed by adds, checks this: a
place in the client's wheel (``bookie.add_timers.LacTimers``), which moves
a writer that had an add since on to its new due time by itself;
a failed WRITE_LAC is only logged (the next add carries the LAC anyway).
Recovery writers send none; close and failure stop the timer.

``ExplicitLac`` is a mixin of ``bookie.writer.LedgerWriter`` (the slots of
its LAC state are here); the other attributes it reads are the writer's,
declared here for the type checker.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging

from bookie import protocol
from bookie.connection import BookieConnection
from bookie.context import ClientContext
from bookie.errors import BKError
from bookie.pending_add import _PendingAdd

log = logging.getLogger("bookie.writer")   # the writer's logger, as before the split

__all__ = ["ExplicitLac"]


class ExplicitLac:
    """The explicit-LAC methods of ``LedgerWriter`` (see the module docstring)."""

    __slots__ = ("_lac_due", "_lac_interval", "_lac_sent", "_last_add_at")

    ledger_id: int
    _sealed: bool
    last_add_confirmed: int
    _ctx: ClientContext
    _loop: asyncio.AbstractEventLoop
    _error: BKError | None
    _closing: bool
    _master_key: bytes
    _pending: collections.deque[_PendingAdd]
    _conns: list[BookieConnection | None]
    _ensemble: tuple[str, ...]
    _write_sets: tuple[tuple[int, ...], ...]
    _blocked: int
    _lac_interval: float
    _lac_sent: int
    _last_add_at: float
    _lac_due: float               # when the client's ``LacTimers`` runs this writer's check; 0.0: not armed

    def _on_lac_timer(self) -> None:
        """The LAC check (``LacTimers``: due ``explicit_lac_interval`` after the last add, on ticks of an eighth
        of it, so the WRITE_LACs of the writers due together leave in one WRITE_LAC_MULTI per bookie)."""
        self._lac_due = 0.0
        if self._error is not None or self._closing or self._sealed:
            return
        now = self._loop.time()
        due = self._last_add_at + self._lac_interval
        if now < due:  # an add since: the interval starts again from it
            self._ctx.lac_timers.arm(self, due)
            return
        if self.last_add_confirmed > self._lac_sent:
            self.send_lac(self.last_add_confirmed)
        if self._pending:  # their acknowledgements may advance the LAC without another add
            self._ctx.lac_timers.arm(self, now + self._lac_interval)

    def send_lac(self, lac: int) -> None:
        """Send a WRITE_LAC of ``lac`` to the write set of entry ``lac`` in the current ensemble (no waiting).

        Bookies without an open connection, or being replaced, are skipped;
        failures are logged only.
        """
        self._lac_sent = max(self._lac_sent, lac)
        conns = self._conns
        for idx in self._write_sets[lac % len(conns)]:
            if self._blocked >> idx & 1:
                continue
            addr = self._ensemble[idx]
            conn = conns[idx]
            if conn is None or conn.is_closed:
                conn = conns[idx] = self._ctx.pool.connected(addr)
                if conn is None:
                    continue
            conn.submit_lac(self.ledger_id, self._master_key, lac, functools.partial(self._on_lac_written, addr, lac))

    def _on_lac_written(self, addr: str, lac: int, result: protocol.Response | BKError) -> None:
        err = result if isinstance(result, BKError) else protocol.error_for(result)
        if err is not None:
            log.info("ledger %d: explicit LAC %d not recorded by %s: %s", self.ledger_id, lac, addr, err)

    def _stop_lac_timer(self) -> None:
        self._lac_due = 0.0   # the wheel skips this writer at that time
