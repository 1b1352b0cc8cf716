"""Replica reads of one ledger: speculative reads, fencing reads, LAC reads.

    reader = LedgerReader(ctx, ledger_id, password, lambda: handle.metadata)
    entry = await reader.read_entry(7)                 # LedgerEntry(entry_id, data, ...)
    async for e in reader.read_range(0, 99): ...       # pipelined, ``read_window`` at a time
    payload = await reader.read_from(addr, 7)          # one replica, digest verified
    lac = await reader.read_lac()                      # highest LAC the last ensemble knows of
    lac = await reader.wait_lac(after=lac, timeout=10)  # long poll: the first LAC above ``after``
    lac = await reader.fence(master_key)               # fencing read of every bookie of the last ensemble

An entry is asked of its write set in the placement policy's read order
(``reorder_read_sequence``, informed by the client's fading failure
history); after ``speculative_read_timeout_ms`` without an answer the next
replica is asked too, and the first verified payload wins. Every payload is
checked against its digest; a bad one counts as a failure of that bookie.

LAC reads ask every bookie of the last ensemble; each answers the larger of
the LAC piggybacked on the adds it stored and the one the writer sent
explicitly (WRITE_LAC), and the highest entry it stores (``last_entry_seen``
keeps the highest seen). ``wait_lac`` long-polls the same bookies (READ_LAC
with ``previous_lac``/``timeout_ms``): the first answer above ``after``
wins; when every bookie answered without one before the time is up (refused,
unreachable), it asks again after a short back-off.

Failure: when no replica serves the entry the most telling error is raised:
``UnauthorizedError``, then ``DigestMismatchError`` (every replica bad),
then ``NoSuchEntryError`` (every replica said so), then any other
``BKError`` (``bookie.errors.TimeoutError``, ``BookieUnavailableError``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, NamedTuple, cast

from bookie import digest as digests
from bookie import errors, protocol
from bookie.context import ClientContext
from bookie.errors import (
    BKError,
    BookieUnavailableError,
    DigestMismatchError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bookie.metadata import LedgerMetadata

if TYPE_CHECKING:
    from bookie.connection import BookieConnection

log = logging.getLogger(__name__)

__all__ = ["BAD_LAST_ENTRY", "LedgerEntry", "LedgerReader", "best_error"]


class LedgerEntry(NamedTuple):
    """One entry read back: ``entry_id``, ``data`` and ``length`` (bytes of data)."""

    ledger_id: int
    entry_id: int
    data: bytes
    ledger_length: int
    """The ledger's length in bytes up to and including this entry."""

    @property
    def length(self) -> int:
        return len(self.data)


class LedgerReader:
    """See the module docstring; ``metadata_of()`` gives the ledger's current metadata."""

    def __init__(self, ctx: ClientContext, ledger_id: int, password: bytes,
                 metadata_of: Callable[[], LedgerMetadata]) -> None:
        self._ctx = ctx
        self.ledger_id = ledger_id
        self._password = bytes(password)
        self._metadata_of = metadata_of
        self._digest = digests.digest_type_of(metadata_of().digest)
        self.last_entry_seen = -1
        """The highest entry id a bookie said it stores, in any LAC read so far (-1: none)."""

    def decode(self, payload: bytes, entry_id: int | None = None) -> digests.Entry:
        """Verify and split a payload of this ledger (``DigestMismatchError``)."""
        return digests.decode_entry(payload, self._digest, self._password, ledger_id=self.ledger_id,
                                    entry_id=entry_id)

    async def read_range(self, first: int, last: int) -> AsyncGenerator[LedgerEntry, None]:
        """Yield entries ``first..last`` in order, ``read_window`` reads in flight."""
        window = max(1, self._ctx.conf.read_window)
        loop = asyncio.get_running_loop()
        inflight: collections.deque[asyncio.Task[LedgerEntry]] = collections.deque()
        nxt = first
        try:
            while nxt <= last or inflight:
                while nxt <= last and len(inflight) < window:
                    inflight.append(loop.create_task(self.read_entry(nxt)))
                    nxt += 1
                yield await inflight.popleft()
        finally:
            for t in inflight:
                t.cancel()

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        """Read one entry from its write set, speculatively asking the next replica after a delay."""
        entry = self.decode(await self.read_payload(entry_id), entry_id)
        return LedgerEntry(self.ledger_id, entry_id, entry.body, entry.length)

    async def read_payload(self, entry_id: int) -> bytes:
        """The verified payload of ``entry_id`` (raises the most telling error if no replica has it)."""
        md = self._metadata_of()
        ensemble = md.ensemble_for(entry_id)
        order = self._ctx.policy.reorder_read_sequence(ensemble, md.write_set(entry_id), self._ctx.failures)
        candidates = [ensemble[i] for i in order]
        errs: list[BaseException] = []
        running: set[asyncio.Task[bytes]] = set()
        delay = self._ctx.conf.speculative_read_timeout_ms / 1000.0
        loop = asyncio.get_running_loop()
        try:
            while candidates or running:
                if candidates and (not running or delay > 0):
                    running.add(loop.create_task(self.read_from(candidates.pop(0), entry_id)))
                timeout = delay if (candidates and delay > 0) else None
                done, _ = await asyncio.wait(running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    running.discard(t)
                    exc = t.exception()
                    if exc is None:
                        return t.result()
                    errs.append(exc)
        finally:
            for t in running:
                t.cancel()
        raise best_error(errs, self.ledger_id, entry_id)

    async def read_from(self, addr: str, entry_id: int) -> bytes:
        """The payload of ``entry_id`` from the bookie at ``addr``, digest verified.

        Raises that bookie's error (``NoSuchEntryError``...), ``DigestMismatchError``,
        ``bookie.errors.TimeoutError`` or ``BookieUnavailableError``; the last three
        count as failures of the bookie.
        """
        timeout = self._ctx.conf.read_entry_timeout
        try:
            conn = await self._ctx.pool.get(addr)
            resp = await conn.request(protocol.read_request(conn.next_txn_id(), self.ledger_id, entry_id), timeout)
        except TimeoutError:
            self._ctx.failures.note(addr)
            quiet = asyncio.get_running_loop().time() - conn.last_reply
            if quiet >= timeout:  # nothing at all came back meanwhile: a dead bookie, not a slow read
                self._ctx.pool.drop(conn, f"no answer for {quiet:.1f} s")
            raise errors.BKTimeoutError(f"read {self.ledger_id}:{entry_id} from {addr} timed out") from None
        except BKError:
            self._ctx.failures.note(addr)
            raise
        protocol.raise_for_status(resp)
        try:
            self.decode(resp.body, entry_id)
        except DigestMismatchError as exc:
            log.warning("ledger %d entry %d from %s: %s", self.ledger_id, entry_id, addr, exc)
            self._ctx.failures.note(addr)
            raise
        return bytes(resp.body)

    async def read_lac(self) -> int:
        """The highest LAC the bookies of the last ensemble know of, piggybacked or explicit (-1 for none).

        ``BookieUnavailableError`` when none of them answers.
        """
        md = self._metadata_of()
        results = await asyncio.gather(*(self._read_lac(a) for a in md.current_ensemble), return_exceptions=True)
        lacs = [r for r in results if isinstance(r, int)]
        if not lacs:
            raise BookieUnavailableError(f"no bookie answered READ_LAC for ledger {self.ledger_id}")
        return max(lacs)

    async def _read_lac(self, addr: str, after: int = -1, timeout: float = 0.0) -> int:
        """One bookie's LAC (-1 when it has no record); with ``timeout`` a long poll for one above ``after``."""
        conn = await self._ctx.pool.get(addr)
        wait_ms = min(max(1, round(timeout * 1000)), protocol.MAX_LONG_POLL_TIMEOUT_MS) if timeout > 0 else 0
        req = protocol.read_lac_request(conn.next_txn_id(), self.ledger_id, previous_lac=after, timeout_ms=wait_ms)
        resp = await conn.request(req, self._ctx.conf.read_entry_timeout + wait_ms / 1000.0)
        if resp.status in (protocol.NO_LEDGER, protocol.NO_ENTRY):
            return -1
        protocol.raise_for_status(resp)
        if resp.entry_id > self.last_entry_seen:
            self.last_entry_seen = int(resp.entry_id)
        return int(resp.lac)

    async def wait_lac(self, after: int, timeout: float) -> int:
        """The first LAC above ``after`` a bookie of the last ensemble reports, or the best seen by ``timeout``.

        Long-polls every bookie of the last ensemble; returns as soon as one
        answers a LAC above ``after``. When the time is up, returns the
        highest LAC any bookie answered (-1 when none answered at all). Never
        raises for refusing or unreachable bookies: while time is left they
        are asked again after a short back-off.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        best = -1
        backoff = _RETRY_BACKOFF
        while True:
            left = deadline - loop.time()
            ensemble = self._metadata_of().current_ensemble
            polls = [loop.create_task(self._read_lac(a, after, left)) for a in ensemble] if left > 0 else []
            try:
                for next_done in asyncio.as_completed(polls):
                    try:
                        lac = await next_done
                    except (BKError, TimeoutError) as exc:
                        log.debug("ledger %d: long-poll READ_LAC failed: %s", self.ledger_id, exc)
                        continue
                    best = max(best, lac)
                    if lac > after:
                        return best
            finally:
                for t in polls:
                    if not t.done():
                        t.cancel()  # its bookie answers at its own timeout; the late answer is ignored
                    elif not t.cancelled():
                        t.exception()  # retrieved: a failure after the winner is not logged as lost
            left = deadline - loop.time()
            if left <= 0:
                return best
            # every bookie answered without progress early (refused or unreachable): ask again shortly
            await asyncio.sleep(min(backoff, left))
            backoff = min(backoff * 2, _MAX_RETRY_BACKOFF)

    async def fence(self, master_key: bytes) -> list[int | BaseException]:
        """Fence the ledger on every bookie of the last ensemble, by a fencing read of its last entry.

        Returns, per ensemble index, the LAC piggybacked on that bookie's last
        entry (-1 when it has none or a bad one) or the error it gave.
        """
        return [r if isinstance(r, BaseException) else (r.lac if isinstance(r, digests.Entry) else -1)
                for r in await self.fence_entries(master_key)]

    async def fence_entries(self, master_key: bytes) -> list[digests.Entry | BaseException | None]:
        """``fence``, keeping what each bookie answered: per ensemble index, its last entry (verified),
        None when it has none, ``BAD_LAST_ENTRY`` when its last entry failed its digest, or its error.

        A fenced bookie accepts no more adds but recovery's, so an entry past
        the last one it answered with is not there (``bookie.recovery`` decides
        the ledger's end from that without reading again).
        """
        ensemble = self._metadata_of().current_ensemble
        conns = [self._ctx.pool.connected(a) for a in ensemble]
        if None in conns:   # a connection to open first: one task per bookie
            return list(await asyncio.gather(*(self._fence_one(a, master_key) for a in ensemble),
                                             return_exceptions=True))
        return await self._fence_connected(cast("list[BookieConnection]", conns), master_key)

    async def _fence_connected(self, conns: list[BookieConnection],
                               master_key: bytes) -> list[digests.Entry | BaseException | None]:
        """``fence_entries`` over open connections: the requests sent at once, their answers awaited in
        turn under one timer, no task per bookie (a takeover fences thousands of ledgers, issue 34)."""
        sent = []
        for conn in conns:
            req = protocol.read_request(conn.next_txn_id(), self.ledger_id, protocol.LAST_ENTRY, fence=True,
                                        master_key=master_key)
            sent.append((conn, req, conn.send(req)))
        futs = [fut for _, _, fut in sent]
        timer = asyncio.get_running_loop().call_later(self._ctx.conf.read_entry_timeout, _time_out_all, futs)
        out: list[digests.Entry | BaseException | None] = []
        try:
            for conn, req, fut in sent:
                try:
                    out.append(self._fenced(conn.address, await fut))
                except TimeoutError as exc:
                    conn.forget(req.txn_id, req.op)
                    out.append(exc)
                except Exception as exc:   # as ``gather(..., return_exceptions=True)`` gave it
                    out.append(exc)
        finally:
            timer.cancel()
            for conn, req, fut in sent:   # cancelled meanwhile: the answers still owed are dropped
                if not fut.done():
                    conn.forget(req.txn_id, req.op)
                    fut.cancel()
        return out

    async def _fence_one(self, addr: str, master_key: bytes) -> digests.Entry | None:
        conn = await self._ctx.pool.get(addr)
        req = protocol.read_request(conn.next_txn_id(), self.ledger_id, protocol.LAST_ENTRY, fence=True,
                                    master_key=master_key)
        return self._fenced(addr, await conn.request(req, self._ctx.conf.read_entry_timeout))

    def _fenced(self, addr: str, resp: protocol.Response) -> digests.Entry | None:
        """What a bookie's answer to a fencing read tells (``fence_entries``); its error status raised."""
        if resp.status in (protocol.NO_ENTRY, protocol.NO_LEDGER):
            return None
        protocol.raise_for_status(resp)
        try:
            return self.decode(resp.body)
        except DigestMismatchError as exc:
            log.warning("fencing ledger %d: bad last entry on %s: %s", self.ledger_id, addr, exc)
            return BAD_LAST_ENTRY


def _time_out_all(futs: list[asyncio.Future[protocol.Response]]) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_exception(TimeoutError())


BAD_LAST_ENTRY = digests.Entry(-1, -1, -1, 0, b"")
"""What ``LedgerReader.fence_entries`` gives for a fenced bookie whose last entry failed its digest."""


_RETRY_BACKOFF = 0.05
_MAX_RETRY_BACKOFF = 1.0


def best_error(errs: list[BaseException], ledger_id: int, entry_id: int) -> BKError:
    """The error that says most about why no replica served an entry."""
    for kind in (UnauthorizedError, DigestMismatchError, NoSuchEntryError, NoSuchLedgerError):
        for e in errs:
            if isinstance(e, kind):
                if kind in (NoSuchEntryError, NoSuchLedgerError) and not all(
                        isinstance(x, NoSuchEntryError | NoSuchLedgerError) for x in errs):
                    continue
                return NoSuchEntryError(str(e)) if kind is NoSuchLedgerError else e
    for e in errs:
        if isinstance(e, BKError):
            return e
    return BookieUnavailableError(f"no replica of {ledger_id}:{entry_id} answered")
