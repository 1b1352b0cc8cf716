"""``HedwigClient``'s publishing: ``publish``, ``publish_async``, producer batching and exactly-once retries.

A mixin of ``HedwigClient`` (``hub.client``, where the module docstring states
the client's rules): the publish path to a topic's owner over its
``HubChannel``, with the batching of one event-loop turn's publishes into
one request, and the retries of a producer's (deduplicated) publish. What
it needs of the client core (``_call``, connections, owners) is declared
below. Errors are ``hub.errors`` classes, as ``publish`` says.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hub import errors
from hub.channel import HubChannel
from hub.client_answers import (
    BatchAnswer,
    MultiAnswer,
    _answer_of,
    _fail_all,
    _long_answered,
    _publish_settled,
)
from hub.conf import HubClientConf
from hub.proto import pubsub_pb2 as pb
from hub.protocol import status_name
from metastore.tasks import spawn

log = logging.getLogger("hub.client")

__all__ = ["ClientPublishing", "TracedPublish"]


@dataclass(frozen=True, slots=True)
class TracedPublish:
    """A sampled publish's outcome (``publish_traced``): its seq id, the hub's and bookies' stage times
    (``hub.tracing``) and the client's own, all ``time.monotonic_ns()``."""

    seq_id: int
    trace: pb.PublishTrace
    sent_ns: int    # the request was queued for the hub's socket (written at the end of that loop turn)
    read_ns: int    # the answer was read

_Conn = HubChannel
_RETRY_WAIT = 0.05         # seconds before the first retry of a request; doubles (hub.client)


class _Batch(BatchAnswer):
    """Publishes to one topic waiting to leave as one request (``HedwigClient._batched``).

    While every message is a body alone (no properties, type or key: the
    usual case) only the bodies are kept, and the request is framed by hand
    (``hub.frames.publish_batch``); the first message that needs more turns
    the batch into a protobuf request (``request``). A batch of bodies alone
    is its request's answer too (a ``BatchAnswer``): one object per request,
    not two (issue 32).
    """

    __slots__ = ("bytes", "conn", "req", "timer")

    def __init__(self, client: ClientPublishing, topic: bytes, conn: _Conn) -> None:   # BatchAnswer's, inline
        self.client = client
        self.topic = topic
        self.finished = False
        self.conn = conn
        self.req: pb.PubSubRequest | None = None
        self.bodies: list[bytes] = []     # the messages so far while ``req`` is None
        self.futures: list[asyncio.Future[int]] = []
        self.bytes = 0
        self.timer: asyncio.TimerHandle | asyncio.Handle | None = None   # the flush to come, when delayed

    def request(self, topic: bytes) -> pb.PubSubRequest:
        """The batch as a protobuf request, built from the bodies so far the first time: always as ``msgs``, which
        more messages join (a single one goes as a plain publish when the batch is sent: ``_flush_batch``)."""
        if self.req is None:
            self.req = _bodies_request(topic, self.bodies, batched=True)
            self.bodies = []
        return self.req


def _publish_request(topic: bytes) -> pb.PubSubRequest:
    req = pb.PubSubRequest(type=pb.PUBLISH, topic=topic)
    req.publishRequest.topic = topic
    return req


def _bodies_request(topic: bytes, bodies: list[bytes], batched: bool = False) -> pb.PubSubRequest:
    """The PUBLISH of ``bodies`` as a protobuf request: a plain one of one body (unless ``batched``: more
    messages are to join it), else a batched one."""
    req = _publish_request(topic)
    if len(bodies) == 1 and not batched:
        req.publishRequest.msg.body = bodies[0]
        return req
    msgs = req.publishRequest.msgs
    for body in bodies:
        msgs.add(body=body)
    return req


def _fill(msg: pb.Message, body: bytes, properties: Mapping[str, bytes] | None, message_type: str,
          key: bytes | None = None) -> pb.Message:
    msg.body = body
    if key is not None:
        msg.key = key
    if message_type:
        msg.header.messageType = message_type
    if properties:
        entries = msg.header.properties.entries
        for k, v in properties.items():
            entries.add(key=k, value=v)
    return msg


def _check_delay(deliver_after_ms: int | None, deliver_at_ms: int | None) -> None:
    """``ValueError`` for delay arguments the hub would refuse as MALFORMED_REQUEST (``hub.delayed``)."""
    if deliver_after_ms is not None and deliver_at_ms is not None:
        raise ValueError("give deliver_after_ms or deliver_at_ms, not both")
    for name, value in (("deliver_after_ms", deliver_after_ms), ("deliver_at_ms", deliver_at_ms)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be an integer >= 0 (ms), not {value!r}")


def _set_delay(msg: pb.Message, deliver_after_ms: int | None, deliver_at_ms: int | None) -> None:
    if deliver_after_ms is not None:
        msg.deliverAfterMs = deliver_after_ms
    elif deliver_at_ms is not None:
        msg.deliverAtMs = deliver_at_ms




class ClientPublishing:
    """The publishing half of ``HedwigClient``."""

    conf: HubClientConf
    closed: bool
    conns: dict[str, _Conn]
    owner: dict[bytes, str]
    _sequences: dict[tuple[bytes, bytes], int]
    _batches: dict[bytes, _Batch]
    _turn_batches: list[tuple[bytes, _Batch]] | None
    _publishing: set[asyncio.Task[Any]]

    if TYPE_CHECKING:
        async def _call(self, topic: bytes, req: pb.PubSubRequest) -> tuple[_Conn, pb.PubSubResponse]: ...

        def _check_open(self) -> None: ...

        @staticmethod
        def _check_names(topic: bytes, subscriber_id: bytes | None = None) -> None: ...

    def _init_publishing(self) -> None:
        self._sequences = {}     # (topic, producer) -> next sequence id
        self._batches = {}       # topic -> publishes waiting to leave together
        self._turn_batches = None  # the batches that leave at the end of this loop turn (_flush_turn)
        self._publishing = set() # publishes going the long way (_call)

    # --- publish ----------------------------------------------------------------------------------
    async def publish(self, topic: bytes, body: bytes, properties: Mapping[str, bytes] | None = None, *,
                      message_type: str = "", producer: bytes | None = None,
                      sequence_id: int | None = None, key: bytes | None = None,
                      deliver_after_ms: int | None = None, deliver_at_ms: int | None = None) -> int:
        """Publish durably; the message's local seq id. ``MessageTooLargeError`` over ``max_message_size``.

        ``message_type`` sets the header's system property ``messageType`` (seen by filters as
        ``Message.message_type``). ``key`` (Pulsar's message key) is stored with the message: a
        KEY_SHARED subscription hands all messages of one key to one consumer.

        Delayed delivery (Pulsar's ``deliverAfter`` / ``deliverAt``, ``hub.delayed``): with
        ``deliver_after_ms`` (from the owner's publish time) or ``deliver_at_ms`` (epoch ms) the
        message is stored at once, and SHARED and KEY_SHARED subscriptions hand it out no earlier than
        that time (EXCLUSIVE and FAILOVER ones at once, as in Pulsar). ``ValueError`` for both, or a
        negative one; ``DeliveryDelayTooLongError`` when the delay exceeds the hub's
        ``max_delivery_delay_ms``. A delayed publish is never batched with others (as in Pulsar), so
        its refusal fails no other publish.

        Exactly once (Pulsar's producer deduplication): with ``producer`` (or the client conf's
        ``producer_name``) the owner stores (producer, ``sequence_id``) at most once per topic and
        answers a duplicate with the seq id the original got; ``DuplicatePublishError`` when the
        sequence id is older than the producer's last ``dedup_window`` publishes. Without
        ``sequence_id`` the client numbers the producer's publishes to the topic itself, increasing,
        from the time in microseconds at its first one (so a restarted client continues above its
        earlier numbers). Such a publish is retried with the same sequence id when its answer is lost
        (a connection dropped, an owner failed) until ``server_ack_response_timeout``, instead of
        raising ``UncertainStateError``; when its answer timed out on a silent hub (the connection
        dropped, see ``hub.channel``) it is asked once more, through the default hub and its redirect
        to the topic's current owner, with a fresh ``server_ack_response_timeout``: such a publish
        fails over within about twice that time and is still stored at most once.

        With ``batching_max_publish_delay_ms``, an awaited publish does not wait for the delay: the
        topic's batch leaves at the end of this event-loop turn, with whatever else the turn added
        (Pulsar's synchronous ``send`` flushes the batch too); the delay is for ``publish_async``.
        """
        fut = self.publish_async(topic, body, properties, message_type=message_type, producer=producer,
                                 sequence_id=sequence_id, key=key, deliver_after_ms=deliver_after_ms,
                                 deliver_at_ms=deliver_at_ms)
        batch = self._batches.get(topic)
        if batch is not None and batch.timer is not None:
            batch.timer.cancel()
            batch.timer = asyncio.get_running_loop().call_soon(self._flush_batch, topic, batch)
        return await fut

    def publish_async(self, topic: bytes, body: bytes, properties: Mapping[str, bytes] | None = None, *,
                      message_type: str = "", producer: bytes | None = None,
                      sequence_id: int | None = None, key: bytes | None = None,
                      deliver_after_ms: int | None = None, deliver_at_ms: int | None = None) -> asyncio.Future[int]:
        """``publish`` started now; a future of its seq id (Pulsar's ``send_async``, Hedwig's ``asyncPublish``).

        Same arguments, ordering and errors as ``publish``, but a bad argument (a name the hub would
        refuse, a message over ``max_message_size``) raises here, before anything is sent, and the
        publish's own outcome comes through the future. Publishes started one after another on a
        topic are sent, stored and answered in that order; cancelling the future does not recall a
        publish already sent.

        Producer batching (Pulsar's, on by default: ``batching_enabled``): to an owner the client
        knows, the publishes a topic gets during one event-loop turn (or within
        ``batching_max_publish_delay_ms``) leave as one request of up to ``batching_max_messages``
        messages and ``batching_max_bytes`` of bodies. The owner stores them in order with
        consecutive seq ids, each future gets its own, and a failure fails exactly the messages
        that were not stored (the stored ones are always the first: its answer says how many). A
        producer's (deduplicated) publish goes alone, after whatever the topic had batched.
        """
        if not properties and not message_type and key is None and producer is None and sequence_id is None \
                and deliver_after_ms is None and deliver_at_ms is None:
            fut = self._join_batch(topic, body)   # the common case, without the checks its batch passed
            if fut is not None:
                return fut
        self._check_open()
        self._check_names(topic)
        delayed = deliver_after_ms is not None or deliver_at_ms is not None
        if delayed:
            _check_delay(deliver_after_ms, deliver_at_ms)
        if len(body) > self.conf.max_message_size:
            raise errors.MessageTooLargeError(f"message of {len(body)} bytes exceeds max_message_size "
                                              f"{self.conf.max_message_size}")
        if producer is None and self.conf.producer_name:
            producer = self.conf.producer_name.encode()
        if sequence_id is not None and not producer:
            raise ValueError("sequence_id needs a producer (or the client conf's producer_name)")
        if producer:
            if sequence_id is None:
                numbered = (topic, producer)
                sequence_id = self._sequences.get(numbered) or time.time_ns() // 1000
                self._sequences[numbered] = sequence_id + 1
            elif sequence_id < 0:
                raise ValueError(f"sequence_id must be >= 0, not {sequence_id}")
            req = _publish_request(topic)
            msg = _fill(req.publishRequest.msg, body, properties, message_type, key)
            _set_delay(msg, deliver_after_ms, deliver_at_ms)
            msg.producer = producer
            msg.sequenceId = sequence_id
            self._flush_batch(topic)     # what the topic has batched goes first
            return spawn(self._publishing, self._publish_once(topic, req))
        if self.conf.batching_enabled and not delayed:
            conn = self.conns.get(self.owner.get(topic, ""))
            if conn is not None and conn.alive:
                return self._batched(topic, conn, body, properties, message_type, key)
        self._flush_batch(topic)     # (batched on a connection that has closed since: those go first)
        req = _publish_request(topic)
        _set_delay(_fill(req.publishRequest.msg, body, properties, message_type, key), deliver_after_ms,
                   deliver_at_ms)
        return self._publish_future(topic, req)

    async def publish_traced(self, topic: bytes, body: bytes) -> TracedPublish:
        """Publish ``body`` alone (not batched) with ``PublishRequest.trace`` set: where its time went.

        For the bench's stage breakdown (``hub.tracing``): the answer carries
        the hub's and the bookies' stage times. What the topic has batched
        leaves first. Errors as ``publish``'s; the first publish to a topic
        goes the long way (redirects) and its stages are then the last try's.
        """
        self._check_open()
        self._check_names(topic)
        if len(body) > self.conf.max_message_size:
            raise errors.MessageTooLargeError(f"message of {len(body)} bytes exceeds max_message_size "
                                              f"{self.conf.max_message_size}")
        self._flush_batch(topic)
        req = _publish_request(topic)
        req.publishRequest.msg.body = body
        req.publishRequest.trace = True
        conn = self.conns.get(self.owner.get(topic, ""))
        read: list[int] = []
        sent = time.monotonic_ns()
        if conn is not None and conn.alive:
            answer = conn.request(req, self.conf.server_ack_response_timeout / 1000.0)
            answer.add_done_callback(lambda _: read.append(time.monotonic_ns()))   # not a loop turn later
            resp = await answer
        else:
            resp = (await self._call(topic, req))[1]
        if resp.statusCode != pb.SUCCESS:
            raise errors.error_for_status(status_name(resp.statusCode), resp.statusMsg or status_name(resp.statusCode))
        return TracedPublish(int(resp.publishResponse.publishedMsgId.localComponent), resp.publishResponse.trace,
                             sent, read[0] if read else time.monotonic_ns())

    def _join_batch(self, topic: bytes, body: bytes) -> asyncio.Future[int] | None:
        """A plain body's publish added to the batch ``topic`` has going (its name was checked when the batch
        started), or to a new one when the topic has none and its owner is known (the hub took the name
        already), as ``_batched`` would add it; None when that is not how it would go (the long way decides)."""
        batch = self._batches.get(topic)
        if self.closed:
            return None
        conf = self.conf
        size = len(body)
        if batch is None:   # a publisher that sends one message a turn: the first of a new batch
            conn = self.conns.get(self.owner.get(topic, ""))
            if conn is None or size > conf.max_message_size or conf.producer_name or not conf.batching_enabled \
                    or not conn.alive:
                return None
            batch = self._open_batch(topic, conn)
        elif batch.req is not None:
            return None
        else:
            conn = batch.conn
            if size > conf.max_message_size or conf.producer_name or not conf.batching_enabled \
                    or batch.bytes + size > conf.batching_max_bytes or not conn.alive \
                    or self.conns.get(self.owner.get(topic, "")) is not conn:
                return None
        fut: asyncio.Future[int] = conn._loop.create_future()
        batch.bodies.append(body)
        futures = batch.futures
        futures.append(fut)
        batch.bytes += size
        if len(futures) >= conf.batching_max_messages:
            self._flush_batch(topic)
        return fut

    def _batched(self, topic: bytes, conn: _Conn, body: bytes, properties: Mapping[str, bytes] | None,
                 message_type: str, key: bytes | None = None) -> asyncio.Future[int]:
        batch = self._batches.get(topic)
        if batch is not None and (batch.conn is not conn or batch.bytes + len(body) > self.conf.batching_max_bytes):
            self._flush_batch(topic)
            batch = None
        if batch is None:
            batch = self._open_batch(topic, conn)
        if properties or message_type or key is not None or batch.req is not None:
            _fill(batch.request(topic).publishRequest.msgs.add(), body, properties, message_type, key)
        else:
            batch.bodies.append(body)
        fut: asyncio.Future[int] = conn._loop.create_future()
        batch.futures.append(fut)
        batch.bytes += len(body)
        if len(batch.futures) >= self.conf.batching_max_messages:
            self._flush_batch(topic)
        return fut

    def _open_batch(self, topic: bytes, conn: _Conn) -> _Batch:
        """A new batch of ``topic`` to ``conn``, to be sent after ``batching_max_publish_delay_ms``, else at the
        end of this loop turn."""
        batch = self._batches[topic] = _Batch(self, topic, conn)
        delay = self.conf.batching_max_publish_delay_ms
        if delay:
            batch.timer = conn._loop.call_later(delay / 1000.0, self._flush_batch, topic, batch)
        else:   # one end-of-turn callback for every topic's batch, not one per topic (issue 34)
            turn = self._turn_batches
            if turn is None:
                turn = self._turn_batches = []
                conn._loop.call_soon(self._flush_turn, turn)
            turn.append((topic, batch))
        return batch

    def _flush_turn(self, turn: list[tuple[bytes, _Batch]]) -> None:
        """The end of the loop turn that started the batches of ``turn`` (without a delay): each leaves, in
        the order they started (one sent earlier, when full or by a later publish's flush, is skipped); the
        batches of bodies alone to topics of one hub together, as PUBLISH_MULTI (``batching_multi_topic``).
        Their requests are written at once, one write per connection (``HubChannel.corked``): this is the
        end of the turn already, so another end-of-turn callback to write them would only add a loop turn."""
        if self._turn_batches is turn:
            self._turn_batches = None
        if len(turn) == 1:   # one topic's batch (a publisher that sends one message a turn)
            topic, batch = turn[0]
            if batch.req is None:   # bodies alone: written at once (``HubChannel.publish_batch``'s ``now``)
                self._flush_batch(topic, batch, now=True)
                return
            conn = batch.conn
            conn.corked = True
            try:
                self._flush_batch(*turn[0])
            finally:
                conn.uncork()
            return
        conns = {batch.conn for _, batch in turn}
        for conn in conns:
            conn.corked = True
        try:
            if self.conf.batching_multi_topic:
                turn = self._flush_multi(turn)
            for topic, batch in turn:
                self._flush_batch(topic, batch)
        finally:
            for conn in conns:
                conn.uncork()

    def _flush_multi(self, turn: list[tuple[bytes, _Batch]]) -> list[tuple[bytes, _Batch]]:
        """Send the batches of bodies alone in ``turn`` to topics whose owner's connection takes PUBLISH_MULTI,
        two or more to a connection, as PUBLISH_MULTI requests (each up to ``batching_max_messages`` messages
        and ``batching_max_bytes`` of bodies); the batches left to send one by one."""
        batches = self._batches
        by_conn: dict[_Conn, list[tuple[bytes, _Batch]]] = {}
        rest: list[tuple[bytes, _Batch]] = []
        for topic, batch in turn:
            conn = batch.conn
            if batch.req is None and conn.multi_publish and batches.get(topic) is batch and conn.alive:
                by_conn.setdefault(conn, []).append((topic, batch))
            else:
                rest.append((topic, batch))
        conf = self.conf
        timeout = conf.server_ack_response_timeout / 1000.0
        for conn, group in by_conn.items():
            if len(group) < 2:
                rest += group
                continue
            parts: list[tuple[bytes, list[bytes], list[asyncio.Future[int]]]] = []
            messages = size = 0
            for topic, batch in group:
                del batches[topic]
                if batch.timer is not None:
                    batch.timer.cancel()
                if messages + len(batch.bodies) > conf.batching_max_messages \
                        or size + batch.bytes > conf.batching_max_bytes:
                    self._send_multi(conn, parts, timeout)
                    parts, messages, size = [], 0, 0
                parts.append((topic, batch.bodies, batch.futures))
                messages += len(batch.bodies)
                size += batch.bytes
            self._send_multi(conn, parts, timeout)
        return rest

    def _send_multi(self, conn: _Conn, parts: list[tuple[bytes, list[bytes], list[asyncio.Future[int]]]],
                    timeout: float) -> None:
        if parts:
            conn.publish_multi([(topic, bodies) for topic, bodies, _ in parts], timeout,
                               MultiAnswer(self, conn, parts))

    def _multi_answered(self, conn: _Conn, parts: list[tuple[bytes, list[bytes], list[asyncio.Future[int]]]],
                        resp: pb.PubSubResponse) -> None:
        """Each part settled by its own answer, as ``_publish_answered`` settles a batch; a request refused as a
        whole stored nothing: its parts go again, each as a request of its own (and with UNKNOWN_OPERATION,
        a hub that predates PUBLISH_MULTI, this connection sends none any more)."""
        answers = resp.multiPublishResponse.answers
        if resp.statusCode != pb.SUCCESS:
            if resp.statusCode == pb.UNKNOWN_OPERATION and conn.multi_publish:
                conn.multi_publish = False
                log.info("hub %s does not take PUBLISH_MULTI: a publish request per topic from now on", conn.address)
            for topic, bodies, futures in parts:
                self._send_publish(topic, _bodies_request(topic, bodies), futures, conn)
            return
        if len(answers) != len(parts):
            _fail_all([fut for part in parts for fut in part[2]], errors.UncertainStateError(
                f"hub {conn.address} answered {len(answers)} parts of a PUBLISH_MULTI of {len(parts)}"))
            return
        for (topic, bodies, futures), part in zip(parts, answers, strict=True):
            if part.statusCode != pb.SUCCESS and not part.publishResponse.stored:
                self._publish_long(topic, _bodies_request(topic, bodies), futures)
            else:
                _publish_settled(futures, part)

    def _flush_batch(self, topic: bytes, only: _Batch | None = None, now: bool = False) -> None:
        """Send what ``topic`` has batched (``only``: if it is still that batch; ``now``: a batch of bodies alone
        is written at once, not at the end of the turn)."""
        if only is None:
            # sent ahead of its turn (what a producer's or a delayed publish sends next may be a task):
            # batches started from now on leave in a callback of their own, after what this call started
            self._turn_batches = None
        batch = self._batches.get(topic)
        if batch is None or (only is not None and batch is not only):
            return
        del self._batches[topic]
        if batch.timer is not None:
            batch.timer.cancel()
        req = batch.req
        if req is None:   # bodies alone
            bodies = batch.bodies
            conn = batch.conn
            if conn.alive:
                conn.publish_batch(topic, bodies, self.conf.server_ack_response_timeout / 1000.0, batch, now)
            else:
                self._send_publish(topic, _bodies_request(topic, bodies), batch.futures, conn)
            return
        pub = req.publishRequest
        if len(pub.msgs) == 1:    # alone: a plain publish
            pub.msg.CopyFrom(pub.msgs[0])
            del pub.msgs[:]
        self._send_publish(topic, req, batch.futures, batch.conn)

    def _publish_future(self, topic: bytes, req: pb.PubSubRequest) -> asyncio.Future[int]:
        """A future of the seq id of the publish ``req`` (one message)."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._send_publish(topic, req, [fut], self.conns.get(self.owner.get(topic, "")))
        return fut

    def _send_publish(self, topic: bytes, req: pb.PubSubRequest, futures: list[asyncio.Future[int]],
                      conn: _Conn | None) -> None:
        """To the owner's open connection: one request and a callback. The first publish to a topic,
        and an answer that stored nothing and is not SUCCESS, go the long way (``_call``: redirects,
        retries) in a task."""
        if conn is None or not conn.alive:
            self._publish_long(topic, req, futures)
            return
        conn.request(req, self.conf.server_ack_response_timeout / 1000.0).add_done_callback(
            functools.partial(self._publish_answered, topic, req, futures))

    def _publish_answered(self, topic: bytes, req: pb.PubSubRequest, futures: list[asyncio.Future[int]],
                          answer: asyncio.Future[pb.PubSubResponse]) -> None:
        """``req`` answered (a batch of bodies alone is answered by its ``hub.client_answers.BatchAnswer``)."""
        resp = _answer_of(futures, answer)
        if resp is None:
            return
        if resp.statusCode != pb.SUCCESS and not resp.publishResponse.stored:
            self._publish_long(topic, req, futures)
            return
        _publish_settled(futures, resp)

    def _publish_bodies_long(self, topic: bytes, bodies: list[bytes], futures: list[asyncio.Future[int]]) -> None:
        """``_publish_long`` of a batch of bodies alone (``BatchAnswer``: its request stored nothing)."""
        self._publish_long(topic, _bodies_request(topic, bodies), futures)

    def _publish_long(self, topic: bytes, req: pb.PubSubRequest, futures: list[asyncio.Future[int]]) -> None:
        # held in _publishing until done (close does not cancel publishes; they fail with their connection)
        spawn(self._publishing, self._call(topic, req)).add_done_callback(functools.partial(_long_answered, futures))

    async def _publish_once(self, topic: bytes, req: pb.PubSubRequest) -> int:
        """A producer's publish: a lost answer is asked again with the same sequence id (the owner dedups)."""
        timeout = self.conf.server_ack_response_timeout / 1000.0
        deadline = time.monotonic() + timeout
        failed_over = False
        while True:
            try:
                return await self._publish_future(topic, req)
            except errors.ResponseTimeoutError as exc:
                if not exc.channel_dropped or failed_over:
                    raise
                failed_over = True      # once: a second silent hub in a row is reported to the caller
                deadline = time.monotonic() + timeout
                log.info("publish of %r sequence id %d: %s; asking again elsewhere",
                         req.publishRequest.msg.producer, req.publishRequest.msg.sequenceId, exc)
                self.owner.pop(topic, None)
            except errors.UncertainStateError as exc:
                if time.monotonic() >= deadline:
                    raise
                log.info("publish of %r sequence id %d: %s; asking again", req.publishRequest.msg.producer,
                         req.publishRequest.msg.sequenceId, exc)
                self.owner.pop(topic, None)
                await asyncio.sleep(_RETRY_WAIT)

