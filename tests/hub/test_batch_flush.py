"""White-box: when TopicLog sends queued publishes as another entry while adds are in flight.

A fake ledger handle holds every add until the test settles it, so which
entries exist at each step is exact (no timing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from bookie.errors import BKError
from bookie.wire.framing import FrameDecoder
from hub import errors
from hub.conf import load_hub_conf
from hub.entry_index import EntryIndex
from hub.persistence import TopicLog, decode_batch
from hub.proto import pubsub_pb2 as pb

pytestmark = pytest.mark.asyncio


class HeldLedger:
    """``async_add_entry`` records each entry; ``settle(i)`` acknowledges the i-th."""

    ledger_id = 7

    def __init__(self) -> None:
        self.adds: list[tuple[list[int], Callable[[int, BaseException | None], None]]] = []

    def async_add_entry(self, data: bytes, cb: Callable[[int, BaseException | None], None]) -> None:
        self.adds.append(([m.msgId.localComponent for m in decode_batch(data)], cb))

    def entries(self) -> list[list[int]]:
        return [seqs for seqs, _ in self.adds]

    def settle(self, i: int) -> None:
        self.adds[i][1](i, None)


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def held_log(**conf: Any) -> tuple[TopicLog, HeldLedger]:
    """A log on a ``HeldLedger``; publishes queue behind any add in flight (``batch_hold_after_adds`` 1, not the
    default) unless ``conf`` says otherwise, so each test sees the hold it is about."""
    log = TopicLog(b"t", None, None, load_hub_conf(None, {"batch_hold_after_adds": 1, **conf}))
    lh = HeldLedger()
    log.lh, log._last_index = lh, EntryIndex(lh.ledger_id)
    return log, lh


def body(n: int) -> pb.Message:
    return pb.Message(body=b"x" * n)


async def test_queued_publishes_wait_for_the_add_in_flight_until_they_fill_batch_flush_bytes() -> None:
    log, lh = held_log(batch_flush_bytes=30, max_outstanding_adds=4)
    first = log.enqueue(body(10))
    await turns()
    assert lh.entries() == [[1]]                       # a lone publish goes out at once
    small = [log.enqueue(body(10)), log.enqueue(body(10))]
    await turns()
    assert lh.entries() == [[1]]                       # 20 bytes < 30: they wait
    small.append(log.enqueue(body(10)))
    await turns()
    assert lh.entries() == [[1], [2, 3, 4]]            # 30 bytes: a second entry joins the first in flight
    lh.settle(1)
    await turns()
    assert not any(f.done() for f in [first, *small])   # completed in order only
    lh.settle(0)
    await turns()
    assert [f.result() for f in [first, *small]] == [1, 2, 3, 4]


async def test_a_small_remainder_goes_once_no_add_is_in_flight() -> None:
    log, lh = held_log(batch_flush_bytes=1000, max_outstanding_adds=4)
    first = log.enqueue(body(10))
    await turns()
    rest = [log.enqueue(body(10)) for _ in range(3)]
    await turns()
    assert lh.entries() == [[1]]
    lh.settle(0)
    await turns()
    assert first.result() == 1
    assert lh.entries() == [[1], [2, 3, 4]]            # the add settled: what queued goes as one entry
    lh.settle(1)
    await turns()
    assert [f.result() for f in rest] == [2, 3, 4]


async def test_no_more_than_max_outstanding_adds_in_flight() -> None:
    log, lh = held_log(batch_flush_bytes=0, max_outstanding_adds=2)
    futs = [log.enqueue(body(1))]
    await turns()
    futs += [log.enqueue(body(1))]
    await turns()
    futs += [log.enqueue(body(1))]
    await turns()
    assert lh.entries() == [[1], [2]]                  # 0: each goes at once, but two in flight at most
    lh.settle(0)
    await turns()
    assert lh.entries() == [[1], [2], [3]]
    lh.settle(1)
    lh.settle(2)
    await turns()
    assert [f.result() for f in futs] == [1, 2, 3]


async def test_publishes_go_at_once_until_batch_hold_after_adds_are_in_flight() -> None:
    log, lh = held_log(batch_hold_after_adds=2, batch_flush_bytes=1000, max_outstanding_adds=4)
    futs = [log.enqueue(body(10))]
    await turns()
    futs.append(log.enqueue(body(10)))
    await turns()
    assert lh.entries() == [[1], [2]]                  # one add in flight: the next publish still goes at once
    futs += [log.enqueue(body(10)), log.enqueue(body(10))]
    await turns()
    assert lh.entries() == [[1], [2]]                  # two in flight: these queue (20 bytes < 1000)
    lh.settle(0)
    await turns()
    assert lh.entries() == [[1], [2], [3, 4]]          # one settled: the queue goes as one entry
    assert futs[0].result() == 1 and not any(f.done() for f in futs[1:])
    lh.settle(2)
    await turns()
    assert not any(f.done() for f in futs[1:])         # completed in order only
    lh.settle(1)
    await turns()
    assert [f.result() for f in futs] == [1, 2, 3, 4]  # in order, dense


async def test_publishes_pipeline_behind_light_entries_and_hold_behind_a_heavy_one() -> None:
    from hub.batcher import LIGHT_ENTRY_MESSAGES

    log, lh = held_log(batch_hold_after_adds=4, batch_flush_bytes=1000, max_outstanding_adds=8)
    futs = [log.enqueue(body(10))]
    await turns()
    futs.append(log.enqueue(body(10)))
    await turns()
    heavy = LIGHT_ENTRY_MESSAGES + 1
    futs += [log.enqueue(body(10)) for _ in range(heavy)]   # one read's worth: more than a light entry
    await turns()
    assert lh.entries() == [[1], [2], list(range(3, 3 + heavy))]   # behind light entries: each at once
    futs.append(log.enqueue(body(10)))
    await turns()
    assert len(lh.entries()) == 3          # 3 in flight < 4, but the newest is heavy: this one holds
    lh.settle(0)
    lh.settle(1)
    await turns()
    assert len(lh.entries()) == 3          # still behind the heavy entry
    lh.settle(2)
    await turns()
    assert lh.entries()[3] == [3 + heavy]  # none in flight: it goes
    lh.settle(3)
    await turns()
    assert [f.result() for f in futs] == list(range(1, 4 + heavy))   # in order, dense


class SignallingLedger(HeldLedger):
    """A ``HeldLedger`` that sets ``added`` on each add."""

    def __init__(self) -> None:
        super().__init__()
        self.added = asyncio.Event()

    def async_add_entry(self, data: bytes, cb: Callable[[int, BaseException | None], None]) -> None:
        super().async_add_entry(data, cb)
        self.added.set()


async def test_queued_publishes_go_once_batch_flush_delay_ms_passed() -> None:
    log = TopicLog(b"t", None, None, load_hub_conf(None, {"batch_flush_delay_ms": 5, "batch_flush_bytes": 1000,
                                                                  "batch_hold_after_adds": 1}))
    lh = SignallingLedger()
    log.lh, log._last_index = lh, EntryIndex(lh.ledger_id)
    loop = asyncio.get_running_loop()
    futs = [log.enqueue(body(10))]
    await asyncio.wait_for(lh.added.wait(), 5)
    lh.added.clear()
    queued_at = loop.time()
    futs += [log.enqueue(body(10)), log.enqueue(body(10))]
    await turns()
    assert lh.entries() == [[1]]                       # held behind the add in flight ...
    await asyncio.wait_for(lh.added.wait(), 5)
    assert loop.time() - queued_at >= 0.004            # ... until the bound, not before
    assert lh.entries() == [[1], [2, 3]]               # then one entry, with the first still in flight
    lh.settle(1)
    lh.settle(0)
    await turns()
    assert [f.result() for f in futs] == [1, 2, 3]
    assert log._hold_timer is None


async def test_a_queue_sent_before_batch_flush_delay_ms_cancels_its_timer() -> None:
    log, lh = held_log(batch_flush_delay_ms=60000, batch_flush_bytes=1000)
    futs = [log.enqueue(body(10))]
    await turns()
    futs.append(log.enqueue(body(10)))
    await turns()
    assert log._hold_timer is not None
    lh.settle(0)
    await turns()
    assert lh.entries() == [[1], [2]]                  # the add settled: the queue went, its timer is gone
    assert log._hold_timer is None
    lh.settle(1)
    await turns()
    assert [f.result() for f in futs] == [1, 2]


class RefusingLedger(HeldLedger):
    """Fails its second add from inside ``async_add_entry``, as a writer that already failed does."""

    closed = False

    def async_add_entry(self, data: bytes, cb: Callable[[int, BaseException | None], None]) -> None:
        super().async_add_entry(data, cb)
        if len(self.adds) == 2:
            cb(1, BKError("refused"))

    async def close(self) -> None:
        self.closed = True


class RangesStore:
    """A ``TopicPersistenceManager`` stand-in that accepts every write."""

    def __init__(self) -> None:
        self.writes: list[pb.LedgerRanges] = []

    async def write_topic_persistence_info(self, topic: bytes, ranges: pb.LedgerRanges, version: Any) -> Any:
        self.writes.append(ranges)
        return version


async def test_an_add_refused_inside_the_send_fails_its_batch_once(caplog: pytest.LogCaptureFixture) -> None:
    store = RangesStore()
    log = TopicLog(b"t", None, store, load_hub_conf(None, {"batch_flush_bytes": 0, "max_outstanding_adds": 4}))
    lh = RefusingLedger()
    log.lh, log._last_index = lh, EntryIndex(lh.ledger_id)
    log.ranges = pb.LedgerRanges(ranges=[pb.LedgerRange(ledgerId=lh.ledger_id, startSeqIdIncluded=1)])
    first = log.enqueue(body(1))
    await turns()
    lh.settle(0)
    await turns()
    assert first.result() == 1
    second = log.enqueue(body(1))    # nothing in flight: it goes at once, and the ledger refuses it inside the send
    await turns(20)
    assert lh.entries() == [[1], [2]]
    with pytest.raises(errors.ServiceDownError):
        second.result()
    assert lh.closed and log.lh is None                     # closed at its last acknowledged entry
    assert [r.endSeqIdIncluded.localComponent for r in store.writes[-1].ranges] == [1]
    failed = [r for r in caplog.records if "add to ledger" in r.getMessage()]
    assert len(failed) == 1                                 # the failure is handled once
    assert log._slow is None and not log._inflight


async def test_a_read_of_publishes_goes_out_when_the_server_says_so_not_at_the_end_of_the_turn() -> None:
    log, lh = held_log()
    done: list[int] = []
    for _ in range(3):
        log.submit(body(10), lambda seq, exc: done.append(seq))
    assert lh.entries() == []           # queued for the end of the loop turn ...
    log.send_queued()
    assert lh.entries() == [[1, 2, 3]]  # ... or now, as one entry, without a loop turn
    await turns()
    assert lh.entries() == [[1, 2, 3]]  # the scheduled pump finds nothing more to send
    log.send_queued()
    assert lh.entries() == [[1, 2, 3]]


async def test_an_acknowledged_batch_is_answered_before_it_is_handed_on_for_delivery() -> None:
    order: list[str] = []
    log, lh = held_log()
    log.on_persisted = lambda topic, first, msgs, wires: order.append(
        f"persisted {list(range(first, first + len(msgs)))}")
    for _ in range(2):
        log.submit(body(10), lambda seq, exc: order.append(f"answer {seq}"))
    log.send_queued()
    lh.settle(0)
    assert order == ["answer 1", "answer 2", "persisted [1, 2]"]


async def test_the_server_writes_every_connections_queued_frames_when_told() -> None:
    from bookie.wire import Outbox
    from hub.server import HubServer

    server = HubServer(load_hub_conf(None, {}))
    written: list[tuple[int, bytes]] = []

    class Recorder:                              # a transport that records what each connection writes
        def __init__(self, i: int) -> None:
            self.i = i

        def writelines(self, data: list[bytes]) -> None:
            written.append((self.i, b"".join(data)))

        def is_closing(self) -> bool:
            return False

    outs = [Outbox(schedule=server.flush_soon) for _ in range(2)]
    for i, out in enumerate(outs):
        out.attach(Recorder(i))
    outs[0].send(b"a")
    outs[1].send(b"b")
    outs[0].send(b"c")
    assert written == []                         # queued for the end of the loop turn ...
    server.flush()
    assert written == [(0, b"ac"), (1, b"b")]    # ... or now (publish answers before deliveries are built)
    await turns()
    assert written == [(0, b"ac"), (1, b"b")]    # the scheduled flush finds nothing left
    outs[1].send(b"d")
    await turns()
    assert written[-1] == (1, b"d")              # and the end-of-turn flush still happens by itself


def _serving(log: TopicLog, lh: HeldLedger) -> tuple[Any, Any, list[list[list[int]]], list[bytes]]:
    """A ``HubConnection`` of a hub (not started) owning topic ``t`` (``log``, adding to ``lh``): the
    connection, the server, the entries of ``lh`` at each ``pool.flush``, the bytes written to the client."""
    from types import SimpleNamespace

    from hub.connection import HubConnection
    from hub.server import HubServer
    from hub.topic import Topic

    server = HubServer(load_hub_conf(None, {}))          # not started: the topic and the pool are stand-ins
    flushed: list[list[list[int]]] = []
    server.bk = SimpleNamespace(pool=SimpleNamespace(flush=lambda: flushed.append(lh.entries())))  # type: ignore[assignment]
    server.topics[b"t"] = Topic(log, None)               # type: ignore[arg-type]
    conn = HubConnection(server)
    written: list[bytes] = []
    conn.connection_made(SimpleNamespace(                 # type: ignore[arg-type]
        writelines=lambda data: written.append(b"".join(data)), is_closing=lambda: False,
        get_extra_info=lambda name, default=None: default, set_write_buffer_limits=lambda **kw: None,
        is_reading=lambda: True, pause_reading=lambda: None, resume_reading=lambda: None))
    return conn, server, flushed, written


def _publishes(txn_ids: range) -> bytes:
    from hub import protocol

    return b"".join(protocol.encode(pb.PubSubRequest(
        protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=i, topic=b"t",
        publishRequest=pb.PublishRequest(topic=b"t", msg=body(100)))) for i in txn_ids)


async def test_a_read_of_publishes_makes_its_entry_and_leaves_the_adds_for_the_end_of_the_turn() -> None:
    log, lh = held_log()
    conn, _, flushed, _ = _serving(log, lh)
    conn.data_received(_publishes(range(1, 4)))          # one read of three publishes
    assert lh.entries() == [[1, 2, 3]]                   # one entry, made at the end of the read ...
    assert flushed == []                                  # ... whose adds leave with the turn's others


async def test_a_long_read_of_publishes_sends_its_first_ones_before_parsing_the_rest() -> None:
    from hub.connection import PIPELINE_PUBLISHES

    log, lh = held_log()                                  # batch_flush_bytes 8192 (the default)
    conn, server, flushed, written = _serving(log, lh)
    n = 100
    conn.data_received(_publishes(range(1, n + 1)))      # one read: a client's whole window
    first = list(range(1, PIPELINE_PUBLISHES + 1))
    assert flushed[0] == [first]                          # the first publishes left for the bookies at once ...
    assert lh.entries() == [first, list(range(PIPELINE_PUBLISHES + 1, n + 1))]   # ... the rest batched behind
    for i in range(len(lh.adds)):
        lh.settle(i)
    server.flush()
    seqs = [(r.txnId, r.publishResponse.publishedMsgId.localComponent)
            for r in (pb.PubSubResponse.FromString(f) for f in FrameDecoder(1 << 20).feed(b"".join(written)))]
    assert seqs == [(i, i) for i in range(1, n + 1)]      # every publish answered, in order, dense seq ids


async def test_a_publish_multi_read_sends_its_parts_at_its_end_with_no_callback_per_part(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: the parts of a PUBLISH_MULTI leave when the read ends, as a PUBLISH's do (``sends``), with no
    end-of-turn ``send_queued`` scheduled per topic (a loop callback per message of a spread publisher)."""
    from hub.batcher import EntryBatcher
    from hub.frames_multi import publish_multi

    log, lh = held_log()
    conn, server, _, written = _serving(log, lh)
    calls: list[bool] = []
    send_queued = EntryBatcher.send_queued

    def counted(self: EntryBatcher) -> None:
        calls.append(self._pump_soon)
        send_queued(self)

    monkeypatch.setattr(EntryBatcher, "send_queued", counted)
    conn.data_received(publish_multi(7, [(b"t", [b"a" * 10]), (b"t", [b"b" * 10, b"c" * 10]), (b"t", [b"d"])]))
    assert lh.entries() == [[1, 2, 3, 4]]                 # one entry, made at the end of the read
    assert calls == [True]                                # by the read's own send_queued ...
    await turns()
    assert calls == [True] and lh.entries() == [[1, 2, 3, 4]]   # ... and none scheduled for the topic
    lh.settle(0)
    server.flush()
    (answer,) = [pb.PubSubResponse.FromString(f) for f in FrameDecoder(1 << 20).feed(b"".join(written))]
    assert answer.txnId == 7 and answer.statusCode == pb.SUCCESS


class KeptLedger(HeldLedger):
    """A ``HeldLedger`` that keeps each entry's bytes too."""

    def __init__(self) -> None:
        super().__init__()
        self.data: list[bytes] = []

    def async_add_entry(self, data: bytes, cb: Callable[[int, BaseException | None], None]) -> None:
        self.data.append(data)
        super().async_add_entry(data, cb)


async def test_publish_multi_parts_of_a_body_alone_are_stored_as_protobuf_stamps_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: a PUBLISH_MULTI part whose message holds a body alone is stamped and serialized from the body,
    once per request (``StampedBody``); any other field (an empty key is one) takes the long way. Both are stored
    exactly as protobuf serializes the stamped message, and each part is answered with its seq id."""
    from hub import protocol

    log = TopicLog(b"t", None, None, load_hub_conf(None, {}))
    lh = KeptLedger()
    log.lh, log._last_index = lh, EntryIndex(lh.ledger_id)
    conn, server, _, written = _serving(log, lh)
    msgs = [pb.Message(body=b"a" * 10), pb.Message(body=b"b", key=b"k"), pb.Message(body=b""),
            pb.Message(body=b"c" * 300, key=b""), pb.Message(body=b"d" * 200)]
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH_MULTI, txnId=9,
                           multiPublishRequest=pb.MultiPublishRequest(publishes=[
                               pb.PublishRequest(topic=b"t", msg=m) for m in msgs]))
    from hub.batcher import EntryBatcher
    from hub.body_publish import StampedBody

    queued: list[bool] = []
    submit = EntryBatcher.submit

    def spy(self: EntryBatcher, message: Any, *args: Any, **kw: Any) -> None:
        queued.append(isinstance(message, StampedBody))
        submit(self, message, *args, **kw)

    monkeypatch.setattr(EntryBatcher, "submit", spy)
    conn.data_received(protocol.encode(req))
    assert queued == [True, False, True, False, True]     # the bodies alone the short way
    assert lh.entries() == [[1, 2, 3, 4, 5]]
    stored = decode_batch(lh.data[0])
    stamp = stored[0].publishTimeMs
    assert stamp > 0 and all(m.publishTimeMs >= stamp for m in stored)
    for got, sent in zip(stored, msgs, strict=True):
        want = pb.Message()
        want.CopyFrom(sent)
        want.srcRegion = server.region_bytes
        want.publishTimeMs = got.publishTimeMs
        want.msgId.localComponent = got.msgId.localComponent   # set by decode_batch
        assert got == want and got.HasField("key") == sent.HasField("key")
    lh.settle(0)
    server.flush()
    (answer,) = [pb.PubSubResponse.FromString(f) for f in FrameDecoder(1 << 20).feed(b"".join(written))]
    assert answer.txnId == 9 and answer.statusCode == pb.SUCCESS
    assert [a.publishResponse.publishedMsgId.localComponent for a in answer.multiPublishResponse.answers] == [
        1, 2, 3, 4, 5]


async def test_a_failed_add_of_a_publish_multi_part_of_a_body_alone_answers_that_part_with_the_failure() -> None:
    """The short way's part (``_PlainPart``): stored, it answers with its seq id; its add failed, the part's
    answer carries the failure (as a PUBLISH's would) and the request is still answered once, whole."""
    from hub.frames_multi import publish_multi

    store = RangesStore()
    log = TopicLog(b"t", None, store, load_hub_conf(None, {"batch_flush_bytes": 0, "max_outstanding_adds": 4}))
    lh = RefusingLedger()                                   # refuses its second add
    log.lh, log._last_index = lh, EntryIndex(lh.ledger_id)
    log.ranges = pb.LedgerRanges(ranges=[pb.LedgerRange(ledgerId=lh.ledger_id, startSeqIdIncluded=1)])
    conn, server, _, written = _serving(log, lh)
    conn.data_received(publish_multi(3, [(b"t", [b"a" * 10])]))
    lh.settle(0)
    conn.data_received(publish_multi(4, [(b"t", [b"b" * 10])]))
    await turns(20)
    server.flush()
    first, second = [pb.PubSubResponse.FromString(f) for f in FrameDecoder(1 << 20).feed(b"".join(written))]
    assert (first.txnId, first.statusCode) == (3, pb.SUCCESS)
    assert [a.publishResponse.publishedMsgId.localComponent for a in first.multiPublishResponse.answers] == [1]
    assert (second.txnId, second.statusCode) == (4, pb.SUCCESS)   # the request; its part failed
    (part,) = second.multiPublishResponse.answers
    assert part.statusCode == pb.SERVICE_DOWN and not part.publishResponse.publishedMsgId.localComponent


async def test_a_batched_publish_is_queued_at_once_and_split_by_the_entry_bounds() -> None:
    """``submit_all`` (the server's batched publish): one entry for what fits, each message its own seq id."""
    log, lh = held_log(max_batch_messages=3, max_outstanding_adds=4, batch_flush_bytes=1)
    got: list[tuple[int, BaseException | None]] = []
    msgs = [body(5) for _ in range(5)]
    log.submit_all(msgs, lambda seq, exc: got.append((seq, exc)), 25)
    await turns()
    assert lh.entries() == [[1, 2, 3], [4, 5]]       # max_batch_messages splits the queue
    assert log._queued_bytes == 0
    lh.settle(0)
    lh.settle(1)
    await turns()
    assert got == [(1, None), (2, None), (3, None), (4, None), (5, None)]


class Runs:
    """A ``hub.batcher.RunDone``: what it was told, one message at a time or in runs."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, BaseException | None]] = []
        self.runs: list[tuple[int, int]] = []

    def __call__(self, seq: int, error: BaseException | None) -> None:
        self.calls.append((seq, error))

    def settle_run(self, first: int, n: int) -> None:
        self.runs.append((first, n))


async def test_a_batched_publish_is_acknowledged_in_runs_of_its_entries() -> None:
    """A ``RunDone`` shared by a batched publish's messages hears once per entry's run, with the run's first
    seq id; a single publish between two batched ones is called on its own, in seq order."""
    log, lh = held_log(max_batch_messages=4, max_outstanding_adds=4, batch_flush_bytes=1)
    a, b = Runs(), Runs()
    single: list[tuple[int, BaseException | None]] = []
    log.submit_all([body(5) for _ in range(3)], a, 15)
    log.submit(body(5), lambda seq, exc: single.append((seq, exc)))
    log.submit_all([body(5) for _ in range(3)], b, 15)
    await turns()
    assert lh.entries() == [[1, 2, 3, 4], [5, 6, 7]]
    lh.settle(0)
    await turns()
    assert a.runs == [(1, 3)] and single == [(4, None)] and b.runs == [] and not a.calls
    lh.settle(1)
    await turns()
    assert b.runs == [(5, 3)] and not b.calls


class Gate:
    """A backlog quota as the log sees it (``hub.batcher.Gate``): each message asked unless it admits all."""

    def __init__(self, all_: bool) -> None:
        self.all = all_
        self.seen: list[bytes] = []

    def admit(self, message: pb.Message, done: Callable[[int, BaseException | None], None]) -> bool:
        self.seen.append(message.body)
        if message.body == b"no":
            done(0, errors.ServiceDownError("held"))
            return False
        return True

    def admits_all(self) -> bool:
        return self.all


async def test_a_batched_publish_goes_through_the_gate_message_by_message_unless_it_admits_all() -> None:
    log, lh = held_log()
    gate = log.gate = Gate(False)                     # a quota that holds: each message is asked
    seen = gate.seen
    got: list[tuple[int, str]] = []
    log.submit_all([pb.Message(body=b"a"), pb.Message(body=b"no"), pb.Message(body=b"b")],
                   lambda seq, exc: got.append((seq, type(exc).__name__)), 4)
    await turns()
    assert seen == [b"a", b"no", b"b"]
    assert got == [(0, "ServiceDownError")] and lh.entries() == [[1, 2]]
    gate.all = True                                   # no quota reached: nobody is asked
    log.submit_all([pb.Message(body=b"no")], lambda seq, exc: got.append((seq, type(exc).__name__)), 2)
    lh.settle(0)
    await turns()
    assert seen == [b"a", b"no", b"b"] and lh.entries() == [[1, 2], [3]]


async def test_the_answers_of_one_turn_leave_as_one_joined_buffer() -> None:
    """A turn's publish answers are one part of one ``writelines`` (``OUT_JOIN_BYTES``), not one part each."""
    log, lh = held_log()
    conn, server, _, _ = _serving(log, lh)
    writes: list[list[bytes]] = []
    conn.transport.writelines = lambda data: writes.append(list(data))   # the parts of each write
    conn.data_received(_publishes(range(1, 6)))          # one read of five publishes: one entry
    lh.settle(0)
    server.flush()
    assert len(writes) == 1 and len(writes[0]) == 1      # one write of one buffer
    answers = [pb.PubSubResponse.FromString(f) for f in FrameDecoder(1 << 20).feed(writes[0][0])]
    seqs = [(r.txnId, r.publishResponse.publishedMsgId.localComponent) for r in answers]
    assert seqs == [(i, i) for i in range(1, 6)]         # every answer, in order
