"""Hub metadata managers: thin layers over the MetaStore tables of DESIGN.md section 3.

Hedwig's ``TopicOwnershipManager``, ``TopicPersistenceManager`` and
``SubscriptionDataManager`` (seed ``hedwig-docs-and-metastore.txt``, "Metadata
management"), plus the registry of live hubs and their load::

    ms = await open_metastore("lmdb://data/metastore")
    owners = TopicOwnershipManager(ms)
    await owners.start()                                   # creates/opens ``topic_owners``
    session = await ms.session(timeout=2.0)
    v = await owners.write_owner_info(b"topic", me, Version.NEW, session)   # ephemeral claim
    got = await owners.read_owner_info(b"topic")           # (HubInfo, Version) or None

    subs = SubscriptionDataManager(ms)
    await subs.start()
    v = await subs.create_subscription_data(b"topic", b"sub1", pb.SubscriptionData(state=...))
    v = await subs.update_subscription_data(b"topic", b"sub1",
                                            pb.SubscriptionData(state=new_state), v)  # prefs untouched
    everyone = await subs.read_subscriptions(b"topic")    # {subscriber: (data, version)}

    hubs = HubRegistry(ms)
    await hubs.start()
    await hubs.register(me, session)                       # ephemeral, with load 0
    await hubs.update_load(me, num_topics=12)
    for info, load in await hubs.live_hubs(): ...

Semantics (the seed's): every write and delete takes a ``Version``;
``Version.NEW`` creates and fails with ``...ExistsError`` when the record is
there; a concrete version is a compare-and-set that fails with
``BadVersionError`` when someone else wrote in between, or ``No...Error``
when the record is gone. Reads return ``None`` for a missing record.

Failure: only ``hub.errors`` classes leave this module. A metastore that
cannot be reached gives ``ServiceDownError``; a topic or subscriber id that
is empty or not UTF-8 (or a topic holding ``"\\x00"``, the subscription key
separator) gives ``MalformedRequestError``; any other metastore failure
gives a plain ``PubSubError`` (``UNEXPECTED_CONDITION``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Generic, TypeVar

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from hub import errors
from hub.proto import pubsub_pb2 as pb
from metastore import errors as ms_errors
from metastore.api import (
    ALL_FIELDS,
    MetaStore,
    MetastoreScannableTable,
    MetastoreTable,
    Order,
    Session,
    Value,
    Version,
    Versioned,
)
from metastore.cas import cas_retry, update_record

__all__ = [
    "HUBS_TABLE",
    "SUBSCRIPTIONS_TABLE",
    "TOPIC_DEDUP_TABLE",
    "TOPIC_OWNERS_TABLE",
    "TOPIC_PERSISTENCE_TABLE",
    "HubRegistry",
    "SubscriptionDataManager",
    "TopicDedupManager",
    "TopicOwnershipManager",
    "TopicPersistenceManager",
    "hub_address",
]

log = logging.getLogger(__name__)

TOPIC_OWNERS_TABLE = "topic_owners"
TOPIC_PERSISTENCE_TABLE = "topic_persistence"
TOPIC_DEDUP_TABLE = "topic_dedup"
SUBSCRIPTIONS_TABLE = "subscriptions"
HUBS_TABLE = "hubs"

DATA_FIELD = "data"
STATE_FIELD = "state"
PREFERENCES_FIELD = "preferences"
LOAD_FIELD = "load"
HTTP_FIELD = "http"
SEPARATOR = "\x00"

P = TypeVar("P", bound=ProtoMessage)


def hub_address(info: pb.HubInfo) -> str:
    """``"host:port:sslport"``: a hub's key in the ``hubs`` table and the ``redirect_to`` format."""
    return f"{info.hostname}:{info.port}:{info.sslPort}"


def _name(raw: bytes, what: str) -> str:
    """The metastore key text of a topic or subscriber id; ``MalformedRequestError`` if unusable."""
    if not isinstance(raw, bytes | bytearray):
        raise errors.MalformedRequestError(f"{what} must be bytes, not {type(raw).__name__}")
    if not raw:
        raise errors.MalformedRequestError(f"{what} must not be empty")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.MalformedRequestError(f"{what} {bytes(raw)!r} is not valid UTF-8") from exc


def _parse(cls: type[P], raw: bytes, where: str) -> P:
    out = cls()
    try:
        out.ParseFromString(raw)
    except DecodeError as exc:
        raise errors.PubSubError(f"corrupt {cls.__name__} record at {where}: {exc}") from exc
    return out


def _translated(exc: ms_errors.MetastoreError, where: str, missing: type[errors.PubSubError],
                exists: type[errors.PubSubError]) -> errors.PubSubError:
    """The ``hub.errors`` exception a metastore error raised at ``where`` maps to."""
    if isinstance(exc, ms_errors.NoKeyError):
        return missing(f"{where}: no such record")
    if isinstance(exc, ms_errors.KeyExistsError):
        return exists(f"{where}: record exists")
    if isinstance(exc, ms_errors.BadVersionError):
        return errors.BadVersionError(f"{where}: version is not the current one")
    if isinstance(exc, ms_errors.ServiceDownError):
        return errors.ServiceDownError(f"{where}: metastore down: {exc}")
    return errors.PubSubError(f"{where}: metastore error {exc.code}: {exc}")


@contextlib.contextmanager
def _mapped(where: str, missing: type[errors.PubSubError],
            exists: type[errors.PubSubError]) -> Iterator[None]:
    """Translate metastore errors raised inside the block into ``hub.errors`` classes."""
    try:
        yield
    except ms_errors.MetastoreError as exc:
        raise _translated(exc, where, missing, exists) from exc


class _Manager:
    """Common part: one table of the store, created by ``start`` (or lazily on first use).

    Subclasses name their table and the ``hub.errors`` classes that a missing
    (``_missing``) or already present (``_exists``) record maps to.
    """

    _table_name: str
    _scannable = False
    _what = "record"
    _missing: type[errors.PubSubError] = errors.PubSubError
    _exists: type[errors.PubSubError] = errors.PubSubError

    def __init__(self, store: MetaStore) -> None:
        self._store = store
        self._table: MetastoreTable | None = None

    async def start(self) -> None:
        """Create or open the manager's table; ``ServiceDownError`` if the metastore is down."""
        if self._table is not None:
            return
        with self._errors("open table", self._table_name):
            if self._scannable:
                self._table = await self._store.create_scannable_table(self._table_name)
            else:
                self._table = await self._store.create_table(self._table_name)

    async def _t(self) -> MetastoreTable:
        if self._table is None:
            await self.start()
        assert self._table is not None
        return self._table

    def _errors(self, action: str, key: str) -> contextlib.AbstractContextManager[None]:
        return _mapped(f"{action} {self._what} {key!r}", self._missing, self._exists)

    def _error(self, exc: ms_errors.MetastoreError, action: str, key: str) -> errors.PubSubError:
        """What ``_errors`` raises for ``exc``, built only when one is raised: a takeover makes tens of
        thousands of metastore calls, each formatting its message up front was a per-topic cost (issue 34)."""
        return _translated(exc, f"{action} {self._what} {key!r}", self._missing, self._exists)

    async def _get(self, key: str) -> Versioned | None:
        """The record at ``key``, or ``None`` when it is missing."""
        table = self._table if self._table is not None else await self._t()
        try:
            return await table.get(key)
        except ms_errors.NoKeyError:
            return None
        except ms_errors.MetastoreError as exc:
            raise self._error(exc, "read", key) from exc

    async def _put(self, action: str, key: str, value: Value, version: Version,
                   session: Session | None = None) -> Version:
        """Create (``Version.NEW``; ephemeral through ``session``) or CAS-write ``key``."""
        table = self._table if self._table is not None else await self._t()
        try:
            if session is not None and version == Version.NEW:
                return await session.put_ephemeral(table, key, value)
            return await table.put(key, value, version)
        except ms_errors.MetastoreError as exc:
            raise self._error(exc, action, key) from exc

    async def _remove(self, key: str, version: Version) -> None:
        table = self._table if self._table is not None else await self._t()
        try:
            await table.remove(key, version)
        except ms_errors.MetastoreError as exc:
            raise self._error(exc, "delete", key) from exc


class _TopicRecordManager(_Manager, Generic[P]):
    """One protobuf record per topic in field ``data``: read / write / delete with versions."""

    _record: type[P]

    async def _read(self, topic: bytes) -> tuple[P, Version] | None:
        key = _name(topic, "topic")
        got = await self._get(key)
        if got is None:
            return None
        return _parse(self._record, got.value.get(DATA_FIELD) or b"", key), got.version

    async def _write(self, topic: bytes, record: P, version: Version,
                     session: Session | None = None) -> Version:
        key = _name(topic, "topic")
        return await self._put("write", key, Value({DATA_FIELD: record.SerializeToString()}), version, session)

    async def _delete(self, topic: bytes, version: Version) -> None:
        await self._remove(_name(topic, "topic"), version)


class TopicOwnershipManager(_TopicRecordManager[pb.HubInfo]):
    """Who owns each topic: table ``topic_owners``, key = topic, field ``data`` = ``HubInfo``."""

    _table_name = TOPIC_OWNERS_TABLE
    _what = "owner of topic"
    _missing = errors.NoTopicOwnerInfoError
    _exists = errors.TopicOwnerInfoExistsError
    _record = pb.HubInfo

    async def read_owner_info(self, topic: bytes) -> tuple[pb.HubInfo, Version] | None:
        """The owner of ``topic`` and the record's version, or ``None`` when nobody owns it."""
        return await self._read(topic)

    async def write_owner_info(self, topic: bytes, owner: pb.HubInfo, version: Version,
                               session: Session | None = None) -> Version:
        """Claim (``Version.NEW``) or CAS-update the owner of ``topic``; returns the new version.

        A claim through ``session`` is ephemeral: it vanishes when the session
        ends. Raises ``TopicOwnerInfoExistsError`` (claim of an owned topic),
        ``BadVersionError`` / ``NoTopicOwnerInfoError`` (CAS).
        """
        return await self._write(topic, owner, version, session)

    async def delete_owner_info(self, topic: bytes, version: Version) -> None:
        """Release ``topic`` if ``version`` is current (``Version.ANY``: unconditionally).

        Raises ``BadVersionError`` or ``NoTopicOwnerInfoError``.
        """
        await self._delete(topic, version)


class TopicPersistenceManager(_TopicRecordManager[pb.LedgerRanges]):
    """A topic's ledgers: table ``topic_persistence``, key = topic, field ``data`` = ``LedgerRanges``."""

    _table_name = TOPIC_PERSISTENCE_TABLE
    _what = "persistence info of topic"
    _missing = errors.NoTopicPersistenceInfoError
    _exists = errors.TopicPersistenceInfoExistsError
    _record = pb.LedgerRanges

    async def read_topic_persistence_info(self, topic: bytes) -> tuple[pb.LedgerRanges, Version] | None:
        """The ledger ranges of ``topic`` and their version, or ``None`` for a topic never persisted."""
        return await self._read(topic)

    async def write_topic_persistence_info(self, topic: bytes, ranges: pb.LedgerRanges,
                                           version: Version) -> Version:
        """Create (``Version.NEW``) or CAS-replace the ranges; returns the new version.

        Raises ``TopicPersistenceInfoExistsError``, ``BadVersionError`` or
        ``NoTopicPersistenceInfoError``.
        """
        return await self._write(topic, ranges, version)

    async def delete_topic_persistence_info(self, topic: bytes, version: Version) -> None:
        """Remove the ranges if ``version`` is current; ``BadVersionError`` / ``NoTopicPersistenceInfoError``."""
        await self._delete(topic, version)


class TopicDedupManager(_TopicRecordManager[pb.DedupSnapshot]):
    """Producer deduplication snapshots: table ``topic_dedup``, key = topic, field ``data`` = ``DedupSnapshot``.

    A record exists for every topic that ever took a publish with a producer (``hub.dedup``).
    """

    _table_name = TOPIC_DEDUP_TABLE
    _what = "dedup snapshot of topic"
    _record = pb.DedupSnapshot

    async def read_snapshot(self, topic: bytes) -> pb.DedupSnapshot | None:
        """The topic's last snapshot, ``None`` if it never had one; ``ServiceDownError`` if unreachable."""
        got = await self._read(topic)
        return None if got is None else got[0]

    async def write_snapshot(self, topic: bytes, snapshot: pb.DedupSnapshot, *, create: bool = False) -> None:
        """Create (``create``: ``PubSubError`` if one exists) or overwrite the topic's snapshot."""
        await self._write(topic, snapshot, Version.NEW if create else Version.ANY)


class SubscriptionDataManager(_Manager):
    """Subscriptions: scannable table ``subscriptions``, key = topic ``\\x00`` subscriber.

    State and preferences are separate fields (``state``, ``preferences``), so
    the frequent consume-pointer updates never rewrite the preferences
    (``is_partial_update_supported`` is True).
    """

    _table_name = SUBSCRIPTIONS_TABLE
    _scannable = True
    _what = "subscription"
    _missing = errors.NoSubscriptionStateError
    _exists = errors.SubscriptionStateExistsError

    @staticmethod
    def is_partial_update_supported() -> bool:
        """True: ``update_subscription_data`` writes only the parts that are set."""
        return True

    @staticmethod
    def _topic(topic: bytes) -> str:
        key = _name(topic, "topic")
        if SEPARATOR in key:
            raise errors.MalformedRequestError(f"topic {key!r} must not contain \\x00")
        return key

    def _key(self, topic: bytes, subscriber: bytes) -> str:
        return self._topic(topic) + SEPARATOR + _name(subscriber, "subscriber id")

    @staticmethod
    def _fields(data: pb.SubscriptionData, *, replace: bool) -> Value:
        value = Value()
        for name, part in ((STATE_FIELD, "state"), (PREFERENCES_FIELD, "preferences")):
            if data.HasField(part):
                value[name] = getattr(data, part).SerializeToString()
            elif replace:
                value[name] = None
        return value

    @staticmethod
    def _data(got: Versioned, where: str) -> pb.SubscriptionData:
        out = pb.SubscriptionData()
        if STATE_FIELD in got.value:
            out.state.CopyFrom(_parse(pb.SubscriptionState, got.value[STATE_FIELD] or b"", where))
        if PREFERENCES_FIELD in got.value:
            out.preferences.CopyFrom(
                _parse(pb.SubscriptionPreferences, got.value[PREFERENCES_FIELD] or b"", where))
        return out

    async def create_subscription_data(self, topic: bytes, subscriber: bytes,
                                       data: pb.SubscriptionData) -> Version:
        """Create the subscription; ``SubscriptionStateExistsError`` if it exists.

        An unset state is stored as an empty ``SubscriptionState`` (consumed up to 0).
        """
        value = self._fields(data, replace=False)
        value.setdefault(STATE_FIELD, pb.SubscriptionState().SerializeToString())
        return await self._put("create", self._key(topic, subscriber), value, Version.NEW)

    async def update_subscription_data(self, topic: bytes, subscriber: bytes, data: pb.SubscriptionData,
                                       version: Version) -> Version:
        """CAS-write only the parts of ``data`` that are set (partial update); the new version.

        Raises ``BadVersionError`` or ``NoSubscriptionStateError``.
        """
        return await self._put("update", self._key(topic, subscriber), self._fields(data, replace=False),
                               version)

    async def replace_subscription_data(self, topic: bytes, subscriber: bytes, data: pb.SubscriptionData,
                                        version: Version) -> Version:
        """CAS-write all of ``data`` (a part that is unset is removed); the new version.

        Raises ``BadVersionError`` or ``NoSubscriptionStateError``.
        """
        return await self._put("replace", self._key(topic, subscriber), self._fields(data, replace=True),
                               version)

    async def delete_subscription_data(self, topic: bytes, subscriber: bytes, version: Version) -> None:
        """Remove the subscription if ``version`` is current; ``BadVersionError`` / ``NoSubscriptionStateError``."""
        await self._remove(self._key(topic, subscriber), version)

    async def read_subscription_data(self, topic: bytes,
                                     subscriber: bytes) -> tuple[pb.SubscriptionData, Version] | None:
        """The subscription's data and version, or ``None`` when it does not exist."""
        key = self._key(topic, subscriber)
        got = await self._get(key)
        return None if got is None else (self._data(got, key), got.version)

    async def read_subscriptions(self, topic: bytes) -> dict[bytes, tuple[pb.SubscriptionData, Version]]:
        """Every subscription of ``topic`` (subscriber id -> (data, version)): one range scan."""
        name = self._topic(topic)
        table = await self._t()
        assert isinstance(table, MetastoreScannableTable)
        first, last = name + SEPARATOR, name + chr(ord(SEPARATOR) + 1)
        out: dict[bytes, tuple[pb.SubscriptionData, Version]] = {}
        with self._errors("scan", first):
            cursor = await table.open_cursor_range(first, True, last, False, Order.ASC, ALL_FIELDS)
            try:
                async for batch in cursor:
                    for key, got in batch:
                        subscriber = key[len(first):].encode("utf-8")
                        out[subscriber] = (self._data(got, key), got.version)
            finally:
                await cursor.close()
        return out


class HubRegistry(_Manager):
    """Live hubs and their load: scannable table ``hubs``, key ``host:port:sslport``.

    Fields ``data`` (``HubInfo``), ``load`` (``HubLoad``) and ``http`` (the
    hub's HTTP base URL, when it serves one: the admin API forwards there);
    the record is ephemeral (it vanishes with the registering session).
    """

    _table_name = HUBS_TABLE
    _scannable = True
    _what = "hub"

    async def register(self, info: pb.HubInfo, session: Session, http_url: str = "") -> None:
        """Register ``info`` as live through ``session`` with load 0.

        A record left at the same address by a previous incarnation (a hub
        restarted on the same ports before its old session expired) is
        replaced: two live hubs cannot listen on one address. Raises
        ``ServiceDownError`` when the metastore is down.
        """
        key = hub_address(info)
        table = await self._t()
        value = Value({DATA_FIELD: info.SerializeToString(),
                       LOAD_FIELD: pb.HubLoad(numTopics=0).SerializeToString()})
        if http_url:
            value[HTTP_FIELD] = http_url.encode()

        async def step() -> None:
            try:
                await session.put_ephemeral(table, key, value)
            except ms_errors.KeyExistsError:
                try:
                    stale = await table.get(key, fields=())
                    log.info("hub %s: replacing a stale registration", key)
                    await table.remove(key, stale.version)
                except ms_errors.NoKeyError:
                    pass
                raise

        with self._errors("register", key):
            await cas_retry(step, retry_on=(ms_errors.KeyExistsError, ms_errors.BadVersionError))

    async def update_load(self, info: pb.HubInfo, num_topics: int) -> None:
        """Record that the hub owns ``num_topics`` topics (a CAS update of its ``load`` field).

        Raises ``ServiceDownError`` when the metastore is down or the hub is no
        longer registered (its session expired: register again).
        """
        key = hub_address(info)
        table = await self._t()
        load = pb.HubLoad(numTopics=num_topics).SerializeToString()

        def update(current: Versioned | None) -> Value | None:
            if current is None:
                return None  # never create a non-ephemeral registration here
            return Value({LOAD_FIELD: load})

        with self._errors("update load of", key):
            written = await update_record(table, key, update)
        if written is None:
            raise errors.ServiceDownError(f"hub {key} is not registered (its session expired?)")

    async def live_hubs(self) -> list[tuple[pb.HubInfo, pb.HubLoad]]:
        """Every registered hub with its load, in address order."""
        table = await self._t()
        out: list[tuple[pb.HubInfo, pb.HubLoad]] = []
        with self._errors("list", "*"):
            cursor = await table.open_cursor(ALL_FIELDS)
            try:
                async for batch in cursor:
                    for key, got in batch:
                        info = _parse(pb.HubInfo, got.value.get(DATA_FIELD) or b"", key)
                        load = _parse(pb.HubLoad, got.value.get(LOAD_FIELD) or b"", key)
                        out.append((info, load))
            finally:
                await cursor.close()
        out.sort(key=lambda pair: hub_address(pair[0]))
        return out

    async def http_url(self, address: str) -> str:
        """The HTTP base URL the live hub ``address`` (``host:port:sslport``) registered, or ``""``."""
        table = await self._t()
        with self._errors("read", address):
            try:
                got = await table.get(address, fields=(HTTP_FIELD,))
            except ms_errors.NoKeyError:
                return ""
        return (got.value.get(HTTP_FIELD) or b"").decode()

    async def unregister(self, info: pb.HubInfo) -> None:
        """Remove the hub's registration (nothing happens if it is already gone)."""
        key = hub_address(info)
        table = await self._t()
        with self._errors("unregister", key):
            with contextlib.suppress(ms_errors.NoKeyError):
                await table.remove(key, Version.ANY)
