"""How a client's publish requests are answered: the seq ids (or errors) a response gives their futures.

    conn.publish_batch(topic, bodies, timeout, BatchAnswer(client, topic, bodies, futures))
    conn.publish_multi(parts, timeout, MultiAnswer(client, conn, parts))
    _publish_settled(futures, response)      # a publish response: each future its seq id, or the error

A batch of bodies alone (``hub.client_publish``'s producer batching) waits
for its response as a ``BatchAnswer``, a ``hub.channel.Answer`` the
connection settles in place when it reads the response: no future of the
request and no done-callback a loop turn later, per request. A response that
stored nothing and is not SUCCESS sends the publishes the long way
(``Publisher._publish_bodies_long``: redirects, retries); a timeout or the
connection's loss fails each publish with that error.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from hub import errors
from hub.proto import pubsub_pb2 as pb
from hub.protocol import status_name

if TYPE_CHECKING:
    from hub.channel import HubChannel

__all__ = ["PUBLISH_ANSWERS", "BatchAnswer", "MultiAnswer", "Publisher"]


class Publisher(Protocol):
    """What an answer needs of the publishing client (``hub.client_publish.ClientPublishing``)."""

    def _publish_bodies_long(self, topic: bytes, bodies: list[bytes], futures: list[asyncio.Future[int]]) -> None: ...

    def _multi_answered(self, conn: HubChannel, parts: list[tuple[bytes, list[bytes], list[asyncio.Future[int]]]],
                        resp: pb.PubSubResponse) -> None: ...


def _publish_settled(futures: list[asyncio.Future[int]], resp: pb.PubSubResponse) -> None:
    """Each publish of the answered request gets its seq id, or the answer's error if it was not stored."""
    status = resp.statusCode
    first = int(resp.publishResponse.publishedMsgId.localComponent)
    stored = len(futures) if status == pb.SUCCESS else resp.publishResponse.stored
    for i, fut in enumerate(futures):
        if fut.done():       # the caller cancelled it
            continue
        if i < stored:
            fut.set_result(first + i)
        else:
            fut.set_exception(errors.error_for_status(status_name(status), resp.statusMsg or status_name(status)))


def _fail_all(futures: list[asyncio.Future[int]], exc: BaseException | None) -> None:
    """``exc`` for each publish still waiting (None: cancel them)."""
    for fut in futures:
        if not fut.done():
            if exc is None:
                fut.cancel()
            else:
                fut.set_exception(exc)


def _answer_of(futures: list[asyncio.Future[int]], done: asyncio.Future[Any]) -> Any | None:
    """``done``'s result; when it was cancelled or failed, so are the publishes, and None is returned."""
    if done.cancelled():
        _fail_all(futures, None)
        return None
    exc = done.exception()
    if exc is not None:
        _fail_all(futures, exc)
        return None
    return done.result()


def _long_answered(futures: list[asyncio.Future[int]], task: asyncio.Future[tuple[Any, pb.PubSubResponse]]) -> None:
    got = _answer_of(futures, task)
    if got is not None:
        _publish_settled(futures, got[1])


class BatchAnswer:
    """The answer a batch of bodies alone waits for (``HubChannel.publish_batch``'s ``hub.channel.Answer``):
    settled in place when the response is read, so a request costs no future of its own and no callback a
    loop turn later; the publishes' futures get their seq ids (or errors) as ``_publish_answered`` gave them."""

    __slots__ = ("bodies", "client", "finished", "futures", "topic")

    def __init__(self, client: Publisher, topic: bytes, bodies: list[bytes],
                 futures: list[asyncio.Future[int]]) -> None:
        self.client = client
        self.topic = topic
        self.bodies = bodies
        self.futures = futures
        self.finished = False

    def done(self) -> bool:
        return self.finished

    def set_result(self, resp: pb.PubSubResponse, /) -> None:
        self.finished = True
        if resp.statusCode != pb.SUCCESS and not resp.publishResponse.stored:   # stored nothing: the long way
            self.client._publish_bodies_long(self.topic, self.bodies, self.futures)
        else:
            _publish_settled(self.futures, resp)

    def published(self, first: int) -> None:
        """``set_result`` of a SUCCESS answer whose first seq id is ``first`` (read by hand,
        ``hub.client_published``): each publish its seq id, as ``_publish_settled`` gives them."""
        self.finished = True
        for i, fut in enumerate(self.futures):
            if not fut.done():   # the caller cancelled it
                fut.set_result(first + i)

    def set_exception(self, exc: BaseException, /) -> None:
        self.finished = True
        _fail_all(self.futures, exc)


class MultiAnswer:
    """``BatchAnswer`` of a PUBLISH_MULTI (``ClientPublishing._multi_answered`` settles its parts)."""

    __slots__ = ("client", "conn", "finished", "parts")

    def __init__(self, client: Publisher, conn: HubChannel,
                 parts: list[tuple[bytes, list[bytes], list[asyncio.Future[int]]]]) -> None:
        self.client = client
        self.conn = conn
        self.parts = parts
        self.finished = False

    @property
    def futures(self) -> list[asyncio.Future[int]]:
        return [fut for part in self.parts for fut in part[2]]

    def done(self) -> bool:
        return self.finished

    def set_result(self, resp: pb.PubSubResponse, /) -> None:
        self.finished = True
        self.client._multi_answered(self.conn, self.parts, resp)

    def published(self, seqs: list[int]) -> None:
        """``set_result`` of a SUCCESS answer whose parts (as many as ``parts``) are each a SUCCESS of the first seq
        id in ``seqs`` (read by hand, ``hub.client_published``): each publish its seq id, as ``_multi_answered``
        gives them, in one loop and without the protobuf answer (issue 34)."""
        self.finished = True
        for (_, _, futures), first in zip(self.parts, seqs, strict=True):
            for fut in futures:
                if not fut.done():   # the caller cancelled it
                    fut.set_result(first)
                first += 1

    def set_exception(self, exc: BaseException, /) -> None:
        self.finished = True
        _fail_all(self.futures, exc)


PUBLISH_ANSWERS = (BatchAnswer, MultiAnswer)
"""What a publish request may wait for besides a future (``HubChannel.publish_batch``): each has ``futures``,
its publishes' (``HedwigClient.close`` waits for them)."""
