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
   the write set). An entry any bookie still has is re-written (the same
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
from bookie.reader import LedgerReader
from bookie.writer import LedgerWriter
from metastore import Version

log = logging.getLogger(__name__)

__all__ = ["covers_every_write_set", "recover_ledger"]


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


async def _fence(reader: LedgerReader, md: LedgerMetadata, master_key: bytes) -> int:
    """Fence the last ensemble; return the highest LAC the bookies know of."""
    results = await reader.fence(master_key)
    for r in results:
        if isinstance(r, UnauthorizedError):
            raise r
    fenced = {i for i, r in enumerate(results) if isinstance(r, int)}
    if not covers_every_write_set(md, fenced):
        ensemble = md.current_ensemble
        errs = "; ".join(f"{ensemble[i]}: {r}" for i, r in enumerate(results) if not isinstance(r, int))
        raise BookieUnavailableError(f"cannot fence ledger {reader.ledger_id} on enough bookies ({errs})")
    lacs = [r for r in results if isinstance(r, int)]
    return max([*lacs, md.ensembles[-1][0] - 1])


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


async def recover_ledger(ctx: ClientContext, ledger_id: int, password: bytes) -> tuple[LedgerMetadata, Version]:
    """Fence, recover and close ``ledger_id``; return the closed metadata and its version.

    Raises ``NoSuchLedgerError``, ``UnauthorizedError`` (wrong password),
    ``BookieUnavailableError`` (too few bookies to fence or to decide the end).
    """
    md, version = await _mark_in_recovery(ctx, ledger_id, password)
    if md.is_closed:
        return md, version
    writer: LedgerWriter | None = None
    reader = LedgerReader(ctx, ledger_id, password, lambda: writer.metadata if writer is not None else md)
    lac = await _fence(reader, md, digests.master_key(password))
    length = 0
    if lac >= 0:
        length = digests.read_header(await reader.read_payload(lac)).length
    writer = LedgerWriter(ctx, ledger_id, md, version, password, recovery=True, last_add_confirmed=lac,
                          length=length)

    entry_id = lac + 1
    rewrites: list[asyncio.Future[int]] = []
    while True:
        payload = await _read_for_recovery(reader, writer.metadata, entry_id)
        if payload is None:
            break
        length = digests.read_header(payload).length
        rewrites.append(writer.resend(entry_id, payload, length))
        entry_id += 1
    if rewrites:
        try:
            await asyncio.gather(*rewrites)
        except LedgerClosedError:  # a concurrent recoverer finished first
            md, version = await ctx.ledgers.read(ledger_id)
            if md.is_closed:
                return md, version
            raise
    last = entry_id - 1
    log.info("recovered ledger %d: last entry %d, length %d (%d entries re-replicated)",
             ledger_id, last, length, len(rewrites))
    return await close_ledger(ctx.ledgers, ledger_id, last, length, current=(writer.metadata, writer.version),
                              recovering=True)
