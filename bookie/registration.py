"""Bookie registration in the metastore table ``bookies`` (key ``host:port``).

The bookie side::

    reg = BookieRegistration(ms, "127.0.0.1:3181", "/region-a/rack-1", session_timeout=2.0)
    await reg.register(read_only=False, free_disk=..., total_disk=...)
    await reg.update(read_only=True, free_disk=..., total_disk=...)   # state change
    await reg.ensure_alive()       # re-register if the session expired (call periodically)
    await reg.unregister()

The reader side (ledger client, placement, tools)::

    for address, rec in (await list_bookies(ms)).items():
        rec.network_location, rec.state == READ_ONLY, rec.free_disk

The key is ephemeral (``SessionCapability``): it vanishes ``session_timeout``
after the process dies. The record is a ``BookieRegistrationRecord``
protobuf in the field ``data``. Only one live bookie can listen on an
address, so a registration found at our address when we start is a dead
predecessor's (kill -9, lease not yet expired): it is replaced at once.
"""

from __future__ import annotations

import logging
import time

from bookie.proto.bookie_pb2 import BookieRegistrationRecord
from metastore import MetaStore, Session, Value, Version
from metastore.api import MetastoreScannableTable
from metastore.errors import KeyExistsError, MetastoreError, NoKeyError

log = logging.getLogger(__name__)

BOOKIES_TABLE = "bookies"
DATA_FIELD = "data"
WRITABLE = BookieRegistrationRecord.WRITABLE
READ_ONLY = BookieRegistrationRecord.READ_ONLY


def decode_registration(value: Value) -> BookieRegistrationRecord:
    """The record stored in a ``bookies`` row (``ValueError`` when it has none)."""
    raw = value.get(DATA_FIELD)
    if raw is None:
        raise ValueError("bookie registration has no 'data' field")
    return BookieRegistrationRecord.FromString(raw)


async def list_bookies(ms: MetaStore) -> dict[str, BookieRegistrationRecord]:
    """Every live registration, by address. Raises ``MetastoreError`` from the store."""
    table = await ms.create_scannable_table(BOOKIES_TABLE)
    cur = await table.open_cursor()
    out: dict[str, BookieRegistrationRecord] = {}
    try:
        while cur.has_more():
            for key, got in await cur.read_entries(256):
                try:
                    out[key] = decode_registration(got.value)
                except ValueError:
                    log.warning("ignoring malformed bookie registration %s", key)
    finally:
        await cur.close()
    return out


class BookieRegistration:
    """One bookie's ephemeral registration; see the module docstring."""

    def __init__(self, ms: MetaStore, address: str, network_location: str,
                 session_timeout: float, http_url: str = "") -> None:
        self.address = address
        self.network_location = network_location
        self.session_timeout = session_timeout
        self._ms = ms
        self._table: MetastoreScannableTable | None = None
        self._session: Session | None = None
        self._record = BookieRegistrationRecord(address=address, network_location=network_location,
                                                http_url=http_url)

    @property
    def record(self) -> BookieRegistrationRecord:
        """A copy of the record last published."""
        rec = BookieRegistrationRecord()
        rec.CopyFrom(self._record)
        return rec

    @property
    def registered(self) -> bool:
        return self._session is not None and self._session.alive

    def _set(self, read_only: bool, free_disk: int, total_disk: int) -> Value:
        self._record.state = READ_ONLY if read_only else WRITABLE
        self._record.free_disk = max(0, free_disk)
        self._record.total_disk = max(0, total_disk)
        return Value({DATA_FIELD: self._record.SerializeToString()})

    async def register(self, *, read_only: bool, free_disk: int, total_disk: int) -> None:
        """Open a session and create the ephemeral key; replaces a dead predecessor's.

        Raises ``MetastoreError`` when the store fails (``KeyExistsError`` if
        the key reappears while we replace it).
        """
        if self._table is None:
            self._table = await self._ms.create_scannable_table(BOOKIES_TABLE)
        self._record.registered_ms = int(time.time() * 1000)
        value = self._set(read_only, free_disk, total_disk)
        session = await self._ms.session(timeout=self.session_timeout)
        try:
            try:
                await session.put_ephemeral(self._table, self.address, value)
            except KeyExistsError:
                log.warning("replacing the stale registration of %s (a previous process)", self.address)
                try:
                    await self._table.remove(self.address, Version.ANY)
                except NoKeyError:
                    pass
                await session.put_ephemeral(self._table, self.address, value)
        except BaseException:
            await session.close()
            raise
        self._session = session
        log.info("registered bookie %s at %s (%s)", self.address, self.network_location,
                 "read-only" if read_only else "writable")

    async def update(self, *, read_only: bool, free_disk: int, total_disk: int) -> None:
        """Publish a new state / free disk; re-registers if the key is gone."""
        value = self._set(read_only, free_disk, total_disk)
        if self._table is None or not self.registered:
            await self.register(read_only=read_only, free_disk=free_disk, total_disk=total_disk)
            return
        try:
            await self._table.put(self.address, value, Version.ANY)
        except NoKeyError:
            await self._drop_session()
            await self.register(read_only=read_only, free_disk=free_disk, total_disk=total_disk)

    async def ensure_alive(self) -> bool:
        """Re-register when the session expired (a long pause, a metastore outage).

        Returns True when a new registration was made. Errors are logged and
        retried at the next call.
        """
        if self.registered:
            return False
        rec = self._record
        log.warning("bookie %s lost its registration session; registering again", self.address)
        try:
            await self._drop_session()
            await self.register(read_only=rec.state == READ_ONLY, free_disk=rec.free_disk,
                                total_disk=rec.total_disk)
        except MetastoreError as exc:
            log.warning("re-registration of %s failed: %s", self.address, exc)
            return False
        return True

    async def _drop_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                await session.close()
            except MetastoreError:
                log.debug("closing an expired session failed", exc_info=True)

    async def unregister(self) -> None:
        """Remove the registration (closing the session removes the ephemeral key)."""
        await self._drop_session()
        log.info("unregistered bookie %s", self.address)
