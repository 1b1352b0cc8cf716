"""One client connection of a hub: the asyncio ``Protocol`` around ``hub.protocol.ServerConnection``.

    server.connections                          # every HubConnection of a HubServer
    conn = HubConnection(server)                # made by the listener for each accepted socket
    conn.send(response); conn.send_delivery(topic, sub, messages)  # queued, written once per loop turn

Bytes go into the sans-IO ``ServerConnection``; its events are dispatched
here: publishes to the owned topic's log (in arrival order), subscription
requests chained per subscription, consumes applied at once. Answers leave
through an ``Outbox`` (``bookie.wire``) that the server flushes for all its
connections at the end of each loop turn. A client that stops reading makes
the transport pause: its deliveries wait and its requests are not read until
the buffer drains (``max_outbound_buffer``). A peer that goes silent (cut
off) is noticed by TCP within ``client_liveness_timeout``: the connection
is lost, as for a close.

Failure: a request that fails is answered with the status
``hub.protocol.failure_response`` gives it; a ``Redirect`` raised by the
server becomes NOT_RESPONSIBLE_FOR_TOPIC; the connection keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from bookie.wire import Outbox, set_tcp_liveness
from hub import errors, protocol
from hub.body_publish import BodyPublish
from hub.connection_multi import MultiPublishPath
from hub.frames import delivery_run
from hub.message import Message
from hub.owned_topics import Redirect
from hub.persistence import TopicLog
from hub.proto import pubsub_pb2 as pb
from hub.regions import is_hub_subscriber
from hub.seek import seek
from hub.substate import SubState
from hub.topic import Topic
from metastore.tasks import spawn

if TYPE_CHECKING:
    from bookie.client import BookKeeper
    from bookie.wire import FrameBudget
    from hub.auth import TokenAuthenticator
    from hub.conf import HubConf
    from hub.metadata import TopicPersistenceManager
    from hub.permissions import Authorizer
    from hub.readahead import ReadAheadCache
    from hub.regions import RegionManager
    from hub.stats import HubStats

log = logging.getLogger("hub.server")   # the hub's request log keeps the name it always had

__all__ = ["OUT_FLUSH_BYTES", "ConnectionHost", "HubConnection", "Redirect"]

_TIMED = {pb.SUBSCRIBE: "subscribe", pb.UNSUBSCRIBE: "unsubscribe"}


OUT_FLUSH_BYTES = 64 * 1024
"""Queued answer bytes past which a connection writes at once (``pause_writing`` is then seen promptly)."""

OUT_JOIN_BYTES = 16 * 1024
"""A turn's answers totalling no more than this leave as one joined buffer, not a ``writev`` of one part per
answer (``Outbox.join_bytes``; issue 32: a loop turn's publish answers are a few dozen bytes each)."""


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


PIPELINE_PUBLISHES = 16
"""Publishes of one read after which what is queued leaves (``_serve``).

A client with many publishes in flight sends them in one burst; had the
whole burst gone as one entry, the bookies would idle while the hub parsed
it and the client while the bookies synced it (lock-step). Sending the first
publishes at once and batching the rest behind them (``hub.batcher``) keeps
the stages overlapping.
"""


class ConnectionHost(Protocol):
    """What a ``HubConnection`` uses of its hub (a ``hub.server.HubServer``): the owned topics, the shared
    caches and clients, the authentication, and the loop-turn and task bookkeeping."""

    conf: HubConf
    stats: HubStats
    topics: dict[bytes, Topic]
    connections: set[HubConnection]
    cache: ReadAheadCache
    bk: BookKeeper
    pm: TopicPersistenceManager
    regions: RegionManager | None
    region_bytes: bytes
    authenticator: TokenAuthenticator | None
    authorizer: Authorizer | None
    frame_budget: FrameBudget

    def next_connection_key(self) -> int: ...

    def charge(self, conn: HubConnection, held: int) -> None: ...

    def flush_soon(self, flush: Callable[[], None]) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    def track(self, task: asyncio.Task[Any]) -> None: ...

    async def topic(self, topic: bytes, should_claim: bool, for_publish: bool = False) -> Topic: ...

    async def release_topic(self, topic: bytes) -> None: ...

    async def follow_regions(self, topic: bytes, subscriber: bytes, synchronous: bool) -> None: ...


class HubConnection(MultiPublishPath, asyncio.Protocol):
    """One client connection (its publish path: ``hub.connection_publish``; of many topics at once:
    ``hub.connection_multi``)."""

    server: ConnectionHost   # all of it here; the publish path declares the part it uses (PublishHost)

    def __init__(self, server: ConnectionHost) -> None:
        self.server = server
        self.conf = server.conf
        self.machine = protocol.ServerConnection(self.conf.max_frame_size, self.conf.max_message_size,
                                                 self.conf.max_requests_per_turn, self.conf.max_pending_requests,
                                                 self.conf.max_delivery_delay_ms, body_publishes=True)
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.subs: dict[tuple[bytes, bytes], SubState] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.chains: dict[tuple[bytes, bytes], asyncio.Task[None]] = {}
        self._out = Outbox(schedule=server.flush_soon, flush_bytes=OUT_FLUSH_BYTES, join_bytes=OUT_JOIN_BYTES)
        self._published_to: list[TopicLog] = []   # topics this read published to (data_received)
        self.closed = False
        self._serve_scheduled = False
        self._charged = False   # this connection's unparsed bytes are on the server's FrameBudget
        self._reading = True    # what _update_reading last asked of the transport (a new one reads)
        self.key = server.next_connection_key()   # newer connections have larger keys (FrameBudget)
        self.role: str | None = None   # the authenticated token's subject (hub.auth)
        self.region_hub = False        # authenticated with superuser_roles/region_roles: may set srcRegion
        self.address = ""              # the client's host:port (consumer stats)

    @property
    def partial_since(self) -> float | None:
        """Loop time the incomplete frame now held was started (``ServerConnection.partial_since``)."""
        return self.machine.partial_since

    # --- transport callbacks ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._out.attach(self.transport)   # type: ignore[arg-type]
        transport.set_write_buffer_limits(high=self.conf.max_outbound_buffer)  # type: ignore[attr-defined]
        self.server.connections.add(self)
        self.server.stats.incr("connections")
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.address = f"{peer[0]}:{peer[1]}"
        timeout = self.conf.client_liveness_timeout / 1000.0
        if timeout:   # a silent peer (cut off): closed, so its consumers' messages go to the others
            set_tcp_liveness(transport.get_extra_info("socket"), idle=timeout / 2, interval=timeout / 6, probes=3,
                             user_timeout=timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.writable.set()
        self.server.connections.discard(self)
        # nothing of a closed connection may outlive it: its partial frame, queued answers, and the
        # cycles connection -> out-buffer -> bound method -> connection and connection <-> transport
        self.server.frame_budget.release(self.key)
        self.machine.clear()
        self._out.detach()
        self.transport = None
        if self.subs:
            self.server.spawn(self._detach_all())

    async def _detach_all(self) -> None:
        for (topic, sub) in list(self.subs):
            t = self.server.topics.get(topic)
            if t is not None:
                await t.subs.detach(sub, self)
        self.subs.clear()

    def pause_writing(self) -> None:
        self.writable.clear()
        self._update_reading()
        self.server.stats.incr("write_pauses")

    def resume_writing(self) -> None:
        self.writable.set()
        if self.machine.backlogged:
            self._serve_soon()
        self._update_reading()

    def _update_reading(self) -> None:
        """Read while the client reads what we write and no requests wait for a later turn."""
        if self.transport is None or self.closed:
            return
        self._reading = self.machine.should_read(self.writable.is_set())
        if self._reading:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        """The client half-closed: answer what it sent (publishes in flight included), then close."""
        self.machine.eof_received()
        self._close_if_done()
        # keep the transport open for the answers; TLS has no half-close (asyncio would warn each time)
        return self.transport is not None and self.transport.get_extra_info("sslcontext") is None

    def _close_if_done(self) -> None:
        if self.machine.close_now and self.transport is not None and not self.closed:
            self._out.flush()
            self.transport.close()


    def data_received(self, data: bytes) -> None:
        self._serve(self.machine.receive_data(data))

    def _serve_soon(self) -> None:
        if not self._serve_scheduled:
            self._serve_scheduled = True
            asyncio.get_running_loop().call_soon(self._serve_more)

    def _serve_more(self) -> None:
        """The next turn's share of requests already read (``ServerConnection.backlogged``)."""
        self._serve_scheduled = False
        if self.closed or not self.writable.is_set() or self.machine.held:
            return    # resume_writing (or _finished) serves the rest
        self._serve(self.machine.next_events())

    def _serve(self, events: list[protocol.ServerEvent]) -> None:
        stats = self.server.stats
        machine = self.machine
        unsent = 0
        received = 0
        try:   # the sends below also after a failure: the publishes queued with sends=True must leave
            for event in events:
                if isinstance(event, BodyPublish):
                    self._publish_body(event)   # the most frequent request, the short way (hub.body_publish)
                elif isinstance(event, protocol.RequestReceived):
                    self._dispatch(event)   # counts it in flight (request_started) unless it is a CONSUME
                elif isinstance(event, protocol.Reject):
                    stats.incr("requests_rejected")
                    self.send(event.response)
                    continue
                else:
                    log.info("closing connection: %s", event.reason)
                    if self.transport is not None:
                        self.transport.close()
                    continue
                received += 1
                if self._published_to:
                    unsent += 1
                    if unsent >= PIPELINE_PUBLISHES:
                        # a long read: its first publishes leave now, the rest batch behind them
                        self._send_published()
                        self.server.bk.pool.flush()   # to the bookies now, before the rest is parsed
                        unsent = 0
            if received:
                stats.counters["packets_received"] += received   # incr's, once per read, not per request
            if machine.backlogged:
                stats.incr("turns_yielded")
                self._serve_soon()
            held = machine.buffered
            if held or machine.partial_since is not None:   # else the clock is stopped already
                machine.track_partial(bool(events), _loop_time)
            if held or self._charged:   # else the budget holds nothing of this connection already
                self.server.charge(self, held)
                self._charged = held > 0
            # should_read's test, without its calls: while _reading, the transport is writable (pause_writing
            # asked _update_reading at once)
            if not self._reading or machine.backlogged or machine.eof or machine.held:
                self._update_reading()   # else reading already, as it should (the most frequent case: no call)
            if machine.eof:
                self._close_if_done()
        finally:
            logs = self._published_to
            if logs:   # the publishes of this read go out as one entry per topic, now (_send_published's)
                self._published_to = []
                for tlog in logs:
                    tlog.send_queued()

    def _send_published(self) -> None:
        """Each topic published to by this read makes its entry now (``send_queued``).

        The adds wait in their bookie connections until the end of the loop
        turn (``BookieConnection.submit_entry``): the reads of all clients in
        one turn then leave as one ADD_ENTRIES_MULTI frame per bookie, one
        write each, instead of one write per bookie after each client's read
        (fewer writes here, fewer reads, wake-ups and journal groups on the
        bookies). Only a long read (``PIPELINE_PUBLISHES``) flushes them early.
        """
        logs, self._published_to = self._published_to, []
        for tlog in logs:
            tlog.send_queued()

    # --- Attachment -------------------------------------------------------------------------------
    def _write(self, frame: bytes) -> None:
        if self.transport is not None and not self.closed:
            self._out.send(frame)

    def send(self, resp: pb.PubSubResponse) -> None:
        self._write(protocol.encode(resp))
        self.server.stats.incr("packets_sent")

    def send_delivery(self, topic: bytes, subscriber: bytes, messages: list[Message]) -> None:
        if len(messages) == 1:
            self._write(protocol.delivery(topic, subscriber, messages[0].wire))
        else:
            self._write(delivery_run(topic, subscriber, messages))   # the run's bytes shared by its subscribers
        self.server.stats.incr("messages_delivered", len(messages))

    def send_event(self, topic: bytes, subscriber: bytes, event: int, consumer_id: int = 0) -> None:
        self._write(protocol.subscription_event(topic, subscriber, event, consumer_id))

    def send_consumer_delivery(self, topic: bytes, subscriber: bytes, consumer_id: int, wires: list[bytes]) -> None:
        self._write(protocol.delivery_batch(topic, subscriber, wires, consumer_id))
        self.server.stats.incr("messages_delivered", len(wires))

    def attached(self, topic: bytes, subscriber: bytes, state: SubState | None) -> None:
        if state is None:
            self.subs.pop((topic, subscriber), None)
        else:
            self.subs[(topic, subscriber)] = state

    # --- dispatch ---------------------------------------------------------------------------------
    def _dispatch(self, ev: protocol.RequestReceived) -> None:
        req = ev.request
        op = req.type   # read once: each read of a protobuf field is a lookup
        if op != pb.CONSUME:   # in flight until answered (request_finished); a CONSUME is answered only if it fails
            self.machine.request_started()
        if op == pb.PING:   # a client's keep-alive: answered at once, before (and without) authentication
            self.machine.request_finished()
            self.send(protocol.response(req.txnId))
            return
        if (not self._authorized(req, ev) if self.server.authenticator is not None
                else op != pb.PUBLISH and self._foreign_region_request(req, ev)):
            if op != pb.CONSUME:
                self.machine.request_finished()   # answered (AUTHENTICATE) or refused already
            return
        if op == pb.CONSUME:
            self._consume(ev)
            return
        if op == pb.PUBLISH_MULTI:
            self._publish_multi(req)
            return
        t = self.server.topics.get(ev.topic)
        if op == pb.PUBLISH:
            if t is None:
                self._track(self._handle(ev, None))
                return
            # synchronously: publish order on a connection is seq order
            if ev.plain is not None:
                self._enqueue_plain(t, req, ev.topic, ev.plain, time.perf_counter())
            else:
                self._enqueue(t, req, time.perf_counter(), ev.plain_bytes, ev.bodies)
            published_to = self._published_to
            if not published_to or published_to[-1] is not t.log:
                published_to.append(t.log)
            return
        # requests of one subscription are applied in the order they arrived
        key = (ev.topic, ev.subscriber)
        task = self._track(self._handle(ev, self.chains.get(key)))
        self.chains[key] = task
        task.add_done_callback(lambda t: self.chains.pop(key, None) if self.chains.get(key) is t else None)

    def _authorized(self, req: pb.PubSubRequest, ev: protocol.RequestReceived) -> bool:
        """With authentication_enabled: AUTHENTICATE first, region-hub subscriptions for region roles only,
        then the role's grants (``hub.permissions``)."""
        authenticator, authorizer = self.server.authenticator, self.server.authorizer
        assert authenticator is not None and authorizer is not None   # both exist with authentication_enabled
        if req.type == pb.AUTHENTICATE:
            try:
                self.role = authenticator.authenticate(req.authenticateRequest.token)
            except errors.AuthenticationError as exc:
                log.info("connection refused a token: %s", exc)
                self._fail(req, exc)
                return False
            self.region_hub = authorizer.is_region_hub(self.role)
            self.send(protocol.response(req.txnId))
            return False
        if self.role is None:
            self._fail(req, errors.AuthenticationError("this hub requires authentication: set the client conf "
                                                       "auth_token or auth_token_file"))
            return False
        if req.type == pb.SUBSCRIBE and req.subscribeRequest.hubSubscriber and not self.region_hub:
            self.server.stats.incr("not_authorized")
            self._fail(req, errors.NotAuthorizedError(f"role {self.role!r} may not subscribe as a region hub "
                                                      "(region_roles, superuser_roles)"))
            return False
        if req.type == pb.PUBLISH_MULTI:   # each part as the PUBLISH it stands for: one refusal refuses all
            refused = next(filter(None, (authorizer.check(self.role, pb.PUBLISH, part.topic, b"")
                                         for part in req.multiPublishRequest.publishes)), None)
        else:
            refused = authorizer.check(self.role, req.type, ev.topic, ev.subscriber)
        if refused is not None:
            self.server.stats.incr("not_authorized")
            self._fail(req, refused)
            return False
        return True

    def _foreign_region_request(self, req: pb.PubSubRequest, ev: protocol.RequestReceived) -> bool:
        """Without authentication: refuse (and answer) a request on a region subscription (``__region_*``
        or ``hubSubscriber``) from a peer that is not a configured region hub (``hub.regions``)."""
        if not (is_hub_subscriber(ev.subscriber)
                or (req.type == pb.SUBSCRIBE and req.subscribeRequest.hubSubscriber)):
            return False
        regions = self.server.regions
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if regions is not None and regions.is_region_peer(host):
            return False
        self.server.stats.incr("not_authorized")
        self._fail(req, errors.NotAuthorizedError(
            f"{host} is not a hub of a configured region: region subscriptions (__region_*, hubSubscriber) "
            "are for the hubs named in regions / remote_hubs (or enable authentication with region_roles)"))
        return True

    def _track(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return spawn(self.tasks, coro)

    def _finished(self) -> None:
        """A request read earlier was answered (or failed): read again if that lifted ``max_pending_requests``."""
        if self.machine.request_finished():
            self._lifted()

    def _lifted(self) -> None:
        """``request_finished`` lifted the hold of ``max_pending_requests``: serve what waits, read again."""
        if self.machine.backlogged:
            self._serve_soon()
        self._update_reading()

    def _fail(self, req: pb.PubSubRequest, exc: BaseException) -> None:
        """Answer ``req`` that failed with ``exc`` (the status is ``hub.protocol``'s decision)."""
        if isinstance(exc, Redirect):
            self.server.stats.incr("redirects")
            self.send(protocol.redirect_response(req, exc.owner))
            return
        if not protocol.expected_failure(exc):
            log.exception("unexpected failure of %s", pb.OperationType.Name(req.type), exc_info=exc)
        self.send(protocol.failure_response(req, exc))

    def _consume(self, ev: protocol.RequestReceived) -> None:
        t0 = time.perf_counter()
        t = self.server.topics.get(ev.topic)
        try:
            if t is None or (ev.topic, ev.subscriber) not in self.subs:
                raise errors.ClientNotSubscribedError(f"{ev.subscriber!r} not attached to {ev.topic!r}")
            self.server.stats.incr("consumes")
            creq = ev.request.consumeRequest
            if creq.consumerId or creq.ackType:   # a consumer's ack, redelivery request or permits
                t.subs.ack(self, ev.subscriber, creq)
                return
            if t.subs.consume(self, ev.subscriber, creq.msgId.localComponent):
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
            if req.type == pb.SEEK and req.seekRequest.resolveOnly and ev.topic not in self.server.topics \
                    and await self.server.pm.read_topic_persistence_info(ev.topic) is None:
                raise errors.NoSuchTopicError(f"topic {ev.topic!r} does not exist")
            t = await self.server.topic(ev.topic, req.shouldClaim, req.type == pb.PUBLISH)
            t.last_active = time.monotonic()
            resp = protocol.response(req.txnId, topic=ev.topic)
            if req.type == pb.PUBLISH:
                self._enqueue(t, req, t0)
                return
            if req.type == pb.SUBSCRIBE:
                self.server.stats.incr("subscribes")
                prefs = await t.subs.subscribe(self, ev.subscriber, req.subscribeRequest)
                resp.subscribeResponse.preferences.CopyFrom(prefs)
                await self.server.follow_regions(ev.topic, ev.subscriber, req.subscribeRequest.synchronous)
            elif req.type == pb.START_DELIVERY:
                t.subs.start_delivery(self, ev.subscriber, self.server.cache,
                                      req.startDeliveryRequest.maxBatchMessages, req.startDeliveryRequest.consumerId)
            elif req.type == pb.STOP_DELIVERY:
                await t.subs.stop_delivery(self, ev.subscriber, req.stopDeliveryRequest.consumerId)
            elif req.type == pb.CLOSESUBSCRIPTION:
                await t.subs.close(self, ev.subscriber, req.closeSubscriptionRequest.consumerId)
            elif req.type == pb.UNSUBSCRIBE:
                self.server.stats.incr("unsubscribes")
                await t.subs.unsubscribe(self, ev.subscriber)
                await self.server.follow_regions(ev.topic, ev.subscriber, False)
            elif req.type == pb.SEEK:
                resp.seekResponse.seqId = await seek(t, ev.subscriber, req.seekRequest, self.server.cache,
                                                      resp.seekResponse)
            self._finished()
            self.send(resp)
            if req.type in _TIMED:
                self.server.stats.observe(_TIMED[req.type], time.perf_counter() - t0)
        except Exception as exc:
            self._finished()
            self._fail(req, exc)
        if self.machine.eof:
            self._close_if_done()
