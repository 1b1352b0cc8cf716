"""The publish path of a hub connection: a mixin of ``hub.connection.HubConnection``.

    conn._enqueue(topic, request, t0)         # a publish (or each message of a batched one) to the log, in order
    conn._enqueue_plain(topic, request, name, publish_request, t0)   # a single one without delivery delay

A publish is stamped (publish time, source region; a region's vector-max)
and queued on its topic's log synchronously, so publish order on a
connection is seq order; its answer is written from inside the add's
acknowledgement (``_published``: hand-framed, ``hub.frames.published``), a
batched publish's once all its messages settled (``_BatchAnswer``).

Failure: a publish that fails is answered with the status
``hub.protocol.failure_response`` gives it (a batched one says how many
were stored first); a log that could not close its ledger is released.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from hub import protocol, tracing
from hub.body_publish import BodyPublish, StampedBody, new_stamped, stamped_bodies
from hub.delayed import resolve_due
from hub.frames import published, published_batch_ok, stamped_wire, stamped_wires
from hub.proto import pubsub_pb2 as pb

if TYPE_CHECKING:
    import asyncio

    from bookie.wire.outbox import Outbox
    from hub.auth import TokenAuthenticator
    from hub.persistence import TopicLog
    from hub.regions import RegionManager
    from hub.stats import HubStats
    from hub.topic import Topic

log = logging.getLogger("hub.connection")   # these lines have always been the connection's

__all__ = ["PublishPath"]


class PublishHost(Protocol):
    """What the publish path uses of its hub: a narrow part of ``hub.connection.ConnectionHost`` (declared
    here, so this module does not import the connection module back)."""

    stats: HubStats
    topics: dict[bytes, Topic]
    regions: RegionManager | None
    region_bytes: bytes

    authenticator: TokenAuthenticator | None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    async def release_topic(self, topic: bytes) -> None: ...


class PublishPath:
    """Publishes of ``HubConnection`` (its ``server``, ``machine``, ``region_hub``, ``transport``, ``closed`` and
    ``_out`` are declared here)."""

    server: PublishHost
    machine: protocol.ServerConnection
    region_hub: bool
    transport: asyncio.Transport | None
    closed: bool
    _out: Outbox
    _published_to: list[TopicLog]

    if TYPE_CHECKING:
        def _finished(self) -> None: ...

        def _lifted(self) -> None: ...

        def _write(self, frame: bytes) -> None: ...

        def _close_if_done(self) -> None: ...

        def _fail(self, req: pb.PubSubRequest, exc: BaseException) -> None: ...

        def _dispatch(self, ev: protocol.RequestReceived) -> None: ...

    def _enqueue(self, t: Topic, req: pb.PubSubRequest, t0: float, plain_bytes: int = -1,
                 bodies: list[bytes] | None = None) -> None:
        """Queue the publish (or each message of a batched one) on the topic's log, in order.

        ``plain_bytes`` (``RequestReceived.plain_bytes``): a batched publish without delays, whose
        messages this connection stamps in one tight loop (one publish time for the request) and the
        log queues at once, unless regions stamp them (a vector-max, or a region hub's own).
        ``bodies`` (``RequestReceived.bodies``): its messages hold a body alone, so their stamped
        serialization is made from the bodies (``hub.frames.stamped_wires``) and goes with them.
        """
        t.last_active = time.monotonic()
        pub = req.publishRequest
        msgs = pub.msgs
        stats = self.server.stats
        topic = req.topic or pub.topic
        if msgs:
            answer = _BatchAnswer(self, req, t, t0, len(msgs))
            stats.incr("publishes", len(msgs))
            regions = self.server.regions
            if plain_bytes >= 0 and not self.region_hub and (regions is None or not regions.stamps(topic)):
                now = time.time_ns() // 1_000_000   # _stamp's, for each message
                region = self.server.region_bytes
                if bodies is not None:   # no msgId to clear; the entry is made of the stamped wires
                    for msg in msgs:
                        msg.publishTimeMs = now
                        msg.srcRegion = region
                    t.log.submit_all(msgs, answer, plain_bytes, stamped_wires(bodies, region, now))
                    return
                for msg in msgs:
                    msg.publishTimeMs = now
                    msg.srcRegion = region
                    msg.ClearField("msgId")
                t.log.submit_all(msgs, answer, plain_bytes)
                return
            for msg in msgs:
                self._stamp(topic, msg)
                t.log.submit(msg, answer.settle)
            return
        msg = pub.msg
        self._stamp(topic, msg)
        stats.incr("publishes")
        if pub.trace:   # a sampled publish (hub.tracing): its answer carries its stage times
            t.log.submit(msg, functools.partial(self._published_traced, req, t, t0, tracing.start(msg), msg))
            return
        t.log.submit(msg, functools.partial(self._published, req, t, t0))

    def _enqueue_plain(self, t: Topic, req: pb.PubSubRequest, topic: bytes, pub: pb.PublishRequest,
                       t0: float) -> None:
        """``_enqueue`` of a single publish without delivery delay (``RequestReceived.plain``: ``pub`` is
        its checked ``publishRequest``): the hub's most frequent request, stamped without a second look
        at its delay fields, unless regions stamp it (a vector-max, or a region hub's own)."""
        regions = self.server.regions
        if self.region_hub or (regions is not None and regions.stamps(topic)):
            self._enqueue(t, req, t0)
            return
        t.last_active = time.monotonic()
        msg = pub.msg
        msg.publishTimeMs = time.time_ns() // 1_000_000   # _stamp's (the owner's clock when stored)
        msg.srcRegion = self.server.region_bytes
        msg.ClearField("msgId")
        self.server.stats.incr("publishes")
        if pub.trace:   # a sampled publish (hub.tracing): its answer carries its stage times
            t.log.submit(msg, functools.partial(self._published_traced, req, t, t0, tracing.start(msg), msg))
            return
        t.log.submit(msg, functools.partial(self._published, req, t, t0))

    def _publish_body(self, ev: BodyPublish) -> None:
        """``_dispatch`` of a single publish of a body alone (``hub.body_publish``): as ``_enqueue_plain``
        stamps and queues it, with its stored serialization made from the body (``hub.frames.stamped_wire``),
        without a protobuf request; the long way (the request parsed) when anything more applies."""
        server = self.server
        t = server.topics.get(ev.topic)
        regions = server.regions
        if t is None or server.authenticator is not None or self.region_hub or \
                (regions is not None and regions.vectors.get(ev.topic)):   # regions.stamps', without its call
            req = ev.request()
            self._dispatch(protocol.RequestReceived(req, ev.topic, b"", -1, req.publishRequest))
            return
        machine = self.machine   # request_started's, without its call (once per publish)
        n = machine.in_flight = machine.in_flight + 1
        if n >= machine.max_pending_requests:
            machine.held = True
        t0 = time.perf_counter()
        t.last_active = time.monotonic()
        now = time.time_ns() // 1_000_000   # _stamp's (the owner's clock when stored)
        region = server.region_bytes
        bodies = ev.bodies
        if bodies is None:
            server.stats.counters["publishes"] += 1   # incr's, without its call (once per publish)
            body = ev.body
            wire = stamped_wire(body, region, now)
            t.log.submit(new_stamped(StampedBody, (body, now, region, wire)),
                         functools.partial(self._body_published, ev, t, t0), wire, sends=True)
        else:   # a batched one: as _enqueue's bodies path, its messages StampedBody too
            server.stats.incr("publishes", len(bodies))
            wires = stamped_wires(bodies, region, now)
            t.log.submit_all(stamped_bodies(bodies, wires, now, region), _BatchAnswer(self, ev, t, t0, len(bodies)),
                             sum(map(len, bodies)), wires, sends=True)
        published_to = self._published_to   # sends=True: _serve sends what this read queued (send_queued)
        if not published_to or published_to[-1] is not t.log:
            published_to.append(t.log)

    def _body_published(self, ev: BodyPublish, t: Topic, t0: float, seq: int, exc: BaseException | None) -> None:
        """``_published`` of a ``BodyPublish`` (a failure is answered from the parsed request, as the long way's)."""
        if exc is not None:
            self._published(ev.request(), t, t0, seq, exc)
            return
        machine = self.machine   # request_finished's, without its call while no hold is lifted
        n = machine.in_flight = machine.in_flight - 1
        if machine.held and n <= machine.max_pending_requests // 2:
            machine.held = False
            self._lifted()
        if self.transport is not None and not self.closed:
            self._out.send(published(ev.txn_id, ev.request_topic, seq))
        if machine.eof:
            self._close_if_done()
        stats = self.server.stats
        stats.counters["packets_sent"] += 1   # incr's, without its call (once per publish)
        if stats.observer is not None:
            stats.observer("publish", time.perf_counter() - t0)

    def _stamp(self, topic: bytes, msg: pb.Message) -> None:
        msg.publishTimeMs = time.time_ns() // 1_000_000   # the owner's clock when stored (hub.message)
        if msg.HasField("deliverAfterMs") or msg.HasField("deliverAtMs"):
            resolve_due(msg)                                # its due time on that clock (hub.delayed)
        if not self.region_hub or not msg.srcRegion:
            # only an authenticated region hub may name another region or carry a version vector:
            # a crafted remoteComponents would otherwise become the topic's vector-max
            msg.srcRegion = self.server.region_bytes
            msg.ClearField("msgId")
        if self.server.regions is not None:
            self.server.regions.stamp(topic, msg)

    def _published(self, req: pb.PubSubRequest, t: Topic, t0: float, seq: int, exc: BaseException | None) -> None:
        self._finished()
        if exc is not None:
            self._publish_failed(req, t, exc)
            return
        if self.transport is not None and not self.closed:   # _write's, without the call (once per publish)
            self._out.send(published(req.txnId, req.topic, seq))
        if self.machine.eof:
            self._close_if_done()
        stats = self.server.stats
        stats.incr("packets_sent")
        if stats.observer is not None:   # observe's
            stats.observer("publish", time.perf_counter() - t0)

    def _published_traced(self, req: pb.PubSubRequest, t: Topic, t0: float, trace: tracing.HubTrace,
                          msg: pb.Message, seq: int, exc: BaseException | None) -> None:
        """``_published`` for a traced publish: the answer is a ``PublishResponse`` with its ``trace``."""
        stages = tracing.finish(trace)
        if exc is not None:
            tracing.forget(msg)
            self._published(req, t, t0, seq, exc)
            return
        self._finished()
        resp = protocol.response(req.txnId, topic=req.topic)
        resp.publishResponse.publishedMsgId.localComponent = seq
        resp.publishResponse.trace.CopyFrom(stages)
        resp.publishResponse.trace.answer_sent_ns = time.monotonic_ns()
        self._write(protocol.encode(resp))
        if self.machine.eof:
            self._close_if_done()
        self.server.stats.incr("packets_sent")
        self.server.stats.observe("publish", time.perf_counter() - t0)

    def _batch_published(self, answer: _BatchAnswer) -> None:
        """Every message of a batched publish is settled: one answer (``hub.protocol.published_batch``)."""
        self._finished()
        req = answer.req
        if answer.error is not None:
            self._publish_failed(req.request() if isinstance(req, BodyPublish) else req, answer.t, answer.error,
                                 answer.first, answer.stored)
            return
        if isinstance(req, BodyPublish):
            self._write(published_batch_ok(req.txn_id, req.request_topic, answer.first, answer.stored))
        else:
            self._write(protocol.published_batch(req.txnId, req.topic, answer.first, answer.stored))
        if self.machine.eof:
            self._close_if_done()
        stats = self.server.stats
        stats.incr("packets_sent")
        stats.observe("publish", time.perf_counter() - answer.t0)

    def _publish_failed(self, req: pb.PubSubRequest, t: Topic, exc: BaseException, first: int = 0,
                        stored: int | None = None) -> None:
        if stored is None:
            self._fail(req, exc)
        else:   # a batched publish: its answer says how many were stored before the failure
            if not protocol.expected_failure(exc):
                log.exception("unexpected failure of a batched publish", exc_info=exc)
            self._write(protocol.published_batch(req.txnId, protocol.request_topic(req), first, stored,
                                                 protocol.status_of(exc), str(exc)))
            self.server.stats.incr("packets_sent")
        if self.machine.eof:
            self._close_if_done()
        if t.log.closed and self.server.topics.get(t.log.topic) is t:
            # its ledger could not be closed: let the next owner recover it
            self.server.spawn(self.server.release_topic(t.log.topic))


class _BatchAnswer:
    """The answer to a batched publish, collected as its messages settle (each once).

    The messages have consecutive seq ids, and a failure fails every message
    queued after it too (``hub.batcher``), so the stored ones are a prefix:
    ``first`` is the first one's seq id, ``stored`` how many, ``error`` a
    failure. The failures can be settled before the successes (the queue
    fails at once while earlier entries are still in flight), so the count
    does not depend on the order the callbacks come in.
    """

    __slots__ = ("conn", "error", "first", "left", "req", "stored", "t", "t0")

    def __init__(self, conn: PublishPath, req: pb.PubSubRequest | BodyPublish, t: Topic, t0: float, n: int) -> None:
        self.conn, self.req, self.t, self.t0 = conn, req, t, t0
        self.left = n
        self.first = 0
        self.stored = 0
        self.error: BaseException | None = None

    def settle(self, seq: int, error: BaseException | None) -> None:
        if error is None:
            if not self.stored:   # the stored ones settle in seq order (hub.batcher completes in order)
                self.first = seq
            self.stored += 1
        else:
            self.error = self.error or error
        self.left -= 1
        if not self.left:
            self._settled()

    __call__ = settle   # a Done (hub.batcher), and a RunDone:

    def settle_run(self, first: int, n: int) -> None:
        """``settle(seq, None)`` of ``n`` stored messages from seq id ``first`` (``hub.batcher.RunDone``)."""
        if not self.stored:
            self.first = first
        self.stored += n
        self.left -= n
        if not self.left:
            self._settled()

    def _settled(self) -> None:
        """Every message is settled: the answer (a PUBLISH_MULTI's part answers otherwise: hub.connection_multi)."""
        self.conn._batch_published(self)
