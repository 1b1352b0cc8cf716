"""Batching both ways: the publishes of one loop turn leave as one request (seq ids, order and errors per
message), and a delivery carries the run of messages ready for a subscriber."""

from __future__ import annotations

import asyncio
import struct
import uuid
from typing import Any

import pytest

from bookie.wire import FrameDecoder
from hub import errors
from hub.channel import Answer
from hub.client import HedwigClient, _publish_settled
from hub.connection_publish import _BatchAnswer
from hub.proto import pubsub_pb2 as pb
from hub.protocol import encode, published_batch
from tests.hub.test_hub import Collector, raw_exchange
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


def name() -> bytes:
    return uuid.uuid4().hex[:10].encode()


def requests_of(c: HedwigClient, topic: bytes) -> list[int]:
    """The number of messages in each publish request ``c`` sends to ``topic``'s owner from now on."""
    conn = c.conns[c.owner[topic]]
    sizes: list[int] = []
    send = conn.request
    send_bodies = conn.publish_batch

    def request(req: pb.PubSubRequest, timeout: float) -> asyncio.Future[pb.PubSubResponse]:
        if req.type == pb.PUBLISH:
            sizes.append(len(req.publishRequest.msgs) or 1)
        return send(req, timeout)

    def publish_batch(topic: bytes, bodies: list[bytes], timeout: float, answer: Answer, now: bool = False) -> None:
        sizes.append(len(bodies))   # a batch of bodies alone, framed by hand
        send_bodies(topic, bodies, timeout, answer, now)

    conn.request = request  # type: ignore[method-assign]
    conn.publish_batch = publish_batch  # type: ignore[method-assign]
    return sizes


async def reader_of(cluster: LocalCluster, topic: bytes, window: int = 1000) -> tuple[HedwigClient, Collector]:
    r = await HedwigClient.connect(cluster.hub_addresses[0])
    await r.subscribe(topic, b"r", message_window_size=window)
    col = Collector()
    await r.start_delivery(topic, b"r", col)
    return r, col


def bodies(col: Collector) -> list[bytes]:
    return [m.body for m in col.got]


def seqs(col: Collector) -> list[int]:
    return [m.seq_id for m in col.got]


async def test_the_publishes_of_one_turn_leave_as_one_request_with_consecutive_seq_ids(
        cluster: LocalCluster) -> None:
    topic = name()
    r, col = await reader_of(cluster, topic)
    async with r, await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        assert await c.publish(topic, b"m0") == 1           # learns the owner (the long way, alone)
        sizes = requests_of(c, topic)
        futures = [c.publish_async(topic, b"m%d" % i, properties={"i": b"%d" % i}) for i in range(1, 501)]
        assert await asyncio.gather(*futures) == list(range(2, 502))
        assert sizes == [500]
        # awaited one at a time, publishes still go alone, as plain publishes
        assert [await c.publish(topic, b"m%d" % i) for i in range(501, 504)] == [502, 503, 504]
        assert sizes == [500, 1, 1, 1]
        await col.wait(lambda g: len(g) == 504)
        assert bodies(col) == [b"m%d" % i for i in range(504)]
        assert seqs(col) == list(range(1, 505))
        assert col.got[7].properties == {"i": b"7"} and col.got[7].src_region == "standalone"


async def test_plain_and_richer_publishes_of_one_turn_share_one_request_in_order(cluster: LocalCluster) -> None:
    topic = name()
    r, col = await reader_of(cluster, topic)
    async with r, await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.publish(topic, b"m0")
        sizes = requests_of(c, topic)
        futures = [c.publish_async(topic, b"m1"), c.publish_async(topic, b"m2", key=b"k"),   # a key: a protobuf batch
                   c.publish_async(topic, b"m3"), c.publish_async(topic, b"m4", {"p": b"v"}),
                   c.publish_async(topic, b"m5")]
        assert await asyncio.gather(*futures) == [2, 3, 4, 5, 6]
        assert sizes == [5]
        await col.wait(lambda g: len(g) == 6)
        assert bodies(col) == [b"m%d" % i for i in range(6)]
        assert [m.key for m in col.got] == [None, None, b"k", None, None, None]
        assert col.got[4].properties == {"p": b"v"} and col.got[5].properties == {}
        first = c.publish_async(topic, b"m6")     # a batch of bodies going: what joins it is still checked
        with pytest.raises(errors.MessageTooLargeError):
            c.publish_async(topic, b"x" * (c.conf.max_message_size + 1))
        c.closed = True
        try:
            with pytest.raises(errors.PubSubError, match="closed"):
                c.publish_async(topic, b"after close")
        finally:
            c.closed = False
        assert await first == 7 and sizes == [5, 1]


@pytest.mark.parametrize(("conf", "body", "count", "expected"), [
    ({"batching_max_messages": "100"}, 10, 250, [100, 100, 50]),
    ({"batching_max_bytes": "1000"}, 100, 25, [10, 10, 5]),
    ({"batching_enabled": "false"}, 10, 5, [1, 1, 1, 1, 1]),
])
async def test_batches_are_bounded_by_the_client_conf(cluster: LocalCluster, conf: dict[str, str], body: int,
                                                       count: int, expected: list[int]) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0], conf=conf) as c:
        await c.publish(topic, b"first")
        sizes = requests_of(c, topic)
        got = await asyncio.gather(*(c.publish_async(topic, b"%0*d" % (body, i)) for i in range(count)))
        assert got == list(range(2, 2 + count))
        assert sizes == expected


async def test_a_message_over_the_byte_bound_goes_alone_in_order(cluster: LocalCluster) -> None:
    topic = name()
    r, col = await reader_of(cluster, topic)
    async with r, await HedwigClient.connect(cluster.hub_addresses[0], conf={"batching_max_bytes": "1000"}) as c:
        await c.publish(topic, b"first")
        sizes = requests_of(c, topic)
        order = [b"a" * 10, b"b" * 10, b"big" * 1000, b"c" * 10]
        assert await asyncio.gather(*(c.publish_async(topic, b) for b in order)) == [2, 3, 4, 5]
        assert sizes == [2, 1, 1]
        await col.wait(lambda g: len(g) == 5)
        assert bodies(col)[1:] == order


async def test_a_publish_delay_gathers_publishes_of_later_turns(cluster: LocalCluster) -> None:
    topic = name()
    for conf, expected in (({"batching_max_publish_delay_ms": "300"}, [3]), ({}, [1, 1, 1])):
        async with await HedwigClient.connect(cluster.hub_addresses[0], conf=conf) as c:
            await c.publish(topic, b"first")
            sizes = requests_of(c, topic)
            futures = []
            for i in range(3):
                futures.append(c.publish_async(topic, b"%d" % i))
                await asyncio.sleep(0)        # the next loop turn
            await asyncio.gather(*futures)
            assert sizes == expected, conf


async def test_an_awaited_publish_does_not_wait_for_the_publish_delay(cluster: LocalCluster) -> None:
    """A 60 s delay: publish_async waits for it, an awaited publish takes the turn's batch along at once."""
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0],
                                          conf={"batching_max_publish_delay_ms": "60000"}) as c:
        await c.publish(topic, b"first")              # the first one goes the long way
        sizes = requests_of(c, topic)
        early = c.publish_async(topic, b"a")
        await asyncio.sleep(0)
        assert not early.done() and sizes == []       # held for the delay
        assert await asyncio.wait_for(c.publish(topic, b"b"), 10) == 3
        assert early.result() == 2 and sizes == [2]   # it left with the awaited one, in order


async def test_a_producer_publish_goes_after_what_the_topic_batched(cluster: LocalCluster) -> None:
    topic = name()
    r, col = await reader_of(cluster, topic)
    async with r, await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.publish(topic, b"first")
        sizes = requests_of(c, topic)
        futures = [c.publish_async(topic, b"a"), c.publish_async(topic, b"b"),
                   c.publish_async(topic, b"p", producer=b"prod", sequence_id=1), c.publish_async(topic, b"c")]
        assert await asyncio.gather(*futures) == [2, 3, 4, 5]
        assert sizes == [2, 1, 1]
        await col.wait(lambda g: len(g) == 5)
        assert bodies(col) == [b"first", b"a", b"b", b"p", b"c"]


async def test_a_batch_sent_to_a_hub_that_does_not_own_the_topic_is_redirected_whole(
        cluster: LocalCluster) -> None:
    topic = name()
    r, col = await reader_of(cluster, topic)
    async with r, await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.publish(topic, b"first")
        owner = c.owner[topic]
        other = next(a for a in cluster.hub_addresses if a != owner)
        await c._conn(other)
        c.owner[topic] = other              # believed to be the owner, as after the topic moved
        assert await asyncio.gather(*(c.publish_async(topic, b"%d" % i) for i in range(50))) == list(range(2, 52))
        assert c.owner[topic] == owner
        await col.wait(lambda g: len(g) == 51)
        assert bodies(col)[1:] == [b"%d" % i for i in range(50)]


def batch_req(topic: bytes, txn: int, *msgs: pb.Message) -> pb.PubSubRequest:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=txn, topic=topic,
                           shouldClaim=True)
    req.publishRequest.topic = topic
    req.publishRequest.msgs.extend(msgs)
    return req


async def test_the_hub_answers_a_batched_publish_with_its_first_seq_id_and_count_and_refuses_bad_ones(
        cluster: LocalCluster) -> None:
    topic = name()
    addr = cluster.hub_addresses[0]
    ok = batch_req(topic, 1, *(pb.Message(body=b"%d" % i) for i in range(5)))
    both = batch_req(topic, 2, pb.Message(body=b"x"))
    both.publishRequest.msg.body = b"y"
    big = batch_req(topic, 3, pb.Message(body=b"x"), pb.Message(body=b"y" * 1258292))
    dedup = batch_req(topic, 4, pb.Message(body=b"x"), pb.Message(body=b"y", producer=b"p", sequenceId=1))
    after = batch_req(topic, 5, pb.Message(body=b"after"), pb.Message(body=b"after2"))
    got = sorted(await raw_exchange(addr, b"".join(encode(r) for r in (ok, both, big, dedup, after)), 5),
                 key=lambda r: r.txnId)    # refusals are answered at once, stored batches once durable
    assert got[0].statusCode == pb.SUCCESS and got[0].publishResponse.stored == 5
    assert got[0].publishResponse.publishedMsgId.localComponent == 1
    assert [r.statusCode for r in got[1:4]] == [pb.MALFORMED_REQUEST, pb.MESSAGE_TOO_LARGE, pb.MALFORMED_REQUEST]
    assert "msg or msgs" in got[1].statusMsg
    assert "message 1 of the batch (1258292 bytes)" in got[2].statusMsg
    assert "cannot carry a producer" in got[3].statusMsg
    assert [r.publishResponse.stored for r in got[1:4]] == [0, 0, 0]
    # nothing of the refused batches was stored: the next batch continues at seq id 6
    assert got[4].statusCode == pb.SUCCESS and got[4].publishResponse.stored == 2
    assert got[4].publishResponse.publishedMsgId.localComponent == 6


async def test_a_failure_fails_exactly_the_messages_not_stored() -> None:
    """Unit: the hub's collected answer and the client's reading of it (a failed add fails a suffix)."""
    answers: list[_BatchAnswer] = []

    class Conn:
        def _batch_published(self, answer: _BatchAnswer) -> None:
            answers.append(answer)

    answer = _BatchAnswer(Conn(), pb.PubSubRequest(txnId=9, topic=b"t"), None, 0.0, 4)  # type: ignore[arg-type]
    down = errors.ServiceDownError("add failed")
    for seq, error in ((10, None), (11, None), (0, down), (0, down)):
        assert not answers
        answer.settle(seq, error)
    assert answers == [answer] and (answer.first, answer.stored, answer.error) == (10, 2, down)
    # the queued ones can fail before the entry in flight ahead of them is acknowledged
    late = _BatchAnswer(Conn(), pb.PubSubRequest(txnId=10, topic=b"t"), None, 0.0, 3)  # type: ignore[arg-type]
    for seq, error in ((0, down), (20, None), (21, None)):
        late.settle(seq, error)
    assert answers[-1] is late and (late.first, late.stored, late.error) == (20, 2, down)
    frame = published_batch(9, b"t", 10, 2, pb.SERVICE_DOWN, "add failed")
    resp = pb.PubSubResponse.FromString(frame[4:])
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[int]] = [loop.create_future() for _ in range(4)]
    _publish_settled(futures, resp)
    assert [f.result() for f in futures[:2]] == [10, 11]
    for f in futures[2:]:
        with pytest.raises(errors.ServiceDownError, match="add failed"):
            f.result()


async def test_close_sends_what_is_batched(cluster: LocalCluster) -> None:
    topic = name()
    r, col = await reader_of(cluster, topic)
    async with r:
        c = await HedwigClient.connect(cluster.hub_addresses[0], conf={"batching_max_publish_delay_ms": "60000"})
        await c.publish(topic, b"first")
        futures = [c.publish_async(topic, b"%d" % i) for i in range(3)]
        unknown = c.publish_async(name(), b"first of a topic")   # no owner known: the long way, in a task
        await c.close()
        assert await asyncio.gather(*futures) == [2, 3, 4]
        assert await unknown == 1
        await col.wait(lambda g: len(g) == 4)



# --- the other direction: a delivery carries a run of messages -------------------------------------

def deliveries_of(c: HedwigClient, topic: bytes) -> list[int]:
    """The number of messages in each delivery frame ``c`` receives from ``topic``'s owner from now on
    (its bytes are framed a second time, beside the client's own reading)."""
    machine = c.conns[c.owner[topic]].machine
    frames = FrameDecoder(1 << 30)
    sizes: list[int] = []
    receive = machine.receive_data

    def counting(data: bytes) -> Any:
        for frame in frames.feed(data):
            resp = pb.PubSubResponse.FromString(frame)
            if resp.WhichOneof("body") == "delivery":
                sizes.append(len(resp.delivery.messages) or 1)
        return receive(data)

    machine.receive_data = counting  # type: ignore[method-assign]
    return sizes


async def test_a_delivery_carries_a_run_of_messages_up_to_the_clients_max_outstanding(
        cluster: LocalCluster) -> None:
    topic = name()
    addr = cluster.hub_addresses[0]
    async with await HedwigClient.connect(addr, conf={"max_outstanding_messages": "4"}) as r, \
            await HedwigClient.connect(addr) as c:
        await c.publish(topic, b"m0")
        await r.subscribe(topic, b"r", message_window_size=1000)
        col = Collector()
        await r.start_delivery(topic, b"r", col)
        sizes = deliveries_of(r, topic)
        # one burst: stored in entries of several messages, each run delivered from the cache once durable
        assert await asyncio.gather(*(c.publish_async(topic, b"m%d" % i) for i in range(1, 301))) == \
            list(range(2, 302))
        await col.wait(lambda g: len(g) == 300)
        assert bodies(col) == [b"m%d" % i for i in range(1, 301)] and seqs(col) == list(range(2, 302))
        assert sum(sizes) == 300 and max(sizes) == 4 and len(sizes) <= 300 / 2, sizes


async def test_a_client_that_does_not_ask_for_batches_gets_one_message_per_delivery(cluster: LocalCluster) -> None:
    """Hedwig's wire: START_DELIVERY without maxBatchMessages, every delivery in ``Delivery.message``."""
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.publish(topic, b"m0")
        host, port = c.owner[topic].split(":")[:2]
        sub = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.SUBSCRIBE, txnId=1, topic=topic)
        sub.subscribeRequest.topic, sub.subscribeRequest.subscriberId = topic, b"raw"
        start = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.START_DELIVERY, txnId=2, topic=topic)
        start.startDeliveryRequest.topic, start.startDeliveryRequest.subscriberId = topic, b"raw"
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(encode(sub) + encode(start))
            got: list[pb.PubSubResponse] = []
            async with asyncio.timeout(20):
                while len([g for g in got if g.txnId]) < 2:
                    got.append(await read_frame(reader))
                await asyncio.gather(*(c.publish_async(topic, b"m%d" % i) for i in range(1, 21)))
                while len([g for g in got if not g.txnId]) < 20:
                    got.append(await read_frame(reader))
        finally:
            writer.close()
        assert [g.statusCode for g in got if g.txnId] == [pb.SUCCESS, pb.SUCCESS]
        delivered = [g.delivery for g in got if not g.txnId]
        assert all(not d.messages for d in delivered)
        assert [d.message.body for d in delivered] == [b"m%d" % i for i in range(1, 21)]


async def read_frame(reader: asyncio.StreamReader) -> pb.PubSubResponse:
    (size,) = struct.unpack(">I", await reader.readexactly(4))
    return pb.PubSubResponse.FromString(await reader.readexactly(size))


async def test_a_traced_publish_answers_with_the_stage_times_of_the_hub_and_both_bookies(
        cluster: LocalCluster) -> None:
    """``publish_traced`` (the bench's stage breakdown, hub.tracing): every stage time is there, in the order a
    message passes them, for each of the entry's W = 2 copies; publishes around it are untouched."""
    topic = name()
    r, col = await reader_of(cluster, topic)
    async with r, await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        assert await c.publish(topic, b"m0") == 1
        before = c.publish_async(topic, b"m1")
        got = await c.publish_traced(topic, b"traced")
        after = await c.publish(topic, b"m3")
        assert (await before, got.seq_id, after) == (2, 3, 4)
        t = got.trace
        assert got.sent_ns <= t.hub_read_ns <= t.add_sent_ns <= t.hub_ack_read_ns <= t.answer_sent_ns <= got.read_ns
        assert len(t.bookies) == 2 and len({b.bookie for b in t.bookies}) == 2
        for b in t.bookies:
            assert b.bookie in cluster.bookie_addresses
            assert t.add_sent_ns <= b.add_sent_ns <= b.read_ns <= b.journal_written_ns <= b.ack_sent_ns \
                <= b.ack_read_ns <= t.hub_ack_read_ns
        # a sampled publish is stored and delivered like any other
        await col.wait(lambda got: len(got) >= 4)
        assert bodies(col)[:4] == [b"m0", b"m1", b"traced", b"m3"]
        # and the next publishes are answered without a trace
        assert await c.publish(topic, b"m4") == 5
        # an entry of 64 KiB or more (which the ledger client sends as an ADD_ENTRY at once) is traced too
        big = await c.publish_traced(topic, b"x" * 70_000)
        assert big.seq_id == 6 and len(big.trace.bookies) == 2
        assert all(big.trace.add_sent_ns <= b.read_ns <= b.journal_written_ns <= b.ack_read_ns
                   for b in big.trace.bookies)
