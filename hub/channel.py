"""One client connection to one hub (Hedwig's channel), and its response timeouts.

    conn = HubChannel(client, "host:port")        # the protocol factory of loop.create_connection
    fut = conn.request(req, timeout)              # the response; ResponseTimeoutError after timeout s
    conn.one_way(consume_req)                     # no response expected (CONSUME)
    conn.publish_batch(topic, bodies, timeout, answer, now)   # the response goes to answer.set_result (no future)
    conn.alive; await conn.lost                   # the connection is usable; resolves once it is gone
    conn.drop("why")                              # close it now: as if the connection had been lost

Bytes go through the sans-IO ``hub.protocol.ClientConnection`` (txn ids,
response matching); requests leave through an ``Outbox`` (``bookie.wire``),
one write per loop turn (or at once, by ``corked``'s holder: ``uncork``).
A request waits for its answer as a future, or, for the client's publishes,
as an ``Answer`` that the read settles in place (``set_result`` inside
``data_received``: no future of the request, no callback a loop turn later).
Deliveries, subscription events and the loss of the connection go to the
owning client (``ChannelOwner``, a ``HedwigClient``).

Failure: a request in flight when the connection drops fails with
``UncertainStateError``; one without an answer in time with
``ResponseTimeoutError``; a broken stream closes the connection (logged).

A silent hub (a host cut off without a FIN or RST reaching the client, a
stopped process: TCP stays up, nothing answers) is detected by this rule:
**a request that times out when nothing at all (no response, delivery or
event) has arrived on its connection since it was sent, while the client was
not holding reading back (``paused_by``), makes the connection suspect, and
it is dropped at once** — its other requests in flight fail with
``UncertainStateError`` (an exactly-once publish asks again with the same
sequence id), the client forgets the owners of the topics it routed through
it and resubscribes the subscriptions attached through it elsewhere (as
Pulsar's client closes a connection whose keep-alive goes unanswered). A
slow answer on a busy connection, where other answers keep arriving, only
fails that request: one slow topic does not cost the others their
connection. The timed-out request's ``ResponseTimeoutError`` has
``channel_dropped`` set when it condemned the connection.

Idle connections (a subscriber waiting for messages sends nothing, so no
request would time out) are pinged: after ``keep_alive_interval`` ms in
which nothing came from the hub, the client sends a PING (Pulsar's
keep-alive), an ordinary request with ``server_ack_response_timeout``, so
the rule above drops the connection of a hub that does not answer it — a
stopped hub process whose kernel still answers TCP probes included — and
its subscriptions attach elsewhere. A hub that does not know PING answers
UNKNOWN_OPERATION, which is an answer too. Below that, TCP keepalive probes
after ``server_ack_response_timeout`` of silence, and ``TCP_USER_TIMEOUT``
bounds how long sent data may stay unacknowledged (``tcp_keepalive``).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import math
import socket
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from bookie.wire import Outbox, set_tcp_liveness
from hub import errors
from hub.client_answers import BatchAnswer, MultiAnswer
from hub.conf import HubClientConf
from hub.message import Message
from hub.proto import pubsub_pb2 as pb
from hub.protocol import (
    ClientConnection,
    ConnectionBroken,
    DeliveryReceived,
    PublishedReceived,
    ResponseReceived,
    SubscriptionEventReceived,
)

log = logging.getLogger("hub.client")   # the client's log keeps the name it always had

__all__ = ["Answer", "ChannelOwner", "Deadlines", "HubChannel", "tcp_keepalive"]

_KEEPALIVE_PROBES = 3
_PRUNE_SLACK = 64
"""``Deadlines``: the answered requests at the head of its queue are dropped once it has grown by this many
entries (and doubled) since the last time: memory stays within about twice what is unanswered, plus this."""


def tcp_keepalive(sock: socket.socket | None, idle: float) -> bool:
    """Turn TCP keepalive on for ``sock``: the peer counts as gone after about ``2 * idle`` seconds.

    Probes start after ``idle`` seconds without traffic and repeat ``_KEEPALIVE_PROBES`` times
    ``idle / _KEEPALIVE_PROBES`` apart; ``TCP_USER_TIMEOUT`` makes sent data that stays
    unacknowledged for ``2 * idle`` seconds fail the connection too (``bookie.wire.set_tcp_liveness``).
    """
    whole = max(1, math.ceil(idle))
    return set_tcp_liveness(sock, idle=whole, interval=max(1, whole // _KEEPALIVE_PROBES), probes=_KEEPALIVE_PROBES,
                            user_timeout=2 * whole)


class Answer(Protocol):
    """What waits for a request's response: an ``asyncio.Future`` or an object settled in place (``done``,
    ``set_result`` with the response as read, ``set_exception`` on a timeout or the connection's loss)."""

    def done(self) -> bool: ...

    def set_result(self, response: pb.PubSubResponse, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class ChannelOwner(Protocol):
    """What a ``HubChannel`` needs of the client that owns it."""

    conf: HubClientConf

    def _delivered(self, conn: HubChannel, topic: bytes, sub: bytes, messages: Sequence[Message]) -> None: ...

    def _sub_event(self, conn: HubChannel, topic: bytes, sub: bytes, event: int) -> None: ...

    def _consumer_delivered(self, conn: HubChannel, consumer_id: int, messages: Sequence[Message]) -> None: ...

    def _consumer_event(self, conn: HubChannel, consumer_id: int, event: int) -> None: ...

    def _conn_lost(self, conn: HubChannel) -> None: ...


class Deadlines:
    """Response timeouts of one connection's requests with one timer, not one per request.

    Requests mostly come with ascending deadlines (one timeout, sent in order)
    and are answered in order: those sit in a deque whose answered head is
    dropped as new ones arrive; a retry with an earlier deadline goes to a
    small heap. The timer is armed for the earliest deadline only.
    """

    def __init__(self, on_expired: Callable[[int, Answer, float], None],
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``on_expired(txn_id, future, sent_at)`` for each request unanswered at its deadline (``sent_at``:
        the loop time it was watched). ``loop``: the connection's (else the running loop, looked up per
        request: a system call each, a publish's worth when every publish goes to a topic of its own)."""
        self._on_expired = on_expired
        self._loop = loop
        self._order: collections.deque[tuple[float, int, Answer, float]] = \
            collections.deque()
        self._late: list[tuple[float, int, Answer, float]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf
        self._prune_at = _PRUNE_SLACK

    def watch(self, txn_id: int, fut: Answer, timeout: float) -> None:
        loop = self._loop or asyncio.get_running_loop()
        now = loop.time()
        at = now + timeout
        order = self._order
        if len(order) >= self._prune_at:   # answered heads dropped now and then, not looked at per request
            while order and order[0][2].done():
                order.popleft()
            self._prune_at = 2 * len(order) + _PRUNE_SLACK
        if order and at < order[-1][0]:
            heapq.heappush(self._late, (at, txn_id, fut, now))
        else:
            order.append((at, txn_id, fut, now))
        if at < self._at:
            self._arm(loop, at)

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self._fire)
        self._at = at

    def _fire(self) -> None:
        self._timer, self._at = None, math.inf
        loop = asyncio.get_running_loop()
        now = loop.time()
        order, late = self._order, self._late
        while order and (order[0][2].done() or order[0][0] <= now):
            _, txn_id, fut, sent = order.popleft()
            if not fut.done():
                self._on_expired(txn_id, fut, sent)
        while late and (late[0][2].done() or late[0][0] <= now):
            _, txn_id, fut, sent = heapq.heappop(late)
            if not fut.done():
                self._on_expired(txn_id, fut, sent)
        nxt = min(order[0][0] if order else math.inf, late[0][0] if late else math.inf)
        if nxt < math.inf:
            self._arm(loop, nxt)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._at = None, math.inf
        self._order.clear()
        self._late.clear()
        self._prune_at = _PRUNE_SLACK


class HubChannel(asyncio.Protocol):
    """One connection to one hub."""

    def __init__(self, client: ChannelOwner, address: str) -> None:
        self.client = client
        self.address = address
        self.machine: ClientConnection[Answer] = ClientConnection(
            max(client.conf.max_message_size * 2 + 65536, 8 << 20))
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self.lost = self._loop.create_future()
        self.paused_by: set[tuple[bytes, bytes]] = set()
        self.deadlines = Deadlines(self._expired, self._loop)
        self.outbox = Outbox()
        self.last_heard = -math.inf      # loop time of the last bytes from the hub
        self.gone = False                # lost or dropped: nothing more goes through it
        self.multi_publish = True        # PUBLISH_MULTI served (until a hub that predates it refuses one)
        self.dropped: str | None = None  # why the client dropped it (``drop``), None if it was lost
        self.pings = 0                   # PINGs sent (keep-alive)
        self._connected_at = self._loop.time()
        self._keep_alive: asyncio.TimerHandle | None = None
        self.corked = False              # requests wait in the outbox for ``uncork`` (``ClientPublishing._flush_turn``)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.outbox.attach(self.transport)
        tcp_keepalive(self.transport.get_extra_info("socket"), self.client.conf.server_ack_response_timeout / 1000.0)
        self._connected_at = self._loop.time()
        if self.client.conf.keep_alive_interval:
            self._keep_alive = self._loop.call_at(self._connected_at + self.client.conf.keep_alive_interval / 1000.0,
                                                  self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        """Ping the hub when nothing came from it for ``keep_alive_interval``; check again when that may be."""
        self._keep_alive = None
        if self.gone:
            return
        conf = self.client.conf
        interval = conf.keep_alive_interval / 1000.0
        now = self._loop.time()
        due = max(self.last_heard, self._connected_at) + interval
        if now >= due and self.alive:
            self.pings += 1
            req = pb.PubSubRequest(type=pb.PING)
            req.pingRequest.SetInParent()
            self.request(req, conf.server_ack_response_timeout / 1000.0).add_done_callback(_ping_answered)
            due = now + interval
        self._keep_alive = self._loop.call_at(due, self._keep_alive_due)

    def data_received(self, data: bytes) -> None:
        self.last_heard = self._loop.time()
        for ev in self.machine.receive_data(data):
            if type(ev) is PublishedReceived:   # a publish's SUCCESS, read by hand: the most frequent answer
                value = ev.value
                got = ev.first
                if isinstance(value, BatchAnswer) and type(got) is int:   # (a client's batch: hub.client_publish)
                    if not value.finished:
                        value.published(got)
                elif isinstance(value, MultiAnswer) and type(got) is list and len(got) == len(value.parts):
                    if not value.finished:   # a PUBLISH_MULTI's parts, each a SUCCESS (issue 34)
                        value.published(got)
                elif not value.done():
                    value.set_result(ev.response)
            elif isinstance(ev, ResponseReceived):
                if not ev.value.done():
                    ev.value.set_result(ev.response)
            elif isinstance(ev, DeliveryReceived):
                if ev.consumer:
                    self.client._consumer_delivered(self, ev.consumer, ev.decoded)
                else:
                    self.client._delivered(self, ev.topic, ev.subscriber, ev.decoded)
            elif isinstance(ev, SubscriptionEventReceived):
                if ev.consumer:
                    self.client._consumer_event(self, ev.consumer, ev.event)
                else:
                    self.client._sub_event(self, ev.topic, ev.subscriber, ev.event)
            elif isinstance(ev, ConnectionBroken):
                log.warning("connection to %s broken: %s", self.address, ev.reason)
                if self.transport is not None:
                    self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self._gone(f"connection to {self.address} lost")

    def drop(self, reason: str) -> None:
        """Close the connection now and act as if it were lost (requests in flight: ``UncertainStateError``)."""
        if self.gone:
            return
        log.warning("dropping the connection to %s: %s", self.address, reason)
        self.dropped = reason
        if self.transport is not None:
            self.transport.abort()
        self._gone(f"connection to {self.address} dropped: {reason}")

    def _gone(self, why: str) -> None:
        if self.gone:
            return
        self.gone = True
        if self._keep_alive is not None:
            self._keep_alive.cancel()
            self._keep_alive = None
        self.outbox.detach()
        self.deadlines.close()
        for fut in self.machine.drain():
            if not fut.done():
                fut.set_exception(errors.UncertainStateError(why))
        self.client._conn_lost(self)

    def _write(self, data: bytes) -> None:
        # one write per loop turn: the requests a turn makes (a burst of publishes, the consumes
        # of a run of handled messages) reach the hub as one segment, one read there
        if self.corked:
            self.outbox.put(data)
        else:
            self.outbox.send(data)

    def uncork(self) -> None:
        """Write what was queued while ``corked`` now (the caller set ``corked`` before its requests)."""
        self.corked = False
        if len(self.outbox):
            self.outbox.flush()

    @property
    def alive(self) -> bool:
        return not self.gone and self.transport is not None and not self.transport.is_closing()

    def request(self, req: pb.PubSubRequest, timeout: float) -> asyncio.Future[pb.PubSubResponse]:
        """The response to ``req``; ``ResponseTimeoutError`` when none comes within ``timeout`` seconds."""
        fut: asyncio.Future[pb.PubSubResponse] = self._loop.create_future()
        if not self.alive:
            fut.set_exception(errors.UncertainStateError(f"connection to {self.address} lost"))
            return fut
        assert self.transport is not None
        self._write(self.machine.send_request(req, fut))
        self.deadlines.watch(req.txnId, fut, timeout)
        return fut

    def publish_batch(self, topic: bytes, bodies: Sequence[bytes], timeout: float, answer: Answer,
                      now: bool = False) -> None:
        """``request`` of the PUBLISH of ``bodies`` to ``topic`` (messages of a body alone; one body: a plain
        publish), framed by hand (``ClientConnection.send_publish_batch``): the client's producer batching.
        The response (or the failure) goes to ``answer``, as a request's to its future. ``now``: written at
        once, with whatever waits before it (the caller is the end of the loop turn already), unless
        ``corked``; alone, straight to the transport, without the outbox."""
        transport = self.transport
        if self.gone or transport is None or transport.is_closing():
            answer.set_exception(errors.UncertainStateError(f"connection to {self.address} lost"))
            return
        txn_id, frame = self.machine.send_publish_batch(topic, bodies, answer)
        outbox = self.outbox
        if self.corked:
            outbox.put(frame)
        elif not now:
            outbox.send(frame)
        elif outbox.queued_bytes:   # requests of this turn queued before it: all leave now, in order
            outbox.put(frame)
            outbox.flush()
        else:
            transport.write(frame)
        self.deadlines.watch(txn_id, answer, timeout)

    def publish_multi(self, parts: Sequence[tuple[bytes, Sequence[bytes]]], timeout: float, answer: Answer) -> None:
        """``publish_batch`` of many topics' bodies, ``(topic, bodies)`` each, as one PUBLISH_MULTI
        (``ClientConnection.send_publish_multi``): the client's producer batching across topics."""
        if not self.alive:
            answer.set_exception(errors.UncertainStateError(f"connection to {self.address} lost"))
            return
        txn_id, frame = self.machine.send_publish_multi(parts, answer)
        self._write(frame)
        self.deadlines.watch(txn_id, answer, timeout)

    def _expired(self, txn_id: int, fut: Answer, sent_at: float) -> None:
        """No answer in time; when nothing at all was heard since ``sent_at``, the connection is dropped."""
        self.machine.forget(txn_id)
        # while the client itself stopped reading (its handlers are behind), silence proves nothing
        silent = self.last_heard < sent_at and not self.paused_by
        fut.set_exception(errors.ResponseTimeoutError(
            f"no answer from {self.address} within the timeout" + ("; nothing heard from it since the request "
                                                                   "was sent: connection dropped" if silent else ""),
            channel_dropped=silent))
        if silent:
            waited = self._loop.time() - sent_at
            self.drop(f"a request went unanswered for {waited:.1f} s and nothing else came from the hub meanwhile")

    def one_way(self, req: pb.PubSubRequest) -> None:
        if self.alive:
            assert self.transport is not None
            self._write(self.machine.send_request(req, None))


def _ping_answered(fut: asyncio.Future[pb.PubSubResponse]) -> None:
    """A PING's outcome is only what its deadline does to the connection (``HubChannel._expired``)."""
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("ping failed: %s", fut.exception())
