"""The hub process: a thin asyncio shell around hub.protocol that does I/O and dispatch.

    server = HubServer(load_hub_conf("conf/hw_server.conf"))
    await server.start()          # metastore, ledger client, liveness registration, listener
    server.address                # "127.0.0.1:4080"
    await server.stop()

One connection carries any number of subscriptions. Requests are decoded
and validated by ``hub.protocol.ServerConnection``; this module claims
topics (``hub.ownership``), persists publishes (``hub.persistence``), keeps
subscriptions (``hub.subscriptions``) and delivers (``hub.delivery``)
through the read-ahead cache. A client that stops reading makes the
transport pause: its deliveries wait and its requests are not read until the
buffer drains (``max_outbound_buffer``).

Seams for regions/SSL/stats: every message gets ``src_region = conf.region``
when it has none; listeners are opened in ``_listen`` only; every counter
goes through ``HubStats.incr``.

Failure: a request that fails gets its status (metastore or bookie trouble:
SERVICE_DOWN); a malformed one gets MALFORMED_REQUEST and the connection
keeps serving; an oversized frame closes that connection only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from bookie.errors import BKError
from hub import errors, protocol
from hub.conf import HubConf
from hub.message import Message
from hub.metadata import (
    HubRegistry,
    SubscriptionDataManager,
    TopicDedupManager,
    TopicOwnershipManager,
    TopicPersistenceManager,
    hub_address,
)
from hub.ownership import Ownership
from hub.persistence import Done, TopicLog
from hub.proto import pubsub_pb2 as pb
from hub.readahead import ReadAheadCache
from hub.subscriptions import SubState, TopicSubscriptions
from metastore.errors import MetastoreError

log = logging.getLogger(__name__)

__all__ = ["HubServer", "HubStats"]


class HubStats:
    """Every counter of the hub, updated in this one place (the stats endpoint reads ``counters``)."""

    def __init__(self) -> None:
        self.counters: collections.Counter[str] = collections.Counter()

    def incr(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    observer: Any = None     # hub.stats.HubMetrics.observe when the stats endpoint is on

    def observe(self, op: str, seconds: float) -> None:
        """A request's latency (``op``: publish, subscribe, unsubscribe, consume)."""
        if self.observer is not None:
            self.observer(op, seconds)


_TIMED = {pb.SUBSCRIBE: "subscribe", pb.UNSUBSCRIBE: "unsubscribe"}


class _Redirect(Exception):
    def __init__(self, owner: str) -> None:
        super().__init__(owner)
        self.owner = owner


class Topic:
    """An owned topic: its log, its subscriptions, its activity clock."""

    def __init__(self, log_: TopicLog, subs: TopicSubscriptions) -> None:
        self.log = log_
        self.subs = subs
        self.last_active = time.monotonic()


class HubConnection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: HubServer) -> None:
        self.server = server
        self.conf = server.conf
        self.machine = protocol.ServerConnection(self.conf.max_frame_size, self.conf.max_message_size)
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.subs: dict[tuple[bytes, bytes], SubState] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.chains: dict[tuple[bytes, bytes], asyncio.Task[None]] = {}
        self._out = protocol.OutBuffer(self._write_now, server.flush_soon)
        self._published_to: list[TopicLog] = []   # topics this read published to (data_received)
        self.closed = False
        self.role: str | None = None   # the authenticated token's subject (hub.auth)
        self.region_hub = False        # authenticated with one of superuser_roles: may set srcRegion

    # --- transport callbacks ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=self.conf.max_outbound_buffer)  # type: ignore[attr-defined]
        self.server.connections.add(self)
        self.server.stats.incr("connections")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.writable.set()
        self.server.connections.discard(self)
        if self.subs:
            self.server.spawn(self._detach_all())

    async def _detach_all(self) -> None:
        for (topic, sub) in list(self.subs):
            t = self.server.topics.get(topic)
            if t is not None:
                await t.subs.detach(sub)
        self.subs.clear()

    def pause_writing(self) -> None:
        self.writable.clear()
        if self.transport is not None:
            self.transport.pause_reading()
        self.server.stats.incr("write_pauses")

    def resume_writing(self) -> None:
        self.writable.set()
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        stats = self.server.stats
        for event in self.machine.receive_data(data):
            if isinstance(event, protocol.RequestReceived):
                stats.incr("packets_received")
                self._dispatch(event)
            elif isinstance(event, protocol.Reject):
                stats.incr("requests_rejected")
                self.send(event.response)
            else:
                log.info("closing connection: %s", event.reason)
                if self.transport is not None:
                    self.transport.close()
        if self._published_to:   # the publishes of this read go out as one entry per topic, now
            logs, self._published_to = self._published_to, []
            for tlog in logs:
                tlog.send_queued()
            self.server.bk.pool.flush()   # and the adds leave for the bookies before anything else runs

    # --- Attachment -------------------------------------------------------------------------------
    def _write(self, frame: bytes) -> None:
        if self.transport is not None and not self.closed:
            self._out.add(frame)

    def _write_now(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def send(self, resp: pb.PubSubResponse) -> None:
        self._write(protocol.encode(resp))
        self.server.stats.incr("packets_sent")

    def send_delivery(self, topic: bytes, subscriber: bytes, message: Message) -> None:
        self._write(protocol.delivery(topic, subscriber, message.wire))
        self.server.stats.incr("messages_delivered")

    def send_event(self, topic: bytes, subscriber: bytes, event: int) -> None:
        self._write(protocol.subscription_event(topic, subscriber, event))

    def attached(self, topic: bytes, subscriber: bytes, state: SubState | None) -> None:
        if state is None:
            self.subs.pop((topic, subscriber), None)
        else:
            self.subs[(topic, subscriber)] = state

    # --- dispatch ---------------------------------------------------------------------------------
    def _dispatch(self, ev: protocol.RequestReceived) -> None:
        req = ev.request
        if self.server.authenticator is not None and not self._authorized(req):
            return
        if req.type == pb.CONSUME:
            self._consume(ev)
            return
        t = self.server.topics.get(ev.topic)
        if req.type == pb.PUBLISH and t is not None:
            # synchronously: publish order on a connection is seq order
            self._enqueue(t, ev, functools.partial(self._published, req, t, time.perf_counter()))
            if not self._published_to or self._published_to[-1] is not t.log:
                self._published_to.append(t.log)
            return
        if req.type == pb.PUBLISH:
            self._track(self._handle(ev, None))
            return
        # requests of one subscription are applied in the order they arrived
        key = (ev.topic, ev.subscriber)
        task = self._track(self._handle(ev, self.chains.get(key)))
        self.chains[key] = task
        task.add_done_callback(lambda t: self.chains.pop(key, None) if self.chains.get(key) is t else None)

    def _authorized(self, req: pb.PubSubRequest) -> bool:
        """With authentication_enabled: AUTHENTICATE first, region-hub subscriptions for superusers only."""
        if req.type == pb.AUTHENTICATE:
            try:
                self.role = self.server.authenticator.authenticate(req.authenticateRequest.token)
            except errors.AuthenticationError as exc:
                log.info("connection refused a token: %s", exc)
                self._fail(req, exc)
                return False
            self.region_hub = self.role in self.conf.superuser_roles
            self.send(protocol.response(req.txnId))
            return False
        if self.role is None:
            self._fail(req, errors.AuthenticationError("this hub requires authentication: set the client conf "
                                                       "auth_token or auth_token_file"))
            return False
        if req.type == pb.SUBSCRIBE and req.subscribeRequest.hubSubscriber and not self.region_hub:
            self._fail(req, errors.NotAuthorizedError(f"role {self.role!r} may not subscribe as a region hub "
                                                      "(superuser_roles)"))
            return False
        return True

    def _track(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _enqueue(self, t: Topic, ev: protocol.RequestReceived, done: Done) -> None:
        t.last_active = time.monotonic()
        msg = ev.request.publishRequest.msg
        if not self.region_hub or not msg.srcRegion:
            # only an authenticated region hub may name another region or carry a version vector:
            # a crafted remoteComponents would otherwise become the topic's vector-max
            msg.srcRegion = self.server.region_bytes
            msg.ClearField("msgId")
        if self.server.regions is not None:
            self.server.regions.stamp(ev.topic, msg)
        self.server.stats.incr("publishes")
        t.log.submit(msg, done)

    def _published(self, req: pb.PubSubRequest, t: Topic, t0: float, seq: int, exc: BaseException | None) -> None:
        if exc is not None:
            self._fail(req, exc)
            if t.log.closed and self.server.topics.get(t.log.topic) is t:
                # its ledger could not be closed: let the next owner recover it
                self.server.spawn(self.server.release_topic(t.log.topic))
            return
        self._write(protocol.published(req.txnId, req.topic, seq))
        stats = self.server.stats
        stats.incr("packets_sent")
        stats.observe("publish", time.perf_counter() - t0)

    def _fail(self, req: pb.PubSubRequest, exc: BaseException) -> None:
        if isinstance(exc, _Redirect):
            self.server.stats.incr("redirects")
            self.send(protocol.response(req.txnId, pb.NOT_RESPONSIBLE_FOR_TOPIC, exc.owner,
                                        topic=protocol.request_topic(req), redirect_to=exc.owner))
            return
        if isinstance(exc, errors.PubSubError):
            try:
                status = pb.StatusCode.Value(exc.status)
            except ValueError:
                status = pb.UNEXPECTED_CONDITION
        elif isinstance(exc, BKError | MetastoreError):
            status = pb.SERVICE_DOWN
        else:
            log.exception("unexpected failure of %s", pb.OperationType.Name(req.type), exc_info=exc)
            status = pb.UNEXPECTED_CONDITION
        self.send(protocol.response(req.txnId, status, str(exc), topic=protocol.request_topic(req)))

    def _consume(self, ev: protocol.RequestReceived) -> None:
        t0 = time.perf_counter()
        t = self.server.topics.get(ev.topic)
        try:
            if t is None or (ev.topic, ev.subscriber) not in self.subs:
                raise errors.ClientNotSubscribedError(f"{ev.subscriber!r} not attached to {ev.topic!r}")
            self.server.stats.incr("consumes")
            if t.subs.consume(self, ev.subscriber, ev.request.consumeRequest.msgId.localComponent):
                task = t.subs.persist_soon(ev.subscriber)   # one write in flight per subscription
                if task is not None:
                    self.server.track(task)
            self.server.stats.observe("consume", time.perf_counter() - t0)
        except errors.PubSubError as exc:
            self._fail(ev.request, exc)

    async def _handle(self, ev: protocol.RequestReceived, after: asyncio.Task[None] | None) -> None:
        req = ev.request
        t0 = time.perf_counter()
        if after is not None:
            await asyncio.gather(after, return_exceptions=True)
        try:
            t = await self.server.topic(ev.topic, req.shouldClaim)
            t.last_active = time.monotonic()
            resp = protocol.response(req.txnId, topic=ev.topic)
            if req.type == pb.PUBLISH:
                self._enqueue(t, ev, functools.partial(self._published, req, t, t0))
                return
            if req.type == pb.SUBSCRIBE:
                self.server.stats.incr("subscribes")
                prefs = await t.subs.subscribe(self, ev.subscriber, req.subscribeRequest)
                resp.subscribeResponse.preferences.CopyFrom(prefs)
                await self.server.follow_regions(ev.topic, ev.subscriber, req.subscribeRequest.synchronous)
            elif req.type == pb.START_DELIVERY:
                t.subs.start_delivery(self, ev.subscriber, self.server.cache)
            elif req.type == pb.STOP_DELIVERY:
                await t.subs.stop_delivery(self, ev.subscriber)
            elif req.type == pb.CLOSESUBSCRIPTION:
                await t.subs.close(self, ev.subscriber)
            elif req.type == pb.UNSUBSCRIBE:
                self.server.stats.incr("unsubscribes")
                await t.subs.unsubscribe(self, ev.subscriber)
                await self.server.follow_regions(ev.topic, ev.subscriber, False)
            self.send(resp)
            if req.type in _TIMED:
                self.server.stats.observe(_TIMED[req.type], time.perf_counter() - t0)
        except Exception as exc:
            self._fail(req, exc)


class HubServer:
    """See the module docstring."""

    def __init__(self, conf: HubConf) -> None:
        self.conf = conf
        self.stats = HubStats()
        self.region_bytes = conf.region.encode()
        self.topics: dict[bytes, Topic] = {}
        self.connections: set[HubConnection] = set()
        self._acquiring: dict[bytes, asyncio.Future[Topic]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._unflushed: list[Callable[[], None]] = []
        self._servers: list[Any] = []     # asyncio.Server, hub.tls.TlsListener
        self.store: Any = None
        self.bk: Any = None
        self.session: Any = None
        self.address = ""
        self.stats_url = ""
        self._stop_stats: Any = None
        self.info = pb.HubInfo()
        self.cache: Any = None
        self.ownership: Ownership | None = None
        self.regions: Any = None      # hub.regions.RegionManager once started
        self.authenticator: Any = None   # hub.auth.TokenAuthenticator with authentication_enabled

    def flush_soon(self, flush: Callable[[], None]) -> None:
        """A connection's ``OutBuffer`` has frames: write them at the end of this loop turn (``flush``)."""
        self._unflushed.append(flush)
        if len(self._unflushed) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write every connection's queued frames now."""
        pending, self._unflushed = self._unflushed, []
        for flush in pending:
            flush()

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep ``task`` until it ends (cancelled on stop), like ``spawn``."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        """Open the metastore and ledger client, listen, register; raises on any failure."""
        import sys

        from bookie.client import BookKeeper, load_client_conf
        from metastore import open_metastore

        for p in self.conf.filter_class_path:
            if p not in sys.path:
                sys.path.append(p)
        from hub.regions import RegionManager

        regions = RegionManager(self)      # a bad region conf fails here, before anything opens
        self.store = await open_metastore(self.conf.metastore)
        bk_conf = load_client_conf(self.conf.bk_client_conf) if self.conf.bk_client_conf else None
        self.bk = await BookKeeper.connect(self.store, conf=bk_conf)
        self.owners = TopicOwnershipManager(self.store)
        self.pm = TopicPersistenceManager(self.store)
        self.sm = SubscriptionDataManager(self.store)
        self.registry = HubRegistry(self.store)
        self.dedup_store = TopicDedupManager(self.store)
        for m in (self.owners, self.pm, self.sm, self.registry, self.dedup_store):
            await m.start()
        self.cache = ReadAheadCache(self.conf, self._scan, last_seq=self._last_seq)
        if self.conf.authentication_enabled:    # a missing key fails start-up before any port opens
            from hub.auth import TokenAuthenticator

            self.authenticator = TokenAuthenticator(self.conf.token_secret_key)
        await self._listen()
        self.info = pb.HubInfo(hostname=self.conf.server_host, port=self._port,
                               sslPort=self._ssl_port,
                               czxid=int.from_bytes(uuid.uuid4().bytes[:7], "big"))
        self.session = await self.store.session(timeout=self.conf.zk_timeout / 1000.0)
        await self.registry.register(self.info, self.session)
        self.ownership = Ownership(self.conf, self.info, self.owners, self.registry, self.session)
        self.spawn(self._timers())
        self.regions = regions
        regions.start()
        if self.conf.stats_http_port:
            self._start_stats()
        log.info("hub %s serving (pid %d)", hub_address(self.info), os.getpid())

    async def _listen(self) -> None:
        """The one place listeners are opened (SSL adds a second here; ``ssl_only`` leaves only that one)."""
        loop = asyncio.get_running_loop()
        ctx = None
        if self.conf.ssl_enabled:    # the certificate first: a bad one fails start-up before any port opens
            from hub.tls import server_context

            ctx = server_context(self.conf.cert_path, self.conf.password)
        self._ssl_port = 0
        if ctx is not None:
            from hub.tls import TlsListener

            ssrv = await TlsListener.start(lambda: HubConnection(self), self.conf.server_host,
                                           self.conf.ssl_server_port, ctx, self.conf.ssl_handshake_timeout / 1000.0,
                                           self.conf.max_frame_size)
            self._servers.append(ssrv)
            self._ssl_port = ssrv.sockets[0].getsockname()[1]
        if self.conf.ssl_only:       # TLS enforced: the hub is named by its TLS port, no plaintext port opens
            self._port = self._ssl_port
        else:
            srv = await loop.create_server(lambda: HubConnection(self), self.conf.server_host, self.conf.server_port,
                                           reuse_address=True, backlog=1024)
            self._servers.append(srv)
            self._port = srv.sockets[0].getsockname()[1]
        self.address = f"{self.conf.server_host}:{self._port}"

    def _start_stats(self) -> None:
        """The one place the stats endpoint is set up (``hub.stats``)."""
        from hub.stats import HubMetrics

        metrics = HubMetrics(self)
        self.stats_url, self._stop_stats = metrics.serve(self.conf.server_host, self.conf.stats_http_port)
        self.stats.observer = metrics.observe

    async def follow_regions(self, topic: bytes, subscriber: bytes, synchronous: bool) -> None:
        """After a local subscriber came or went: keep the topic's remote subscriptions (``hub.regions``)."""
        from hub.regions import is_hub_subscriber

        if self.regions is not None and not is_hub_subscriber(subscriber):
            await self.regions.subscribers_changed(topic, synchronous)

    # --- topics -----------------------------------------------------------------------------------
    async def topic(self, topic: bytes, should_claim: bool) -> Topic:
        """The owned topic (claiming and acquiring it first); ``_Redirect`` when another hub owns it."""
        t = self.topics.get(topic)
        if t is not None:
            return t
        fut = self._acquiring.get(topic)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._acquiring[topic] = fut
            try:
                fut.set_result(await self._acquire(topic, should_claim))
            except BaseException as exc:
                fut.set_exception(exc)
                fut.exception()    # retrieved: waiters re-raise it themselves
            finally:
                self._acquiring.pop(topic, None)
        return await asyncio.shield(fut)

    async def _acquire(self, topic: bytes, should_claim: bool) -> Topic:
        assert self.ownership is not None
        owner = await self.ownership.claim(topic, should_claim)
        if owner is not None:
            raise _Redirect(owner)
        try:
            tlog = await TopicLog.acquire(topic, self.bk, self.pm, self.conf, self._persisted, self.dedup_store)
            subs = TopicSubscriptions(topic, self.sm, self.conf, lambda: tlog.last_seq, self._consumed,
                                      track=self.track)
            await subs.load()
        except BaseException as exc:
            await self.ownership.release(topic)
            if isinstance(exc, Exception) and not isinstance(exc, errors.ServiceDownError):
                # a raced owner (BAD_VERSION), a bookie or metastore failure: the client may retry
                raise errors.ServiceDownError(f"cannot acquire topic {topic!r}: {exc}") from exc
            raise
        t = Topic(tlog, subs)
        if self.regions is not None:
            await self.regions.recover_vector(topic, tlog)
        self.topics[topic] = t
        if self.regions is not None:
            self.spawn(self.regions.topic_acquired(topic))
        self.ownership.num_topics = len(self.topics)
        self.stats.incr("topics_acquired")
        log.info("acquired topic %r at seq %d", topic, tlog.last_seq)
        return t

    def _persisted(self, topic: bytes, msgs: list[pb.Message]) -> None:
        self.flush()   # the publish answers of this batch leave before the deliveries are built
        t = self.topics.get(topic)
        if t is not None and t.subs.delivering():
            for m in msgs:       # a hint for the cache: only worth building messages someone may read soon
                self.cache.on_published(topic, Message.from_proto(m, keep_wire=True))
            t.subs.wake_all()

    def _consumed(self, topic: bytes) -> None:
        t = self.topics.get(topic)
        if t is not None:
            self.cache.consumed_up_to(topic, t.subs.min_consumed())

    def _last_seq(self, topic: bytes) -> int:
        t = self.topics.get(topic)
        return t.log.last_seq if t is not None else 0

    async def _scan(self, topic: bytes, start: int, max_messages: int, max_bytes: int) -> list[Message]:
        t = self.topics.get(topic)
        if t is None:
            raise errors.ServiceDownError(f"topic {topic!r} is not owned here")
        return await t.log.scan(start, max_messages, max_bytes)

    async def release_topic(self, topic: bytes) -> None:
        """Give ``topic`` up: subscribers get TOPIC_MOVED, pointers persisted, ledger closed, record removed."""
        t = self.topics.pop(topic, None)
        if t is None:
            return
        await t.subs.release()
        await t.log.release()
        self.cache.release_topic(topic)
        if self.regions is not None:
            await self.regions.topic_released(topic)
        if self.ownership is not None:
            await self.ownership.release(topic)
            self.ownership.num_topics = len(self.topics)
        log.info("released topic %r", topic)

    # --- timers -----------------------------------------------------------------------------------
    async def _timers(self) -> None:
        """Load updates, retention, consumed-ledger deletion, session health; one loop."""
        consumed_every = self.conf.messages_consumed_thread_run_interval / 1000.0
        tick = min(1.0, consumed_every, max(0.1, self.conf.zk_timeout / 4000.0))
        next_consumed = time.monotonic() + consumed_every
        reported = -1
        while True:
            await asyncio.sleep(tick)
            try:
                if len(self.topics) != reported:
                    reported = len(self.topics)
                    await self.registry.update_load(self.info, reported)
                now = time.monotonic()
                if self.conf.retention_secs:
                    for topic, t in list(self.topics.items()):
                        if now - t.last_active > self.conf.retention_secs and not t.subs.attached_count:
                            await self.release_topic(topic)
                if now >= next_consumed:
                    next_consumed = now + consumed_every
                    await self.delete_consumed_ledgers()
                if self.session is not None and not self.session.alive:
                    log.warning("metastore session lost: releasing every topic")
                    for topic in list(self.topics):
                        await self.release_topic(topic)
                    self.session = await self.store.session(timeout=self.conf.zk_timeout / 1000.0)
                    await self.registry.register(self.info, self.session)
                    if self.ownership is not None:
                        self.ownership.session = self.session
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("hub timer: %s", exc)

    async def delete_consumed_ledgers(self) -> int:
        """Delete ledgers every subscriber has consumed past, on every owned topic; how many."""
        n = 0
        for t in list(self.topics.values()):
            n += len(await t.log.delete_consumed(t.subs.min_consumed()))
        if n:
            self.stats.incr("ledgers_deleted", n)
        return n

    async def stop(self) -> None:
        """Stop listening, release every topic, unregister, close clients."""
        for srv in self._servers:
            srv.close()
        if self._stop_stats is not None:
            self._stop_stats()
            self._stop_stats = None
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for task in list(self._tasks):
            task.cancel()
        for topic in list(self.topics):
            with contextlib.suppress(Exception):
                await self.release_topic(topic)
        if self.regions is not None:
            with contextlib.suppress(Exception):
                await self.regions.close()
        if self.cache is not None:
            with contextlib.suppress(Exception):
                await self.cache.close()
        if self.session is not None:
            with contextlib.suppress(Exception):
                await self.session.close()
        if self.bk is not None:
            with contextlib.suppress(Exception):
                await self.bk.close()
        if self.store is not None:
            with contextlib.suppress(Exception):
                await self.store.close()
