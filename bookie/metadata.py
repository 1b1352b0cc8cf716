"""Ledger metadata and its manager over the metastore ``ledgers`` and ``idgen`` tables.

    mgr = await LedgerMetadataManager.open(store)
    ledger_id = await mgr.new_ledger_id()                 # CAS increment of idgen/ledger
    version = await mgr.create(ledger_id, metadata)       # LedgerExistsError if taken
    metadata, version = await mgr.read(ledger_id)         # NoSuchLedgerError
    version = await mgr.write(ledger_id, metadata, version)  # MetadataVersionError on a lost CAS
    await mgr.delete(ledger_id)

Records are ``LedgerMetadataFormat`` protobufs in field ``data``; keys are the
20-digit zero-padded ledger id so the scannable table lists ledgers in id
order.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from bookie.errors import BKError, NoSuchLedgerError
from bookie.proto import ledger_metadata_pb2 as pb
from metastore import MetaStore, Order, Value, Version
from metastore.api import MetastoreScannableTable, MetastoreTable
from metastore.errors import BadVersionError, KeyExistsError, NoKeyError

LEDGERS_TABLE = "ledgers"
IDGEN_TABLE = "idgen"
IDGEN_KEY = "ledger"


class MetadataVersionError(BKError):
    """The ledger metadata changed under a compare-and-set (another writer or recoverer)."""

    code = "MetadataVersionException"


class LedgerExistsError(BKError):
    code = "LedgerExistException"


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


def ledger_key(ledger_id: int) -> str:
    return f"{ledger_id:020d}"


def password_digest(password: bytes) -> bytes:
    return hashlib.sha256(b"quire-ledger-password:" + password).digest()


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
        return {b for _, ens in self.ensembles for b in ens}

    def copy(self) -> LedgerMetadata:
        return dataclasses.replace(self, ensembles=[(f, list(e)) for f, e in self.ensembles],
                                   properties=dict(self.properties))

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


class LedgerMetadataManager:
    """Read/write/delete-with-version of ledger metadata; ledger ids from ``idgen``."""

    def __init__(self, ledgers: MetastoreScannableTable, idgen: MetastoreTable) -> None:
        self.ledgers = ledgers
        self.idgen = idgen

    @classmethod
    async def open(cls, store: MetaStore) -> LedgerMetadataManager:
        return cls(await store.create_scannable_table(LEDGERS_TABLE), await store.create_table(IDGEN_TABLE))

    async def new_ledger_id(self) -> int:
        """The next ledger id (1, 2, ...), by CAS increment of ``idgen/ledger``."""
        while True:
            try:
                got = await self.idgen.get(IDGEN_KEY)
            except NoKeyError:
                try:
                    await self.idgen.put(IDGEN_KEY, Value({"next": b"1"}), Version.NEW)
                except KeyExistsError:
                    pass
                continue
            current = int(got.value.get("next") or b"0")
            try:
                await self.idgen.put(IDGEN_KEY, Value({"next": str(current + 1).encode()}), got.version)
            except BadVersionError:
                continue
            return current

    async def create(self, ledger_id: int, metadata: LedgerMetadata) -> Version:
        try:
            return await self.ledgers.put(ledger_key(ledger_id), Value({"data": metadata.encode()}), Version.NEW)
        except KeyExistsError:
            raise LedgerExistsError(f"ledger {ledger_id} exists") from None

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, Version]:
        try:
            got = await self.ledgers.get(ledger_key(ledger_id))
        except NoKeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        return LedgerMetadata.decode(got.value.get("data") or b""), got.version

    async def write(self, ledger_id: int, metadata: LedgerMetadata, version: Version) -> Version:
        try:
            return await self.ledgers.put(ledger_key(ledger_id), Value({"data": metadata.encode()}), version)
        except BadVersionError:
            raise MetadataVersionError(f"ledger {ledger_id} metadata changed") from None
        except NoKeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    async def delete(self, ledger_id: int) -> None:
        try:
            await self.ledgers.remove(ledger_key(ledger_id), Version.ANY)
        except NoKeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    async def exists(self, ledger_id: int) -> bool:
        try:
            await self.ledgers.get(ledger_key(ledger_id), fields=())
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
