"""The hub's HTTP admin API, after Pulsar's (served by ``bookie.http`` on the hub's loop).

    admin = HubAdmin(server)                   # server: a started ``hub.server.HubServer``
    HttpServer(registry, ready=admin.readiness, token=..., routes=admin.routes())

============================================================  ==============================================
``GET /admin/v1/topics``                                      topics this hub owns (``?all=1``: every topic
                                                              the metastore knows), a JSON list of names
``GET /admin/v1/topics/{topic}/stats``                        ``topic``, ``owner``, ``last_seq_id``,
                                                              ``ledgers``, ``publish_rate``, ``subscriptions``
``DELETE /admin/v1/topics/{topic}[?force=true]``              subscriptions, ledgers, persistence info
``POST /admin/v1/topics/{topic}/subscriptions/{sub}/reset``   ``{"seq_id": N}``: redeliver from N; or
                                                              ``{"publish_time_ms": T}``: from the first
                                                              message published at or after T (``hub.seek``)
``DELETE /admin/v1/topics/{topic}/subscriptions/{sub}``       the subscription (``?force=true`` if attached)
``POST /admin/v1/topics/{topic}/release``                     the owner gives the topic up, as load shedding
                                                              does
``GET|PUT|DELETE /admin/v1/permissions...``                   grants of produce/consume on topic prefixes
                                                              (``hub.admin_permissions``)
``GET|PUT|DELETE /admin/v1/policies...``                      lifecycle policies by topic prefix
                                                              (``hub.admin_policies``)
``POST /admin/v1/topics/{topic}/compact``,                    compact the topic; its compaction status
``GET /admin/v1/topics/{topic}/compaction``                   (``hub.admin_compaction``)
============================================================  ==============================================

Names are URL-encoded path segments (UTF-8). Any hub answers for any
topic: a request about a topic another hub owns is forwarded to that hub's
HTTP server (its URL is in its ``hubs`` registration; the header
``X-Quire-Forwarded`` stops a second hop, and the ``Authorization`` header
travels along). When the owner cannot be reached, ``stats`` is answered from
the metastore (then ``publish_rate`` is 0.0 and ``attached`` is ``null``:
only the owner knows) and a change is refused with 409 naming the owner.
``storage_bytes`` are the bytes of every ledger kept, ``backlog_bytes``
those after the slowest subscription (``hub.lifecycle``), ``msg_rate_in``
the publish rate (messages/s), ``policy`` the lifecycle policy in force
(``hub.policies``) and ``compaction`` the topic's compaction status
(``hub.admin_compaction``); answered from the metastore, ``storage_bytes`` and
``backlog_bytes`` count the closed ledgers only and ``msg_rate_in`` is 0.0.
``ledgers`` lists ``{ledger_id, start_seq_id, end_seq_id}``; the ledger
being written has ``end_seq_id`` = the last seq id (``null`` while empty).
``backlog`` is ``last_seq_id - consumed_seq_id``. Read from the metastore, the
end of a ledger still open is its last add confirmed (read without fencing:
a stats call never disturbs a writer), which may lag the last message of an
owner that crashed.

The mutating verbs act where the topic lives: on the owner, or, for a topic
no hub has loaded, this hub claims the owner record for the time of the
call (so no hub acquires it meanwhile) and works on the metastore. ``DELETE``
of a topic refuses (409) while a subscriber is attached unless
``?force=true`` (attached subscribers then get SUBSCRIPTION_FORCED_CLOSED);
a deleted topic starts again at seq id 1; while it is being deleted, clients
that publish or subscribe to it get SERVICE_DOWN (and retry). ``reset`` stores consume pointer
``N - 1``: an attached subscriber gets SUBSCRIPTION_RESET and messages from
N on; N is 1 .. last seq id + 1.

``release`` is load shedding for one topic (``HubServer.release_topic``):
attached subscribers get TOPIC_MOVED, consume pointers are persisted, the
ledger is closed and the owner record removed, so the topic's next publish
or subscribe lands on the least loaded hub. It answers ``{"released":
topic, "owner": the hub that released it, "last_seq_id": N,
"subscribers_moved": [attached subscribers]}``; a topic no hub owns is 404,
one whose owner cannot be reached 409.

Failure: bad JSON or a bad ``seq_id`` is 400; an unknown topic or
subscription 404; a metastore or bookie failure 503; always
``{"error": ...}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from aiohttp import web
from google.protobuf.message import DecodeError

from bookie.errors import BKError, NoSuchLedgerError
from bookie.http import HttpError, RequestHandler, errors_as_statuses, json_body, json_response
from hub import errors
from hub.admin_compaction import CompactionAdmin, stored_status
from hub.admin_permissions import PermissionsAdmin, PermissionsHost
from hub.admin_policies import PoliciesAdmin, PoliciesHost
from hub.compaction import compaction_ledgers
from hub.lifecycle import backlog_bytes
from hub.log_usage import bytes_after as usage_bytes_after
from hub.metadata import SEPARATOR, TOPIC_OWNERS_TABLE, TOPIC_PERSISTENCE_TABLE, hub_address
from hub.ownership import same_hub
from hub.proto import pubsub_pb2 as pb
from hub.seek import check_seq, seq_for_time
from metastore import Version
from metastore.errors import MetastoreError

if TYPE_CHECKING:
    from bookie.client import BookKeeper
    from hub.metadata import HubRegistry, SubscriptionDataManager, TopicOwnershipManager, TopicPersistenceManager
    from hub.ownership import Ownership
    from hub.policy_store import PolicyCache
    from hub.readahead import ReadAheadCache
    from hub.regions import RegionManager
    from hub.stats import HubStats
    from hub.topic import Topic

__all__ = ["AdminHost", "HubAdmin"]

log = logging.getLogger(__name__)

FORWARDED_HEADER = "X-Quire-Forwarded"
"""Set on a request one hub forwards to the topic's owner (which then never forwards it again)."""
FORWARD_TIMEOUT = 30.0


def _name(topic: bytes) -> str:
    return topic.decode("utf-8", "backslashreplace")


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def _prefs(p: pb.SubscriptionPreferences) -> dict[str, Any]:
    return {"message_bound": p.messageBound, "message_filter": p.messageFilter,
            "message_window_size": p.messageWindowSize,
            "options": {e.key: e.value.decode("utf-8", "backslashreplace") for e in p.options.entries}}


def _ledgers(ranges: pb.LedgerRanges, last_seq: int | None) -> list[dict[str, Any]]:
    out = []
    for r in ranges.ranges:
        if r.HasField("endSeqIdIncluded"):
            end: int | None = r.endSeqIdIncluded.localComponent
        else:
            end = last_seq if last_seq is not None and last_seq >= r.startSeqIdIncluded else None
        out.append({"ledger_id": r.ledgerId, "start_seq_id": r.startSeqIdIncluded, "end_seq_id": end})
    return out


def _stored_last_seq(ranges: pb.LedgerRanges) -> int:
    """The last seq id the persistence info records (an open last ledger's end is not in it)."""
    last = 0
    for r in ranges.ranges:
        if r.HasField("endSeqIdIncluded"):
            last = max(last, r.endSeqIdIncluded.localComponent)
        else:
            last = max(last, r.startSeqIdIncluded - 1)
    return last


class AdminHost(PermissionsHost, PoliciesHost, Protocol):
    """What ``HubAdmin`` uses of its hub (a started ``hub.server.HubServer``): the owned topics and the
    topics' records, the ledger client, and the topic life cycle (acquire, release, delete)."""

    address: str
    info: pb.HubInfo
    stats: HubStats
    topics: dict[bytes, Topic]
    deleting: set[bytes]
    pm: TopicPersistenceManager
    sm: SubscriptionDataManager
    owners: TopicOwnershipManager
    registry: HubRegistry
    ownership: Ownership | None
    policies: PolicyCache
    bk: BookKeeper
    cache: ReadAheadCache
    regions: RegionManager | None

    def track(self, task: asyncio.Task[Any]) -> None: ...

    async def is_ready(self) -> str | None: ...

    async def topic(self, topic: bytes, should_claim: bool) -> Topic: ...

    async def release_topic(self, topic: bytes) -> None: ...

    async def follow_regions(self, topic: bytes, subscriber: bytes, synchronous: bool) -> None: ...


class HubAdmin:
    """See the module docstring. ``server`` is the hub it administers (``AdminHost``)."""

    def __init__(self, server: AdminHost) -> None:
        self.server = server

    async def readiness(self) -> str | None:
        return await self.server.is_ready()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/admin/v1/topics", self._wrap(self.list_topics)),
            web.get("/admin/v1/topics/{topic}/stats", self._wrap(self.topic_stats)),
            web.delete("/admin/v1/topics/{topic}", self._wrap(self.delete_topic)),
            web.post("/admin/v1/topics/{topic}/subscriptions/{sub}/reset", self._wrap(self.reset_subscription)),
            web.delete("/admin/v1/topics/{topic}/subscriptions/{sub}", self._wrap(self.delete_subscription)),
            web.post("/admin/v1/topics/{topic}/release", self._wrap(self.release_topic)),
            *PermissionsAdmin(self.server).routes(),      # /admin/v1/permissions: hub.admin_permissions
            *PoliciesAdmin(self.server).routes(),         # /admin/v1/policies: hub.admin_policies
            *CompactionAdmin(self).routes(),              # .../compact, .../compaction: hub.admin_compaction
        ]

    @staticmethod
    def _wrap(handler: RequestHandler) -> RequestHandler:
        return errors_as_statuses(handler, ((errors.ClientNotSubscribedError, 404), (errors.MalformedRequestError, 400),
                                            ((errors.PubSubError, MetastoreError, BKError), 503)))

    # --- names ------------------------------------------------------------------------------------
    @staticmethod
    def _topic(request: web.Request) -> bytes:
        name = request.match_info["topic"]
        if not name or SEPARATOR in name:
            raise HttpError(400, f"bad topic name {name!r}")
        return name.encode("utf-8")

    @staticmethod
    def _sub(request: web.Request) -> bytes:
        name = request.match_info["sub"]
        if not name:
            raise HttpError(400, "empty subscriber id")
        return name.encode("utf-8")

    # --- reads ------------------------------------------------------------------------------------
    async def list_topics(self, request: web.Request) -> web.Response:
        server = self.server
        names = {_name(t) for t in server.topics}
        if _true(request.query.get("all")):
            names |= await self._stored_topics()
        return json_response(sorted(names))

    async def _stored_topics(self) -> set[str]:
        store = self.server.store
        names: set[str] = set()
        for table_name in (TOPIC_PERSISTENCE_TABLE, TOPIC_OWNERS_TABLE):
            table = await store.create_table(table_name)
            async for batch in await table.open_cursor():
                names.update(key for key, _ in batch)
        subs = await store.create_scannable_table("subscriptions")
        async for batch in await subs.open_cursor():
            names.update(key.split(SEPARATOR, 1)[0] for key, _ in batch)
        return names

    async def topic_stats(self, request: web.Request) -> web.Response:
        topic = self._topic(request)
        server = self.server
        t = server.topics.get(topic)
        if t is not None:
            return json_response(self._owned_stats(topic, t))
        forwarded = await self._forwarded(request, topic)
        if forwarded is not None:
            return forwarded
        got = await server.pm.read_topic_persistence_info(topic)
        subs = await server.sm.read_subscriptions(topic)
        owner = await server.owners.read_owner_info(topic)
        if got is None and not subs and owner is None:
            raise HttpError(404, f"no topic {_name(topic)!r}")
        ranges = got[0] if got is not None else pb.LedgerRanges()
        last = _stored_last_seq(ranges)
        tail = await self._confirmed_tail(ranges)
        if tail is not None:
            last = max(last, tail)
        return json_response({
            "topic": _name(topic), "owner": f"{owner[0].hostname}:{owner[0].port}" if owner is not None else None,
            "owned_here": False, "last_seq_id": last, "publish_rate": 0.0, "msg_rate_in": 0.0,
            **await self._stored_usage(ranges, [data.state.msgId.localComponent for data, _ in subs.values()]),
            "policy": self.server.policies.for_topic(topic).to_json(),
            "ledgers": _ledgers(ranges, tail),
            "compaction": stored_status(ranges),
            "subscriptions": {
                _name(sub): {"consumed_seq_id": data.state.msgId.localComponent,
                             "backlog": max(0, last - data.state.msgId.localComponent),
                             "attached": None if owner is not None else False,
                             "preferences": _prefs(data.preferences)}
                for sub, (data, _) in sorted(subs.items())},
        })

    async def _stored_usage(self, ranges: pb.LedgerRanges, pointers: list[int]) -> dict[str, int]:
        """``storage_bytes`` and ``backlog_bytes`` of the closed ledgers, from their metadata."""
        closed = []
        for r in ranges.ranges:
            if not r.HasField("endSeqIdIncluded"):
                continue
            try:
                md, _ = await self.server.bk.ledgers.read(r.ledgerId)
            except (BKError, MetastoreError) as exc:
                log.info("stats: cannot read the metadata of ledger %d: %s", r.ledgerId, exc)
                continue
            closed.append((int(r.startSeqIdIncluded), int(r.endSeqIdIncluded.localComponent), md.length))
        backlog = usage_bytes_after(closed, min(pointers)) if pointers else 0
        return {"storage_bytes": sum(size for _, _, size in closed), "backlog_bytes": backlog}

    async def _confirmed_tail(self, ranges: pb.LedgerRanges) -> int | None:
        """The last confirmed seq id of an open last ledger (read without fencing: its LAC), or ``None``."""
        rs = ranges.ranges
        if not rs or rs[-1].HasField("endSeqIdIncluded"):
            return None
        try:
            rh = await self.server.bk.open_ledger_no_recovery(rs[-1].ledgerId)
            try:
                lac = rh.last_add_confirmed
                if lac < 0:
                    return None
                async for e in rh.read(lac, lac):
                    batch = pb.MessageBatch.FromString(e.data)
                    return int(batch.first_local_seq_id + len(batch.messages) - 1)
            finally:
                await rh.close()
        except (BKError, DecodeError, ValueError) as exc:
            log.info("stats: cannot read the tail of ledger %d: %s", rs[-1].ledgerId, exc)
        return None

    def _owned_stats(self, topic: bytes, t: Topic) -> dict[str, Any]:
        last = int(t.log.last_seq)
        rate = round(t.publish_rate(time.monotonic()), 3)
        return {
            "topic": _name(topic), "owner": self.server.address, "owned_here": True, "last_seq_id": last,
            "publish_rate": rate, "msg_rate_in": rate, "storage_bytes": t.log.storage_bytes(),
            "backlog_bytes": backlog_bytes(t.log, t.subs),
            "policy": self.server.policies.for_topic(topic).to_json(),
            "ledgers": _ledgers(t.log.ranges, last),
            "compaction": t.compaction.status(),
            "subscriptions": {
                _name(sub): {"consumed_seq_id": s.consumed, "backlog": max(0, last - s.consumed),
                             "attached": s.attached, "preferences": _prefs(s.prefs), **t.subs.stats_of(sub)}
                for sub, s in sorted(t.subs.subs.items())},
        }

    # --- forwarding to the owner ------------------------------------------------------------------
    async def _owner_elsewhere(self, topic: bytes) -> str | None:
        """The registry key of the other hub that owns ``topic``, or ``None`` (owned here or by nobody)."""
        server = self.server
        if topic in server.topics:
            return None
        got = await server.owners.read_owner_info(topic)
        if got is None or same_hub(got[0], server.info):
            return None
        return str(hub_address(got[0]))

    async def _forwarded(self, request: web.Request, topic: bytes) -> web.Response | None:
        """The owner's answer to ``request`` when another hub owns ``topic`` and answers; else ``None``."""
        if request.headers.get(FORWARDED_HEADER):
            return None
        owner = await self._owner_elsewhere(topic)
        if owner is None:
            return None
        base = await self.server.registry.http_url(owner)
        if not base:
            return None
        headers = {FORWARDED_HEADER: self.server.address}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        if request.content_type:
            headers["Content-Type"] = request.content_type
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT)) as session:
                async with session.request(request.method, base + request.raw_path, data=await request.read(),
                                           headers=headers) as resp:
                    body = await resp.read()
                    return web.Response(body=body, status=resp.status, content_type=resp.content_type)
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.info("cannot forward %s %s to the owner %s (%s): %s", request.method, request.path, owner, base,
                     exc)
            return None

    # --- changes ----------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _held(self, topic: bytes) -> AsyncIterator[Topic | None]:
        """The owned ``Topic``, or ``None`` with this hub holding the owner record for the call."""
        server = self.server
        if server.ownership is None:      # start-up: the HTTP server is up before the registration
            raise HttpError(503, "this hub is starting; retry")
        if topic not in server.topics:
            owner = await server.ownership.claim(topic, True)
            if owner is not None:
                raise HttpError(409, f"topic {_name(topic)!r} is owned by hub {owner}: send this to that hub")
        try:
            yield server.topics.get(topic)
        finally:
            if topic not in server.topics:     # deleted, or never loaded (and not acquired by a client meanwhile)
                await server.ownership.release(topic)
                server.ownership.num_topics = len(server.topics)

    async def _exists(self, topic: bytes) -> bool:
        server = self.server
        return (topic in server.topics or await server.pm.read_topic_persistence_info(topic) is not None
                or bool(await server.sm.read_subscriptions(topic))
                or await server.owners.read_owner_info(topic) is not None)

    async def delete_topic(self, request: web.Request) -> web.Response:
        topic = self._topic(request)
        force = _true(request.query.get("force"))
        server = self.server
        forwarded = await self._forwarded(request, topic)
        if forwarded is not None:
            return forwarded
        if not await self._exists(topic):
            raise HttpError(404, f"no topic {_name(topic)!r}")
        if topic in server.deleting:
            raise HttpError(409, f"topic {_name(topic)!r} is being deleted")
        server.deleting.add(topic)      # clients get SERVICE_DOWN (and retry) until it is gone
        try:
            deleted, removed_subs = await self._delete(topic, force)
        finally:
            server.deleting.discard(topic)
        log.warning("topic %r deleted by the admin API (ledgers %s, subscriptions %s)", topic, deleted,
                    removed_subs)
        return json_response({"deleted": _name(topic), "ledgers": deleted, "subscriptions": sorted(removed_subs)})

    async def _delete(self, topic: bytes, force: bool) -> tuple[list[int], list[str]]:
        server = self.server
        async with self._held(topic) as t:
            removed_subs: list[str] = []
            if t is not None:
                attached = sorted(_name(s) for s, st in t.subs.subs.items() if st.attached)
                if attached and not force:
                    raise HttpError(409, f"subscribers attached to {_name(topic)!r}: {', '.join(attached)} "
                                         f"(add ?force=true to close them)")
                for sub in list(t.subs.subs):
                    await t.subs.remove(sub)
                    removed_subs.append(_name(sub))
                server.topics.pop(topic, None)
                await t.log.release()          # publishes drained, the current ledger closed
                t.detach()
                server.cache.release_topic(topic)
                if server.regions is not None:
                    await server.regions.topic_released(topic)
            for sub in await server.sm.read_subscriptions(topic):
                with contextlib.suppress(errors.NoSubscriptionStateError):
                    await server.sm.delete_subscription_data(topic, sub, Version.ANY)
                removed_subs.append(_name(sub))
            deleted: list[int] = []
            got = await server.pm.read_topic_persistence_info(topic)
            if got is not None:
                for r in got[0].ranges:
                    try:
                        await server.bk.delete_ledger(r.ledgerId)
                    except NoSuchLedgerError:
                        pass
                    deleted.append(r.ledgerId)
                for lid in compaction_ledgers(got[0]):     # its compacted ledgers (hub.compaction)
                    with contextlib.suppress(NoSuchLedgerError):
                        await server.bk.delete_ledger(lid)
                with contextlib.suppress(errors.NoTopicPersistenceInfoError):
                    await server.pm.delete_topic_persistence_info(topic, Version.ANY)
        return deleted, removed_subs

    async def reset_subscription(self, request: web.Request) -> web.Response:
        topic, sub = self._topic(request), self._sub(request)
        body = await json_body(request)
        given, when = body.get("seq_id"), body.get("publish_time_ms")
        if (given is None) == (when is None):
            raise HttpError(400, 'expected {"seq_id": N} or {"publish_time_ms": T}, exactly one of them')
        if when is not None and (not isinstance(when, int) or isinstance(when, bool) or when < 0):
            raise HttpError(400, 'expected {"publish_time_ms": T} with an integer T >= 0 (epoch ms)')
        if given is not None and (not isinstance(given, int) or isinstance(given, bool) or given < 1):
            raise HttpError(400, 'expected {"seq_id": N} with an integer N >= 1')
        seq: int = given or 0
        forwarded = await self._forwarded(request, topic)
        if forwarded is not None:
            return forwarded
        server = self.server
        if when is not None and topic not in server.topics:
            if not await self._exists(topic):
                raise HttpError(404, f"no topic {_name(topic)!r}")
            await server.topic(topic, True)   # finding a time reads the log: load the topic here
        async with self._held(topic) as t:
            if t is not None:
                last = int(t.log.last_seq)
                if sub not in t.subs.subs:
                    raise HttpError(404, f"no subscription {_name(sub)!r} on {_name(topic)!r}")
                if when is not None:
                    seq = await seq_for_time(t.log, when)
                self._check_seq(seq, last, t.log.ranges)
                await t.subs.reset(sub, seq - 1, server.cache)
            else:
                if when is not None:   # released meanwhile
                    raise HttpError(503, f"topic {_name(topic)!r} was released meanwhile; retry")
                got = await server.sm.read_subscription_data(topic, sub)
                if got is None:
                    raise HttpError(404, f"no subscription {_name(sub)!r} on {_name(topic)!r}")
                ranges = await server.pm.read_topic_persistence_info(topic)
                last = _stored_last_seq(ranges[0]) if ranges is not None else 0
                open_ledger = ranges is not None and any(not r.HasField("endSeqIdIncluded")
                                                         for r in ranges[0].ranges)
                # an open last ledger's end is not known without recovering it
                self._check_seq(seq, None if open_ledger else last,
                                ranges[0] if ranges is not None else pb.LedgerRanges())
                data = pb.SubscriptionData()
                data.state.msgId.localComponent = seq - 1
                await server.sm.update_subscription_data(topic, sub, data, Version.ANY)
        log.warning("subscription %r/%r reset to seq id %d by the admin API", topic, sub, seq)
        return json_response({"topic": _name(topic), "subscription": _name(sub), "seq_id": seq,
                              "consumed_seq_id": seq - 1})

    @staticmethod
    def _check_seq(seq: int, last: int | None, ranges: pb.LedgerRanges) -> None:
        """400 unless messages from ``seq`` on can be delivered: not past the end, not in a deleted ledger."""
        try:
            check_seq(seq, last, ranges)
        except ValueError as exc:
            raise HttpError(400, str(exc)) from exc

    async def delete_subscription(self, request: web.Request) -> web.Response:
        topic, sub = self._topic(request), self._sub(request)
        force = _true(request.query.get("force"))
        forwarded = await self._forwarded(request, topic)
        if forwarded is not None:
            return forwarded
        server = self.server
        async with self._held(topic) as t:
            if t is not None:
                state = t.subs.subs.get(sub)
                if state is None:
                    raise HttpError(404, f"no subscription {_name(sub)!r} on {_name(topic)!r}")
                if state.attached and not force:   # a Hedwig subscriber or any consumer
                    raise HttpError(409, f"{_name(sub)!r} is attached (add ?force=true to close it)")
                await t.subs.remove(sub)
            else:
                try:
                    await server.sm.delete_subscription_data(topic, sub, Version.ANY)
                except errors.NoSubscriptionStateError:
                    raise HttpError(404, f"no subscription {_name(sub)!r} on {_name(topic)!r}") from None
        await server.follow_regions(topic, sub, False)
        log.warning("subscription %r/%r deleted by the admin API", topic, sub)
        return json_response({"topic": _name(topic), "deleted": _name(sub)})

    async def release_topic(self, request: web.Request) -> web.Response:
        """Release ``topic`` on its owner exactly as load shedding does (the owner answers; others forward)."""
        topic = self._topic(request)
        forwarded = await self._forwarded(request, topic)
        if forwarded is not None:
            return forwarded
        server = self.server
        t = server.topics.get(topic)
        if t is None:
            owner = await self._owner_elsewhere(topic)
            if owner is not None:
                raise HttpError(409, f"topic {_name(topic)!r} is owned by hub {owner}, which cannot be reached")
            raise HttpError(404, f"topic {_name(topic)!r} is not owned by any hub")
        moved = sorted(_name(sub) for sub, st in t.subs.subs.items() if st.attached)
        last = int(t.log.last_seq)
        await server.release_topic(topic)
        server.stats.incr("topics_released_by_admin")
        await server.registry.update_load(server.info, len(server.topics))
        log.warning("topic %r released by the admin API at seq id %d (subscribers moved: %s)", topic, last, moved)
        return json_response({"released": _name(topic), "owner": server.address, "last_seq_id": last,
                              "subscribers_moved": moved})
