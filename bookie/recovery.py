"""Ledger recovery: fence, find the end, re-replicate the tail, close — BookKeeper's recovery-open.

    md, version = await recover_ledger(bk, ledger_id, password)

1. Mark the ledger IN_RECOVERY in the metadata (compare-and-set).
2. Fence it on the bookies of its last ensemble: a fencing read of each
   bookie's last entry. From then on those bookies refuse the old writer's
   adds, so no new entry can reach an ack quorum. Enough bookies must answer
   that every write set has at least ``W - A + 1`` fenced members.
3. The LAC is the highest last-add-confirmed piggybacked on the entries
   the bookies returned (and at least the entry before the last segment).
4. Read forward from LAC + 1. An entry any bookie still has is re-written
   (the same payload, as a recovery add that passes the fence) to its full
   write quorum, replacing dead bookies by ensemble change. The first entry
   that at least ``W - A + 1`` of its write set say they do not have ends the
   ledger: it cannot have been acknowledged. If too few bookies answer to
   decide, recovery fails with ``BookieUnavailableError`` and can be retried.
5. Close the ledger in the metadata by compare-and-set (state CLOSED, last
   entry id, length). A concurrent recoverer that closed first wins; both
   computed the same end because both read the same fenced bookies.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from bookie import digest as digests
from bookie import protocol
from bookie.errors import (
    BKError,
    BookieUnavailableError,
    DigestMismatchError,
    LedgerClosedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bookie.metadata import LedgerMetadata, LedgerState, MetadataVersionError
from metastore import Version

if TYPE_CHECKING:
    from bookie.client import BookKeeper, LedgerHandle

log = logging.getLogger(__name__)


def covers_every_write_set(md: LedgerMetadata, indexes: set[int]) -> bool:
    """True when every write set has at least ``W - A + 1`` members in ``indexes``."""
    need = md.write_quorum - md.ack_quorum + 1
    e = md.ensemble_size
    return all(sum(1 for i in range(md.write_quorum) if (s + i) % e in indexes) >= need for s in range(e))


async def _mark_in_recovery(bk: BookKeeper, ledger_id: int, password: bytes) -> tuple[LedgerMetadata, Version]:
    while True:
        md, version = await bk._read_checked(ledger_id, password)
        if md.state is not LedgerState.OPEN:
            return md, version
        new = md.copy()
        new.state = LedgerState.IN_RECOVERY
        try:
            return new, await bk.ledgers.write(ledger_id, new, version)
        except MetadataVersionError:
            continue


async def _fence(bk: BookKeeper, ledger_id: int, md: LedgerMetadata, master_key: bytes,
                 digest: digests.DigestType, password: bytes) -> int:
    """Fence the last ensemble; return the highest LAC the bookies know of."""
    ensemble = md.current_ensemble

    async def fence_one(addr: str) -> int:
        conn = await bk.pool.get(addr)
        req = protocol.read_request(conn.next_txn_id(), ledger_id, protocol.LAST_ENTRY, fence=True,
                                    master_key=master_key)
        resp = await conn.request(req, bk.conf.read_entry_timeout)
        if resp.status in (protocol.NO_ENTRY, protocol.NO_LEDGER):
            return -1
        protocol.raise_for_status(resp)
        try:
            entry = digests.decode_entry(resp.body, digest, password, ledger_id=ledger_id)
        except DigestMismatchError as exc:
            log.warning("recovery of %d: bad last entry on %s: %s", ledger_id, addr, exc)
            return -1
        return max(entry.lac, -1)

    results = await asyncio.gather(*(fence_one(a) for a in ensemble), return_exceptions=True)
    for r in results:
        if isinstance(r, UnauthorizedError):
            raise r
    fenced = {i for i, r in enumerate(results) if isinstance(r, int)}
    if not covers_every_write_set(md, fenced):
        errs = "; ".join(f"{ensemble[i]}: {r}" for i, r in enumerate(results) if not isinstance(r, int))
        raise BookieUnavailableError(f"cannot fence ledger {ledger_id} on enough bookies ({errs})")
    lacs = [r for r in results if isinstance(r, int)]
    return max([*lacs, md.ensembles[-1][0] - 1])


async def _read_for_recovery(handle: LedgerHandle, entry_id: int) -> bytes | None:
    """The payload of ``entry_id`` if any bookie has it; None if enough say it does not exist."""
    md = handle.metadata
    ensemble = md.ensemble_for(entry_id)
    addrs = [ensemble[i] for i in md.write_set(entry_id)]
    results = await asyncio.gather(*(handle._read_from(a, entry_id) for a in addrs), return_exceptions=True)
    for r in results:
        if isinstance(r, bytes):
            return r
    missing = sum(1 for r in results if isinstance(r, NoSuchEntryError | NoSuchLedgerError))
    if missing >= md.write_quorum - md.ack_quorum + 1:
        return None
    errs = "; ".join(f"{a}: {r!r}" for a, r in zip(addrs, results, strict=True))
    raise BookieUnavailableError(f"recovery of ledger {handle.ledger_id} cannot decide entry {entry_id}: {errs}")


async def recover_ledger(bk: BookKeeper, ledger_id: int, password: bytes) -> tuple[LedgerMetadata, Version]:
    """Fence, recover and close ``ledger_id``; return the closed metadata and its version.

    Raises ``NoSuchLedgerError``, ``UnauthorizedError`` (wrong password),
    ``BookieUnavailableError`` (too few bookies to fence or to decide the end).
    """
    from bookie.client import LedgerHandle

    md, version = await _mark_in_recovery(bk, ledger_id, password)
    if md.is_closed:
        return md, version
    master_key = digests.master_key(password)
    digest = digests.digest_type_of(md.digest)
    lac = await _fence(bk, ledger_id, md, master_key, digest, password)

    handle = LedgerHandle(bk, ledger_id, md, version, password, writable=True, recovery=True)
    handle.last_add_confirmed = lac
    handle._next_entry_id = lac + 1
    length = 0
    if lac >= 0:
        length = digests.read_header(await handle.read_payload(lac)).length
    handle.length = length

    entry_id = lac + 1
    rewrites: list[asyncio.Future[int]] = []
    while True:
        payload = await _read_for_recovery(handle, entry_id)
        if payload is None:
            break
        header = digests.read_header(payload)
        handle._next_entry_id = entry_id + 1
        rewrites.append(handle._enqueue(entry_id, payload, header.length, len(payload)))
        length = header.length
        entry_id += 1
    if rewrites:
        try:
            await asyncio.gather(*rewrites)
        except LedgerClosedError:  # a concurrent recoverer finished first
            md, version = await bk.ledgers.read(ledger_id)
            if md.is_closed:
                return md, version
            raise
    last = entry_id - 1
    log.info("recovered ledger %d: last entry %d, length %d (%d entries re-replicated)",
             ledger_id, last, length, len(rewrites))

    md, version = handle.metadata, handle._version
    while True:
        new = md.copy()
        new.state = LedgerState.CLOSED
        new.last_entry_id = last
        new.length = length
        try:
            version = await bk.ledgers.write(ledger_id, new, version)
            return new, version
        except MetadataVersionError:
            md, version = await bk.ledgers.read(ledger_id)
            if md.is_closed:
                if md.last_entry_id != last:
                    log.error("ledger %d closed concurrently at %d, this recovery found %d",
                              ledger_id, md.last_entry_id, last)
                return md, version
        except BKError:
            raise
