"""Lifecycle policies (``hub.policies``) kept in the metastore, and every hub's refreshed copy of them.

    store = PolicyStore(ms)                                  # table ``topic_policies`` of the hub's metastore
    await store.put("orders/", {"retention_size_mb": 10})    # exactly these keys for the prefix
    await store.update("orders/", {"message_ttl_seconds": 60})   # merged into what the prefix has
    await store.delete("orders/")                            # LookupError when the prefix has none
    await store.policies()                                   # {prefix: {key: value}}, sorted by prefix

    cache = PolicyCache(store, Policy.from_conf(conf), refresh_interval=1.0)   # one per hub
    await cache.start(); spawn(cache.refresh_forever())      # as the grants (``hub.refresh``)
    cache.for_topic(b"orders/eu")                            # a resolved ``Policy``, synchronously

Table ``topic_policies`` (created like the hub's other tables): key =
``"p" + PREFIX`` (metastore keys may not be empty, and the empty prefix is
every topic), field ``policy`` = the prefix's keys as a JSON object. Writers
(the admin API, ``quire console set policy``) change one record by
compare-and-set. Every hub re-reads the whole table every
``policies_refresh_interval`` ms; the hub whose admin API made the change
re-reads at once. A record that does not parse (written by a newer version,
or by hand) is skipped with a warning, never fatal.

Failure: ``put``/``update`` raise ``hub.policies.PolicyError`` (a
``ValueError`` naming the key) for a bad prefix or value; metastore failures
come out as ``hub.errors`` classes (``ServiceDownError`` when it cannot be
reached).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from hub.metadata import _Manager
from hub.policies import Policy, PolicyError, PolicyTable, check_prefix, parse_policy
from hub.refresh import RefreshedCopy
from metastore import errors as ms_errors
from metastore.api import ALL_FIELDS, Value, Version
from metastore.cas import cas_retry

__all__ = ["POLICIES_TABLE", "PolicyCache", "PolicyStore"]

log = logging.getLogger(__name__)

POLICIES_TABLE = "topic_policies"
POLICY_FIELD = "policy"
_KEY_MARK = "p"

Policies = dict[str, dict[str, int | str]]


class PolicyStore(_Manager):
    """The stored policies by prefix: table ``topic_policies`` (see the module docstring)."""

    _table_name = POLICIES_TABLE
    _what = "policy"

    async def policies(self) -> Policies:
        """Every stored prefix and its keys, sorted by prefix."""
        table = await self._t()
        out: Policies = {}
        with self._errors("list", POLICIES_TABLE):
            cursor = await table.open_cursor(fields=ALL_FIELDS)
            try:
                while cursor.has_more():
                    for key, value in await cursor.read_entries(1000):
                        if not key.startswith(_KEY_MARK):
                            continue
                        try:
                            out[key[1:]] = _decode(value.value.get(POLICY_FIELD))
                        except (ValueError, PolicyError) as exc:
                            log.warning("skipping the unreadable policy of prefix %r: %s", key[1:], exc)
            finally:
                await cursor.close()
        return dict(sorted(out.items()))

    async def get(self, prefix: str) -> dict[str, int | str] | None:
        """The keys stored for exactly ``prefix`` (``None``: none)."""
        got = await self._get(_KEY_MARK + check_prefix(prefix))
        return _decode(got.value.get(POLICY_FIELD)) if got is not None else None

    async def put(self, prefix: str, values: Mapping[str, Any]) -> dict[str, int | str]:
        """Make ``values`` exactly the keys of ``prefix`` (an empty object removes the record); what is stored."""
        wanted = parse_policy(values)
        return await self._change(prefix, lambda have: wanted)

    async def update(self, prefix: str, values: Mapping[str, Any]) -> dict[str, int | str]:
        """Merge ``values`` into the keys of ``prefix``; what is stored now."""
        wanted = parse_policy(values)
        return await self._change(prefix, lambda have: {**have, **wanted})

    async def delete(self, prefix: str) -> dict[str, int | str]:
        """Remove the policy of ``prefix``; what it was. ``LookupError`` when the prefix has none."""
        removed: dict[str, int | str] = {}

        def drop(have: dict[str, int | str]) -> dict[str, int | str]:
            if not have:
                raise LookupError(f"no policy on prefix {prefix!r}")
            removed.update(have)
            return {}

        await self._change(prefix, drop)
        return removed

    async def _change(self, prefix: str, change: Callable[[dict[str, int | str]], dict[str, int | str]]
                      ) -> dict[str, int | str]:
        key = _KEY_MARK + check_prefix(prefix)
        table = await self._t()

        async def step() -> dict[str, int | str]:
            try:
                current = await table.get(key)
            except ms_errors.NoKeyError:
                current = None
            have = _decode(current.value.get(POLICY_FIELD)) if current is not None else {}
            new = change(dict(have))
            if new != have or current is None:
                if not new:
                    if current is not None:
                        await table.remove(key, current.version)
                else:
                    version = Version.NEW if current is None else current.version
                    await table.put(key, Value({POLICY_FIELD: _encode(new)}), version)
            return new

        with self._errors("write", key):
            return await cas_retry(step)


def _encode(values: Mapping[str, int | str]) -> bytes:
    return json.dumps(dict(sorted(values.items())), separators=(",", ":")).encode()


def _decode(raw: bytes | None) -> dict[str, int | str]:
    if not raw:
        return {}
    return parse_policy(json.loads(raw.decode("utf-8")))


class PolicyCache(RefreshedCopy[Policies]):
    """A hub's copy of the policies, re-read every ``refresh_interval`` seconds (``hub.refresh``)."""

    what = "topic_policies"

    def __init__(self, store: PolicyStore, defaults: Policy, refresh_interval: float,
                 on_refresh_failure: Callable[[], None] | None = None,
                 on_change: Callable[[], None] | None = None) -> None:
        super().__init__({}, refresh_interval, on_refresh_failure, on_change)
        self.store = store
        self.table = PolicyTable(defaults)

    async def read(self) -> Policies:
        return await self.store.policies()

    def install(self, value: Policies) -> None:
        self.table = PolicyTable(self.table.defaults, value)

    def for_topic(self, topic: bytes) -> Policy:
        """The policy in force for ``topic`` now."""
        table = self.table
        got = table._memo.get(topic)   # PolicyTable.for_topic's memo, without its call (once per publish)
        return got if got is not None else table.for_topic(topic)
