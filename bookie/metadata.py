"""Ledger metadata and its manager over the metastore ``ledgers`` and ``idgen`` tables.

    mgr = await LedgerMetadataManager.open(store, id_block_size=1000)
    ledger_id = await mgr.new_ledger_id()                 # from a block reserved in idgen (bookie.idgen)
    version = await mgr.create(ledger_id, metadata)       # LedgerExistsError if taken
    metadata, version = await mgr.read(ledger_id)         # NoSuchLedgerError
    version = await mgr.write(ledger_id, metadata, version)  # MetadataVersionError on a lost CAS
    metadata, version = await mgr.update(ledger_id, change)  # read-modify-write, retried on conflicts
    metadata, version = await close_ledger(mgr, ledger_id, last_entry_id, length)
    await mgr.delete(ledger_id)
    ids = await mgr.ledger_ids()                          # every ledger id (keys only; for bookie GC)

Every read-modify-write goes through ``metastore.cas.cas_retry`` (bounded
attempts, jittered backoff): ``update`` for ledger records. ``close_ledger``
is the one close-by-CAS, used by the writer's ``close`` and by recovery.
Ledger ids come from ``bookie.idgen``: blocks of ids, one metastore write
per block.

Records are ``LedgerMetadataFormat`` protobufs in field ``data``; keys are the
20-digit zero-padded ledger id so the scannable table lists ledgers in id
order.
"""

from __future__ import annotations

import bisect
import enum
import functools
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from bookie.errors import BKError, LedgerFencedError, NoSuchLedgerError, UnauthorizedError
from bookie.idgen import DEFAULT_BLOCK_SIZE, IDGEN_TABLE, LedgerIdAllocator
from bookie.idgen import IDGEN_KEY as IDGEN_KEY  # re-exported: where callers have found it
from bookie.proto import ledger_metadata_pb2 as pb
from metastore import MetaStore, Order, Value, Version
from metastore.api import MetastoreScannableTable, MetastoreTable
from metastore.cas import cas_retry
from metastore.errors import BadVersionError, KeyExistsError, NoKeyError

log = logging.getLogger(__name__)

LEDGERS_TABLE = "ledgers"


class MetadataVersionError(BKError):
    """The ledger metadata changed under a compare-and-set (another writer or recoverer)."""

    code = "MetadataVersionException"


class LedgerExistsError(BKError):
    code = "LedgerExistException"


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


def ledger_record_key(ledger_id: int) -> str:
    """The ``ledgers`` table key of a ledger: its id, zero-padded to 20 digits (sorts in id order)."""
    return f"{ledger_id:020d}"


def password_digest(password: bytes) -> bytes:
    return _password_digest(bytes(password))


@functools.lru_cache(maxsize=64)
def _password_digest(password: bytes) -> bytes:
    """Shared by a client's ledgers of one password (each kept its own copy: 65 bytes a ledger)."""
    return hashlib.sha256(b"quire-ledger-password:" + password).digest()


def check_password(md: LedgerMetadata, ledger_id: int, password: bytes) -> None:
    """Raise ``UnauthorizedError`` unless ``password`` is the ledger's (a ledger without one takes any)."""
    if md.password_digest and md.password_digest != password_digest(password):
        raise UnauthorizedError(f"wrong password for ledger {ledger_id}")


@dataclass
class LedgerMetadata:
    """What the metastore knows of a ledger: quorums, state, segments, properties."""

    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: list[tuple[int, list[str]]]
    digest: str = "crc32c"
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    password_digest: bytes = b""
    ctime_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    properties: dict[str, bytes] = field(default_factory=dict)

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def current_ensemble(self) -> list[str]:
        return self.ensembles[-1][1]

    def ensemble_for(self, entry_id: int) -> list[str]:
        """The ensemble that holds ``entry_id`` (the last segment starting at or before it)."""
        starts = [first for first, _ in self.ensembles]
        i = bisect.bisect_right(starts, entry_id) - 1
        return self.ensembles[max(i, 0)][1]

    def write_set(self, entry_id: int) -> list[int]:
        """Ensemble indexes that store ``entry_id``: e, e+1, ... e+W-1 modulo E."""
        return [(entry_id + i) % self.ensemble_size for i in range(self.write_quorum)]

    def bookies(self) -> set[str]:
        """Every bookie of every segment (the ones that may hold entries of this ledger)."""
        return {b for _, ens in self.ensembles for b in ens}

    def copy(self) -> LedgerMetadata:
        """A copy whose ensembles and properties are its own (the fields as they are: no ``__init__``
        run again, as ``dataclasses.replace`` would: twice per ledger a takeover recovers, issue 34)."""
        out = object.__new__(LedgerMetadata)
        out.__dict__.update(self.__dict__)
        out.ensembles = [(f, list(e)) for f, e in self.ensembles]
        out.properties = dict(self.properties)
        return out

    def encode(self) -> bytes:
        return pb.LedgerMetadataFormat(
            ensemble_size=self.ensemble_size, write_quorum_size=self.write_quorum,
            ack_quorum_size=self.ack_quorum, state=self.state.value,
            last_entry_id=self.last_entry_id, length=self.length,
            segments=[pb.LedgerMetadataFormat.Segment(first_entry_id=f, ensemble=e) for f, e in self.ensembles],
            digest_type=self.digest, password_digest=self.password_digest, ctime_ms=self.ctime_ms,
            properties=self.properties,
        ).SerializeToString()

    @classmethod
    def decode(cls, data: bytes) -> LedgerMetadata:
        m = pb.LedgerMetadataFormat.FromString(data)
        return cls(
            ensemble_size=m.ensemble_size, write_quorum=m.write_quorum_size, ack_quorum=m.ack_quorum_size,
            ensembles=[(s.first_entry_id, list(s.ensemble)) for s in m.segments],
            digest=m.digest_type or "crc32c", state=LedgerState(pb.LedgerMetadataFormat.State.Name(m.state)),
            last_entry_id=m.last_entry_id, length=m.length, password_digest=m.password_digest,
            ctime_ms=m.ctime_ms, properties=dict(m.properties),
        )


def metadata_dict(ledger_id: int, md: LedgerMetadata) -> dict[str, object]:
    """The ledger's metadata as JSON-ready values (``quire shell ledgermetadata --json``, the HTTP API)."""
    return {
        "ledger_id": ledger_id,
        "state": md.state.value,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "digest": md.digest,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "ctime_ms": md.ctime_ms,
        "has_password": bool(md.password_digest) and md.password_digest != password_digest(b""),
        "ensembles": [{"first_entry": first, "bookies": list(ens)} for first, ens in md.ensembles],
        "properties": {k: v.decode("utf-8", "backslashreplace") for k, v in md.properties.items()},
    }


class LedgerMetadataManager:
    """Read/write/delete-with-version of ledger metadata; ledger ids from ``idgen``."""

    def __init__(self, ledgers: MetastoreScannableTable, idgen: MetastoreTable,
                 ids: LedgerIdAllocator | None = None) -> None:
        self.ledgers = ledgers
        self.idgen = idgen
        self.ids = ids if ids is not None else LedgerIdAllocator(idgen)

    @classmethod
    async def open(cls, store: MetaStore, *, id_block_size: int = DEFAULT_BLOCK_SIZE) -> LedgerMetadataManager:
        """The manager on ``store``'s tables; ledger ids in blocks of ``id_block_size`` (``bookie.idgen``)."""
        idgen = await store.create_table(IDGEN_TABLE)
        return cls(await store.create_scannable_table(LEDGERS_TABLE), idgen,
                   await LedgerIdAllocator.open(store, idgen, id_block_size))

    async def new_ledger_id(self) -> int:
        """A ledger id never handed out before, from this client's block (``bookie.idgen``).

        Contention between clients never fails it: a block reservation that
        loses a compare-and-set retries; metastore errors propagate.
        """
        return await self.ids.next_id()

    async def create(self, ledger_id: int, metadata: LedgerMetadata, encoded: bytes | None = None) -> Version:
        """Create the ledger's record (``encoded``: ``metadata.encode()`` when the caller has it already)."""
        data = metadata.encode() if encoded is None else encoded
        try:
            return await self.ledgers.put(ledger_record_key(ledger_id), Value({"data": data}), Version.NEW)
        except KeyExistsError:
            raise LedgerExistsError(f"ledger {ledger_id} exists") from None

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, Version]:
        try:
            got = await self.ledgers.get(ledger_record_key(ledger_id))
        except NoKeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        return LedgerMetadata.decode(got.value.get("data") or b""), got.version

    async def write(self, ledger_id: int, metadata: LedgerMetadata, version: Version) -> Version:
        try:
            return await self.ledgers.put(ledger_record_key(ledger_id), Value({"data": metadata.encode()}), version)
        except BadVersionError:
            raise MetadataVersionError(f"ledger {ledger_id} metadata changed") from None
        except NoKeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    async def update(self, ledger_id: int, change: Callable[[LedgerMetadata], LedgerMetadata | None], *,
                     current: tuple[LedgerMetadata, Version] | None = None) -> tuple[LedgerMetadata, Version]:
        """Read-modify-write one ledger's metadata by compare-and-set, retried on conflicts.

        ``change(md)`` gets a copy of the current metadata and returns the
        metadata to write, or ``None`` to leave the record as it is (then the
        current one is returned). It may raise to give up (the error
        propagates) and may run several times. The first attempt uses
        ``current`` when given (a version the caller holds) instead of
        reading. Returns the metadata as stored and its version. Raises
        ``NoSuchLedgerError``, or ``MetadataVersionError`` after the bounded
        attempts all conflicted.
        """
        known = [current]

        async def step() -> tuple[LedgerMetadata, Version]:
            held = known[0]
            known[0] = None
            md, version = held if held is not None else await self.read(ledger_id)
            new = change(md.copy())
            if new is None:
                return md, version
            return new, await self.write(ledger_id, new, version)

        return await cas_retry(step, retry_on=(MetadataVersionError,))

    async def delete(self, ledger_id: int) -> None:
        try:
            await self.ledgers.remove(ledger_record_key(ledger_id), Version.ANY)
        except NoKeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    async def exists(self, ledger_id: int) -> bool:
        try:
            await self.ledgers.get(ledger_record_key(ledger_id), fields=())
            return True
        except NoKeyError:
            return False

    async def list(self) -> AsyncIterator[tuple[int, LedgerMetadata]]:
        """Every ledger in id order."""
        cur = await self.ledgers.open_cursor_range("", True, "", True, Order.ASC)
        try:
            while cur.has_more():
                for key, got in await cur.read_entries(500):
                    yield int(key), LedgerMetadata.decode(got.value.get("data") or b"")
        finally:
            await cur.close()

    async def ledger_ids(self) -> set[int]:
        """The id of every ledger the metastore lists (no record decoded: keys only).

        Raises ``MetastoreError`` when the table cannot be read. Keys that are
        not ledger ids (written by something else) are skipped.
        """
        ids: set[int] = set()
        cur = await self.ledgers.open_cursor(fields=())
        try:
            while cur.has_more():
                for key, _ in await cur.read_entries(1024):
                    if key.isdigit():
                        ids.add(int(key))
        finally:
            await cur.close()
        return ids


async def close_ledger(manager: LedgerMetadataManager, ledger_id: int, last_entry_id: int, length: int, *,
                       current: tuple[LedgerMetadata, Version] | None = None,
                       recovering: bool = False) -> tuple[LedgerMetadata, Version]:
    """Mark a ledger CLOSED at ``last_entry_id``/``length`` by compare-and-set (the one close of a ledger).

    A ledger already closed is left as it is and its metadata returned: the
    caller compares ``last_entry_id`` (a writer whose end differs was fenced;
    a recoverer that lost the race to another one accepts its result). A
    writer (``recovering=False``) finding the ledger IN_RECOVERY gets
    ``LedgerFencedError``. Raises ``NoSuchLedgerError`` and, after the
    bounded attempts, ``MetadataVersionError``.
    """

    def close(md: LedgerMetadata) -> LedgerMetadata | None:
        if md.is_closed:
            return None
        if md.state is LedgerState.IN_RECOVERY and not recovering:
            raise LedgerFencedError(f"ledger {ledger_id} is being recovered")
        md.state = LedgerState.CLOSED
        md.last_entry_id = last_entry_id
        md.length = length
        return md

    md, version = await manager.update(ledger_id, close, current=current)
    if md.last_entry_id != last_entry_id:
        log.log(logging.ERROR if recovering else logging.INFO,
                "ledger %d was closed at %d, this %s had %d", ledger_id, md.last_entry_id,
                "recovery" if recovering else "writer", last_entry_id)
    return md, version
