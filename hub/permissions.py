"""Per-topic-prefix authorization (Pulsar's ``grant-permission``): which role may produce or consume where.

    store = PermissionStore(ms)                         # table ``permissions`` of the hub's metastore
    await store.start()
    await store.grant("orders-app", "orders/", {"produce"})      # adds to what the role has there
    await store.revoke("orders-app", "orders/", {"produce"})     # None: every action
    await store.grants()                                # [Grant(role, prefix, actions)], sorted

    cache = PermissionCache(store, refresh_interval=1.0)   # one per hub, with authentication_enabled
    await cache.start()                                 # first read
    spawn(cache.refresh_forever())                      # then re-read every refresh_interval
    cache.allowed("orders-app", b"orders/eu", PRODUCE)  # synchronous: the hub's dispatch path

    auth = Authorizer(cache, superuser_roles=("admin",), region_roles=("region-hub",))
    exc = auth.check(role, pb.PUBLISH, topic, subscriber)   # None, or the NotAuthorizedError to answer

Revoking ``consume`` also closes the subscriptions the role has attached
(they get ``SUBSCRIPTION_FORCED_CLOSED``) on each hub once it has re-read
the grants (``revoked_attachments`` lists them); publishes already
acknowledged stay.

Superusers may do anything. Region roles (and superusers) are region hubs:
they may subscribe as a region's hub subscriber (``__region_<region>``,
``hubSubscriber``) on any topic and keep the ``srcRegion`` of what they
publish; anything else they do needs grants like any role. A region
subscription (a subscriber id starting ``__region_``) is theirs alone:
any other role is refused every request on it (subscribe, attach with
force, start/stop delivery, consume, close, unsubscribe) whatever its
grants and whatever the request's ``hubSubscriber`` flag says, so a
consume grant on a topic cannot take a region's replication over.

A grant is (role, topic prefix, actions): ``produce`` allows publishing to
every topic whose name starts with the prefix; ``consume`` allows
subscribing, starting and stopping delivery, consuming, closing and
unsubscribing. The empty prefix means every topic. A role may hold any
number of grants; it may act on a topic when any of its prefixes matches.

Table ``permissions`` (created like the hub's other tables): key =
``ROLE "\\x00" PREFIX``, field ``actions`` = the actions, comma separated
and sorted (``consume,produce``). Writers (``quire console grant``, the
admin API) change one record by compare-and-set; a record whose last
action is revoked is removed.

Staleness: a hub re-reads the whole table every
``permissions_refresh_interval`` ms (default 1000), so a grant or revoke
made anywhere is in force on every hub within that interval plus one
metastore read; the hub whose admin API made the change re-reads at once.
When a re-read fails the hub keeps the grants it last read, logs a warning
and counts ``permissions_refresh_failures``.

Failure: ``grant``/``revoke`` raise ``ValueError`` for an empty or unknown
action, an empty role, or a role or prefix holding ``"\\x00"``; metastore
failures come out as ``hub.errors`` classes (``ServiceDownError`` when it
cannot be reached).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from hub import errors
from hub.metadata import SEPARATOR, _Manager
from hub.proto import pubsub_pb2 as pb
from hub.refresh import RefreshedCopy
from hub.regions import is_hub_subscriber
from metastore import errors as ms_errors
from metastore.api import ALL_FIELDS, MetaStore, Value, Version
from metastore.cas import cas_retry

__all__ = ["ACTIONS", "CONSUME", "PERMISSIONS_TABLE", "PRODUCE", "Authorizer", "Grant", "PermissionCache",
           "PermissionStore", "RoleConnection", "parse_actions", "revoked_attachments"]

log = logging.getLogger(__name__)

PERMISSIONS_TABLE = "permissions"
PRODUCE = "produce"
CONSUME = "consume"
ACTIONS = (CONSUME, PRODUCE)
ACTIONS_FIELD = "actions"


@dataclass(frozen=True, order=True)
class Grant:
    """``role`` may do ``actions`` on every topic whose name starts with ``prefix``."""

    role: str
    prefix: str
    actions: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"role": self.role, "prefix": self.prefix, "actions": list(self.actions)}


def parse_actions(text: str | Iterable[str]) -> frozenset[str]:
    """``"produce,consume"`` (or a list of words) as a set; ``ValueError`` naming an unknown or missing action."""
    words = text.split(",") if isinstance(text, str) else list(text)
    out = set()
    for word in words:
        word = word.strip().lower()
        if word not in ACTIONS:
            raise ValueError(f"unknown action {word!r}: the actions are {', '.join(ACTIONS)}")
        out.add(word)
    if not out:
        raise ValueError(f"no action given: the actions are {', '.join(ACTIONS)}")
    return frozenset(out)


def _key(role: str, prefix: str) -> str:
    if not role:
        raise ValueError("a grant needs a role")
    for what, value in (("role", role), ("prefix", prefix)):
        if SEPARATOR in value:
            raise ValueError(f"{what} {value!r} must not hold \\x00")
    return role + SEPARATOR + prefix


def _encode(actions: Iterable[str]) -> bytes:
    return ",".join(sorted(actions)).encode()


def _decode(raw: bytes | None) -> frozenset[str]:
    return frozenset(a for a in (raw or b"").decode("utf-8", "replace").split(",") if a in ACTIONS)


class PermissionStore(_Manager):
    """The grants of every role: table ``permissions`` (see the module docstring)."""

    _table_name = PERMISSIONS_TABLE
    _what = "grant"

    def __init__(self, store: MetaStore) -> None:
        super().__init__(store)

    async def grants(self) -> list[Grant]:
        """Every grant, sorted by role then prefix."""
        table = await self._t()
        out = []
        with self._errors("list", PERMISSIONS_TABLE):
            cursor = await table.open_cursor(fields=ALL_FIELDS)
            try:
                while cursor.has_more():
                    for key, value in await cursor.read_entries(1000):
                        role, _, prefix = key.partition(SEPARATOR)
                        actions = _decode(value.value.get(ACTIONS_FIELD))
                        if actions:
                            out.append(Grant(role, prefix, tuple(sorted(actions))))
            finally:
                await cursor.close()
        return sorted(out)

    async def grant(self, role: str, prefix: str, actions: Iterable[str]) -> Grant:
        """Add ``actions`` to what ``role`` may do on ``prefix``; the grant as it now stands."""
        wanted = parse_actions(actions)
        return await self._change(role, prefix, lambda have: have | wanted)

    async def set_grant(self, role: str, prefix: str, actions: Iterable[str]) -> Grant:
        """Make ``actions`` exactly what ``role`` may do on ``prefix``."""
        wanted = parse_actions(actions)
        return await self._change(role, prefix, lambda have: wanted)

    async def revoke(self, role: str, prefix: str, actions: Iterable[str] | None = None) -> Grant | None:
        """Take ``actions`` (None: all) from ``role`` on ``prefix``; what is left (None: nothing).

        ``NoSuchGrantError``-like ``LookupError`` when the role holds no grant on that prefix."""
        dropped = parse_actions(actions) if actions is not None else frozenset(ACTIONS)
        left = await self._change(role, prefix, lambda have: have - dropped, must_exist=True)
        return left if left.actions else None

    async def _change(self, role: str, prefix: str, change: Callable[[frozenset[str]], frozenset[str]],
                      must_exist: bool = False) -> Grant:
        key = _key(role, prefix)
        table = await self._t()

        async def step() -> Grant:
            try:
                current = await table.get(key)
            except ms_errors.NoKeyError:
                current = None
            have = _decode(current.value.get(ACTIONS_FIELD)) if current is not None else frozenset()
            if must_exist and not have:
                raise LookupError(f"role {role!r} has no grant on prefix {prefix!r}")
            new = change(have)
            if new != have:
                if not new:
                    assert current is not None
                    await table.remove(key, current.version)
                else:
                    version = Version.NEW if current is None else current.version
                    await table.put(key, Value({ACTIONS_FIELD: _encode(new)}), version)
            return Grant(role, prefix, tuple(sorted(new)))

        with self._errors("write", key):
            return await cas_retry(step)


_Grants = dict[str, tuple[tuple[str, frozenset[str]], ...]]


class PermissionCache(RefreshedCopy[_Grants]):
    """A hub's copy of the grants, re-read every ``refresh_interval`` seconds (see the module docstring).

    The re-reading (``start``, ``refresh``, ``refresh_forever``, ``generation``) is ``hub.refresh``'s."""

    what = "permissions"

    def __init__(self, store: PermissionStore, refresh_interval: float,
                 on_refresh_failure: Callable[[], None] | None = None,
                 on_change: Callable[[], None] | None = None) -> None:
        super().__init__({}, refresh_interval, on_refresh_failure, on_change)
        self.store = store
        self._by_role: _Grants = {}

    async def read(self) -> _Grants:
        by_role: dict[str, list[tuple[str, frozenset[str]]]] = {}
        for g in await self.store.grants():
            by_role.setdefault(g.role, []).append((g.prefix, frozenset(g.actions)))
        return {role: tuple(grants) for role, grants in by_role.items()}

    def install(self, value: _Grants) -> None:
        self._by_role = value

    def allowed(self, role: str, topic: bytes, action: str) -> bool:
        """Whether ``role`` holds ``action`` on a prefix of ``topic``."""
        grants = self._by_role.get(role)
        if not grants:
            return False
        name = topic.decode("utf-8", "replace")
        return any(action in actions and name.startswith(prefix) for prefix, actions in grants)


class Authorizer:
    """Who may do what, for a hub with ``authentication_enabled`` (see the module docstring)."""

    def __init__(self, cache: PermissionCache, superuser_roles: Iterable[str], region_roles: Iterable[str]) -> None:
        self.cache = cache
        self.superusers = frozenset(superuser_roles)
        self.region_roles = frozenset(region_roles) | self.superusers

    def is_region_hub(self, role: str | None) -> bool:
        """Whether ``role`` may act as another region's hub (``region_roles`` or ``superuser_roles``)."""
        return role in self.region_roles

    def check(self, role: str, op: int, topic: bytes, subscriber: bytes) -> errors.NotAuthorizedError | None:
        """``None`` when ``role`` may do ``op`` (a ``pb.OperationType``) on ``topic``; else the error to answer."""
        if role in self.superusers or op == pb.AUTHENTICATE:
            return None
        if op != pb.PUBLISH and is_hub_subscriber(subscriber):
            if role in self.region_roles:
                return None
            # another region's replication subscription: a consume grant on the topic is not enough
            # (a force attach would take the region's messages, and it would never get them back)
            return errors.NotAuthorizedError(
                f"role {role!r} may not use the region subscription "
                f"{subscriber.decode('utf-8', 'backslashreplace')!r}: only region_roles and superuser_roles may")
        action = PRODUCE if op == pb.PUBLISH else CONSUME
        if self.cache.allowed(role, topic, action):
            return None
        name = topic.decode("utf-8", "backslashreplace")
        return errors.NotAuthorizedError(f"role {role!r} is not authorized to {action} on topic {name!r} "
                                         f"(no grant of {action} on a prefix of it)")


class RoleConnection(Protocol):
    """What ``revoked_attachments`` reads of a connection (a ``hub.connection.HubConnection``)."""

    @property
    def role(self) -> str | None: ...

    @property
    def subs(self) -> Iterable[tuple[bytes, bytes]]: ...


_Conn = TypeVar("_Conn", bound=RoleConnection)


def revoked_attachments(authorizer: Authorizer, connections: Iterable[_Conn]) -> list[tuple[_Conn, bytes, bytes]]:
    """``(connection, topic, subscriber)`` of every attached subscription whose role may no longer consume.

    ``connections`` are the hub's (each with ``role`` and ``subs`` keyed by ``(topic, subscriber)``)."""
    out = []
    for conn in connections:
        role = getattr(conn, "role", None)
        if role is None:
            continue
        for topic, sub in list(conn.subs):
            if authorizer.check(role, pb.SUBSCRIBE, topic, sub) is not None:
                out.append((conn, topic, sub))
    return out
