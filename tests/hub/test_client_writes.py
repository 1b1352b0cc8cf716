"""The client's publish path writes and answers with few steps (issue 32), and says what it said before.

A fake transport records each write: a turn's one batch leaves at the end of
that turn in one write of exactly the bytes protobuf would give, after what
the connection had queued before it; the answer settles the futures in the
read; the per-connection deadline queue stays bounded while answers come.
"""

from __future__ import annotations

import asyncio

from hub import errors
from hub.channel import _PRUNE_SLACK, Deadlines, HubChannel
from hub.client import HedwigClient
from hub.conf import client_conf
from hub.frames import _ONE_TAILS, _ONE_TAILS_KEPT, publish_batch, published
from hub.proto import pubsub_pb2 as pb
from hub.protocol import encode
from tests.hub.test_client_frames import protobuf_request


class Wire:
    """A transport that keeps what is written, one entry per write call."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: list[bytes]) -> None:
        self.writes.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True


async def client_on_wire(topic: bytes) -> tuple[HedwigClient, HubChannel, Wire]:
    client = HedwigClient(["127.0.0.1:1"], client_conf({"keep_alive_interval": "0",   # (nothing listens there)
                                                        "server_ack_response_timeout": "500"}))
    conn = HubChannel(client, "127.0.0.1:1")
    wire = Wire()
    conn.connection_made(wire)  # type: ignore[arg-type]
    client.conns["127.0.0.1:1"] = conn
    client.owner[topic] = "127.0.0.1:1"
    return client, conn, wire


async def test_a_turns_one_publish_is_one_write_of_protobufs_bytes_and_its_answer_settles_it() -> None:
    client, conn, wire = await client_on_wire(b"t")
    futures = []
    for i in range(3):
        fut = client.publish_async(b"t", b"body %d" % i)
        assert len(wire.writes) == i             # nothing leaves before the end of the turn
        await asyncio.sleep(0)
        assert len(wire.writes) == i + 1
        assert wire.writes[i] == protobuf_request(i + 1, b"t", [b"body %d" % i])
        futures.append(fut)
    conn.data_received(published(2, b"t", 8) + published(1, b"t", 7))   # in any order, by txn id
    assert [f.done() for f in futures] == [True, True, False]           # settled in the read, no loop turn
    assert [f.result() for f in futures[:2]] == [7, 8]
    conn.data_received(published(3, b"t", 9)[:5])                       # a frame in two reads
    assert not futures[2].done()
    conn.data_received(published(3, b"t", 9)[5:])
    assert futures[2].result() == 9
    conn.drop("test over")


async def test_what_the_connection_queued_before_a_publish_leaves_first() -> None:
    client, conn, wire = await client_on_wire(b"t")
    consume = pb.PubSubRequest(type=pb.CONSUME, topic=b"t")
    consume.consumeRequest.topic, consume.consumeRequest.subscriberId = b"t", b"s"
    consume.consumeRequest.msgId.localComponent = 3
    conn.one_way(consume)                        # queued for the end of this turn
    fut = client.publish_async(b"t", b"body")
    await asyncio.sleep(0)
    consume.txnId, consume.protocolVersion = 1, pb.VERSION_ONE
    assert b"".join(wire.writes) == encode(consume) + protobuf_request(2, b"t", [b"body"])
    conn.corked = True                           # held back: the publish waits behind the queued request
    conn.one_way(consume)
    second = client.publish_async(b"t", b"more")
    await asyncio.sleep(0)
    assert len(wire.writes) == 2
    conn.uncork()
    assert wire.writes[2:] == [encode(consume) + protobuf_request(4, b"t", [b"more"])]   # consumes: txns 1, 3
    conn.drop("test over")
    assert isinstance(fut.exception(), errors.UncertainStateError)
    assert isinstance(second.exception(), errors.UncertainStateError)


async def test_a_publish_on_a_closing_connection_goes_the_long_way_not_to_the_wire() -> None:
    client, conn, wire = await client_on_wire(b"t")
    fut = client.publish_async(b"t", b"body")
    wire.closing = True                          # closed after the publish joined its batch
    await asyncio.sleep(0)
    assert wire.writes == []
    conn.drop("test over")
    await asyncio.wait_for(asyncio.wait([fut]), 10.0)   # the long way: the hub's address refuses it
    assert isinstance(fut.exception(), errors.PubSubError) and wire.writes == []


async def test_the_deadline_queue_stays_bounded_while_answers_come_and_late_ones_still_expire() -> None:
    loop = asyncio.get_running_loop()
    expired: list[int] = []
    d = Deadlines(lambda txn, fut, sent: (expired.append(txn), fut.set_exception(errors.ResponseTimeoutError("x"))),
                  loop)

    def answered(txns: range) -> int:
        """Watch and answer each of ``txns``; the longest the queue was."""
        longest = 0
        for txn in txns:
            fut = loop.create_future()
            d.watch(txn, fut, 60.0)
            fut.set_result(None)
            longest = max(longest, len(d._order))
        return longest

    assert answered(range(1, 10_001)) <= _PRUNE_SLACK + 1      # answered ones are dropped, not kept for 60 s
    stuck = loop.create_future()
    d.watch(10_001, stuck, 0.2)                 # never answered: what came after it waits behind it ...
    answered(range(10_002, 12_002))
    await asyncio.wait_for(asyncio.wait([stuck]), 5.0)
    assert isinstance(stuck.exception(), errors.ResponseTimeoutError)
    assert expired == [10_001]
    assert len(d._order) == 0                   # ... and goes with it
    assert answered(range(12_002, 22_002)) <= _PRUNE_SLACK + 1
    assert expired == [10_001]
    d.close()


def test_a_plain_publishs_kept_bytes_stay_bounded_and_right_over_many_topics() -> None:
    for i in range(_ONE_TAILS_KEPT + 10):
        topic = b"topic-%d" % i
        assert publish_batch(i + 1, topic, [b"x" * (i % 300)]) == protobuf_request(i + 1, topic, [b"x" * (i % 300)])
        assert len(_ONE_TAILS) <= _ONE_TAILS_KEPT
    assert publish_batch(5, b"topic-3", [b"y"]) == protobuf_request(5, b"topic-3", [b"y"])
