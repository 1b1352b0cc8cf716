"""hub.subscriptions' consume-pointer persists against a real (lmdb) metastore: one write in flight, never backwards."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub import errors
from hub.conf import load_hub_conf
from hub.message import Message, MessageId
from hub.metadata import SubscriptionDataManager
from hub.proto import pubsub_pb2 as pb
from hub.subscriptions import TopicSubscriptions
from metastore import Version, open_metastore

TIMEOUT = 5.0
TOPIC, SUB = b"topic", b"sub"


class GatedManager(SubscriptionDataManager):
    """Counts the pointer writes in flight; holds them at ``gate`` while it is set; may fail them."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.written: list[int] = []
        self.wrote = asyncio.Event()      # set at each write
        self.fail: Exception | None = None

    async def update_subscription_data(self, topic: bytes, subscriber: bytes, data: pb.SubscriptionData,
                                       version: Version) -> Version:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.entered.set()
            if self.gate is not None:
                await self.gate.wait()
            if self.fail is not None:
                raise self.fail
            got = await super().update_subscription_data(topic, subscriber, data, version)
            if data.HasField("state"):
                self.written.append(data.state.msgId.localComponent)
                self.wrote.set()
            return got
        finally:
            self.in_flight -= 1


class ConfRecorder:
    """A server filter that keeps the conf its ``initialize`` got."""

    seen: list[dict[str, str]] = []

    def initialize(self, conf: dict[str, str]) -> None:
        ConfRecorder.seen.append(conf)

    def set_subscription_preferences(self, topic: bytes, subscriber_id: bytes, preferences: Any) -> None: ...

    def test_message(self, message: Any) -> bool:
        return True

    def uninitialize(self) -> None: ...


class OnlySome:
    """A server filter passing the seq ids in its ``pass`` option (comma separated)."""

    def initialize(self, conf: dict[str, str]) -> None: ...

    def set_subscription_preferences(self, topic: bytes, subscriber_id: bytes, preferences: Any) -> None:
        self.passing = {int(x) for x in preferences.options["pass"].split(b",")}

    def test_message(self, message: Any) -> bool:
        return message.seq_id in self.passing

    def uninitialize(self) -> None: ...


class Conn:
    def __init__(self) -> None:
        self.writable = asyncio.Event()
        self.writable.set()
        self.sent: list[int] = []

    def send_delivery(self, topic: bytes, subscriber: bytes, messages: list[Any]) -> None:
        self.sent.extend(m.seq_id for m in messages)

    def send_event(self, topic: bytes, subscriber: bytes, event: int) -> None: ...

    def attached(self, topic: bytes, subscriber: bytes, state: Any) -> None: ...


@pytest.fixture
async def subs(tmp_path: Path) -> AsyncIterator[tuple[TopicSubscriptions, GatedManager]]:
    store = await open_metastore(f"lmdb://{tmp_path}/meta")
    mgr = GatedManager(store)
    await mgr.create_subscription_data(TOPIC, SUB, pb.SubscriptionData())
    conf = load_hub_conf(None, {"consume_interval": 1, "server_filter_allowlist": f"{__name__}.ConfRecorder",
                                "password": "secret", "region": "here"})
    s = TopicSubscriptions(TOPIC, mgr, conf, last_seq=lambda: 1000)
    await s.load()
    try:
        yield s, mgr
    finally:
        await store.close()


async def stored(mgr: GatedManager) -> int:
    got = await mgr.read_subscription_data(TOPIC, SUB)
    assert got is not None
    return got[0].state.msgId.localComponent


async def test_persists_of_one_subscription_never_overlap_and_coalesce(
        subs: tuple[TopicSubscriptions, GatedManager]) -> None:
    s, mgr = subs
    conn = Conn()
    mgr.gate = asyncio.Event()
    assert s.consume(conn, SUB, 10)
    first = asyncio.ensure_future(s.persist(SUB))
    await asyncio.wait_for(mgr.entered.wait(), TIMEOUT)          # pointer 10 is being written
    later = []
    for seq in (20, 30, 40):                                     # more consume intervals meanwhile
        assert s.consume(conn, SUB, seq)
        later.append(asyncio.ensure_future(s.persist(SUB)))
    mgr.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *later), TIMEOUT)
    assert mgr.most_in_flight == 1                               # old code: four CAS writes at once
    assert mgr.written == [10, 40]                               # the newest, once
    assert await stored(mgr) == 40
    assert s.persist_soon(SUB) is None                           # nothing left to write


async def test_a_detach_persists_even_when_the_background_write_was_cancelled(
        subs: tuple[TopicSubscriptions, GatedManager]) -> None:
    s, mgr = subs
    conn = Conn()
    mgr.gate = asyncio.Event()
    assert s.consume(conn, SUB, 10)
    task = s.persist_soon(SUB)
    assert task is not None
    await asyncio.wait_for(mgr.entered.wait(), TIMEOUT)
    task.cancel()                                                # what the server's stop does to its tasks
    mgr.gate.set()
    await asyncio.wait_for(s.detach(SUB), TIMEOUT)               # then it releases the topic: persists again
    assert task.cancelled()
    assert await stored(mgr) == 10


async def test_a_conflicting_write_never_moves_the_pointer_backwards(
        subs: tuple[TopicSubscriptions, GatedManager]) -> None:
    s, mgr = subs
    conn = Conn()
    assert s.consume(conn, SUB, 10)
    await asyncio.wait_for(s.persist(SUB), TIMEOUT)
    newer = pb.SubscriptionData()                                # someone else stored 50 (version moves on)
    newer.state.msgId.localComponent = 50
    _, version = await mgr.read_subscription_data(TOPIC, SUB) or (None, Version.ANY)
    await SubscriptionDataManager.update_subscription_data(mgr, TOPIC, SUB, newer, version)
    assert s.consume(conn, SUB, 40)
    await asyncio.wait_for(s.persist(SUB), TIMEOUT)              # BadVersionError, read again: 50 >= 40
    assert await stored(mgr) == 50                               # old code: the retry wrote 40 over 50
    assert s.consume(conn, SUB, 60)
    await asyncio.wait_for(s.persist(SUB), TIMEOUT)
    assert await stored(mgr) == 60


async def test_a_failed_background_persist_is_logged_and_retried(
        subs: tuple[TopicSubscriptions, GatedManager], caplog: pytest.LogCaptureFixture) -> None:
    s, mgr = subs
    conn = Conn()
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
    try:
        mgr.fail = errors.ServiceDownError("metastore down")
        assert s.consume(conn, SUB, 10)
        task = s.persist_soon(SUB)
        assert task is not None
        with caplog.at_level(logging.WARNING, logger="hub.subscriptions"):
            await asyncio.wait_for(asyncio.wait([task]), TIMEOUT)
        assert "could not persist consume pointer" in caplog.text
        del task
        gc.collect()
        assert unhandled == []                                   # the exception was retrieved
        mgr.fail = None
        assert s.consume(conn, SUB, 20)
        task = s.persist_soon(SUB)
        assert task is not None
        await asyncio.wait_for(task, TIMEOUT)
        assert await stored(mgr) == 20
    finally:
        loop.set_exception_handler(None)


class ConsumerConn(Conn):
    def __init__(self) -> None:
        super().__init__()
        self.arrived = asyncio.Event()

    def send_consumer_delivery(self, topic: bytes, subscriber: bytes, consumer_id: int, wires: list[bytes]) -> None:
        self.sent.extend(pb.Message.FromString(w).msgId.localComponent for w in wires)
        self.arrived.set()

    def send_event(self, topic: bytes, subscriber: bytes, event: int, consumer_id: int = 0) -> None: ...


async def until(cond: Any, changed: asyncio.Event) -> None:
    """Wait (bounded) until ``cond()``, checking it each time ``changed`` is set."""
    async def wait() -> None:
        while not cond():
            changed.clear()
            await changed.wait()
    await asyncio.wait_for(wait(), TIMEOUT)


@contextlib.asynccontextmanager
async def shared_subscription(tmp_path: Path, ack_persist_interval_ms: int
                              ) -> AsyncIterator[tuple[TopicSubscriptions, GatedManager, ConsumerConn]]:
    """A SHARED subscription (consume_interval 10) with one consumer holding messages 1..100 unacked; the
    manager's write record starts empty."""
    store = await open_metastore(f"lmdb://{tmp_path}/meta")
    try:
        mgr = GatedManager(store)
        conf = load_hub_conf(None, {"consume_interval": 10, "ack_persist_interval_ms": ack_persist_interval_ms})
        s = TopicSubscriptions(TOPIC, mgr, conf, last_seq=lambda: 100, cache=Cache(100))  # type: ignore[arg-type]
        req = pb.SubscribeRequest(createOrAttach=pb.SubscribeRequest.CREATE_OR_ATTACH, consumerId=1,
                                  receiverQueueSize=100, startSeqId=1)
        req.preferences.subscriptionType = pb.SHARED
        conn = ConsumerConn()
        await s.subscribe(conn, SUB, req)
        await until(lambda: len(conn.sent) == 100, conn.arrived)
        mgr.written.clear()
        yield s, mgr, conn
        await s.release()
    finally:
        await store.close()


def ack_range(s: TopicSubscriptions, conn: ConsumerConn, first: int, last: int) -> None:
    """Consumer 1's individual acks of ``first`` .. ``last``, as one request."""
    creq = pb.ConsumeRequest(consumerId=1, ackType=pb.ConsumeRequest.INDIVIDUAL)
    creq.seqIds.extend(range(first, last + 1))
    s.ack(conn, SUB, creq)


async def test_a_stream_of_acks_is_written_once_per_consume_interval_and_the_rest_within_the_interval(
        tmp_path: Path) -> None:
    """A consumer subscription does not write back to back: after a write, fewer than consume_interval acks
    wait for the ack timer, as many or more go at once."""
    async with shared_subscription(tmp_path, 300) as (s, mgr, conn):
        state = s.subs[SUB]

        def ack(first: int, last: int) -> None:
            ack_range(s, conn, first, last)

        mgr.gate = asyncio.Event()
        ack(1, 10)                                   # consume_interval acks: a write of 10 starts (held)
        task = state.persisting
        assert task is not None
        await asyncio.wait_for(mgr.entered.wait(), TIMEOUT)
        ack(11, 13)                                  # 3 more meanwhile
        mgr.gate.set()
        await asyncio.wait_for(task, TIMEOUT)
        assert mgr.written == [10]                   # old code: wrote 13 right after, one write per commit
        assert state.ack_timer is not None           # ... they go within ack_persist_interval_ms
        await until(lambda: mgr.written == [10, 13], mgr.wrote)
        mgr.gate = asyncio.Event()
        mgr.entered.clear()
        ack(14, 23)                                  # a write of 23 starts (held)
        task = state.persisting
        assert task is not None
        await asyncio.wait_for(mgr.entered.wait(), TIMEOUT)
        ack(24, 35)                                  # consume_interval or more meanwhile: written at once
        mgr.gate.set()
        await asyncio.wait_for(task, TIMEOUT)
        assert mgr.written == [10, 13, 23, 35]
        ack(36, 36)
        await asyncio.wait_for(s.persist(SUB), TIMEOUT)   # a detach's persist writes whatever is left
        assert await stored(mgr) == 36


async def test_acks_during_a_write_are_left_to_that_write_loop(tmp_path: Path) -> None:
    """Ack batches that come while a write is in flight only count: the loop writes the newest state once its
    write returns, and nothing else is started or tracked for them (old code: a track call per batch)."""
    async with shared_subscription(tmp_path, 60000) as (s, mgr, conn):
        state = s.subs[SUB]
        tracked: list[asyncio.Task[Any]] = []
        s.track = tracked.append
        mgr.gate = asyncio.Event()
        for first in range(1, 61, 10):           # six batches of consume_interval acks
            ack_range(s, conn, first, first + 9)
            if first == 1:
                await asyncio.wait_for(mgr.entered.wait(), TIMEOUT)   # the write of 10 is in flight
        task = state.persisting
        assert task is not None
        assert tracked == [task]                 # tracked once, when it started
        assert state.ack_timer is None
        mgr.gate.set()
        await asyncio.wait_for(task, TIMEOUT)
        assert mgr.written == [10, 60]           # the newest, at once, by the same loop


async def test_acks_a_failed_write_left_behind_are_written_within_the_ack_interval(tmp_path: Path) -> None:
    """Acks that came while a write failed are not left until the next ack or detach: the ack timer tries
    again within ack_persist_interval_ms."""
    async with shared_subscription(tmp_path, 50) as (s, mgr, conn):
        state = s.subs[SUB]
        mgr.gate = asyncio.Event()
        mgr.fail = errors.ServiceDownError("metastore down")
        for first in (1, 11):                    # a write of 10 starts (held, then fails); 10 more meanwhile
            ack_range(s, conn, first, first + 9)
            if first == 1:
                await asyncio.wait_for(mgr.entered.wait(), TIMEOUT)
        task = state.persisting
        assert task is not None
        mgr.gate.set()
        await asyncio.wait_for(asyncio.wait([task]), TIMEOUT)
        assert isinstance(task.exception(), errors.ServiceDownError)
        mgr.fail = None
        await until(lambda: mgr.written == [20], mgr.wrote)   # the ack timer's write, no ack needed
        assert await stored(mgr) == 20


async def test_a_server_filter_is_initialized_with_the_hubs_conf(
        subs: tuple[TopicSubscriptions, GatedManager]) -> None:
    s, _ = subs
    ConfRecorder.seen = []
    req = pb.SubscribeRequest(subscriberId=b"filtered", createOrAttach=pb.SubscribeRequest.CREATE)
    req.preferences.messageFilter = f"{__name__}.ConfRecorder"
    await s.subscribe(Conn(), b"filtered", req)
    [conf] = ConfRecorder.seen                                   # old code: {}
    assert conf["consume_interval"] == "1" and conf["region"] == "here"
    assert conf["server_filter_allowlist"] == f"{__name__}.ConfRecorder"
    assert conf["readahead_enabled"] == "true" and conf["max_message_size"] == "1258291"
    assert "password" not in conf                                # the certificate's password stays in the hub
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in conf.items())


class Cache:
    """Messages 1..n, all cached (what Delivery reads through)."""

    def __init__(self, n: int) -> None:
        self.msgs = {s: Message(body=b"m", msg_id=MessageId(s)) for s in range(1, n + 1)}

    def cached(self, topic: bytes, seq: int) -> Message | None:
        return self.msgs.get(seq)

    def cached_run(self, topic: bytes, seq: int, count: int) -> list[Message]:
        run = []
        while len(run) < count and seq + len(run) in self.msgs:
            run.append(self.msgs[seq + len(run)])
        return run

    async def scan_single(self, topic: bytes, seq: int) -> Message:
        return self.msgs[seq]


async def test_messages_a_filter_skips_advance_the_consume_pointer(tmp_path: Path) -> None:
    store = await open_metastore(f"lmdb://{tmp_path}/meta")
    moved = asyncio.Event()
    try:
        mgr = SubscriptionDataManager(store)
        conf = load_hub_conf(None, {"consume_interval": 1, "server_filter_allowlist": f"{__name__}.OnlySome"})
        s = TopicSubscriptions(TOPIC, mgr, conf, last_seq=lambda: 10, on_consumed=lambda topic: moved.set())
        conn = Conn()
        req = pb.SubscribeRequest(subscriberId=SUB, createOrAttach=pb.SubscribeRequest.CREATE)
        req.preferences.messageFilter = f"{__name__}.OnlySome"
        req.preferences.options.entries.add(key="pass", value=b"3,6")
        s.last_seq = lambda: 0                                   # a new subscription starts after seq id 0
        await s.subscribe(conn, SUB, req)
        s.last_seq = lambda: 10
        state = s.subs[SUB]

        async def pointer_at(seq: int) -> None:
            async with asyncio.timeout(TIMEOUT):
                while state.consumed != seq:
                    moved.clear()
                    await moved.wait()

        s.start_delivery(conn, SUB, Cache(10))
        await pointer_at(2)                                      # 1 and 2 skipped, 3 delivered: old code stayed at 0
        assert conn.sent == [3, 6]
        s.consume(conn, SUB, 3)                                  # 4 and 5 skipped, 6 delivered and unconsumed
        await pointer_at(5)
        s.consume(conn, SUB, 6)                                  # 7..10 skipped: everything is consumed
        await pointer_at(10)
        await s.close(conn, SUB)
        assert await stored(mgr) == 10                           # persisted (old code: 6)
        assert s.min_consumed() == 10
    finally:
        await store.close()


async def test_a_readers_temporary_subscription_starts_where_asked_and_a_new_owner_deletes_it(tmp_path: Path) -> None:
    store = await open_metastore(f"lmdb://{tmp_path}/meta")
    try:
        mgr = SubscriptionDataManager(store)
        conf = load_hub_conf(None, {})
        s = TopicSubscriptions(TOPIC, mgr, conf, last_seq=lambda: 10)
        conn = Conn()
        for sub, start, temporary in ((b"reader-1", 4, True), (b"durable", 4, False), (b"late", 99, False)):
            req = pb.SubscribeRequest(subscriberId=sub, createOrAttach=pb.SubscribeRequest.CREATE, startSeqId=start)
            req.preferences.temporary = temporary
            await s.subscribe(conn, sub, req)
        assert [s.subs[x].consumed for x in (b"reader-1", b"durable", b"late")] == [3, 3, 10]   # past the end: the end
        again = TopicSubscriptions(TOPIC, mgr, conf, last_seq=lambda: 10)     # a new owner loads the topic
        await again.load()
        assert sorted(again.subs) == [b"durable", b"late"]
        assert await mgr.read_subscription_data(TOPIC, b"reader-1") is None
    finally:
        await store.close()


def _brute_retained_after(s: TopicSubscriptions) -> int:
    last = int(s.last_seq())
    if not s.subs:
        return last
    return min(max(st.consumed, last - st.prefs.messageBound) if st.prefs.messageBound else st.consumed
               for st in s.subs.values())


_OPS = st.lists(st.tuples(st.sampled_from(["sub", "resub", "consume", "unsub", "reset", "publish", "evict"]),
                          st.integers(0, 5), st.integers(0, 40), st.sampled_from([0, 0, 0, 3])),
                max_size=60)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_retained_after_keeps_a_running_minimum_equal_to_the_brute_force_one(
        tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int, int]]) -> None:
    """The running minimum (O(1) per consume) is the minimum over every subscriber's bounded pointer,
    whatever the order of subscribes, consumes, acks on everyone's behalf, resets and unsubscribes."""
    from hub.lifecycle import ack_for_every_subscription

    async def run() -> None:
        store = await open_metastore(f"lmdb://{tmp_path_factory.mktemp('meta')}/meta")
        last = [5]
        try:
            s = TopicSubscriptions(TOPIC, SubscriptionDataManager(store), load_hub_conf(None, {}),
                                   last_seq=lambda: last[0])
            conn = Conn()
            for op, who, seq, bound in ops:
                sub = b"s%d" % who
                if op in ("sub", "resub"):
                    req = pb.SubscribeRequest(createOrAttach=pb.SubscribeRequest.CREATE_OR_ATTACH,
                                              startSeqId=seq if op == "sub" else 0)
                    req.preferences.messageBound = bound
                    await s.subscribe(conn, sub, req)
                elif op == "publish":
                    last[0] += seq % 7
                elif op == "evict":
                    ack_for_every_subscription(s, min(seq, last[0]))
                elif sub not in s.subs:
                    continue
                elif op == "consume":
                    s.consume(conn, sub, seq)
                elif op == "unsub":
                    await s.unsubscribe(conn, sub)
                else:
                    await s.reset(sub, min(seq, last[0]), cache=None)   # type: ignore[arg-type]
                assert s.retained_after() == _brute_retained_after(s), (op, who, seq, bound)
            for st_ in list(s.subs.values()):
                if st_.persisting is not None:
                    await asyncio.gather(st_.persisting, return_exceptions=True)
        finally:
            await store.close()

    asyncio.run(run())
