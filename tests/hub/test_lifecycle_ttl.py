"""hub.lifecycle's message TTL, white-box: which seq id expired (whole ledgers by ledger time, the partly
expired one by its messages' publish times, with few reads) and what expiry does to a dispatcher's cursor."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hub.conf import load_hub_conf
from hub.cursor import AckCursor
from hub.delayed import DelayIndex, now_ms
from hub.dispatch_key_shared import KeySharedDispatcher, key_hash
from hub.dispatch_shared import SharedDispatcher
from hub.lifecycle import ack_for_every_subscription, ttl_expired_seq
from hub.message import Message, MessageId
from hub.metadata import SubscriptionDataManager
from hub.policies import Policy
from hub.proto import pubsub_pb2 as pb
from hub.subscriptions import TopicSubscriptions
from metastore import open_metastore

pytestmark = pytest.mark.asyncio

TTL = Policy(message_ttl_seconds=10)


class Log:
    """A topic log's calls TTL uses: ledgers of ``per`` messages published ``step`` ms apart from t=1000."""

    topic = b"t"

    def __init__(self, n: int, per: int, step: int = 100, first_times: bool = True) -> None:
        self.times = {seq: 1000 + (seq - 1) * step for seq in range(1, n + 1)}
        self.last_seq = n
        self.ranges = pb.LedgerRanges()
        for i, start in enumerate(range(1, n + 1, per)):
            r = self.ranges.ranges.add(ledgerId=i + 1, startSeqIdIncluded=start)
            end = min(n, start + per - 1)
            if end < n:                           # the last one is being written
                r.endSeqIdIncluded.localComponent = end
                if first_times:
                    r.firstPublishTimeMs = self.times[start]
        self.reads: list[int] = []

    def written_through(self) -> list[tuple[int, int]]:
        """Ledger-level time: a ledger counts as written when the next one was created (its first message)."""
        out = []
        rs = self.ranges.ranges
        for i, r in enumerate(rs):
            end = r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded") else self.last_seq
            nxt = self.times[rs[i + 1].startSeqIdIncluded] if i + 1 < len(rs) else self.times[self.last_seq]
            out.append((end, nxt))
        return out

    async def scan(self, start: int, max_messages: int, max_bytes: int) -> list[Message]:
        self.reads.append(start)
        return [Message(b"m", msg_id=MessageId(start), publish_time_ms=self.times[start])]


async def test_whole_ledgers_expire_without_reads_and_the_partly_expired_one_per_message() -> None:
    log = Log(100, per=20)            # message s published at 1000 + 100 (s - 1) ms
    # cutoff = now - 10 s; message 45 is at 5400: now 15_400 expires 1..45 exactly
    assert await ttl_expired_seq(log, TTL, 15_400) == 45   # type: ignore[arg-type]
    assert log.reads and all(41 <= s <= 60 for s in log.reads) and len(log.reads) <= 6, log.reads
    log.reads.clear()
    # every subscription past 45 already: only what is after it is looked at
    assert await ttl_expired_seq(log, TTL, 15_450, floor=45) <= 45   # type: ignore[arg-type]   # nothing new
    assert log.reads == [46]
    log.reads.clear()
    # ledger 2 (21..40) is not wholly expired by ledger time (ledger 3 started at 5000): read per message
    assert await ttl_expired_seq(log, TTL, 14_999) == 40   # type: ignore[arg-type]
    assert all(21 <= s <= 40 for s in log.reads), log.reads
    log.reads.clear()
    # ledger 1 is recorded as first published at 1000: a cutoff before it needs no read at all
    assert await ttl_expired_seq(log, TTL, 10_999) == 0   # type: ignore[arg-type]
    assert log.reads == []
    assert await ttl_expired_seq(log, TTL, 1_000_000) == 100   # type: ignore[arg-type]
    assert await ttl_expired_seq(log, Policy(), 1_000_000) == 0   # type: ignore[arg-type]   # no TTL


async def test_the_ledger_being_written_expires_per_message() -> None:
    log = Log(30, per=100, first_times=False)      # one open ledger: no ledger-level answer
    assert await ttl_expired_seq(log, TTL, 12_000) == 11   # type: ignore[arg-type]   # 11 is at 2000
    assert len(log.reads) <= 7


async def test_a_read_failure_leaves_the_whole_ledgers() -> None:
    log = Log(100, per=20)

    async def broken(start: int, n: int, b: int) -> list[Message]:
        raise OSError("bookie down")
    log.scan = broken   # type: ignore[method-assign]
    assert await ttl_expired_seq(log, TTL, 15_400) == 40   # type: ignore[arg-type]


class Conn:
    def __init__(self) -> None:
        self.got: list[int] = []

    def send_consumer_delivery(self, topic: bytes, sub: bytes, cid: int, wires: list[bytes]) -> None:
        self.got += [pb.Message.FromString(w).msgId.localComponent for w in wires]


class Cache:
    def __init__(self, n: int, key: bytes | None = None) -> None:
        self.n = n
        self.key = key

    def cached(self, topic: bytes, seq: int) -> Message:
        return Message(b"%d" % seq, msg_id=MessageId(seq), key=self.key)

    def cached_run(self, topic: bytes, seq: int, count: int) -> list[Message]:
        return [self.cached(topic, s) for s in range(seq, seq + count)]

    async def scan_single(self, topic: bytes, seq: int) -> Message:
        return self.cached(topic, seq)


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def test_expiry_keeps_the_acks_after_it_and_forgets_what_consumers_held_before_it() -> None:
    cache = Cache(10)
    acked: list[tuple[bool, int]] = []
    d = SharedDispatcher(b"t", b"s", AckCursor(0), cache=cache, last_seq=lambda: cache.n,   # type: ignore[arg-type]
                         on_acked=lambda adv, n: acked.append((adv, n)))
    a, b = Conn(), Conn()
    sa, sb = d.add(a, 1, permits=5), d.add(b, 2, permits=5)
    await settle()
    assert sorted(a.got + b.got) == list(range(1, 11))
    d.ack([2, 7, 9])
    d.redeliver(sa, [a.got[0]] if a.got[0] != 2 else [a.got[1]])   # one waits for redelivery ...
    sa.permits = sb.permits = 0                                        # ... and stays waiting
    assert d.ack_through(6) >= 1
    assert d.cursor.mark_delete == 7 and d.cursor.is_acked(9) and not d.cursor.is_acked(8)
    assert set(d.pending) | d.replay == {8, 10}          # 1..6 are no longer held or waiting
    assert not any(s <= 6 for s in sa.unacked | sb.unacked)
    assert acked[-1][0] is True
    assert d.ack([3, 5]) == 0                             # a late ack of an expired message: ignored
    assert d.redeliver(sa, [1, 3]) == 0                   # and a late nack
    d.flow(sa, 10)
    d.flow(sb, 10)
    await settle()
    later = a.got[5:] + b.got[5:]
    assert all(s in (8, 10) for s in later), later        # nothing acknowledged or expired comes again
    d.ack([8, 10])
    assert d.cursor.mark_delete == 10
    assert d.ack_through(20) == 0 and d.next_read == 21   # past what was read: the dispatcher goes on after it
    await d.stop()


async def test_expiry_frees_a_key_shared_key_held_by_another_consumer() -> None:
    """A key's messages wait while an earlier one is held elsewhere; expiring the held ones lets them go."""
    cache = Cache(3)
    d = KeySharedDispatcher(b"t", b"s", AckCursor(0), cache=cache,   # type: ignore[arg-type]
                            last_seq=lambda: cache.n)
    a, b = Conn(), Conn()
    d.add(a, 1, permits=10)
    slot_b = d.add(b, 2, permits=10)
    key = next(k for k in (b"k%d" % i for i in range(1000)) if d.owner_of(key_hash(k)) is slot_b)
    d.remove(slot_b)
    cache.key = key
    await settle()
    assert a.got == [1, 2, 3]                 # the key's consumer while b is away
    d.add(b, 2, permits=10)                   # the key moves to b: 4..6 wait for a's 1..3
    cache.n = 6
    d.wake()
    await settle()
    assert b.got == [] and d.replay == {4, 5, 6}
    d.ack_through(3)                          # 1..3 expired: a holds nothing of the key now
    await settle()
    assert b.got == [4, 5, 6] and a.got == [1, 2, 3]
    await d.stop()


async def test_expiry_of_a_stored_shared_subscription_no_consumer_attached_keeps_its_ranges(tmp_path: Path) -> None:
    """A SHARED subscription loaded by a (new) owner with acked ranges and no consumer yet: expiry moves its
    pointer through what it covers and stores the ranges after it (nothing acked is delivered again)."""
    store = await open_metastore(f"lmdb://{tmp_path}/meta")
    try:
        mgr = SubscriptionDataManager(store)
        data = pb.SubscriptionData()
        data.preferences.subscriptionType = pb.SHARED
        data.state.msgId.localComponent = 0
        for first, last in ((5, 7), (12, 12)):
            data.state.ackedRanges.add(first=first, last=last)
        await mgr.create_subscription_data(b"t", b"w", data)
        subs = TopicSubscriptions(b"t", mgr, load_hub_conf(None, {"consume_interval": 1}), last_seq=lambda: 20)
        await subs.load()
        assert ack_for_every_subscription(subs, 6) == [b"w"]
        assert subs.subs[b"w"].consumed == 7                    # 1..6 expired, 7 was acked already
        await subs.persist(b"w")
        got = await mgr.read_subscription_data(b"t", b"w")
        assert got is not None
        assert got[0].state.msgId.localComponent == 7
        assert [(r.first, r.last) for r in got[0].state.ackedRanges] == [(12, 12)]
    finally:
        await store.close()


async def test_expiry_forgets_delayed_messages_not_due_yet() -> None:
    later = now_ms() + 3_600_000

    class Delayed(Cache):
        def cached(self, topic: bytes, seq: int) -> Message:
            return Message(b"%d" % seq, msg_id=MessageId(seq), deliver_at_ms=later if seq <= 4 else 0)

    cache = Delayed(6)
    delays = DelayIndex(100)
    d = SharedDispatcher(b"t", b"s", AckCursor(0), cache=cache, last_seq=lambda: cache.n,   # type: ignore[arg-type]
                         delays=delays)
    a = Conn()
    d.add(a, 1, permits=10)
    await settle()
    assert a.got == [5, 6] and len(delays) == 4          # 1..4 wait an hour
    d.ack_through(3)
    assert len(delays) == 1 and d.stats()["delayed"] == 1  # only 4 still waits
    await d.stop()
