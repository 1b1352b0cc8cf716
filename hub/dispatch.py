"""Dispatch of one subscription's messages to its attached consumers (Pulsar's consumer model).

    d = SharedDispatcher(topic, sub, cursor, cache=cache, last_seq=lambda: log.last_seq)
    slot = d.add(conn, consumer_id=1, permits=1000, address="10.0.0.7:5123")
    d.flow(slot, 500)            # the consumer takes 500 more messages (Pulsar's flow permits)
    d.ack([7, 9])                # individual acks, any order
    d.ack_cumulative(slot, 12)   # EXCLUSIVE / FAILOVER
    d.ack_through(40)            # message TTL, backlog eviction: on every consumer's behalf
    d.redeliver(slot, [8])       # a nack or an ack timeout (the client decides when)
    d.remove(slot)               # detached or its connection dropped: its unacked go to the others
    await d.stop()

The base class owns the cursor (``hub.cursor.AckCursor``), what each
consumer holds unacknowledged (``pending``), the messages waiting to be
handed out again (``replay``, always before newer ones, in seq order) and
each message's redelivery count (in memory, as Pulsar's
``InMemoryRedeliveryTracker``: after an owner change counts restart at 0).
Subclasses decide who gets a message (``choose``): ``SharedDispatcher``
(round-robin among consumers with permits), ``FailoverDispatcher`` (the
first attached), ``KeySharedDispatcher`` (consistent hashing of the key).

A consumer gets messages only while it has permits: each message handed to
it takes one; the client gives them back as its application receives
(``flow``). Redelivery adds one to a message's ``redelivery_count`` each time
it goes back (``redeliver``, ``remove``). Acks of messages that are not
outstanding (never delivered, or acknowledged already) are ignored.
``on_acked(advanced, n)`` tells the owner after ``n`` acks (``advanced``: the
mark-delete point moved), so it can persist the cursor.

Delayed delivery (``hub.delayed``): a dispatcher given a ``DelayIndex``
(SHARED and KEY_SHARED subscriptions) holds a message that is not due yet
back in it while later messages go on, with one timer for the earliest due
time; a due message is handed out as a redelivery is (before newer ones, in
seq order), with ``redelivery_count`` 0.

Failure: a message deleted under the subscription (it can only be one an
operator reset past) is skipped as acknowledged; any other read error is
logged and retried on the next wake.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from hub import errors
from hub.cursor import AckCursor
from hub.delayed import DelayIndex, now_ms
from hub.message import Message

if TYPE_CHECKING:
    from hub.readahead import ReadAheadCache

log = logging.getLogger(__name__)

__all__ = ["RATE_WINDOW", "ConsumerLink", "ConsumerSlot", "Dispatcher", "OutRate"]

RATE_WINDOW = 10.0   # seconds over which ``OutRate`` measures


class OutRate:
    """Messages handed out per second over about the last ``RATE_WINDOW`` seconds (sampled, not per message)."""

    def __init__(self) -> None:
        self.total = 0
        self._samples: collections.deque[tuple[float, int]] = collections.deque([(time.monotonic(), 0)])

    def add(self, n: int) -> None:
        self.total += n
        now = time.monotonic()
        if now - self._samples[-1][0] >= 1.0:
            self._samples.append((now, self.total))
            while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW:
                self._samples.popleft()

    def rate(self) -> float:
        when, total = self._samples[0]
        elapsed = time.monotonic() - when
        return (self.total - total) / elapsed if elapsed > 0 else 0.0

_YIELD_EVERY = 128
"""Messages handed out before the dispatch task flushes its frames and yields once: more than a run
(``ROUND_ROBIN_BATCH``), so a run goes in one frame (at 64 a run of 100 went as 64 and 36)."""
ROUND_ROBIN_BATCH = 100
"""Messages in a row to one consumer before round-robin moves on (Pulsar's dispatcherMaxRoundRobinBatchSize,
there 20, where a producer's batch of up to 1000 messages is one entry and goes to one consumer whole):
runs make fuller delivery frames and ack requests than one message each. 50 rather than 20: on ``quire bench
queue --consumers 4`` (receiver queue 100) it gave 15-28 % more msg/s and 2-5 µs less hub CPU per message in
three of three interleaved pairs; a consumer's permits still bound its run. 100 rather than 50 (issue 29): a
consumer's run then fills its receiver queue's worth of a publish batch (delivery frames of 50 messages on average
instead of 33, ack requests of 66 instead of 43), and in six of six interleaved pairs it cost 0.9-1.5 µs less
client CPU per message, in five of six 0.7-1.5 µs less hub CPU, with 5-20 % fewer acked-state writes. A run does
not outlast the dispatch pass that started it: messages published one at a time (one pass each) go round-robin
one by one."""
BATCH_BYTES = 64 * 1024    # a consumer's delivery frame is sent before it would pass this


class ConsumerLink(Protocol):
    """What a dispatcher needs of a consumer's connection (permits bound what it is sent), and what its
    subscription tells the consumer (``send_event``); the connection is a ``hub.substate.Attachment``."""

    def send_consumer_delivery(self, topic: bytes, subscriber: bytes, consumer_id: int,
                               wires: list[bytes]) -> None: ...

    def send_event(self, topic: bytes, subscriber: bytes, event: int, consumer_id: int = 0) -> None: ...


class ConsumerSlot:
    """One attached consumer: its connection and id, permits, and what it holds unacknowledged."""

    __slots__ = ("address", "conn", "consumer_id", "delivered", "name", "permits", "unacked")

    def __init__(self, conn: ConsumerLink, consumer_id: int, permits: int, name: str, address: str = "") -> None:
        self.conn = conn
        self.consumer_id = consumer_id
        self.permits = permits
        self.name = name               # stable while attached (key-shared hashing)
        self.address = address
        self.unacked: set[int] = set()
        self.delivered = 0             # messages handed to it (stats)

    def __repr__(self) -> str:
        return f"<consumer {self.consumer_id} at {self.address or '?'}: {self.permits} permits, " \
               f"{len(self.unacked)} unacked>"


class Dispatcher:
    """See the module docstring. Subclasses implement ``choose``."""

    kind = "SHARED"
    wake_on_ack = True
    gives_runs = False
    """Whether ``_give_run`` hands a run of new messages out as ``choose`` and ``_give`` would one by one."""
    """Whether an individual ack can let a message go that ``choose`` held back (a key-shared hash that was
    busy); without it an ack wakes the dispatch task only when it shrinks the replay (the pass stops at a
    limit on it). Permits come back with flow requests, which always wake it."""

    def __init__(self, topic: bytes, subscriber: bytes, cursor: AckCursor, *, cache: ReadAheadCache,
                 last_seq: Callable[[], int], on_acked: Callable[[bool, int], None] | None = None,
                 delays: DelayIndex | None = None) -> None:
        self.topic = topic
        self.subscriber = subscriber
        self.cursor = cursor
        self.cache = cache
        self.last_seq = last_seq
        self.on_acked = on_acked
        self.consumers: list[ConsumerSlot] = []   # attach order
        self.pending: dict[int, ConsumerSlot] = {}
        self.replay: set[int] = set()
        self.counts: dict[int, int] = {}
        self.next_read = cursor.mark_delete + 1
        self.redelivered_total = 0
        self.out = OutRate()
        self._names = 0
        self._rr = 0
        self._run_left = 0         # messages the current round-robin consumer may still take in a row
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.delays = delays                # messages not due yet (hub.delayed); None: delays are ignored
        self._delay_timer: asyncio.TimerHandle | None = None
        self._delay_timer_at = 0            # the due time (epoch ms) the timer is set for
        self._resets = 0                    # skip_to calls (a rescan of the log that spans one stops)

    # --- consumers --------------------------------------------------------------------------------
    def find(self, conn: ConsumerLink, consumer_id: int) -> ConsumerSlot | None:
        for slot in self.consumers:
            if slot.conn is conn and slot.consumer_id == consumer_id:
                return slot
        return None

    def add(self, conn: ConsumerLink, consumer_id: int, permits: int, address: str = "") -> ConsumerSlot:
        """Attach a consumer (the same connection and id again: that one, its permits topped up)."""
        slot = self.find(conn, consumer_id)
        if slot is None:
            self._names += 1
            slot = ConsumerSlot(conn, consumer_id, permits, f"c{self._names}", address)
            self.consumers.append(slot)
            self._joined(slot)
        else:
            slot.permits = max(slot.permits, permits)
        self._start()
        self.wake()
        return slot

    def remove(self, slot: ConsumerSlot) -> None:
        """Detach ``slot``: what it held unacknowledged is handed out again (redelivery count + 1)."""
        if slot not in self.consumers:
            return
        self.redeliver(slot, None)
        self.consumers.remove(slot)
        self._left(slot)
        self.wake()

    def _joined(self, slot: ConsumerSlot) -> None:
        """A consumer attached (subclasses: hash rings)."""

    def _left(self, slot: ConsumerSlot) -> None:
        """A consumer detached, after its messages went back (subclasses: hash rings)."""

    # --- flow and acks ----------------------------------------------------------------------------
    def flow(self, slot: ConsumerSlot, permits: int) -> None:
        slot.permits += permits
        if self._has_work():
            self.wake()

    def _has_work(self) -> bool:
        """Whether a pass could hand anything out: a message waits for redelivery, is not read yet, or is
        delayed. At the tail, most permits come back with nothing to deliver (a pass then does nothing: on
        ``quire bench queue --consumers 4`` more than half of all passes did); a new message wakes the task."""
        delays = self.delays
        return bool(self.replay) or self.next_read <= self.last_seq() or (
            delays is not None and (len(delays) > 0 or delays.overflow_from is not None))

    def ack(self, seqs: Iterable[int]) -> int:
        """Acknowledge ``seqs`` individually (whoever holds them); how many were outstanding."""
        cursor, pending, replay, counts = self.cursor, self.pending, self.replay, self.counts
        before = cursor.mark_delete
        freed = False
        outstanding: list[int] = []
        keep = outstanding.append
        # only dispatchers that keep per-holder state (key-shared) need the call per message
        released = self._released if type(self)._released is not Dispatcher._released else None
        for seq in seqs:
            holder = pending.pop(seq, None)
            if holder is not None:
                holder.unacked.discard(seq)
                if released is not None:
                    released(holder, seq)
            elif seq in replay:
                replay.discard(seq)
                freed = True
            else:
                continue
            if counts:
                counts.pop(seq, None)
            keep(seq)
        n = cursor.ack_many(outstanding)   # a consumer's run of acks is one range
        if n:
            self._acked(before, n, freed or self.wake_on_ack)
        return n

    def ack_cumulative(self, slot: ConsumerSlot | None, upto: int) -> int:
        """Acknowledge everything up to ``upto`` (not past what was read); how many outstanding messages that
        covered."""
        return self.ack_through(min(upto, self.next_read - 1))

    def ack_through(self, upto: int) -> int:
        """Acknowledge everything up to ``upto`` on the subscription's behalf (message TTL, backlog eviction),
        read or not; how many outstanding messages that covered.

        Messages a consumer holds unacknowledged up to ``upto`` count as
        acknowledged (Pulsar's expiry moves the mark-delete point past them):
        they are not redelivered, and the consumer's later ack or nack of them
        is ignored. Delayed messages up to ``upto`` that are not due yet are
        forgotten. Acknowledged ranges after ``upto`` are kept."""
        before = self.cursor.mark_delete
        n = 0
        for seq in [s for s in self.pending if s <= upto]:
            holder = self.pending.pop(seq)
            holder.unacked.discard(seq)
            self._released(holder, seq)
            n += 1
        for seq in [s for s in self.replay if s <= upto]:
            self.replay.discard(seq)
            n += 1
        for seq in [s for s in self.counts if s <= upto]:
            del self.counts[seq]
        if self.delays is not None:          # delayed ones not due yet expire too
            self.delays.forget_through(upto)
        self.cursor.ack_through(upto)
        self.next_read = max(self.next_read, upto + 1)
        if self.cursor.mark_delete != before or n:
            self._acked(before, max(n, 1))
        return n

    def _acked(self, before: int, n: int, wake: bool = True) -> None:
        if wake:
            self.wake()     # a key-shared hash may be free now, or the replay under its limit
        if self.on_acked is not None:
            self.on_acked(self.cursor.mark_delete != before, n)

    def redeliver(self, slot: ConsumerSlot, seqs: Iterable[int] | None) -> int:
        """Hand ``seqs`` (None: all) that ``slot`` holds to the consumers again; how many went back."""
        chosen = list(slot.unacked) if seqs is None else [s for s in seqs if self.pending.get(s) is slot]
        for seq in chosen:
            del self.pending[seq]
            slot.unacked.discard(seq)
            self._released(slot, seq)
            self.counts[seq] = self.counts.get(seq, 0) + 1
            self.replay.add(seq)
        self.redelivered_total += len(chosen)
        if chosen:
            self.wake()
        return len(chosen)

    def skip_to(self, mark_delete: int) -> None:
        """The consume pointer moved to ``mark_delete`` by other means (a Hedwig consume, an operator's reset):
        forget everything outstanding and deliver from after it."""
        for slot in self.consumers:
            for seq in list(slot.unacked):
                self._released(slot, seq)
            slot.unacked.clear()
        self.pending.clear()
        self.replay.clear()
        self.counts.clear()
        if self.delays is not None:
            self.delays.clear()
            self._resets += 1
        self.cursor.reset(mark_delete)
        self.next_read = mark_delete + 1
        self.wake()

    # --- choosing ---------------------------------------------------------------------------------
    def choose(self, seq: int, msg: Message, blocked: set[int]) -> ConsumerSlot | None:
        """The consumer to get ``msg`` now, or None (it waits in ``replay``). ``blocked``: per-pass state."""
        raise NotImplementedError

    def _round_robin(self) -> ConsumerSlot | None:
        """The next consumer with a free permit, taking up to ``ROUND_ROBIN_BATCH`` in a row."""
        consumers = self.consumers
        n = len(consumers)
        if not n:
            return None
        if self._run_left > 0:
            slot = consumers[(self._rr - 1) % n]
            if slot.permits > 0:
                self._run_left -= 1
                return slot
        for i in range(n):
            slot = consumers[(self._rr + i) % n]
            if slot.permits > 0:
                self._rr = (self._rr + i + 1) % n
                self._run_left = ROUND_ROBIN_BATCH - 1
                return slot
        return None

    def has_permits(self) -> bool:
        return any(slot.permits > 0 for slot in self.consumers)

    def _given(self, slot: ConsumerSlot, seq: int, msg: Message) -> None:
        """``msg`` went to ``slot`` (subclasses: per-key bookkeeping)."""

    def _released(self, slot: ConsumerSlot, seq: int) -> None:
        """``slot`` no longer holds ``seq`` (acked or going back)."""

    # --- the task ---------------------------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def _start(self) -> None:
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while self.consumers:
            self._wake.clear()
            try:
                await self._pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatch of %r/%r failed; retried at the next wake", self.topic, self.subscriber)
            if not self._wake.is_set():
                await self._wake.wait()

    async def _fetch(self, seq: int, out: dict[ConsumerSlot, list[bytes]]) -> Message | None:
        """Message ``seq`` from the log (``_pass`` takes a cached one itself: no coroutine per message)."""
        msg = self.cache.cached(self.topic, seq)
        if msg is not None:
            return msg
        self._flush(out)
        try:
            return await self.cache.scan_single(self.topic, seq)
        except errors.NoTopicPersistenceInfoError:
            log.warning("%r/%r: message %d was deleted before it was acknowledged; skipped", self.topic,
                        self.subscriber, seq)
            self.replay.discard(seq)
            self.counts.pop(seq, None)
            self.cursor.ack(seq)
            return None

    def _flush(self, out: dict[ConsumerSlot, list[bytes]]) -> None:
        for slot, wires in out.items():
            if wires and slot in self.consumers:
                slot.conn.send_consumer_delivery(self.topic, self.subscriber, slot.consumer_id, wires)
                self.out.add(len(wires))
        out.clear()

    def _give(self, slot: ConsumerSlot, seq: int, msg: Message, out: dict[ConsumerSlot, list[bytes]]) -> None:
        slot.permits -= 1
        slot.unacked.add(seq)
        slot.delivered += 1
        self.pending[seq] = slot
        self._given(slot, seq, msg)
        wires = out.get(slot)
        if wires is None:
            wires = out[slot] = []
        counts = self.counts
        wires.append(msg.redelivered_wire(counts[seq]) if counts and seq in counts else msg.wire)
        if len(wires) >= 256:
            self._flush(out)

    def _give_run(self, run: list[Message], seq: int, out: dict[ConsumerSlot, list[bytes]]) -> int:
        """Give ``run`` (seq ids ``seq``, ``seq + 1``, ...: new, unacknowledged, not delayed, not redelivered)
        to the consumers; how many went (fewer: no consumer has permits left). Subclasses that set
        ``gives_runs``."""
        raise NotImplementedError

    async def _pass(self) -> None:
        """Hand out what can go now: first what waits for redelivery (seq order), then new messages."""
        out: dict[ConsumerSlot, list[bytes]] = {}
        blocked: set[int] = set()
        handed = 0
        delays = self.delays
        self._run_left = 0     # a run is one pass's: the next pass starts with the next consumer
        try:
            if delays is not None:
                await self._due(delays, out)
            if self.replay:
                for seq in sorted(self.replay):
                    if not self.has_permits():
                        return
                    if seq not in self.replay:
                        continue
                    if self.cursor.is_acked(seq):
                        self.replay.discard(seq)
                        continue
                    msg = await self._fetch(seq, out)
                    if msg is None or seq not in self.replay:
                        continue
                    slot = self.choose(seq, msg, blocked)
                    if slot is None:
                        continue
                    self.replay.discard(seq)
                    self._give(slot, seq, msg, out)
                    handed += 1
            await self._pass_new(out, blocked, handed)
        finally:
            self._flush(out)
            if delays is not None:
                self._arm_delay_timer(delays)

    async def _pass_new(self, out: dict[ConsumerSlot, list[bytes]], blocked: set[int], handed: int) -> None:
        """``_pass``'s second half: new messages in seq order while a consumer has permits.

        Cached messages are taken in runs (``ReadAheadCache.cached_run``),
        without a call or an await per message; whether any consumer has
        permits is asked again only when the one just given to has none left
        (or after an await), and ``last_seq`` only after an await (it moves
        only between loop turns). A miss is read on its own (``_fetch``).
        """
        cursor, replay, cache, topic, delays = self.cursor, self.replay, self.cache, self.topic, self.delays
        limit = max(1000, sum(s.permits for s in self.consumers))
        last, permitted = self.last_seq(), self.has_permits()
        yielded = handed
        while permitted and self.next_read <= last and len(replay) < limit:
            seq = self.next_read
            if cursor.is_acked(seq):
                self.next_read = seq + 1
                continue
            run = cache.cached_run(topic, seq, min(last - seq + 1, _YIELD_EVERY))
            if self.gives_runs and run and not self.counts and cursor.unacked_from(seq) and not (
                    delays is not None and any(m.deliver_at_ms for m in run)):
                given = self._give_run(run, seq, out)    # what the loop below does, a consumer's share at once
                seq += given
                handed += given
                self.next_read = max(self.next_read, seq)
                permitted = given == len(run) and self.has_permits()
                run = []
            elif not run:
                msg = await self._fetch(seq, out)
                last, permitted = self.last_seq(), self.has_permits()
                self.next_read = max(self.next_read, seq + 1)
                if msg is None:
                    continue
                run = [msg]          # handed out below even without permits now: choose() decides
            for msg in run:
                if self.next_read <= seq:
                    self.next_read = seq + 1
                if cursor.is_acked(seq):
                    pass
                elif delays is not None and msg.deliver_at_ms and msg.deliver_at_ms > now_ms():
                    delays.defer(seq, msg.deliver_at_ms)   # held back (or left to the log: found again)
                    handed += 1
                else:
                    slot = self.choose(seq, msg, blocked)
                    if slot is None:
                        replay.add(seq)
                    else:
                        self._give(slot, seq, msg, out)
                        handed += 1
                        if slot.permits <= 0:
                            permitted = self.has_permits()
                seq += 1
                if not permitted or len(replay) >= limit:
                    break
            if handed - yielded >= _YIELD_EVERY:
                yielded = handed
                self._flush(out)
                await asyncio.sleep(0)
                last, permitted = self.last_seq(), self.has_permits()

    # --- delayed delivery (hub.delayed) ---------------------------------------------------------------
    async def _due(self, delays: DelayIndex, out: dict[ConsumerSlot, list[bytes]]) -> None:
        """Move what is due to ``replay``; past the index's capacity, read the log again for what it left there."""
        for seq in delays.pop_due(now_ms()):
            if seq not in self.pending and not self.cursor.is_acked(seq):
                self.replay.add(seq)
        start = delays.rescan_from()
        if start is None:
            return
        seq = start
        resets = self._resets
        end = self.next_read
        while seq < end:
            if seq not in self.pending and seq not in self.replay and not self.cursor.is_acked(seq):
                msg = await self._fetch(seq, out)
                if resets != self._resets:
                    return          # reset meanwhile: the index was cleared
                if msg is not None:
                    if msg.deliver_at_ms > now_ms():
                        if not delays.track(seq, msg.deliver_at_ms):
                            return  # full again: resumes at seq
                    else:
                        self.replay.add(seq)
            seq += 1
            if seq % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
                if resets != self._resets:
                    return
        delays.rescanned(seq, done=True)

    def _arm_delay_timer(self, delays: DelayIndex) -> None:
        """One timer per subscription, for the earliest due time held (it wakes the dispatcher)."""
        due = delays.next_due()
        timer = self._delay_timer
        if timer is not None and (due is None or due != self._delay_timer_at):
            timer.cancel()
            self._delay_timer = timer = None
        if due is not None and timer is None:
            self._delay_timer_at = due
            self._delay_timer = asyncio.get_running_loop().call_later(
                max(0.0, (due - now_ms()) / 1000.0) + 0.001, self._delay_due)

    def _delay_due(self) -> None:
        self._delay_timer = None
        self.wake()

    def stats(self) -> dict[str, Any]:
        """The admin API's view: consumers (address, unacked, permits), unacked, redelivered_total, msg_rate_out."""
        return {"consumers": [{"address": s.address, "consumer_id": s.consumer_id, "unacked": len(s.unacked),
                               "permits": s.permits, "delivered": s.delivered} for s in self.consumers],
                "unacked": len(self.pending), "waiting_redelivery": len(self.replay),
                "delayed": len(self.delays) if self.delays is not None else 0,
                "delayed_overflow": self.delays is not None and self.delays.overflow_from is not None,
                "redelivered_total": self.redelivered_total, "msg_rate_out": round(self.out.rate(), 3)}
