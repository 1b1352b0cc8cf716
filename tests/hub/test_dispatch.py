"""hub.dispatch*: who gets which message, with an in-memory log in place of the read-ahead cache."""

from __future__ import annotations

import asyncio
import collections

import pytest

from hub.cursor import AckCursor
from hub.dispatch import ROUND_ROBIN_BATCH, Dispatcher
from hub.dispatch_failover import FailoverDispatcher
from hub.dispatch_key_shared import KeySharedDispatcher
from hub.dispatch_shared import SharedDispatcher
from hub.message import Message, MessageId

pytestmark = pytest.mark.asyncio


class Log:
    """The cache's three calls, over a list of messages (seq ids 1..n)."""

    def __init__(self) -> None:
        self.msgs: list[Message] = []

    def add(self, key: bytes | None = None) -> None:
        self.msgs.append(Message(str(len(self.msgs) + 1).encode(), msg_id=MessageId(len(self.msgs) + 1), key=key))

    def cached(self, topic: bytes, seq: int) -> Message | None:
        return self.msgs[seq - 1]

    def cached_run(self, topic: bytes, seq: int, count: int) -> list[Message]:
        return self.msgs[seq - 1:seq - 1 + count]

    async def scan_single(self, topic: bytes, seq: int) -> Message:
        return self.msgs[seq - 1]


class Conn:
    def __init__(self) -> None:
        self.got: list[int] = []
        self.arrived = asyncio.Event()

    def send_consumer_delivery(self, topic: bytes, sub: bytes, cid: int, wires: list[bytes]) -> None:
        from hub.proto import pubsub_pb2 as pb

        self.got += [pb.Message.FromString(w).msgId.localComponent for w in wires]
        self.arrived.set()


def make(cls: type[Dispatcher], log: Log) -> Dispatcher:
    return cls(b"t", b"s", AckCursor(0), cache=log, last_seq=lambda: len(log.msgs))  # type: ignore[arg-type]


async def settle(d: Dispatcher) -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def test_shared_round_robin_respects_permits_and_redelivers_a_leavers_messages() -> None:
    log = Log()
    for _ in range(10):
        log.add()
    d = make(SharedDispatcher, log)
    a, b = Conn(), Conn()
    sa = d.add(a, 1, 3)
    sb = d.add(b, 2, 100)
    await settle(d)
    assert len(a.got) == 3 and len(b.got) == 7 and sorted(a.got + b.got) == list(range(1, 11))
    d.ack(a.got[:1])
    d.remove(sa)
    await settle(d)
    assert sorted(b.got) == sorted(set(range(1, 11)) - {a.got[0]})
    assert d.counts == {s: 1 for s in a.got[1:]} and d.redelivered_total == 2
    d.ack(range(1, 11))
    assert d.cursor.mark_delete == 10 and not sb.unacked
    await d.stop()


async def test_shared_hands_a_pass_out_in_runs_and_rotates_between_passes() -> None:
    log = Log()
    d = make(SharedDispatcher, log)
    a, b = Conn(), Conn()
    d.add(a, 1, 1000)
    d.add(b, 2, 1000)
    for _ in range(4):                       # one message per pass (published one at a time): one by one
        log.add()
        d.wake()
        await settle(d)
    assert (a.got, b.got) == ([1, 3], [2, 4])
    for _ in range(ROUND_ROBIN_BATCH + 10):  # one pass finds them all: a run, then the next consumer
        log.add()
    d.wake()
    await settle(d)
    run = list(range(5, 5 + ROUND_ROBIN_BATCH))
    assert a.got == [1, 3, *run] and b.got == [2, 4, *range(5 + ROUND_ROBIN_BATCH, 15 + ROUND_ROBIN_BATCH)]
    await d.stop()


class OneByOne(SharedDispatcher):
    """SHARED without ``_give_run``: every message through ``choose`` and ``_give``."""

    gives_runs = False


class Frames(Conn):
    """A connection that keeps each delivery frame's seq ids apart."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[list[int]] = []

    def send_consumer_delivery(self, topic: bytes, sub: bytes, cid: int, wires: list[bytes]) -> None:
        before = len(self.got)
        super().send_consumer_delivery(topic, sub, cid, wires)
        self.frames.append(self.got[before:])


@pytest.mark.parametrize("seed", range(12))
async def test_shared_runs_are_handed_out_as_one_by_one(seed: int) -> None:
    """A SHARED pass gives a consumer its share of a run at once (``_give_run``): the frames, permits,
    holders and rotation are those of choosing and giving each message (random publishes, flows, acks
    and a leaver)."""
    import random

    rnd = random.Random(seed)
    log = Log()
    runs, single = make(SharedDispatcher, log), make(OneByOne, log)
    conns: dict[Dispatcher, list[Frames]] = {runs: [], single: []}
    slots: dict[Dispatcher, list] = {runs: [], single: []}
    for d in (runs, single):
        conns[d].extend(Frames() for _ in range(4))
    permits = [rnd.randrange(0, 130) for _ in range(4)]
    for d in (runs, single):
        for i in range(4):
            slots[d].append(d.add(conns[d][i], i + 1, permits[i]))
    for _ in range(30):
        what = rnd.random()
        if what < 0.4:
            for _ in range(rnd.randrange(1, 150)):
                log.add()
            args: tuple = ()
        elif what < 0.7:
            args = (rnd.randrange(4), rnd.randrange(1, 80))
        elif what < 0.95:
            args = (rnd.sample(sorted(runs.pending), min(len(runs.pending), rnd.randrange(0, 120))),)
        else:
            args = (None,)
        for d in (runs, single):
            if len(args) == 2:
                d.flow(slots[d][args[0]], args[1])
            elif len(args) == 1 and args[0] is not None:
                d.ack(sorted(args[0]) if rnd.random() < 0.7 else args[0])
            elif len(args) == 1 and len(d.consumers) > 1:
                d.remove(d.consumers[0])
            d.wake()
            await settle(d)
        assert [c.frames for c in conns[runs]] == [c.frames for c in conns[single]]
        assert runs.pending.keys() == single.pending.keys() and runs.next_read == single.next_read
        assert [(s.permits, s.delivered, sorted(s.unacked)) for s in slots[runs]] == \
            [(s.permits, s.delivered, sorted(s.unacked)) for s in slots[single]]
        assert (runs._rr, runs.counts, runs.cursor.mark_delete) == \
            (single._rr, single.counts, single.cursor.mark_delete)
    assert sum(len(c.got) for c in conns[runs]) > 0
    await runs.stop()
    await single.stop()


async def test_failover_only_the_first_gets_and_the_next_continues_from_the_first_unacked() -> None:
    log = Log()
    for _ in range(6):
        log.add()
    d = make(FailoverDispatcher, log)
    a, b = Conn(), Conn()
    sa = d.add(a, 1, 100)
    d.add(b, 2, 100)
    await settle(d)
    assert a.got == [1, 2, 3, 4, 5, 6] and b.got == []
    d.ack_cumulative(sa, 2)
    d.remove(sa)
    await settle(d)
    assert b.got == [3, 4, 5, 6]
    await d.stop()


async def test_key_shared_a_key_waits_for_its_outstanding_messages_before_moving() -> None:
    log = Log()
    d = make(KeySharedDispatcher, log)
    assert isinstance(d, KeySharedDispatcher)
    a, b = Conn(), Conn()
    d.add(a, 1, 1000)
    keys = [f"k{i}".encode() for i in range(40)]
    for k in keys:
        log.add(k)
    d.wake()
    await settle(d)
    assert len(a.got) == 40
    d.add(b, 2, 1000)                          # some keys now hash to b, but a holds their messages
    for k in keys:
        log.add(k)
    d.wake()
    await settle(d)
    assert b.got == [] and len(a.got) == 80 - len(d.replay)
    moved = [s for s in d.replay]
    assert moved, "b owns some keys"
    d.ack(range(1, 41))                        # a acknowledges the first round: the moved keys go to b
    await settle(d)
    assert sorted(b.got) == sorted(moved)
    owner = collections.defaultdict(set)
    for conn, got in (("a", a.got[40:]), ("b", b.got)):
        for seq in got:
            owner[log.msgs[seq - 1].key].add(conn)
    assert all(len(v) == 1 for v in owner.values())
    await d.stop()


async def test_key_shared_a_joining_consumer_moves_only_its_share() -> None:
    log = Log()
    d = make(KeySharedDispatcher, log)
    assert isinstance(d, KeySharedDispatcher)
    slots = [d.add(Conn(), i, 0) for i in range(4)]
    from hub.dispatch_key_shared import key_hash

    hashes = [key_hash(f"user-{i}".encode()) for i in range(2000)]
    before = [d.owner_of(h) for h in hashes]
    d.add(Conn(), 9, 0)
    after = [d.owner_of(h) for h in hashes]
    moved = [(x, y) for x, y in zip(before, after, strict=True) if x is not y]
    assert 0 < len(moved) < 2000 * 0.35                    # about a fifth, not a reshuffle
    assert all(y.consumer_id == 9 for _, y in moved)       # and only to the newcomer
    assert {s.consumer_id for s in before} == {s.consumer_id for s in slots}
    await d.stop()


async def test_messages_stored_before_the_new_fields_read_with_their_defaults() -> None:
    from hub.proto import pubsub_pb2 as pb

    old = pb.MessageBatch(first_local_seq_id=1, messages=[pb.Message(body=b"x", srcRegion=b"standalone")])
    msg = Message.from_proto(pb.MessageBatch.FromString(old.SerializeToString()).messages[0])
    assert (msg.key, msg.publish_time_ms, msg.redelivery_count) == (None, 0, 0)
    keyed = Message.from_proto(pb.Message.FromString(Message(b"y", key=b"", publish_time_ms=5).wire))
    assert (keyed.key, keyed.publish_time_ms) == (b"", 5)          # an empty key is a key, not None
    assert pb.Message.FromString(keyed.redelivered_wire(3)).redeliveryCount == 3
    assert keyed.redelivered_wire(0) is keyed.wire


async def test_permits_at_the_tail_do_not_wake_the_dispatcher_but_permits_for_waiting_messages_do() -> None:
    log = Log()
    for _ in range(4):
        log.add()
    d = make(SharedDispatcher, log)
    a = Conn()
    slot = d.add(a, 1, 2)
    await settle(d)
    assert a.got == [1, 2]
    d.flow(slot, 5)                      # messages 3 and 4 wait for permits: a pass hands them out
    await asyncio.wait_for(a.arrived.wait(), 5)
    await settle(d)
    assert a.got == [1, 2, 3, 4]
    d.flow(slot, 5)                      # nothing unread, nothing to redeliver: no pass
    assert not d._wake.is_set()
    d.redeliver(slot, [2])               # one goes back (a nack): handed out again
    await settle(d)
    assert a.got == [1, 2, 3, 4, 2] and d.counts == {2: 1}
    log.add()                            # a new message wakes it as the owner's wake_all does
    d.wake()
    await settle(d)
    assert a.got[-1] == 5
    await d.stop()
