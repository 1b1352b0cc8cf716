"""The hub process: a thin asyncio shell around hub.protocol that does I/O and dispatch.

    server = HubServer(load_hub_conf("conf/hw_server.conf"))
    await server.start()          # metastore, ledger client, liveness registration, listener
    server.address                # "127.0.0.1:4080"
    await server.stop()

One connection (``hub.connection.HubConnection``) carries any number of
subscriptions; each owned topic is a ``hub.topic.Topic``. Requests are
decoded and validated by ``hub.protocol.ServerConnection``; the owned topics
are acquired and released by ``hub.owned_topics`` (claims: ``hub.ownership``;
publishes persisted by ``hub.persistence``, subscriptions kept by
``hub.subscriptions``, delivered by ``hub.delivery`` through the read-ahead
cache), the periodic work is ``hub.housekeeping``'s. This module wires those
parts: it opens the metastore, ledger client, listeners and HTTP server, and
hands each part the narrow view of the hub it declares (``ConnectionHost``,
``AdminHost``, ``RegionHost``, ``MetricsSource``...); no part imports this
module. A client that stops reading makes the transport pause: its
deliveries wait and its requests are not read until the buffer drains
(``max_outbound_buffer``).

Seams for regions/SSL/stats: every message gets ``src_region = conf.region``
when it has none; listeners are opened in ``_listen`` only; every counter
goes through ``HubStats.incr``.

Failure: a request that fails gets its status (metastore or bookie trouble:
SERVICE_DOWN); a malformed one gets MALFORMED_REQUEST and the connection
keeps serving; an oversized frame closes that connection only.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from bookie.wire import FrameBudget
from hub.conf import HubConf
from hub.connection import HubConnection
from hub.gcwatch import GcWatch
from hub.housekeeping import HubHousekeeping
from hub.metadata import (
    HubRegistry,
    SubscriptionDataManager,
    TopicDedupManager,
    TopicOwnershipManager,
    TopicPersistenceManager,
    hub_address,
)
from hub.owned_topics import OwnedTopics
from hub.ownership import Ownership, same_hub
from hub.proto import pubsub_pb2 as pb
from hub.readahead import ReadAheadCache
from hub.shedding import TopicLoadShedder
from hub.stats import HubStats
from hub.topic import RATE_WINDOW, Topic
from metastore.tasks import keep, spawn

if TYPE_CHECKING:
    from bookie.client import BookKeeper
    from bookie.http import HttpServer
    from hub.auth import TokenAuthenticator
    from hub.permissions import Authorizer
    from hub.policy_store import PolicyCache
    from hub.regions import RegionManager
    from hub.tls import TlsListener
    from metastore.api import MetaStore, Session

log = logging.getLogger(__name__)

__all__ = ["RATE_WINDOW", "HubConnection", "HubServer", "HubStats", "Topic"]


_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
_FD_LOG_INTERVAL = 10.0   # seconds between log lines about running out of file descriptors


class HubServer(OwnedTopics, HubHousekeeping):
    """See the module docstring."""

    store: MetaStore            # opened by start()
    bk: BookKeeper              # connected by start()
    cache: ReadAheadCache       # built by start()
    policies: PolicyCache       # read by start() (hub.policy_store)

    def __init__(self, conf: HubConf) -> None:
        self.conf = conf
        self.stats = HubStats()
        self.shedder = TopicLoadShedder(conf.rebalance_tolerance_percentage, conf.rebalance_max_shed)
        self.region_bytes = conf.region.encode()
        self.topics: dict[bytes, Topic] = {}
        self.connections: set[HubConnection] = set()
        self._acquiring: dict[bytes, asyncio.Future[Topic]] = {}
        # max_concurrent_topic_loads: acquisitions, and new ledgers, at once (more wait their turn)
        self._load_slots = asyncio.Semaphore(conf.max_concurrent_topic_loads)
        self._ledger_slots = asyncio.Semaphore(conf.max_concurrent_topic_loads)
        self.loads_waiting = 0          # acquisitions waiting for a slot
        self._alive_checks: dict[Any, Callable[[], bool]] = {}   # the current session's liveness (_alive_check)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._unflushed: list[Callable[[], None]] = []
        self._flush_loop: asyncio.AbstractEventLoop | None = None   # flush_soon's loop (taken at its first call)
        self._servers: list[asyncio.Server | TlsListener] = []
        # store, bk and cache exist from start() on (class annotations above); session once registered
        self.session: Session | None = None
        self.address = ""
        self.stats_url = ""
        self.http_url = ""              # the HTTP server's base URL ("" when off)
        self._http: HttpServer | None = None   # once started
        self.stopping = False
        self.deleting: set[bytes] = set()   # topics the admin API is deleting: not acquired meanwhile
        self.releasing: set[bytes] = set()  # topics being released: a moved subscriber's retry waits for it
        self.info = pb.HubInfo()
        self.ownership: Ownership | None = None
        self.regions: RegionManager | None = None
        self.authenticator: TokenAuthenticator | None = None   # with authentication_enabled
        self.authorizer: Authorizer | None = None      # with authentication_enabled
        self.frame_budget = FrameBudget(conf.max_partial_frame_bytes)
        self.gc_watch = GcWatch(self.stats)
        self._connection_keys = itertools.count(1)
        self._fd_warned_at = -math.inf
        self._fd_unlogged = 0

    def next_connection_key(self) -> int:
        return next(self._connection_keys)

    # --- memory and descriptor bounds -------------------------------------------------------------
    def charge(self, conn: HubConnection, held: int) -> None:
        """Record the bytes ``conn`` holds unparsed; close the newest holders while all together exceed
        ``max_partial_frame_bytes``."""
        victims = self.frame_budget.update(conn.key, held)
        if not victims:
            return
        by_key = {c.key: c for c in self.connections}
        for key in victims:
            self.frame_budget.release(key)
            victim = by_key.get(key)
            if victim is None or victim.transport is None:
                continue
            log.warning("closing a client connection holding %d bytes of incomplete frames: all connections "
                        "together hold more than max_partial_frame_bytes (%d)", victim.machine.buffered,
                        self.frame_budget.limit)
            self.stats.incr("connections_closed_partial_frame_budget")
            victim.machine.clear()
            victim.transport.abort()

    def loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The loop's exception handler: running out of file descriptors is counted and logged
        (at most every ``_FD_LOG_INTERVAL`` seconds); anything else goes to the default handler."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS:
            self.stats.incr("accept_out_of_descriptors")
            now = time.monotonic()
            if now - self._fd_warned_at >= _FD_LOG_INTERVAL:
                more = f" ({self._fd_unlogged} more since the last report)" if self._fd_unlogged else ""
                log.error("cannot accept client connections: %s (%s)%s; raise the open file limit "
                          "(ulimit -n) or lower the number of clients", os.strerror(exc.errno or 0),
                          context.get("message", ""), more)
                self._fd_warned_at, self._fd_unlogged = now, 0
            else:
                self._fd_unlogged += 1
            return
        loop.default_exception_handler(context)

    def flush_soon(self, flush: Callable[[], None]) -> None:
        """A connection's ``Outbox`` has frames: write them at the end of this loop turn (``flush``)."""
        unflushed = self._unflushed
        unflushed.append(flush)
        if len(unflushed) == 1:   # the first of this turn: the loop kept (get_running_loop makes a getpid syscall)
            loop = self._flush_loop
            if loop is None or loop.is_closed():
                loop = self._flush_loop = asyncio.get_running_loop()
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write every connection's queued frames now."""
        pending, self._unflushed = self._unflushed, []
        for flush in pending:
            flush()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        spawn(self._tasks, coro)

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep ``task`` until it ends (cancelled on stop), like ``spawn``."""
        keep(self._tasks, task)

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
        self.policies = await self._policies()
        if self.conf.authentication_enabled:    # a missing key fails start-up before any port opens
            from hub.auth import TokenAuthenticator

            self.authenticator = TokenAuthenticator(self.conf.token_secret_key)
            self.authorizer = await self._authorizer()
        await self._listen()
        self.info = pb.HubInfo(hostname=self.conf.server_host, port=self._port,
                               sslPort=self._ssl_port,
                               czxid=int.from_bytes(uuid.uuid4().bytes[:7], "big"))
        await self._start_http()      # before registering: the registration names its URL
        self.session = await self.store.session(timeout=self.conf.zk_timeout / 1000.0)
        await self.registry.register(self.info, self.session, self.http_url)
        self.ownership = Ownership(self.conf, self.info, self.owners, self.registry, self.session)
        self.spawn(self._timers())
        self.gc_watch.start()         # what start-up built is frozen; long collections are logged (hub.gcwatch)
        self.spawn(self.gc_watch.run())
        if self.conf.incomplete_frame_timeout:
            self.spawn(self._close_stalled_connections())
        self.regions = regions
        regions.start()
        log.info("hub %s serving (pid %d)", hub_address(self.info), os.getpid())

    async def _authorizer(self) -> Authorizer:
        """The grants (``hub.permissions``), read now and re-read every ``permissions_refresh_interval``."""
        from hub.permissions import Authorizer, PermissionCache, PermissionStore

        cache = PermissionCache(PermissionStore(self.store), self.conf.permissions_refresh_interval / 1000.0,
                                lambda: self.stats.incr("permissions_refresh_failures"), self._close_revoked)
        await cache.start()
        self.spawn(cache.refresh_forever())
        return Authorizer(cache, self.conf.superuser_roles, self.conf.region_roles)

    async def _policies(self) -> PolicyCache:
        """The lifecycle policies (``hub.policy_store``), read now and re-read every ``policies_refresh_interval``."""
        from hub.policies import Policy
        from hub.policy_store import PolicyCache, PolicyStore

        cache = PolicyCache(PolicyStore(self.store), Policy.from_conf(self.conf),
                            self.conf.policies_refresh_interval / 1000.0,
                            lambda: self.stats.incr("policies_refresh_failures"), self._policies_changed)
        await cache.start()
        self.spawn(cache.refresh_forever())
        return cache

    def _policies_changed(self) -> None:
        """A policy changed: publishes held by a quota that no longer holds them go on."""
        for t in list(self.topics.values()):
            if t.quota is not None:
                t.quota.wake()

    def _close_revoked(self) -> None:
        """The grants changed: close the attached subscriptions whose role lost ``consume`` there."""
        from hub.permissions import revoked_attachments

        if self.authorizer is None:
            return
        for conn, topic, sub in revoked_attachments(self.authorizer, self.connections):
            log.info("closing subscription %r/%r: role %r may no longer consume there", topic, sub, conn.role)
            self.stats.incr("subscriptions_closed_not_authorized")
            conn.send_event(topic, sub, pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED)
            t = self.topics.get(topic)
            state = t.subs.subs.get(sub) if t is not None else None
            consumers = t.subs.consumer_ids(sub, conn) if t is not None else []
            for cid in consumers:   # its consumers (hub.subscription_consumers) are told one by one
                conn.send_event(topic, sub, pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED, cid)
            if t is not None and state is not None and (state.conn is conn or consumers):
                self.spawn(t.subs.detach(sub, conn))

    async def _listen(self) -> None:
        """The one place listeners are opened (SSL adds a second here; ``ssl_only`` leaves only that one)."""
        loop = asyncio.get_running_loop()
        if loop.get_exception_handler() is None:   # accept() failing for want of descriptors: see loop_exception
            loop.set_exception_handler(self.loop_exception)
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

    async def _start_http(self) -> None:
        """The one place the HTTP server is set up (``bookie.http``: metrics of ``hub.stats``, ``hub.admin``,
        the web console ``hub.ui``)."""
        from bookie.http import HttpServer, admin_token, resolve_http_port
        from hub.admin import HubAdmin
        from hub.stats import HubMetrics

        conf = self.conf
        port = resolve_http_port(conf.http_server_port, conf.stats_http_port)
        if port is None:
            return
        metrics = HubMetrics(self)
        admin = HubAdmin(self)
        self._http = HttpServer(metrics.registry, ready=admin.readiness,
                                token=admin_token(conf.http_admin_token, conf.http_admin_token_file),
                                routes=admin.routes())
        from hub.ui import install as install_console
        install_console(self._http.app, self, admin, base_path=conf.http_ui_base_path)   # /ui/: hub.ui
        self.http_url = await self._http.start(conf.http_server_host, port)
        self.stats_url = self.http_url + "/metrics"
        self.stats.observer = metrics.observe

    async def is_ready(self) -> str | None:
        """``None`` when the hub accepts clients and is registered as live in the metastore; else why not."""
        if self.stopping:
            return "stopping"
        if not self._servers:
            return "not listening"
        if self.session is None:
            return "not registered in the metastore yet"
        if not self.session.alive:
            return "metastore session lost"

        if not any(same_hub(info, self.info) for info, _ in await self.registry.live_hubs()):
            return "not registered in the metastore"
        return None

    async def follow_regions(self, topic: bytes, subscriber: bytes, synchronous: bool) -> None:
        """After a local subscriber came or went: keep the topic's remote subscriptions (``hub.regions``)."""
        from hub.regions import is_hub_subscriber

        if self.regions is not None and not is_hub_subscriber(subscriber):
            await self.regions.subscribers_changed(topic, synchronous)

    async def stop(self) -> None:
        """Stop listening, release every topic, then close clients and unregister.

        Topics are released while the clients are still connected, as load
        shedding does: publishes already in flight are answered (a publish
        whose answer was lost would be retried and stored twice), attached
        subscribers get TOPIC_MOVED. Meanwhile ``topic()`` refuses to acquire
        anything (SERVICE_DOWN: the client retries, and finds the next owner).
        """
        self.stopping = True
        for srv in self._servers:
            srv.close()
        if self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.stop()
            self._http = None
        for topic in list(self.topics):
            with contextlib.suppress(Exception):
                await self.release_topic(topic)
        self.flush()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for task in list(self._tasks):
            task.cancel()
        self.gc_watch.stop()
        if self.regions is not None:
            with contextlib.suppress(Exception):
                await self.regions.close()
        if (started_cache := getattr(self, "cache", None)) is not None:
            with contextlib.suppress(Exception):
                await started_cache.close()
        if self.session is not None:
            with contextlib.suppress(Exception):
                await self.session.close()
        if (started_bk := getattr(self, "bk", None)) is not None:
            with contextlib.suppress(Exception):
                await started_bk.close()
        if (started_store := getattr(self, "store", None)) is not None:
            with contextlib.suppress(Exception):
                await started_store.close()
