"""hub.delayed: the publish check, the owner's stamp, the index, and a dispatcher holding messages until due."""

from __future__ import annotations

import asyncio

from hub.cursor import AckCursor
from hub.delayed import DelayIndex, delay_problem, now_ms, resolve_due
from hub.dispatch import Dispatcher
from hub.dispatch_key_shared import KeySharedDispatcher
from hub.dispatch_shared import SharedDispatcher
from hub.message import Message, MessageId
from hub.proto import pubsub_pb2 as pb
from hub.protocol import Reject, RequestReceived, ServerConnection, encode

TIMEOUT = 5.0


# --- the publish check and the stamp ------------------------------------------------------------------
def msg(**fields: int) -> pb.Message:
    return pb.Message(body=b"x", **fields)


def test_delay_problem_refuses_both_negative_and_too_long() -> None:
    clock = lambda: 1_000_000  # noqa: E731
    assert delay_problem(msg(), clock, 0) is None
    assert delay_problem(msg(deliverAfterMs=0), clock, 0) is None
    assert delay_problem(msg(deliverAtMs=5), clock, 10) is None            # in the past: at once
    status, text = delay_problem(msg(deliverAfterMs=1, deliverAtMs=2), clock, 0)  # type: ignore[misc]
    assert status == pb.MALFORMED_REQUEST and "not both" in text
    status, text = delay_problem(msg(deliverAfterMs=-1), clock, 0)  # type: ignore[misc]
    assert status == pb.MALFORMED_REQUEST and "deliver_after_ms" in text
    status, text = delay_problem(msg(deliverAtMs=-5), clock, 0)  # type: ignore[misc]
    assert status == pb.MALFORMED_REQUEST and "deliver_at_ms" in text
    assert delay_problem(msg(deliverAfterMs=10**12), clock, 0) is None      # 0: no limit
    assert delay_problem(msg(deliverAfterMs=1000), clock, 1000) is None
    status, text = delay_problem(msg(deliverAfterMs=1001), clock, 1000)  # type: ignore[misc]
    assert status == pb.DELIVERY_DELAY_TOO_LONG and "max_delivery_delay_ms 1000" in text
    assert delay_problem(msg(deliverAtMs=1_001_000), clock, 1000) is None
    assert delay_problem(msg(deliverAtMs=1_001_001), clock, 1000)[0] == pb.DELIVERY_DELAY_TOO_LONG  # type: ignore[index]


def test_the_clock_is_read_only_for_a_due_time_against_a_limit() -> None:
    def clock() -> int:
        raise AssertionError("clock read")
    assert delay_problem(msg(), clock, 1000) is None
    assert delay_problem(msg(deliverAfterMs=5), clock, 1000) is None
    assert delay_problem(msg(deliverAtMs=5), clock, 0) is None


def test_resolve_due_turns_a_delay_into_a_due_time_on_the_publish_clock() -> None:
    m = msg(deliverAfterMs=1500, publishTimeMs=10_000)
    resolve_due(m)
    assert not m.HasField("deliverAfterMs") and m.deliverAtMs == 11_500
    m = msg(deliverAtMs=42, publishTimeMs=10_000)
    resolve_due(m)
    assert m.deliverAtMs == 42                      # past: kept, delivered at once
    for zero in (msg(deliverAfterMs=0, publishTimeMs=1), msg(deliverAtMs=0, publishTimeMs=1)):
        resolve_due(zero)
        assert not zero.HasField("deliverAtMs") and not zero.HasField("deliverAfterMs")
    assert Message.from_proto(msg(deliverAtMs=7)).deliver_at_ms == 7
    assert Message.from_proto(msg()).deliver_at_ms == 0
    assert Message(b"x", deliver_at_ms=9).to_proto().deliverAtMs == 9


def _publish(txn: int, *msgs: pb.Message) -> bytes:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=txn, topic=b"t")
    req.publishRequest.topic = b"t"
    if len(msgs) == 1:
        req.publishRequest.msg.CopyFrom(msgs[0])
    else:
        req.publishRequest.msgs.extend(msgs)
    return encode(req)


def test_server_connection_rejects_bad_delays_and_keeps_parsing() -> None:
    conn = ServerConnection(1 << 20, 1 << 20, max_delivery_delay_ms=60_000, clock_ms=lambda: 1_000_000)
    events = conn.receive_data(_publish(1, msg(deliverAfterMs=1, deliverAtMs=1))
                               + _publish(2, msg(deliverAfterMs=-3))
                               + _publish(3, msg(deliverAtMs=1_000_000 + 60_001))
                               + _publish(4, msg(), msg(deliverAfterMs=61_000))    # a batch: all refused
                               + _publish(5, msg(deliverAfterMs=60_000))
                               + _publish(6, msg(), msg(deliverAtMs=5)))
    assert [type(e) for e in events] == [Reject, Reject, Reject, Reject, RequestReceived, RequestReceived]
    codes = [e.response.statusCode for e in events if isinstance(e, Reject)]
    assert codes == [pb.MALFORMED_REQUEST, pb.MALFORMED_REQUEST, pb.DELIVERY_DELAY_TOO_LONG,
                     pb.DELIVERY_DELAY_TOO_LONG]
    assert "message 1 of the batch" in events[3].response.statusMsg  # type: ignore[union-attr]


# --- the index ---------------------------------------------------------------------------------------
def test_index_pops_in_due_order_and_reports_the_earliest() -> None:
    idx = DelayIndex(capacity=10)
    assert idx.next_due() is None and idx.pop_due(10**15) == []
    for seq, due in ((1, 300), (2, 100), (3, 200), (4, 100)):
        assert idx.defer(seq, due)
    assert len(idx) == 4 and idx.next_due() == 100
    assert idx.pop_due(99) == []
    assert idx.pop_due(100) == [2, 4]
    assert idx.next_due() == 200 and idx.pop_due(1000) == [3, 1] and len(idx) == 0


def test_index_past_capacity_leaves_messages_to_the_log_and_rescans_from_the_first() -> None:
    idx = DelayIndex(capacity=4)
    for seq in range(1, 5):
        assert idx.defer(seq, 1000 + seq)
    assert not idx.defer(5, 10)                       # full: left to the log, even an earlier one
    assert idx.overflow_from == 5 and len(idx) == 4
    idx.pop_due(1001)
    assert not idx.defer(6, 10)                       # there is room, but 5 came first: seq order is kept
    assert idx.overflow_from == 5 and len(idx) == 3
    assert idx.rescan_from() is None                  # not drained to half yet
    idx.pop_due(1002)
    assert idx.rescan_from() == 5
    assert idx.track(5, 10) and idx.track(6, 10)
    assert not idx.track(7, 10)                       # full again: resume at 7
    assert idx.overflow_from == 7 and len(idx) == 4
    idx.pop_due(1004)
    assert idx.rescan_from() == 7
    idx.rescanned(9, done=True)
    assert idx.overflow_from is None and idx.rescan_from() is None
    assert idx.defer(9, 5)                            # indexed again
    idx.clear()
    assert len(idx) == 0 and idx.overflow_from is None


# --- a dispatcher over an in-memory log --------------------------------------------------------------
class Log:
    def __init__(self) -> None:
        self.msgs: list[Message] = []
        self.reads = 0

    def add(self, *, key: bytes | None = None, after: int = 0) -> int:
        seq = len(self.msgs) + 1
        self.msgs.append(Message(str(seq).encode(), msg_id=MessageId(seq), key=key,
                                 deliver_at_ms=now_ms() + after if after else 0))
        return seq

    def cached(self, topic: bytes, seq: int) -> Message | None:
        self.reads += 1
        return self.msgs[seq - 1]

    def cached_run(self, topic: bytes, seq: int, count: int) -> list[Message]:
        run = self.msgs[seq - 1:seq - 1 + count]
        self.reads += len(run)
        return run

    async def scan_single(self, topic: bytes, seq: int) -> Message:
        return self.msgs[seq - 1]


class Conn:
    def __init__(self, log: Log, arrived: asyncio.Event | None = None) -> None:
        self.log = log
        self.got: list[tuple[int, int]] = []      # (seq, received at ms)
        self.arrived = arrived or asyncio.Event()

    def send_consumer_delivery(self, topic: bytes, sub: bytes, cid: int, wires: list[bytes]) -> None:
        self.got += [(pb.Message.FromString(w).msgId.localComponent, now_ms()) for w in wires]
        self.arrived.set()

    async def wait_for(self, n: int) -> None:
        async with asyncio.timeout(TIMEOUT):
            while len(self.got) < n:
                self.arrived.clear()
                await self.arrived.wait()

    def seqs(self) -> list[int]:
        return [s for s, _ in self.got]


def make(cls: type[Dispatcher], log: Log, capacity: int = 100) -> Dispatcher:
    return cls(b"t", b"s", AckCursor(0), cache=log, last_seq=lambda: len(log.msgs),  # type: ignore[arg-type]
               delays=DelayIndex(capacity))


def assert_not_early(log: Log, conn: Conn) -> None:
    for seq, at in conn.got:
        due = log.msgs[seq - 1].deliver_at_ms
        assert at >= due, f"message {seq} came {due - at} ms early"


async def test_dispatcher_holds_a_delayed_message_and_the_ones_after_it_go_on() -> None:
    log = Log()
    log.add(after=800)
    log.add()
    log.add(after=400)
    log.add()
    d = make(SharedDispatcher, log)
    conn = Conn(log)
    d.add(conn, 1, 100)
    await conn.wait_for(2)
    assert conn.seqs() == [2, 4] and d.stats()["delayed"] == 2
    await conn.wait_for(4)
    assert conn.seqs() == [2, 4, 3, 1]
    assert_not_early(log, conn)
    assert d.stats()["delayed"] == 0 and d.cursor.mark_delete == 0
    d.ack([1, 2, 3, 4])
    assert d.cursor.mark_delete == 4
    await d.stop()


async def test_once_delivered_a_delayed_message_is_nacked_redelivered_and_acked_as_any_other() -> None:
    log = Log()
    log.add(after=100)
    d = make(SharedDispatcher, log)
    conn = Conn(log)
    slot = d.add(conn, 1, 1)
    await conn.wait_for(1)
    d.redeliver(slot, [1])                       # a nack: back at once (it is due), redelivery_count 1
    d.flow(slot, 1)
    await conn.wait_for(2)
    assert conn.seqs() == [1, 1] and d.counts == {1: 1}
    assert_not_early(log, conn)
    assert d.ack([1]) == 1 and d.cursor.mark_delete == 1
    await d.stop()


async def test_key_shared_delayed_messages_leave_their_key_order_and_keep_their_consumer() -> None:
    log = Log()
    for after in (300, 0, 300, 0):
        log.add(key=b"k", after=after)
    d = make(KeySharedDispatcher, log)
    arrived = asyncio.Event()
    a, b = Conn(log, arrived), Conn(log, arrived)
    d.add(a, 1, 100)
    d.add(b, 2, 100)
    async with asyncio.timeout(TIMEOUT):
        while len(a.got) + len(b.got) < 4:
            arrived.clear()
            await arrived.wait()
    holder, other = (a, b) if a.got else (b, a)
    assert other.got == [] and holder.seqs() == [2, 4, 1, 3]
    assert_not_early(log, holder)
    await d.stop()


async def test_past_the_capacity_the_log_keeps_them_and_none_is_early_or_lost() -> None:
    log = Log()
    for i in range(12):                          # later seq ids due earlier; every third not delayed
        log.add(after=0 if i % 3 == 2 else 600 - 25 * i)
    d = make(SharedDispatcher, log, capacity=3)
    conn = Conn(log)
    d.add(conn, 1, 100)
    await conn.wait_for(4)
    assert conn.seqs() == [3, 6, 9, 12]          # the undelayed ones are not held up by the full index
    assert len(d.delays or ()) == 3
    await conn.wait_for(12)
    assert sorted(conn.seqs()) == list(range(1, 13))
    assert_not_early(log, conn)
    assert d.delays is not None and len(d.delays) == 0 and d.delays.overflow_from is None
    await d.stop()


async def test_a_reset_forgets_the_index_and_reads_again() -> None:
    log = Log()
    log.add(after=60_000)
    log.add(after=100)
    d = make(SharedDispatcher, log)
    conn = Conn(log)
    d.add(conn, 1, 100)
    await asyncio.sleep(0)
    d.skip_to(1)                                  # an operator's reset past the first
    await conn.wait_for(1)
    assert conn.seqs() == [2] and len(d.delays or ()) == 0
    assert_not_early(log, conn)
    await d.stop()


async def test_without_an_index_delays_are_ignored() -> None:
    log = Log()
    log.add(after=60_000)
    d = SharedDispatcher(b"t", b"s", AckCursor(0), cache=log, last_seq=lambda: len(log.msgs))  # type: ignore[arg-type]
    conn = Conn(log)
    d.add(conn, 1, 10)
    await conn.wait_for(1)
    assert d.stats()["delayed"] == 0
    await d.stop()

