"""PUBLISH_MULTI on a hub connection (issue 34): the publishes of many topics in one request, one answer.

    conn._publish_multi(request)     # each part queued on its topic's log now, in the parts' order

A client publishing to many topics this hub owns sends the batches of one
event-loop turn as one request (``hub.client_publish``, framed by
``hub.frames_multi``). Each part is what a PUBLISH of its own would be, and
is treated as one: stamped and queued on its topic's log synchronously (so
a topic's publishes on a connection keep their order), its messages an entry
of that topic's ledger; a topic not loaded here is first loaded or redirected
as a PUBLISH's (``HubServer.topic``). The request is answered once every part
is settled, each part's answer being what its PUBLISH would have got: its
seq id (and how many were stored), or its error (NOT_RESPONSIBLE_FOR_TOPIC
with the owner, SERVICE_DOWN, ...) for the client to retry that part alone.
A part is answered only after its add is durable, as any publish.

Refused as a whole, before anything is queued (MALFORMED_REQUEST,
MESSAGE_TOO_LARGE, DELIVERY_DELAY_TOO_LONG, as a PUBLISH of the part would
be; NOT_AUTHORIZED by ``hub.connection``): a part the hub would refuse. A hub
that predates PUBLISH_MULTI answers UNKNOWN_OPERATION; both store nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hub import protocol
from hub.body_publish import StampedBody, new_stamped
from hub.connection_publish import PublishHost, PublishPath, _BatchAnswer
from hub.frames import stamped_wire
from hub.frames_multi import multi_published, part_published
from hub.owned_topics import Redirect
from hub.proto import pubsub_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from hub.persistence import TopicLog
    from hub.topic import Topic

log = logging.getLogger("hub.connection")

__all__ = ["MultiPublishPath", "multi_problem"]


class MultiPublishHost(PublishHost, Protocol):
    """What PUBLISH_MULTI uses of its hub beyond the publish path's: loading a topic not loaded yet."""

    async def topic(self, topic: bytes, should_claim: bool, for_publish: bool = False) -> Topic: ...


def _body_size(body: bytes) -> int:
    """The serialized size of a ``Message`` holding ``body`` alone: its field's tag, length and bytes."""
    n = len(body)
    if not n:
        return 0
    size = 2 + n   # the tag, the length's first byte
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def multi_problem(machine: protocol.ServerConnection, parts: Sequence[pb.PublishRequest],
                  seen: list[tuple[bytes, bytes | None]] | None = None) -> tuple[int, str] | None:
    """Why a PUBLISH_MULTI is refused as a whole: its first part that a PUBLISH of its own would be refused for
    (``ServerConnection``'s checks: the topic's name, message sizes, delays, producers in a batch); else None.

    ``seen`` gets each part's topic and, for a message of a body alone (no other field: a size of the body's
    field alone, so no delay either), its body, else None: what the caller reads again otherwise (a protobuf
    bytes field is copied at each read)."""
    limit = machine.max_message_size
    for i, pub in enumerate(parts):
        topic = pub.topic
        problem = protocol.name_problem(topic, "topic", protocol.MAX_TOPIC_BYTES)
        if problem is not None:
            return pb.MALFORMED_REQUEST, f"part {i}: {problem}"
        if pub.msgs:
            refused, _ = machine._batch_problem(pub)
            if refused is not None:
                return refused[0], f"part {i}: {refused[1]}"
            if seen is not None:
                seen.append((topic, None))
            continue
        msg = pub.msg
        body = msg.body
        if msg.ByteSize() == _body_size(body) and len(body) <= limit:
            if seen is not None:
                seen.append((topic, body))
            continue
        refused = machine.message_problem(msg)
        if refused is not None:
            return refused[0], f"part {i}: {refused[1]}"
        if seen is not None:
            seen.append((topic, None))
    return None


class MultiPublishPath(PublishPath):
    """PUBLISH_MULTI of ``HubConnection`` (on top of its single-topic publish path)."""

    server: MultiPublishHost
    _published_to: list[TopicLog]

    if TYPE_CHECKING:
        def _track(self, coro: Coroutine[Any, Any, None]) -> Any: ...

        def send(self, resp: pb.PubSubResponse) -> None: ...

    def _publish_multi(self, req: pb.PubSubRequest) -> None:
        """Queue each part of ``req`` (a PUBLISH_MULTI, counted in flight) on its topic's log, in order."""
        parts = req.multiPublishRequest.publishes
        seen: list[tuple[bytes, bytes | None]] = []
        refused = multi_problem(self.machine, parts, seen)
        if refused is not None:
            self._finished()
            self.server.stats.incr("requests_rejected")
            self.send(protocol.response(req.txnId, refused[0], refused[1]))
            return
        answer = _MultiAnswer(self, req.txnId, len(parts), time.perf_counter())
        if not parts:
            self._multi_published(answer)
            return
        server = self.server
        topics = server.topics
        published_to = self._published_to
        # the request's stamp, once: the owner's clock (``_stamp``'s) and whether a part of a body alone may
        # be queued as a ``StampedBody`` (``_publish_body``'s short way: no regions stamping this hub's messages)
        now = time.monotonic()
        now_ms = time.time_ns() // 1_000_000
        regions = server.regions
        vectors = None if regions is None else regions.vectors   # a topic with a vector-max: the long way
        short = not self.region_hub
        region = server.region_bytes
        plain = 0
        for i, (topic, body) in enumerate(seen):
            t = topics.get(topic)
            if t is None:
                self._track(self._part_when_loaded(answer, i, parts[i]))
                continue
            t.last_active = now
            if body is not None and short and not (vectors and vectors.get(topic)):
                # a message of a body alone (any other field would add to its size): stamped and serialized
                # from the body, as a single publish of a body is, without protobuf field writes and a
                # serialization per message (issue 34)
                wire = stamped_wire(body, region, now_ms)
                t.log.submit(new_stamped(StampedBody, (body, now_ms, region, wire)),
                             _PlainPart(self, answer, i, t), wire, sends=True)
                plain += 1
            else:
                self._enqueue_part(t, parts[i], answer, i, sends=True)
            if not published_to or published_to[-1] is not t.log:
                published_to.append(t.log)
        if plain:
            server.stats.counters["publishes"] += plain   # incr's, once per request

    async def _part_when_loaded(self, answer: _MultiAnswer, i: int, pub: pb.PublishRequest) -> None:
        """A part to a topic not loaded here: loaded (or redirected, failed) as a PUBLISH's topic is."""
        try:
            t = await self.server.topic(pub.topic, False, True)
        except Exception as exc:
            if isinstance(exc, Redirect):
                self.server.stats.incr("redirects")
            elif not protocol.expected_failure(exc):
                log.exception("unexpected failure loading %r for a multi-topic publish", pub.topic, exc_info=exc)
            answer.part_done(i, _part_failed(exc, 0, None))
            return
        self._enqueue_part(t, pub, answer, i)

    def _enqueue_part(self, t: Topic, pub: pb.PublishRequest, answer: _MultiAnswer, i: int, *,
                      sends: bool = False) -> None:
        """``_enqueue`` of one part: its message (or messages, with consecutive seq ids) on ``t``'s log.

        ``sends``: queued during a read, whose end sends it (``_publish_multi`` lists the log in
        ``_published_to``): no end-of-turn callback per topic (``EntryBatcher.submit``'s), as for a PUBLISH."""
        t.last_active = time.monotonic()
        topic = pub.topic
        stamp = self._stamp
        msgs = pub.msgs
        if msgs:
            part = _Part(self, answer, i, t, len(msgs), True)
            nbytes = 0
            for msg in msgs:
                stamp(topic, msg)
                nbytes += len(msg.body)
            self.server.stats.incr("publishes", len(msgs))
            t.log.submit_all(msgs, part, nbytes, sends=sends)
            return
        msg = pub.msg
        stamp(topic, msg)
        self.server.stats.incr("publishes")
        t.log.submit(msg, _Part(self, answer, i, t, 1, False), sends=sends)

    def _multi_published(self, answer: _MultiAnswer) -> None:
        """Every part is settled: one answer (``hub.frames_multi.multi_published``)."""
        self._finished()
        self._write(multi_published(answer.txn_id, answer.answers))
        if self.machine.eof:
            self._close_if_done()
        stats = self.server.stats
        stats.incr("packets_sent")
        stats.observe("publish", time.perf_counter() - answer.t0)

    def _part_failed(self, part: _Part) -> None:
        """A part's failure: its answer, and a log that could not close its ledger released (as ``_publish_failed``)."""
        exc = part.error
        assert exc is not None
        if not protocol.expected_failure(exc):
            log.exception("unexpected failure of a part of a multi-topic publish", exc_info=exc)
        part.answer.part_done(part.index, _part_failed(exc, part.first, part.stored if part.batched else None))
        t = part.t
        if t.log.closed and self.server.topics.get(t.log.topic) is t:
            self.server.spawn(self.server.release_topic(t.log.topic))


def _part_failed(exc: BaseException, first: int, stored: int | None) -> bytes:
    """A part's answer for ``exc``, serialized: a PUBLISH's (``_fail``'s; a batched one's says how many were
    stored first)."""
    if isinstance(exc, Redirect):
        resp = protocol.response(0, pb.NOT_RESPONSIBLE_FOR_TOPIC, exc.owner, redirect_to=exc.owner)
    else:
        resp = protocol.response(0, protocol.status_of(exc), str(exc))
    if stored is not None:
        if first:
            resp.publishResponse.publishedMsgId.localComponent = first
        resp.publishResponse.stored = stored
    return resp.SerializeToString()


class _MultiAnswer:
    """The answer to a PUBLISH_MULTI, collected as its parts settle (each once, in any order): each part's
    serialized answer, or a plain part's seq id (``multi_published`` encodes it with the frame)."""

    __slots__ = ("answers", "conn", "left", "t0", "txn_id")

    def __init__(self, conn: MultiPublishPath, txn_id: int, n: int, t0: float) -> None:
        self.conn, self.txn_id, self.t0 = conn, txn_id, t0
        self.answers: list[bytes | int] = [b""] * n
        self.left = n

    def part_done(self, index: int, data: bytes | int) -> None:
        self.answers[index] = data
        self.left -= 1
        if not self.left:
            self.conn._multi_published(self)


class _Part(_BatchAnswer):
    """One part's outcome: a batched publish's (``_BatchAnswer``: the stored ones are a prefix), given to the
    request's ``_MultiAnswer`` instead of answered on its own; a part of one message is answered as a
    plain publish (no ``stored``)."""

    __slots__ = ("answer", "batched", "index")

    def __init__(self, conn: MultiPublishPath, answer: _MultiAnswer, index: int, t: Topic, n: int,
                 batched: bool) -> None:
        self.conn = conn
        self.t = t
        self.left = n
        self.first = 0
        self.stored = 0
        self.error = None
        self.answer, self.index, self.batched = answer, index, batched

    def _settled(self) -> None:
        if self.error is None:
            self.answer.part_done(self.index, part_published(self.first, self.stored, self.batched))
        else:
            self.conn._part_failed(self)  # type: ignore[attr-defined]


class _PlainPart:
    """The ``Done`` of a part of one message of a body alone (``_publish_multi``'s short way): its answer is its
    seq id, put in the request's answers as is (``multi_published`` encodes it); a failure goes the way of
    ``_Part``'s."""

    __slots__ = ("answer", "conn", "index", "t")

    def __init__(self, conn: MultiPublishPath, answer: _MultiAnswer, index: int, t: Topic) -> None:
        self.conn, self.answer, self.index, self.t = conn, answer, index, t

    def __call__(self, seq: int, error: BaseException | None) -> None:
        if error is not None:
            _Part(self.conn, self.answer, self.index, self.t, 1, False).settle(0, error)
            return
        answer = self.answer   # part_done's, without its call (once per message)
        answer.answers[self.index] = seq
        answer.left -= 1
        if not answer.left:
            self.conn._multi_published(answer)
