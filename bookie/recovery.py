"""Ledger recovery: fence, find the end, re-replicate the tail, close — BookKeeper's recovery-open.

    md, version = await recover_ledger(ctx, ledger_id, password)

1. Mark the ledger IN_RECOVERY in the metadata (compare-and-set).
2. Fence it on the bookies of its last ensemble: a fencing read of each
   bookie's last entry (``LedgerReader.fence``). From then on those bookies
   refuse the old writer's adds, so no new entry can reach an ack quorum.
   Enough bookies must answer that every write set has at least
   ``W - A + 1`` fenced members.
3. The LAC is the highest last-add-confirmed piggybacked on the entries
   the bookies returned (and at least the entry before the last segment).
4. Read forward from LAC + 1 (``LedgerReader.read_from`` on each member of
   the write set; an entry a fenced bookie answered as its last, or that
   enough of its write set lack by their answers, is not read: see
   ``recover``). An entry any bookie still has is re-written (the same
   payload, as a recovery add that passes the fence: ``LedgerWriter.resend``)
   to its full write quorum, replacing dead bookies by ensemble change. The
   first entry that at least ``W - A + 1`` of its write set say they do not
   have ends the ledger: it cannot have been acknowledged. If too few
   bookies answer to decide, recovery fails with ``BookieUnavailableError``
   and can be retried.
5. Close the ledger in the metadata by compare-and-set
   (``bookie.metadata.close_ledger``, the writer's close too). A concurrent
   recoverer that closed first wins; both computed the same end because both
   read the same fenced bookies.

Recovery uses only the public methods of the reader and the writer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

from bookie import digest as digests
from bookie.context import ClientContext
from bookie.errors import (
    BookieUnavailableError,
    LedgerClosedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bookie.metadata import LedgerMetadata, LedgerState, check_password, close_ledger
from bookie.reader import BAD_LAST_ENTRY, LedgerReader
from bookie.writer import LedgerWriter
from metastore import Version

log = logging.getLogger(__name__)

__all__ = ["Recovered", "covers_every_write_set", "recover", "recover_ledger"]


def covers_every_write_set(md: LedgerMetadata, indexes: set[int]) -> bool:
    """True when every write set has at least ``W - A + 1`` members in ``indexes``."""
    need = md.write_quorum - md.ack_quorum + 1
    e = md.ensemble_size
    return all(sum(1 for i in range(md.write_quorum) if (s + i) % e in indexes) >= need for s in range(e))


async def _mark_in_recovery(ctx: ClientContext, ledger_id: int, password: bytes) -> tuple[LedgerMetadata, Version]:
    def mark(md: LedgerMetadata) -> LedgerMetadata | None:
        check_password(md, ledger_id, password)
        if md.state is not LedgerState.OPEN:
            return None
        md.state = LedgerState.IN_RECOVERY
        return md

    return await ctx.ledgers.update(ledger_id, mark)


class _Fenced(NamedTuple):
    """What the fencing reads told: the LAC, and each answering bookie's last entry (``None``: none).

    A fenced bookie accepts no adds but recovery's, and answers the fencing
    read only once every add it took before is durable (the fence goes
    through its journal after them). So an entry past a fenced bookie's last
    entry is not on it, and an entry the writer had acknowledged is on at
    least one fenced bookie of its write set (``covers_every_write_set``).
    """

    lac: int
    ensemble: tuple[str, ...]
    """The fenced (last) ensemble: every entry after ``lac`` was written to it."""
    write_quorum: int
    last: dict[int, digests.Entry | None]
    """Per ensemble index of the bookies that answered (a bad last entry: absent, nothing is known of it)."""

    def write_set(self, entry_id: int) -> list[int]:
        n = len(self.ensemble)
        return [(entry_id + i) % n for i in range(self.write_quorum)]

    def known(self, entry_id: int) -> digests.Entry | None:
        """``entry_id`` as a fenced bookie answered it (its last entry), if one did."""
        for e in self.last.values():
            if e is not None and e.entry_id == entry_id:
                return e
        return None

    def absent_from(self, entry_id: int) -> int:
        """How many of ``entry_id``'s write set surely lack it (fenced, their last entry before it)."""
        n = 0
        for i in self.write_set(entry_id):
            if i in self.last:
                e = self.last[i]
                if e is None or e.entry_id < entry_id:
                    n += 1
        return n

    def held_by_all(self, entry_id: int) -> bool:
        """True when every member of ``entry_id``'s write set answered the fence with it: nothing to re-write."""
        for i in self.write_set(entry_id):
            e = self.last.get(i)
            if e is None or e.entry_id != entry_id:
                return False
        return True


async def _fence(reader: LedgerReader, md: LedgerMetadata, master_key: bytes) -> _Fenced:
    """Fence the last ensemble; return the highest LAC the bookies know of and their last entries."""
    results = await reader.fence_entries(master_key)
    for r in results:
        if isinstance(r, UnauthorizedError):
            raise r
    fenced = {i for i, r in enumerate(results) if not isinstance(r, BaseException)}
    ensemble = tuple(md.current_ensemble)
    if not covers_every_write_set(md, fenced):
        errs = "; ".join(f"{ensemble[i]}: {r}" for i, r in enumerate(results) if isinstance(r, BaseException))
        raise BookieUnavailableError(f"cannot fence ledger {reader.ledger_id} on enough bookies ({errs})")
    last: dict[int, digests.Entry | None] = {}
    lacs = []
    for i, r in enumerate(results):
        if r is None:
            last[i] = None
        elif isinstance(r, digests.Entry) and r is not BAD_LAST_ENTRY:
            last[i] = r
            lacs.append(r.lac)
    return _Fenced(max([*lacs, md.ensembles[-1][0] - 1]), ensemble, md.write_quorum, last)


async def _read_for_recovery(reader: LedgerReader, md: LedgerMetadata, entry_id: int) -> bytes | None:
    """The payload of ``entry_id`` if any bookie has it; None if enough say it does not exist."""
    ensemble = md.ensemble_for(entry_id)
    addrs = [ensemble[i] for i in md.write_set(entry_id)]
    results = await asyncio.gather(*(reader.read_from(a, entry_id) for a in addrs), return_exceptions=True)
    for r in results:
        if isinstance(r, bytes):
            return r
    missing = sum(1 for r in results if isinstance(r, NoSuchEntryError | NoSuchLedgerError))
    if missing >= md.write_quorum - md.ack_quorum + 1:
        return None
    errs = "; ".join(f"{a}: {r!r}" for a, r in zip(addrs, results, strict=True))
    raise BookieUnavailableError(f"recovery of ledger {reader.ledger_id} cannot decide entry {entry_id}: {errs}")


class Recovered(NamedTuple):
    """What ``recover`` gives: the closed metadata, its version and the ledger's last entry."""

    metadata: LedgerMetadata
    version: Version
    last_entry: digests.Entry | None
    """The last entry, verified (None: the ledger is empty, or it was already closed by someone else)."""


async def recover_ledger(ctx: ClientContext, ledger_id: int, password: bytes) -> tuple[LedgerMetadata, Version]:
    """Fence, recover and close ``ledger_id``; return the closed metadata and its version.

    Raises ``NoSuchLedgerError``, ``UnauthorizedError`` (wrong password),
    ``BookieUnavailableError`` (too few bookies to fence or to decide the end).
    """
    got = await recover(ctx, ledger_id, password)
    return got.metadata, got.version


async def recover(ctx: ClientContext, ledger_id: int, password: bytes) -> Recovered:
    """``recover_ledger``, also giving the last entry recovery met (callers need not read it again).

    The fencing reads answer each bookie's last entry; recovery uses them
    before reading: the LAC entry's length and the entries after it that a
    fenced bookie answered are not read again, an entry that enough of its
    write set lack (their last entry is before it) ends the ledger without a
    read, and when every entry after the LAC was answered by its whole write
    set, nothing needs re-writing (the usual end of a writer that stopped
    cleanly or died between adds). Anything else is read and re-written as
    in the module docstring.
    """
    md, version = await _mark_in_recovery(ctx, ledger_id, password)
    if md.is_closed:
        return Recovered(md, version, None)
    writer: LedgerWriter | None = None
    reader = LedgerReader(ctx, ledger_id, password, lambda: writer.metadata if writer is not None else md)
    fenced = await _fence(reader, md, digests.master_key(password))
    lac = fenced.lac
    lac_length = 0
    last_entry: digests.Entry | None = None
    if lac >= 0:
        last_entry = fenced.known(lac)
        if last_entry is None:
            last_entry = reader.decode(await reader.read_payload(lac), lac)
        lac_length = last_entry.length
    length = lac_length

    need = md.write_quorum - md.ack_quorum + 1
    found: list[tuple[int, bytes, digests.Entry]] = []   # the entries after the LAC: (id, payload, entry)
    entry_id = lac + 1
    while True:
        entry = fenced.known(entry_id)
        if entry is not None:
            payload: bytes | None = None     # encoded again only if it must be re-written
        elif fenced.absent_from(entry_id) >= need:
            break
        else:
            payload = await _read_for_recovery(reader, md, entry_id)
            if payload is None:
                break
            entry = reader.decode(payload, entry_id)
        found.append((entry_id, payload or b"", entry))
        last_entry = entry
        length = entry.length
        entry_id += 1
    last = entry_id - 1
    rewritten = 0
    if found and not all(fenced.held_by_all(eid) for eid, _, _ in found):
        writer = LedgerWriter(ctx, ledger_id, md, version, password, recovery=True, last_add_confirmed=lac,
                              length=lac_length)
        encode = digests.entry_encoder(digests.digest_type_of(md.digest), password)
        rewrites: list[asyncio.Future[int]] = []
        for eid, payload, entry in found:
            if not payload:
                payload = encode(ledger_id, eid, entry.lac, entry.length, entry.body)
            rewrites.append(writer.resend(eid, payload, entry.length))
        rewritten = len(rewrites)
        try:
            await asyncio.gather(*rewrites)
        except LedgerClosedError:  # a concurrent recoverer finished first
            md, version = await ctx.ledgers.read(ledger_id)
            if md.is_closed:
                return Recovered(md, version, None)
            raise
    # a takeover recovers thousands of ledgers: a line each only when entries had to be re-written
    log.log(logging.INFO if rewritten else logging.DEBUG, "recovered ledger %d: last entry %d, length %d "
            "(%d entries re-replicated)", ledger_id, last, length, rewritten)
    current = (writer.metadata, writer.version) if writer is not None else (md, version)
    md, version = await close_ledger(ctx.ledgers, ledger_id, last, length, current=current, recovering=True)
    if md.last_entry_id != last:
        last_entry = None    # another recoverer closed it elsewhere first (close_ledger logged it)
    return Recovered(md, version, last_entry)
