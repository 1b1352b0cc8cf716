"""The ledger client: create, write, read, recover, close and delete replicated ledgers.

    bk = await BookKeeper.connect("lmdb://data/metastore")        # rack-aware placement
    lh = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2,
                                digest="crc32c", password=b"secret")
    eid = await lh.add_entry(b"payload")          # 0, 1, 2, ... completed in entry-id order
    async for e in lh.read(0, lh.last_add_confirmed):
        e.entry_id, e.data
    await lh.close()
    rh = await bk.open_ledger(lh.ledger_id, password=b"secret")    # fences and recovers
    await bk.close()

Guarantees (BookKeeper's): an entry is acknowledged once ``ack_quorum``
bookies of its write set have made it durable; entry ``e`` is written to the
``write_quorum`` bookies ``e, e+1, ... mod E`` of the ensemble; entries
complete in id order, so ``last_add_confirmed`` is the highest entry below
which everything is acknowledged. When a bookie fails an add the handle asks
the placement policy for a replacement, records a new ensemble segment in the
ledger metadata by compare-and-set and re-sends what is pending: the writer
sees the failure only when no replacement can be found. Every read verifies
the entry digest and falls back to another replica.

The pieces, one concept per module: ``bookie.writer`` (the add pipeline),
``bookie.reader`` (replica reads), ``bookie.ledger`` (the handle joining
them), ``bookie.recovery`` (recovery-open), ``bookie.watcher`` (bookie
registrations), ``bookie.connection`` (the connection pool),
``bookie.client_conf`` (``ClientConf``), ``bookie.failures`` (the fading
failure history that orders reads).

Failure modes: ``NotEnoughBookiesError`` (no ensemble or replacement),
``LedgerFencedError`` (the ledger was recovered under the writer),
``UnauthorizedError`` (wrong password), ``NoSuchLedgerError``,
``NoSuchEntryError``, ``DigestMismatchError`` (every replica bad),
``EntryTooLargeError`` (an add over ``max_entry_size``),
``BookieUnavailableError``, ``bookie.errors.TimeoutError``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from bookie import digest as digests
from bookie.client_conf import PLACEMENT_KEYS, ClientConf, load_client_conf
from bookie.connection import BookieConnectionPool
from bookie.context import ClientContext
from bookie.errors import BKError, NotEnoughBookiesError
from bookie.failures import FailureHistory
from bookie.ledger import LedgerEntry, LedgerHandle
from bookie.metadata import LedgerMetadata, LedgerMetadataManager, check_password, password_digest
from bookie.recovery import recover
from bookie.registration import BOOKIES_TABLE
from bookie.watcher import BookieWatcher
from metastore import MetaStore, Version, open_existing_metastore
from placement import EnsemblePlacementPolicy, StaticMapping, client_policy
from placement import NotEnoughBookiesError as PlacementNotEnoughBookiesError

log = logging.getLogger(__name__)

__all__ = ["PLACEMENT_KEYS", "BookKeeper", "ClientConf", "LedgerEntry", "LedgerHandle", "load_client_conf"]


class BookKeeper:
    """A ledger client bound to one metastore; see the module docstring."""

    def __init__(self, store: MetaStore, ctx: ClientContext, owns_store: bool) -> None:
        self.store = store
        self._ctx = ctx
        self._owns_store = owns_store
        # open handles (a dict: about 21 bytes a handle, where a set takes 50 to 100; a hub keeps one per topic)
        self._handles: dict[LedgerHandle, None] = {}
        self._closed = False

    # the parts, for callers and tests that look inside
    @property
    def ledgers(self) -> LedgerMetadataManager:
        return self._ctx.ledgers

    @property
    def policy(self) -> EnsemblePlacementPolicy:
        return self._ctx.policy

    @property
    def watcher(self) -> BookieWatcher:
        return self._ctx.watcher

    @property
    def conf(self) -> ClientConf:
        return self._ctx.conf

    @property
    def pool(self) -> BookieConnectionPool:
        return self._ctx.pool

    @property
    def failure_history(self) -> FailureHistory:
        """Recent read/add failures per bookie (halved every ``failure_half_life_s``)."""
        return self._ctx.failures

    @classmethod
    async def connect(cls, metastore: str | MetaStore, placement_policy: EnsemblePlacementPolicy | None = None,
                      conf: Mapping[str, Any] | None = None) -> BookKeeper:
        """Open the metastore (a URI or an open store), read the bookie registrations, start watching.

        A URI is opened with ``open_existing_metastore``: a client never creates
        a store, so ``lmdb:///typo`` fails at once naming the path.

        Raises ``ConfError`` naming a bad key of ``conf``, and
        ``metastore.errors.ServiceDownError`` when the metastore is unreachable
        (``StoreNotFoundError``, a subclass, when it does not exist).
        """
        cconf = ClientConf.from_mapping(conf)
        mapping: StaticMapping | None = None
        if placement_policy is None:
            placement_policy, mapping = client_policy(conf)
        owns = isinstance(metastore, str)
        store = await open_existing_metastore(metastore) if isinstance(metastore, str) else metastore
        try:
            manager = await LedgerMetadataManager.open(store, id_block_size=cconf.ledger_id_block_size)
            await store.create_scannable_table(BOOKIES_TABLE)
            watcher = BookieWatcher(store, placement_policy, mapping, cconf.bookie_watch_interval_ms / 1000.0)
            await watcher.refresh()
        except BaseException:
            if owns:
                await store.close()
            raise
        watcher.start()
        ctx = ClientContext(ledgers=manager, policy=placement_policy, watcher=watcher, conf=cconf,
                            pool=BookieConnectionPool(cconf.connect_timeout, cconf.max_frame_size,
                                                      user_timeout=cconf.tcp_user_timeout,
                                                      keepalive=cconf.tcp_keepalive_interval),
                            failures=FailureHistory(cconf.failure_half_life_s))
        return cls(store, ctx, owns)

    def _check_open(self) -> None:
        if self._closed:
            raise BKError("BookKeeper client is closed")

    @functools.cached_property
    def _forget_handle(self) -> Callable[[LedgerHandle], None]:
        """Every handle's ``on_close``, bound once (a bound method is 64 bytes a handle)."""
        return self._forget

    def _forget(self, lh: LedgerHandle) -> None:
        self._handles.pop(lh, None)

    def _handle(self, ledger_id: int, md: LedgerMetadata, version: Version, password: bytes, *,
                writable: bool, encoded: bytes | None = None) -> LedgerHandle:
        lh = LedgerHandle(self._ctx, ledger_id, md, version, password, writable=writable,
                          on_close=self._forget_handle, encoded=encoded)
        self._handles[lh] = None
        return lh

    async def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                            digest: str = "crc32c", password: bytes = b"",
                            properties: Mapping[str, bytes] | None = None) -> LedgerHandle:
        """Create a ledger on ``ensemble`` bookies chosen by the placement policy.

        Raises ``ValueError`` for impossible quorums or an unknown digest,
        ``NotEnoughBookiesError`` when too few writable bookies are registered (bookies that failed an add or
        a read in the last ``bookie_quarantine_time_s`` seconds do not count).
        """
        self._check_open()
        if not (ensemble >= write_quorum >= ack_quorum >= 1):
            raise ValueError(f"need ensemble >= write_quorum >= ack_quorum >= 1, got {ensemble}/{write_quorum}/"
                             f"{ack_quorum}")
        digests.digest_type_of(digest)
        try:
            bookies = self.policy.new_ensemble(ensemble, write_quorum, ack_quorum, self._ctx.quarantined())
        except PlacementNotEnoughBookiesError:
            await self.watcher.refresh()
            try:
                bookies = self.policy.new_ensemble(ensemble, write_quorum, ack_quorum, self._ctx.quarantined())
            except PlacementNotEnoughBookiesError as exc:
                raise NotEnoughBookiesError(str(exc)) from None
        ledger_id = await self.ledgers.new_ledger_id()
        md = LedgerMetadata(ensemble_size=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
                            ensembles=[(0, list(bookies))], digest=str(digest),
                            password_digest=password_digest(password),
                            properties={k: bytes(v) for k, v in (properties or {}).items()})
        encoded = md.encode()   # once, for the record and the writer (issue 34: a takeover creates thousands)
        version = await self.ledgers.create(ledger_id, md, encoded)
        log.debug("created ledger %d on %s", ledger_id, bookies)
        return self._handle(ledger_id, md, version, password, writable=True, encoded=encoded)

    async def open_ledger(self, ledger_id: int, password: bytes = b"") -> LedgerHandle:
        """Recovery-open: fence the ledger, recover its tail, close it; a read-only handle on the result.

        ``NoSuchLedgerError``, ``UnauthorizedError``, ``BookieUnavailableError``
        (too few bookies to fence or to decide the end; retry later).
        """
        self._check_open()
        got = await recover(self._ctx, ledger_id, password)
        md = got.metadata
        lh = self._handle(ledger_id, md, got.version, password, writable=False)
        lh.last_add_confirmed = md.last_entry_id
        last = got.last_entry
        if last is not None and last.entry_id == md.last_entry_id:   # ``read_last_entry`` reads nothing
            lh._recovered_last = LedgerEntry(ledger_id, last.entry_id, last.body, last.length)
        return lh

    async def open_ledger_no_recovery(self, ledger_id: int, password: bytes = b"") -> LedgerHandle:
        """Open without fencing; an open ledger can be tailed up to its LAC (``read_last_add_confirmed``).

        ``NoSuchLedgerError``, ``UnauthorizedError``, ``BookieUnavailableError``.
        """
        self._check_open()
        md, version = await self.ledgers.read(ledger_id)
        check_password(md, ledger_id, password)
        lh = self._handle(ledger_id, md, version, password, writable=False)
        if md.is_closed:
            lh.last_add_confirmed = md.last_entry_id
        else:
            await lh.read_last_add_confirmed()
        return lh

    async def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata; bookies garbage-collect its entries. ``NoSuchLedgerError``."""
        self._check_open()
        await self.ledgers.delete(ledger_id)

    async def close(self) -> None:
        """Close the client: pending adds fail, connections close; the metastore closes if we opened it."""
        if self._closed:
            return
        self._closed = True
        for lh in list(self._handles):
            lh.fail(BKError("BookKeeper client closed"))
        await self.watcher.stop()
        self.pool.close()
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> BookKeeper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
