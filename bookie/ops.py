"""The one adapter to the bookie package's lower layers for ``quire shell`` and AutoRecovery.

Everything the shell and the replication workers do below the public ledger
client (``BookKeeper``) goes through ``BookieOps``, so a change in the bookie
package's internals changes this module only::

    ops = await BookieOps.open(store, conf={"ensemble_placement_policy": "rackaware"})
    info = await ops.bookie_info("127.0.0.1:3181")            # BookieInfo(free_disk, total_disk, read_only)
    payload = await ops.read_payload("127.0.0.1:3181", ledger_id, entry_id)   # the stored bytes
    await ops.write_payload("127.0.0.1:3182", ledger_id, entry_id, master_key, payload)  # recovery add
    md, version = await ops.read_metadata(ledger_id)
    async for ledger_id, md in ops.list_ledgers(): ...
    md = await ops.replace_in_segment(ledger_id, first_entry, old="127.0.0.1:3181", new="127.0.0.1:3183")
    regs = await ops.registrations()                          # {address: BookieRegistrationRecord}
    await ops.refresh_placement()                              # feed the policy the live bookies
    spare = ops.policy.replace_bookie(3, 2, 2, ensemble, old, exclude={old})
    await ops.remove_registration("127.0.0.1:3181")
    bk = await ops.client()                                    # a BookKeeper on the same store
    master_key(password); password_matches(md, password); verify_payload(md, lid, eid, payload, password)
    await ops.close()                                          # closes the client and connections, not the store

The adapter owns its own bookie connections (``bookie.connection``), its own
placement policy (``placement.build_policy`` fed from the ``bookies``
registrations, as the ledger client's is) and its own ledger-metadata manager
(``bookie.metadata``); metadata updates are compare-and-set through
``metastore.cas``.

Failure: bookie operations raise ``bookie.errors.BKError`` subclasses
(``BookieUnavailableError`` when the bookie cannot be reached,
``bookie.errors.TimeoutError`` past ``timeout``, the status's error for a
non-OK answer); metadata operations raise ``NoSuchLedgerError`` or
``metastore.errors.MetastoreError``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from bookie import digest as digests
from bookie import protocol
from bookie.client import PLACEMENT_KEYS, BookKeeper, ClientConf
from bookie.client_conf import client_keys
from bookie.connection import BookieConnectionPool
from bookie.errors import BKTimeoutError, ConfError
from bookie.metadata import LedgerMetadata, LedgerMetadataManager, LedgerState, MetadataVersionError, password_digest
from bookie.proto.bookie_pb2 import BookieRegistrationRecord
from bookie.registration import BOOKIES_TABLE, READ_ONLY, list_bookies
from bookie.watcher import apply_registrations
from metastore import MetaStore, Version
from metastore.cas import cas_retry
from metastore.errors import NoKeyError
from placement import EnsemblePlacementPolicy, StaticMapping, client_policy

log = logging.getLogger(__name__)

__all__ = ["CLIENT_KEYS", "PLACEMENT_KEYS", "READ_ONLY", "BookieInfo", "BookieOps", "LedgerMetadata", "LedgerState",
           "master_key", "password_matches", "verify_payload"]

CLIENT_KEYS = frozenset(f.name for f in dataclasses.fields(ClientConf))
"""Ledger-client keys the shell passes on from a ``--conf`` file (with ``PLACEMENT_KEYS``)."""


@dataclass(frozen=True)
class BookieInfo:
    """A bookie's answer to GET_BOOKIE_INFO."""

    free_disk: int
    total_disk: int
    read_only: bool


class BookieOps:
    """Low-level bookie and ledger-metadata operations on one metastore; see the module docstring."""

    def __init__(self, store: MetaStore, ledgers: LedgerMetadataManager, policy: EnsemblePlacementPolicy,
                 mapping: StaticMapping | None, conf: Mapping[str, str], timeout: float) -> None:
        self.store = store
        self.policy = policy
        self.timeout = timeout
        self._ledgers = ledgers
        self._mapping = mapping
        self._conf = dict(conf)
        self._pool = BookieConnectionPool(connect_timeout=min(timeout, 3.0))
        self._client: BookKeeper | None = None

    @classmethod
    async def open(cls, store: MetaStore, conf: Mapping[str, str] | None = None, timeout: float = 5.0) -> BookieOps:
        """Bind to an open ``store``; ``conf`` may name the placement policy (``ensemble_placement_policy``...).

        Raises ``ValueError`` for a placement configuration that cannot work,
        ``MetastoreError`` when the store fails.
        """
        conf = {k: str(v) for k, v in (conf or {}).items()}
        policy, mapping = client_policy({k: v for k, v in conf.items() if k in PLACEMENT_KEYS})
        ledgers = await LedgerMetadataManager.open(store)
        await store.create_scannable_table(BOOKIES_TABLE)
        return cls(store, ledgers, policy, mapping, conf, timeout)

    async def client(self) -> BookKeeper:
        """A ledger client on the same store (made once; closed by ``close``).

        Raises ``bookie.errors.ConfError`` (one line naming the key) for a bad client or placement key.
        """
        if self._client is None:
            keys = client_keys()  # the client's and the placement policy's
            conf = {k: v for k, v in self._conf.items() if k in keys and v != ""}
            try:
                self._client = await BookKeeper.connect(self.store, conf=conf or None)
            except ValueError as exc:
                raise ConfError(str(exc)) from None
        return self._client

    async def close(self) -> None:
        """Close the ledger client (if made) and the bookie connections; the store stays open."""
        self._pool.close()
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    # --- bookies --------------------------------------------------------------------------------
    async def _request(self, address: str, request_of: Any) -> protocol.Response:
        conn = await self._pool.get(address)
        try:
            return await conn.request(request_of(conn.next_txn_id()), self.timeout)
        except TimeoutError:
            raise BKTimeoutError(f"bookie {address} did not answer within {self.timeout:g} s") from None

    async def bookie_info(self, address: str) -> BookieInfo:
        """GET_BOOKIE_INFO of one bookie: free and total disk bytes, read-only state."""
        resp = protocol.raise_for_status(await self._request(address, protocol.bookie_info_request))
        return BookieInfo(int(resp.free_disk), int(resp.total_disk), bool(resp.read_only))

    async def read_payload(self, address: str, ledger_id: int, entry_id: int) -> bytes:
        """The payload of ``ledger_id:entry_id`` as ``address`` stores it (digest not checked here).

        Raises ``NoSuchEntryError`` / ``NoSuchLedgerError`` when that bookie lacks it.
        """
        resp = await self._request(address, lambda txn: protocol.read_request(txn, ledger_id, entry_id))
        return bytes(protocol.raise_for_status(resp).body)

    async def write_payload(self, address: str, ledger_id: int, entry_id: int, master_key: bytes,
                            payload: bytes) -> None:
        """Store ``payload`` as ``ledger_id:entry_id`` on ``address``, durably, as a recovery add.

        A recovery add passes a fence; writing an entry the bookie already has
        replaces it with the same bytes. ``UnauthorizedError`` when the bookie
        knows the ledger under another master key.
        """
        resp = await self._request(address, lambda txn: protocol.add_request(txn, ledger_id, entry_id, master_key,
                                                                             payload, recovery=True))
        protocol.raise_for_status(resp)

    async def registrations(self) -> dict[str, BookieRegistrationRecord]:
        """Every live bookie registration, by address."""
        return await list_bookies(self.store)

    async def refresh_placement(self) -> dict[str, BookieRegistrationRecord]:
        """Tell the placement policy which bookies are writable/read-only now, and where they are."""
        regs = await self.registrations()
        apply_registrations(regs, self.policy, self._mapping)
        return regs

    async def remove_registration(self, address: str) -> bool:
        """Remove ``address`` from the ``bookies`` table; False when it was not registered."""
        table = await self.store.create_scannable_table(BOOKIES_TABLE)
        try:
            await table.remove(address, Version.ANY)
        except NoKeyError:
            return False
        return True

    # --- ledger metadata ------------------------------------------------------------------------
    async def read_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, Version]:
        """The ledger's metadata and version; ``NoSuchLedgerError``."""
        return await self._ledgers.read(ledger_id)

    async def list_ledgers(self) -> AsyncIterator[tuple[int, LedgerMetadata]]:
        """Every ledger in id order."""
        async for item in self._ledgers.list():
            yield item

    async def replace_in_segment(self, ledger_id: int, first_entry: int, old: str, new: str) -> LedgerMetadata:
        """Put ``new`` in ``old``'s place in the segment starting at ``first_entry``, by compare-and-set.

        Re-reads and retries on a concurrent change. Returns the metadata as
        stored afterwards (unchanged when the segment no longer holds ``old``).
        Raises ``NoSuchLedgerError`` when the ledger is gone and ``ValueError``
        when ``new`` is already in that segment.
        """

        async def step() -> LedgerMetadata:
            md, version = await self._ledgers.read(ledger_id)
            for i, (first, ensemble) in enumerate(md.ensembles):
                if first == first_entry and old in ensemble:
                    if new in ensemble:
                        raise ValueError(f"ledger {ledger_id}: {new} is already in the ensemble of entries "
                                         f"from {first_entry}")
                    updated = md.copy()
                    members = list(ensemble)
                    members[members.index(old)] = new
                    updated.ensembles[i] = (first, members)
                    await self._ledgers.write(ledger_id, updated, version)
                    return updated
            return md

        return await cas_retry(step, retry_on=(MetadataVersionError,))


def master_key(password: bytes) -> bytes:
    """What a writer shows bookies to prove it may write the ledger (derived from its password)."""
    return digests.master_key(password)


def password_matches(md: LedgerMetadata, password: bytes) -> bool:
    """True when ``password`` is the ledger's (or the ledger has none recorded)."""
    return not md.password_digest or md.password_digest == password_digest(password)


def verify_payload(md: LedgerMetadata, ledger_id: int, entry_id: int, payload: bytes, password: bytes) -> bytes:
    """The entry's body after checking the payload's digest; ``DigestMismatchError`` when it is bad."""
    return digests.decode_entry(payload, md.digest, password, ledger_id=ledger_id, entry_id=entry_id).body
