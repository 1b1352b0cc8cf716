"""``HedwigClient``'s readers and seek (DESIGN 6b).

    reader = await c.reader(b"topic", start_seq_id=1)        # or start_publish_time_ms=T (epoch ms)
    async for msg in reader: ...                             # until reader.close(); also `async with reader`
    seq = await c.seek(b"topic", b"sub", seq_id=N)           # next delivered is N; or publish_time_ms=T

A mixin of ``HedwigClient`` (``hub.client``). ``seek`` is one SEEK request
to the topic's owner (``hub.seek``): the subscription's pointer moves as the
admin reset moves it, and attached consumers get SUBSCRIPTION_RESET and then
messages from the new position. It returns the seq id chosen.

Design of a reader: the owner first resolves the start (a SEEK probe:
``NoSuchTopicError`` for a topic never created, a seq id before the first
kept message moves to it, a time to the first message published at or
after it); then the reader attaches an EXCLUSIVE consumer of a *temporary*
subscription ``reader-<random hex>`` (``SubscriptionPreferences.temporary``)
created to deliver from that seq id (``SubscribeRequest.startSeqId``), so
nothing before the start is ever delivered. Messages are acknowledged as
they are read. The hub deletes a temporary subscription as soon as its
consumer closes or its connection drops (a client killed with a reader
open leaves nothing behind that holds the topic's ledgers), and a new
owner deletes those it finds when it loads the topic. So the reader's
position is the client's, as in Pulsar's non-durable readers: after a
dropped connection or an owner change the consumer subscribes again,
creating the subscription from the message after the last one read
(anything older that still comes is skipped). ``close()`` detaches it
(and unsubscribes, for a hub that kept it).

A compacted reader (``compacted=True``, from a ``start_seq_id``; Pulsar's
``readCompacted``) first reads the topic's compacted ledger
(``hub.compaction``) page by page (SEEK probes with ``readCompacted``): the
newest message of each key up to the compaction point, from
``start_seq_id`` on, in seq-id order; then the topic itself from after the
compaction point (or from ``start_seq_id`` when that is later), as any
reader. Its temporary subscription stands at ``start_seq_id`` meanwhile,
so the tail it reads next is not deleted under it. A compaction that
finishes between two pages moves the point on: the reader goes on in the
newer compacted ledger, from the seq id it had reached. A topic never
compacted reads as with ``compacted=False``.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from hub import errors
from hub.message import Message
from hub.proto import pubsub_pb2 as pb

if TYPE_CHECKING:
    from hub.channel import HubChannel
    from hub.consumer import Consumer
    from hub.message import SubscriptionPreferences

__all__ = ["ClientReaders", "Reader"]

_READER_QUEUE = 1000
_COMPACTED_PAGE = 500


def _position(seq_id: int | None, publish_time_ms: int | None, what: str) -> pb.SeekRequest:
    """A SeekRequest for exactly one of the two positions; ``ValueError`` otherwise."""
    seq_name, time_name = ("start_seq_id", "start_publish_time_ms") if what == "reader" else \
        ("seq_id", "publish_time_ms")
    if (seq_id is None) == (publish_time_ms is None):
        raise ValueError(f"{what} needs exactly one of {seq_name} and {time_name}")
    if seq_id is not None:
        if isinstance(seq_id, bool) or not isinstance(seq_id, int) or seq_id < 1:
            raise ValueError(f"{seq_name} must be an integer >= 1, not {seq_id!r}")
        return pb.SeekRequest(seqId=seq_id)
    if isinstance(publish_time_ms, bool) or not isinstance(publish_time_ms, int) or publish_time_ms < 0:
        raise ValueError(f"{time_name} must be an integer >= 0 (epoch ms), not {publish_time_ms!r}")
    return pb.SeekRequest(publishTimeMs=publish_time_ms, byTime=True)


class Reader:
    """Messages of a topic from a position on, without a durable subscription (see the module docstring)."""

    def __init__(self, client: ClientReaders, consumer: Consumer, start_seq_id: int, compacted: bool = False
                 ) -> None:
        self.client = client
        self.consumer = consumer
        self.topic = consumer.topic
        self.start_seq_id = start_seq_id     # the first seq id this reader delivers
        self.closed = False
        self.compacted_up_to_seq_id = 0      # a compacted reader: the compaction point it read up to
        self._compacted = compacted          # still in the compacted part
        self._next = start_seq_id            # a compacted reader: the next seq id to ask for
        self._page: collections.deque[Message] = collections.deque()

    async def read_next(self, timeout: float | None = None) -> Message:
        """The next message; ``TimeoutError`` when none comes within ``timeout`` seconds (None: wait),
        ``ConsumerClosedError`` once the reader is closed."""
        if self._compacted:
            if self.closed:
                raise errors.ConsumerClosedError(f"reader of {self.topic!r} is closed")
            if not self._page:
                await self._next_page()
            if self._page:
                return self._page.popleft()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            msg = await self.consumer.receive(None if deadline is None else max(0.0, deadline - loop.time()))
            await self.consumer.ack(msg)
            req = self.consumer.req
            if msg.seq_id >= req.startSeqId:   # else read before a re-subscribe: skipped
                req.startSeqId = msg.seq_id + 1   # where a re-subscribe creates the subscription
                return msg

    async def _next_page(self) -> None:
        """The next page of the compacted ledger; once it is read, the topic after the compaction point."""
        probe = pb.SeekRequest(seqId=self._next, resolveOnly=True, readCompacted=True, maxMessages=_COMPACTED_PAGE)
        resp = await self.client._seek_resp(self.topic, self.consumer.subscriber, probe)
        self.compacted_up_to_seq_id = max(self.compacted_up_to_seq_id, int(resp.compactedUpToSeqId))
        if resp.messages:
            self._page.extend(Message.from_proto(m) for m in resp.messages)
            self._next = self._page[-1].seq_id + 1
            return
        self._compacted = False
        tail = max(self.start_seq_id, self.compacted_up_to_seq_id + 1)
        start = await self.client._seek_call(self.topic, self.consumer.subscriber,
                                             pb.SeekRequest(seqId=tail, resolveOnly=True))
        await self.client._seek_call(self.topic, self.consumer.subscriber, pb.SeekRequest(seqId=start))
        self.consumer.req.startSeqId = start     # a re-subscribe creates the subscription there now
        self.consumer.receiver_queue_size = _READER_QUEUE
        self.consumer.flow(_READER_QUEUE)

    async def close(self) -> None:
        """Stop reading and remove the reader's temporary subscription."""
        if self.closed:
            return
        self.closed = True
        await self.consumer.close()
        try:
            await self.client.unsubscribe(self.topic, self.consumer.subscriber)
        except errors.ClientNotSubscribedError:
            pass

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.read_next()
        except errors.ConsumerClosedError:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ClientReaders:
    """The reader and seek half of ``HedwigClient``."""

    if TYPE_CHECKING:
        def _call(self, topic: bytes, req: pb.PubSubRequest) -> Awaitable[tuple[HubChannel, pb.PubSubResponse]]:
            ...

        async def _new_consumer(self, topic: bytes, subscriber_id: bytes, subscription_type: str,
                                create_or_attach: str, receiver_queue_size: int, ack_timeout_ms: int,
                                nack_delay_ms: int, max_redeliver_count: int, dead_letter_topic: bytes | str | None,
                                prefs: SubscriptionPreferences | None = None, force_attach: bool = False,
                                temporary_from: int = 0) -> Consumer:
            ...

        async def unsubscribe(self, topic: bytes, subscriber_id: bytes) -> None: ...

    async def _seek_resp(self, topic: bytes, subscriber_id: bytes, sreq: pb.SeekRequest) -> pb.SeekResponse:
        sreq.topic, sreq.subscriberId = topic, subscriber_id
        req = pb.PubSubRequest(type=pb.SEEK, topic=topic)
        req.seekRequest.CopyFrom(sreq)
        _, resp = await self._call(topic, req)
        return resp.seekResponse

    async def _seek_call(self, topic: bytes, subscriber_id: bytes, sreq: pb.SeekRequest) -> int:
        return int((await self._seek_resp(topic, subscriber_id, sreq)).seqId)

    async def seek(self, topic: bytes, subscriber_id: bytes, seq_id: int | None = None,
                   publish_time_ms: int | None = None) -> int:
        """Move the subscription so that the next message delivered is ``seq_id``, or the first one published
        at or after ``publish_time_ms`` (epoch ms; before the first kept message: that message; after the
        last: the next one published). Returns the seq id chosen.

        ``ValueError`` for neither or both positions or a negative one; ``MalformedRequestError`` for a seq
        id past the end or already deleted; ``ClientNotSubscribedError`` for an unknown subscription."""
        sreq = _position(seq_id, publish_time_ms, "seek")
        return await self._seek_call(topic, subscriber_id, sreq)

    async def reader(self, topic: bytes, start_seq_id: int | None = None, start_publish_time_ms: int | None = None,
                     compacted: bool = False) -> Reader:
        """A ``Reader`` (async iterator of ``Message``) from ``start_seq_id`` (a seq id before the first kept
        message starts at that one) or from the first message published at or after
        ``start_publish_time_ms``. ``ValueError`` for neither or both or a negative position,
        ``NoSuchTopicError`` for a topic that does not exist.

        ``compacted=True`` (from a ``start_seq_id`` only: ``ValueError`` for a time) yields, up to the
        topic's compaction point, only the newest message of each key in seq-id order, then every message
        after that point (see the module docstring)."""
        if compacted and start_publish_time_ms is not None:
            raise ValueError("a compacted reader starts at a start_seq_id, not at a start_publish_time_ms")
        sreq = _position(start_seq_id, start_publish_time_ms, "reader")
        name = b"reader-" + secrets.token_hex(8).encode()
        probe = pb.SeekRequest()
        probe.CopyFrom(sreq)
        probe.resolveOnly = True
        start = await self._seek_call(topic, name, probe)
        # a compacted reader takes permits once the compacted part is read (Reader._next_page)
        consumer = await self._new_consumer(topic, name, "EXCLUSIVE", "CREATE_OR_ATTACH",
                                            0 if compacted else _READER_QUEUE, 0, 1000, 0, None, temporary_from=start)
        if compacted:
            assert start_seq_id is not None
            return Reader(self, consumer, start_seq_id, compacted=True)
        return Reader(self, consumer, start)
