"""The ledger client: create, write, read, recover, close and delete replicated ledgers.

    bk = await BookKeeper.connect("lmdb:///var/lib/quire/meta")        # rack-aware placement
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

Failure modes: ``NotEnoughBookiesError`` (no ensemble or replacement),
``LedgerFencedError`` (the ledger was recovered under the writer),
``UnauthorizedError`` (wrong password), ``NoSuchLedgerError``,
``NoSuchEntryError``, ``DigestMismatchError`` (every replica bad),
``BookieUnavailableError``, ``bookie.errors.TimeoutError``.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from bookie import digest as digests
from bookie import protocol
from bookie.conf import read_properties
from bookie.connection import BookieConnectionPool
from bookie.errors import (
    BKError,
    BookieUnavailableError,
    ConfError,
    DigestMismatchError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    TimeoutError,
    UnauthorizedError,
)
from bookie.metadata import (
    LedgerMetadata,
    LedgerMetadataManager,
    LedgerState,
    MetadataVersionError,
    password_digest,
)
from bookie.registration import BOOKIES_TABLE, READ_ONLY, list_bookies
from metastore import MetaStore, Version, open_metastore
from placement import EnsemblePlacementPolicy, RackawareEnsemblePlacementPolicy, StaticMapping
from placement import NotEnoughBookiesError as PlacementNotEnoughBookiesError

log = logging.getLogger(__name__)

__all__ = ["BookKeeper", "ClientConf", "LedgerEntry", "LedgerHandle", "load_client_conf"]


@dataclass(frozen=True)
class ClientConf:
    """Ledger-client settings (keys of the client conf; strings accepted)."""

    add_entry_timeout: float = 10.0
    """Seconds an add may wait for a bookie before that bookie counts as failed."""
    read_entry_timeout: float = 5.0
    """Seconds a read waits for one bookie."""
    speculative_read_timeout_ms: int = 500
    """After this long without an answer a read also asks the next replica (0 = never)."""
    connect_timeout: float = 3.0
    bookie_watch_interval_ms: int = 1000
    """How often the client re-reads the ``bookies`` registrations."""
    read_window: int = 64
    """Entries read concurrently by ``read(first, last)``."""
    max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any] | None) -> ClientConf:
        """Take the known keys of ``conf`` (other keys belong to other components)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if conf is not None and f.name in conf:
                raw = conf[f.name]
                try:
                    values[f.name] = int(raw) if f.type == "int" else float(raw)
                except (TypeError, ValueError):
                    raise ValueError(f"client conf {f.name}={raw!r} is not a number") from None
        return cls(**values)


PLACEMENT_KEYS = frozenset({"ensemble_placement_policy", "network_topology_script_file",
                            "network_topology_stabilize_period_seconds", "dns_resolver_class", "local_region"})


def load_client_conf(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a ledger-client conf file (``conf/bk_client.conf``) for ``BookKeeper.connect(conf=...)``.

    Raises ``ConfError`` naming the key for an unknown key or a bad value.
    """
    props = read_properties(path)
    known = {f.name for f in fields(ClientConf)} | PLACEMENT_KEYS
    for key in props:
        if key not in known:
            raise ConfError(f"unknown key {key!r} in {path}")
    try:
        ClientConf.from_mapping(props)
    except ValueError as exc:
        raise ConfError(f"{path}: {exc}") from None
    return {k: v for k, v in props.items() if v != ""}


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


class BookieWatcher:
    """Keeps the placement policy's view of the cluster current from the ``bookies`` table."""

    def __init__(self, store: MetaStore, policy: EnsemblePlacementPolicy, mapping: StaticMapping | None,
                 interval: float) -> None:
        self._store = store
        self._policy = policy
        self._mapping = mapping
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self.writable: set[str] = set()
        self.readonly: set[str] = set()

    async def refresh(self) -> None:
        regs = await list_bookies(self._store)
        writable: set[str] = set()
        readonly: set[str] = set()
        for addr, rec in regs.items():
            if self._mapping is not None and rec.network_location:
                self._mapping.set_location(addr, rec.network_location)
            (readonly if rec.state == READ_ONLY else writable).add(addr)
        if (writable, readonly) != (self.writable, self.readonly):
            log.info("bookies: %d writable, %d read-only", len(writable), len(readonly))
        self.writable, self.readonly = writable, readonly
        self._policy.on_cluster_changed(writable, readonly)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
            except Exception as exc:  # keep watching through metastore hiccups
                log.warning("cannot refresh bookie registrations: %s", exc)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


class _PendingAdd:
    __slots__ = ("acked", "data_length", "done", "entry_id", "future", "ledger_length", "payload", "sent", "timer")

    def __init__(self, entry_id: int, payload: bytes, ledger_length: int, data_length: int,
                 future: asyncio.Future[int]) -> None:
        self.entry_id = entry_id
        self.payload = payload
        self.ledger_length = ledger_length
        self.data_length = data_length
        self.future = future
        self.acked: set[str] = set()
        self.sent: set[str] = set()
        self.done = False
        self.timer: asyncio.TimerHandle | None = None


class BookKeeper:
    """A ledger client bound to one metastore; see the module docstring."""

    def __init__(self, store: MetaStore, manager: LedgerMetadataManager, policy: EnsemblePlacementPolicy,
                 watcher: BookieWatcher, conf: ClientConf, owns_store: bool) -> None:
        self.store = store
        self.ledgers = manager
        self.policy = policy
        self.watcher = watcher
        self.conf = conf
        self.pool = BookieConnectionPool(conf.connect_timeout, conf.max_frame_size)
        self.failure_history: dict[str, int] = collections.defaultdict(int)
        self._owns_store = owns_store
        self._handles: set[LedgerHandle] = set()
        self._closed = False

    @classmethod
    async def connect(cls, metastore: str | MetaStore, placement_policy: EnsemblePlacementPolicy | None = None,
                      conf: Mapping[str, Any] | None = None) -> BookKeeper:
        """Open the metastore (a URI or an open store), read the bookie registrations, start watching.

        Raises ``metastore.errors.ServiceDownError`` when the metastore is unreachable.
        """
        owns = isinstance(metastore, str)
        store = await open_metastore(metastore) if isinstance(metastore, str) else metastore
        cconf = ClientConf.from_mapping(conf)
        mapping: StaticMapping | None = None
        if placement_policy is None:
            mapping = StaticMapping({})
            own_dns = bool(conf and (conf.get("dns_resolver_class") or conf.get("network_topology_script_file")))
            if conf and (conf.get("ensemble_placement_policy") or own_dns):
                from placement import build_policy

                placement_policy = build_policy({k: str(v) for k, v in conf.items()},
                                                dns=None if own_dns else mapping)
                if own_dns:
                    mapping = None
            else:
                placement_policy = RackawareEnsemblePlacementPolicy(dns=mapping)
        manager = await LedgerMetadataManager.open(store)
        await store.create_scannable_table(BOOKIES_TABLE)
        watcher = BookieWatcher(store, placement_policy, mapping, cconf.bookie_watch_interval_ms / 1000.0)
        await watcher.refresh()
        watcher.start()
        return cls(store, manager, placement_policy, watcher, cconf, owns)

    def _check_open(self) -> None:
        if self._closed:
            raise BKError("BookKeeper client is closed")

    async def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                            digest: str = "crc32c", password: bytes = b"",
                            properties: Mapping[str, bytes] | None = None) -> LedgerHandle:
        """Create a ledger on ``ensemble`` bookies chosen by the placement policy.

        Raises ``ValueError`` for impossible quorums or an unknown digest,
        ``NotEnoughBookiesError`` when too few writable bookies are registered.
        """
        self._check_open()
        if not (ensemble >= write_quorum >= ack_quorum >= 1):
            raise ValueError(f"need ensemble >= write_quorum >= ack_quorum >= 1, got {ensemble}/{write_quorum}/"
                             f"{ack_quorum}")
        digests.digest_type_of(digest)
        try:
            bookies = self.policy.new_ensemble(ensemble, write_quorum, ack_quorum, set())
        except PlacementNotEnoughBookiesError:
            await self.watcher.refresh()
            try:
                bookies = self.policy.new_ensemble(ensemble, write_quorum, ack_quorum, set())
            except PlacementNotEnoughBookiesError as exc:
                raise NotEnoughBookiesError(str(exc)) from None
        ledger_id = await self.ledgers.new_ledger_id()
        md = LedgerMetadata(ensemble_size=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
                            ensembles=[(0, list(bookies))], digest=str(digest),
                            password_digest=password_digest(password),
                            properties={k: bytes(v) for k, v in (properties or {}).items()})
        version = await self.ledgers.create(ledger_id, md)
        log.debug("created ledger %d on %s", ledger_id, bookies)
        return self._track(LedgerHandle(self, ledger_id, md, version, password, writable=True))

    def _track(self, lh: LedgerHandle) -> LedgerHandle:
        self._handles.add(lh)
        return lh

    async def _read_checked(self, ledger_id: int, password: bytes) -> tuple[LedgerMetadata, Version]:
        md, version = await self.ledgers.read(ledger_id)
        if md.password_digest and md.password_digest != password_digest(password):
            raise UnauthorizedError(f"wrong password for ledger {ledger_id}")
        return md, version

    async def open_ledger(self, ledger_id: int, password: bytes = b"") -> LedgerHandle:
        """Recovery-open: fence the ledger, recover its tail, close it; a read-only handle on the result."""
        self._check_open()
        from bookie.recovery import recover_ledger

        md, version = await recover_ledger(self, ledger_id, password)
        lh = LedgerHandle(self, ledger_id, md, version, password, writable=False)
        lh.last_add_confirmed = md.last_entry_id
        return self._track(lh)

    async def open_ledger_no_recovery(self, ledger_id: int, password: bytes = b"") -> LedgerHandle:
        """Open without fencing; an open ledger can be tailed up to its LAC (``read_last_add_confirmed``)."""
        self._check_open()
        md, version = await self._read_checked(ledger_id, password)
        lh = LedgerHandle(self, ledger_id, md, version, password, writable=False)
        if md.is_closed:
            lh.last_add_confirmed = md.last_entry_id
        else:
            await lh.read_last_add_confirmed()
        return self._track(lh)

    async def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata; bookies garbage-collect its entries. ``NoSuchLedgerError``."""
        self._check_open()
        await self.ledgers.delete(ledger_id)

    def note_failure(self, address: str) -> None:
        self.failure_history[address] += 1

    async def close(self) -> None:
        """Close the client: pending adds fail, connections close; the metastore closes if we opened it."""
        if self._closed:
            return
        self._closed = True
        for lh in list(self._handles):
            lh._fail_all(BKError("BookKeeper client closed"))
        self.watcher.stop()
        self.pool.close()
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> BookKeeper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class LedgerHandle:
    """A handle on one ledger: the writer's (``create_ledger``) or a reader's (``open_ledger*``)."""

    def __init__(self, bk: BookKeeper, ledger_id: int, metadata: LedgerMetadata, version: Version,
                 password: bytes, *, writable: bool, recovery: bool = False) -> None:
        self.bk = bk
        self.ledger_id = ledger_id
        self.metadata = metadata
        self._version = version
        self._password = bytes(password)
        self._master_key = digests.master_key(self._password)
        self._digest = digests.digest_type_of(metadata.digest)
        self._writable = writable
        self._recovery = recovery
        self._quorum = metadata.write_quorum if recovery else metadata.ack_quorum
        self.last_add_confirmed = -1
        self.length = 0
        self._next_entry_id = 0
        self._pending: collections.deque[_PendingAdd] = collections.deque()
        self._replacing: set[str] = set()
        self._to_replace: set[str] = set()
        self._change_task: asyncio.Task[None] | None = None
        self._error: BKError | None = None
        self._closing = False
        self._loop = asyncio.get_running_loop()

    # --- state ----------------------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return self.metadata.is_closed

    def __repr__(self) -> str:
        return f"<LedgerHandle {self.ledger_id} {self.metadata.state.value} lac={self.last_add_confirmed}>"

    # --- writing --------------------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if not self._writable or self.metadata.is_closed or self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed for adds")

    async def add_entry(self, data: bytes) -> int:
        """Append ``data``; returns its entry id once ``ack_quorum`` bookies made it durable."""
        return await self._submit(bytes(data))

    async def add_entries(self, items: Sequence[bytes]) -> list[int]:
        """Append many entries, pipelined; returns their ids (in order)."""
        futures = [self._submit_nowait(bytes(d)) for d in items]
        return list(await asyncio.gather(*futures))

    def _submit_nowait(self, data: bytes) -> asyncio.Future[int]:
        self._check_writable()
        entry_id = self._next_entry_id
        self._next_entry_id += 1
        self.length += len(data)
        payload = digests.encode_entry(self.ledger_id, entry_id, self.last_add_confirmed, self.length, data,
                                       self._digest, self._password)
        return self._enqueue(entry_id, payload, self.length, len(data))

    async def _submit(self, data: bytes) -> int:
        return await self._submit_nowait(data)

    def _enqueue(self, entry_id: int, payload: bytes, ledger_length: int, data_length: int) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = self._loop.create_future()
        p = _PendingAdd(entry_id, payload, ledger_length, data_length, fut)
        p.timer = self._loop.call_later(self.bk.conf.add_entry_timeout, self._add_timed_out, p)
        self._pending.append(p)
        self._send(p)
        return fut

    def _send(self, p: _PendingAdd) -> None:
        ensemble = self.metadata.current_ensemble
        for idx in self.metadata.write_set(p.entry_id):
            addr = ensemble[idx]
            if addr in p.acked or addr in p.sent or addr in self._replacing or addr in self._to_replace:
                continue
            p.sent.add(addr)
            conn = self.bk.pool._conns.get(addr)
            if conn is not None and not conn.closed:
                self._send_on(conn, p, addr)
            else:
                self._loop.create_task(self._connect_and_send(p, addr))

    async def _connect_and_send(self, p: _PendingAdd, addr: str) -> None:
        try:
            conn = await self.bk.pool.get(addr)
        except BKError as exc:
            self._bookie_failed(addr, exc)
            return
        if p.done or addr not in p.sent:
            return
        self._send_on(conn, p, addr)

    def _send_on(self, conn: Any, p: _PendingAdd, addr: str) -> None:
        req = protocol.add_request(conn.next_txn_id(), self.ledger_id, p.entry_id, self._master_key, p.payload,
                                   recovery=self._recovery)
        conn.send(req).add_done_callback(lambda fut: self._on_add_response(p, addr, fut))

    def _on_add_response(self, p: _PendingAdd, addr: str, fut: asyncio.Future[protocol.Response]) -> None:
        if addr not in p.sent:
            return  # a reply from a bookie that was replaced since
        exc = fut.exception()
        if exc is not None:
            self._bookie_failed(addr, exc)
            return
        resp = fut.result()
        if resp.status == protocol.OK:
            if addr in self._replacing or addr in self._to_replace:
                return
            p.acked.add(addr)
            if not p.done and len(p.acked) >= self._quorum:
                p.done = True
                self._complete_in_order()
            return
        err = protocol.error_for(resp)
        if resp.status in (protocol.FENCED, protocol.UNAUTHORIZED):
            assert err is not None
            self._fail_all(err)
        else:
            self._bookie_failed(addr, err)

    def _complete_in_order(self) -> None:
        while self._pending and self._pending[0].done:
            p = self._pending.popleft()
            if p.timer is not None:
                p.timer.cancel()
            self.last_add_confirmed = p.entry_id
            if not p.future.done():
                p.future.set_result(p.entry_id)

    def _add_timed_out(self, p: _PendingAdd) -> None:
        if p.done:
            return
        slow = p.sent - p.acked
        if not slow:
            return
        for addr in slow:
            self._bookie_failed(addr, TimeoutError(f"add {self.ledger_id}:{p.entry_id} timed out on {addr}"))
        p.timer = self._loop.call_later(self.bk.conf.add_entry_timeout, self._add_timed_out, p)

    def _bookie_failed(self, addr: str, exc: BaseException | None) -> None:
        if self._error is not None or addr in self._replacing or addr in self._to_replace:
            return
        if addr not in self.metadata.current_ensemble:
            return
        log.warning("ledger %d: bookie %s failed (%s); changing ensemble", self.ledger_id, addr, exc)
        self.bk.note_failure(addr)
        self._to_replace.add(addr)
        if self._change_task is None or self._change_task.done():
            self._change_task = self._loop.create_task(self._change_ensemble())

    async def _change_ensemble(self) -> None:
        while self._to_replace and self._error is None:
            failed = set(self._to_replace)
            self._replacing |= failed
            self._to_replace -= failed
            try:
                await self._write_new_segment(failed)
            except BKError as exc:
                self._fail_all(exc)
                return
            finally:
                self._replacing -= failed
            for p in list(self._pending):
                p.acked -= failed
                p.sent -= failed
                if not p.done:
                    self._send(p)

    async def _write_new_segment(self, failed: set[str]) -> None:
        md = self.metadata
        for _ in range(20):
            new = md.copy()
            ensemble = list(new.current_ensemble)
            exclude = set(ensemble) | failed | self._to_replace
            for addr in failed:
                if addr not in ensemble:
                    continue
                try:
                    replacement = self.bk.policy.replace_bookie(new.ensemble_size, new.write_quorum,
                                                                new.ack_quorum, ensemble, addr, exclude)
                except PlacementNotEnoughBookiesError:
                    await self.bk.watcher.refresh()
                    try:
                        replacement = self.bk.policy.replace_bookie(new.ensemble_size, new.write_quorum,
                                                                    new.ack_quorum, ensemble, addr, exclude)
                    except PlacementNotEnoughBookiesError as exc:
                        raise NotEnoughBookiesError(str(exc)) from None
                ensemble[ensemble.index(addr)] = replacement
                exclude.add(replacement)
            first = self.last_add_confirmed + 1
            if new.ensembles[-1][0] >= first:
                new.ensembles[-1] = (new.ensembles[-1][0], ensemble)
            else:
                new.ensembles.append((first, ensemble))
            try:
                self._version = await self.bk.ledgers.write(self.ledger_id, new, self._version)
            except MetadataVersionError:
                md, self._version = await self.bk.ledgers.read(self.ledger_id)
                if md.state is not LedgerState.OPEN and not self._recovery:
                    raise LedgerFencedError(f"ledger {self.ledger_id} is being recovered") from None
                if md.is_closed:
                    raise LedgerClosedError(f"ledger {self.ledger_id} was closed") from None
                self.metadata = md
                continue
            log.info("ledger %d: new ensemble from entry %d: %s", self.ledger_id, first, ensemble)
            self.metadata = new
            return
        raise MetadataVersionError(f"ledger {self.ledger_id}: could not record the ensemble change")

    def _fail_all(self, exc: BKError) -> None:
        if self._error is None:
            self._error = exc
        while self._pending:
            p = self._pending.popleft()
            if p.timer is not None:
                p.timer.cancel()
            if not p.future.done():
                p.future.set_exception(exc)

    async def _drain(self) -> None:
        if self._pending:
            await asyncio.gather(*(p.future for p in list(self._pending)), return_exceptions=True)

    async def close(self) -> None:
        """Wait for pending adds, then mark the ledger CLOSED (last entry, length) in the metadata.

        A reader's handle just closes. ``LedgerFencedError`` when the ledger
        was recovered under this writer with a different end.
        """
        if not self._writable or self.metadata.is_closed:
            self.bk._handles.discard(self)
            return
        self._closing = True
        await self._drain()
        if self._change_task is not None:
            await asyncio.gather(self._change_task, return_exceptions=True)
        md, version = self.metadata.copy(), self._version
        for _ in range(20):
            md.state = LedgerState.CLOSED
            md.last_entry_id = self.last_add_confirmed
            md.length = self._acked_length()
            try:
                self._version = await self.bk.ledgers.write(self.ledger_id, md, version)
                self.metadata = md
                break
            except MetadataVersionError:
                md, version = await self.bk.ledgers.read(self.ledger_id)
                if md.is_closed:
                    self.metadata, self._version = md, version
                    if md.last_entry_id != self.last_add_confirmed:
                        raise LedgerFencedError(
                            f"ledger {self.ledger_id} was recovered with last entry {md.last_entry_id}, "
                            f"writer had {self.last_add_confirmed}") from None
                    break
                if md.state is LedgerState.IN_RECOVERY:
                    raise LedgerFencedError(f"ledger {self.ledger_id} is being recovered") from None
        else:
            raise MetadataVersionError(f"ledger {self.ledger_id}: could not record the close")
        self.bk._handles.discard(self)
        if self._error is not None and not isinstance(self._error, LedgerClosedError):
            log.info("ledger %d closed after error %s", self.ledger_id, self._error)

    def _acked_length(self) -> int:
        pending_bytes = sum(p.data_length for p in self._pending)
        return self.length - pending_bytes

    # --- reading --------------------------------------------------------------------------------
    async def read_last_add_confirmed(self) -> int:
        """Ask the last ensemble's bookies for their LAC; update and return ``last_add_confirmed``."""
        if self.metadata.is_closed:
            self.last_add_confirmed = self.metadata.last_entry_id
            return self.last_add_confirmed
        results = await asyncio.gather(*(self._read_lac(a) for a in self.metadata.current_ensemble),
                                       return_exceptions=True)
        lacs = [r for r in results if isinstance(r, int)]
        if not lacs:
            raise BookieUnavailableError(f"no bookie answered READ_LAC for ledger {self.ledger_id}")
        self.last_add_confirmed = max(self.last_add_confirmed, *lacs)
        return self.last_add_confirmed

    async def _read_lac(self, addr: str) -> int:
        conn = await self.bk.pool.get(addr)
        resp = await conn.request(protocol.read_lac_request(conn.next_txn_id(), self.ledger_id),
                                  self.bk.conf.read_entry_timeout)
        if resp.status in (protocol.NO_LEDGER, protocol.NO_ENTRY):
            return -1
        protocol.raise_for_status(resp)
        return int(resp.lac)

    async def read(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Yield entries ``first..last`` in order (reads pipelined, each from the best replica).

        ``NoSuchEntryError`` when the range goes past the last confirmed entry.
        """
        limit = self.metadata.last_entry_id if self.metadata.is_closed else self.last_add_confirmed
        if first < 0 or last < first or last > limit:
            raise NoSuchEntryError(f"ledger {self.ledger_id}: cannot read {first}..{last} (last readable is {limit})")
        window = max(1, self.bk.conf.read_window)
        inflight: collections.deque[asyncio.Task[LedgerEntry]] = collections.deque()
        nxt = first
        try:
            while nxt <= last or inflight:
                while nxt <= last and len(inflight) < window:
                    inflight.append(self._loop.create_task(self.read_entry(nxt)))
                    nxt += 1
                yield await inflight.popleft()
        finally:
            for t in inflight:
                t.cancel()

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        """Read one entry from its write set, speculatively asking the next replica after a delay."""
        payload = await self.read_payload(entry_id)
        entry = digests.decode_entry(payload, self._digest, self._password, ledger_id=self.ledger_id,
                                     entry_id=entry_id)
        return LedgerEntry(self.ledger_id, entry_id, entry.body, entry.length)

    async def read_payload(self, entry_id: int) -> bytes:
        """The verified payload of ``entry_id`` (raises the most telling error if no replica has it)."""
        md = self.metadata
        ensemble = md.ensemble_for(entry_id)
        order = self.bk.policy.reorder_read_sequence(ensemble, md.write_set(entry_id), self.bk.failure_history)
        candidates = [ensemble[i] for i in order]
        errors: list[BaseException] = []
        running: set[asyncio.Task[bytes]] = set()
        delay = self.bk.conf.speculative_read_timeout_ms / 1000.0
        try:
            while candidates or running:
                if candidates and (not running or delay > 0):
                    running.add(self._loop.create_task(self._read_from(candidates.pop(0), entry_id)))
                timeout = delay if (candidates and delay > 0) else None
                done, _ = await asyncio.wait(running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    running.discard(t)
                    exc = t.exception()
                    if exc is None:
                        return t.result()
                    errors.append(exc)
        finally:
            for t in running:
                t.cancel()
        raise _best_error(errors, self.ledger_id, entry_id)

    async def _read_from(self, addr: str, entry_id: int) -> bytes:
        try:
            conn = await self.bk.pool.get(addr)
            resp = await conn.request(protocol.read_request(conn.next_txn_id(), self.ledger_id, entry_id),
                                      self.bk.conf.read_entry_timeout)
        except builtins.TimeoutError:
            self.bk.note_failure(addr)
            raise TimeoutError(f"read {self.ledger_id}:{entry_id} from {addr} timed out") from None
        except BKError:
            self.bk.note_failure(addr)
            raise
        protocol.raise_for_status(resp)
        try:
            digests.decode_entry(resp.body, self._digest, self._password, ledger_id=self.ledger_id,
                                 entry_id=entry_id)
        except DigestMismatchError as exc:
            log.warning("ledger %d entry %d from %s: %s", self.ledger_id, entry_id, addr, exc)
            self.bk.note_failure(addr)
            raise
        return bytes(resp.body)


def _best_error(errors: list[BaseException], ledger_id: int, entry_id: int) -> BKError:
    """The error that says most about why no replica served an entry."""
    for kind in (UnauthorizedError, DigestMismatchError, NoSuchEntryError, NoSuchLedgerError):
        for e in errors:
            if isinstance(e, kind):
                if kind in (NoSuchEntryError, NoSuchLedgerError) and not all(
                        isinstance(x, NoSuchEntryError | NoSuchLedgerError) for x in errors):
                    continue
                return NoSuchEntryError(str(e)) if kind is NoSuchLedgerError else e
    for e in errors:
        if isinstance(e, BKError):
            return e
    return BookieUnavailableError(f"no replica of {ledger_id}:{entry_id} answered")
