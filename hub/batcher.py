"""Publishes of a topic's log batched into ledger entries, DistributedLog-style, with dense seq ids.

    topic_log.submit(message, done)             # done(seq, None) once durable, done(0, error) if not
    fut = topic_log.enqueue(message); seq = await topic_log.publish(message)
    topic_log.send_queued()                     # the server: the publishes of this read leave now

``EntryBatcher`` is the publishing half of ``hub.persistence.TopicLog`` (a
mixin: the ledger it writes to, its ranges and the dedup state belong to
the log). A publish that finds no add in flight is sent at once (with the
other publishes of the same read); publishes arriving while adds are in
flight queue up and leave together as one ``MessageBatch`` entry, bounded
by ``max_batch_messages`` / ``max_batch_bytes``, once no add is in flight
or ``batch_flush_bytes`` have queued (up to ``max_outstanding_adds``). Two
keys shorten that hold: with ``batch_hold_after_adds`` N, a publish goes
out at once while fewer than N adds are in flight and the newest of them is
light (at most ``LIGHT_ENTRY_MESSAGES`` messages: BookKeeper's pipelined adds
for single publishes, while publishes that batch anyway hold as with 1; 1
holds behind any add; the default is 3, issue 32); with ``batch_flush_delay_ms`` T, a queue
goes out at most T after its first publish queued (DistributedLog's
periodic flush; 0 is no bound). Neither changes what an acknowledgement
means: entries complete in entry order, so seq ids stay dense. An
acknowledged entry completes its publishes, then goes to ``on_persisted``.
The ledger rolls after ``max_entries_per_ledger`` entries.

Failure: see ``hub.persistence`` (a failed add fails its batch and every
publish queued behind it with ``ServiceDownError``; ledger start failures
back off).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import operator
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from hub import errors, tracing
from hub.body_publish import StampedBody
from hub.conf import HubConf
from hub.dedup import ProducerDedup
from hub.entry_index import EntryIndex
from hub.frames import batch_entry
from hub.proto import pubsub_pb2 as pb
from metastore.idle import IDLE
from metastore.tasks import spawn

if TYPE_CHECKING:
    from bookie.ledger import LedgerHandle
    from hub.metadata import TopicDedupManager

log = logging.getLogger("hub.persistence")   # these lines have always been the log's

__all__ = ["Batch", "Done", "EntryBatcher", "Gate", "InflightAdd", "Persisted", "Queued", "RunDone"]


Done = Callable[[int, BaseException | None], None]
"""A publish's completion: ``(seq_id, None)`` once durable, ``(0, error)`` when it failed."""
Queued = pb.Message | StampedBody
"""A queued publish's message: a ``pb.Message``, or a body publish's ``StampedBody`` (the server's most frequent
publish, queued without a protobuf message: it reads as the fields the log uses)."""
Batch = list[tuple[Queued, Done, bytes | None]]
"""Queued publishes: ``(message, done, wire)``, ``wire`` the message serialized when the server made it
already (``submit_all``), else None."""
Persisted = Callable[[bytes, int, list[Queued], list[bytes]], None]
"""``on_persisted(topic, first, messages, wires)``: an acknowledged entry's messages (seq ids ``first``,
``first + 1``, ...; their ``msgId`` is not set) and each one's serialization as stored."""


class InflightAdd:
    """One entry sent to the ledger: its batch and, once the add's callback ran, the outcome."""

    __slots__ = ("batch", "error", "first", "lh", "settled", "wires")

    def __init__(self, lh: LedgerHandle, first: int, batch: Batch, wires: list[bytes]) -> None:
        self.lh = lh
        self.first = first
        self.batch = batch
        self.wires = wires              # each message serialized, as in the entry
        self.settled = False
        self.error: BaseException | None = None


class Gate(Protocol):
    """What the log asks of its gate (``hub.lifecycle.BacklogQuota``) before queueing publishes: the object
    itself, not bound methods, so an owned topic holds no extra object for it (issue 34)."""

    def admit(self, message: Queued, done: Done) -> bool:
        """True lets the publish be queued now; False when the gate took it (held or failed)."""

    def admits_all(self) -> bool:
        """Whether ``admit`` would let every publish through now (``EntryBatcher.submit_all``)."""


class _LedgerLock(asyncio.Lock):
    """A topic's ledger-change lock, counting the changes that hold or wait for it (``EntryBatcher._lock``)."""

    users = 0


_MESSAGE = operator.itemgetter(0)
"""A queued publish's message (``Batch`` items are ``(message, done, wire)``)."""
_DONE = operator.itemgetter(1)


class RunDone(Protocol):
    """A ``Done`` shared by several publishes (``submit_all``) that may also take a run of them at once."""

    def __call__(self, seq: int, error: BaseException | None) -> None: ...

    def settle_run(self, first: int, n: int) -> None:
        """``self(seq, None)`` for ``seq`` in ``first .. first + n - 1``, at once."""


def _resolve(fut: asyncio.Future[int], seq: int, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(seq)


def _settle_runs(batch: Batch, first: int) -> None:
    """``_acked``'s completions when publishes share their ``done`` (a batched publish's messages): one
    ``settle_run`` (``RunDone``) per run of the same ``done``, else a call per message."""
    seq = first
    for done, items in itertools.groupby(batch, _DONE):
        n = len(list(items))
        run = getattr(done, "settle_run", None)
        try:
            if run is not None:
                run(seq, n)
            else:
                for i in range(n):
                    done(seq + i, None)
        except Exception:
            log.exception("publish completion callback raised")
        seq += n


LIGHT_ENTRY_MESSAGES = 2
"""An entry of at most this many messages is light: publishes pipeline behind it (``batch_hold_after_adds``)."""


def _pipelined(inflight: collections.deque[InflightAdd], depth: int) -> bool:
    """Whether queued publishes may go out now as an entry of their own: with no add out, or fewer than ``depth``
    and the newest light (``LIGHT_ENTRY_MESSAGES``). Single publishes pipeline (BookKeeper's adds); publishes that
    batch anyway (a loaded hub's reads, a queue grown behind a hold) hold as with ``depth`` 1, entries as full."""
    n = len(inflight)
    return not n or (n < depth and len(inflight[-1].batch) <= LIGHT_ENTRY_MESSAGES)


def _call(done: Done, seq: int, error: BaseException | None) -> None:
    try:
        done(seq, error)
    except Exception:
        log.exception("publish completion callback raised")


class EntryBatcher:
    """The publishing path of ``hub.persistence.TopicLog`` (see the module docstring)."""

    if not TYPE_CHECKING:    # the state is TopicLog's slots (mypy checks it through the annotations below)
        __slots__ = ()

    # the log's state this uses (set by TopicLog.__init__)
    topic: bytes
    conf: HubConf
    last_seq: int
    last_write_ms: int
    lh: LedgerHandle | None
    entries_in_ledger: int
    on_persisted: Persisted | None
    closed: bool
    gate: Gate | None
    owned: Callable[[], bool] | None
    _broken: str | None
    _first_time_ms: int
    _last_index: EntryIndex | None
    _queue: collections.deque[tuple[Queued, Done, bytes | None]]
    _queued_bytes: int
    _inflight: collections.deque[InflightAdd]
    _pump_soon: bool
    _hold_timer: asyncio.TimerHandle | None
    _hold_over: bool
    _pumping: bool
    _slow: asyncio.Task[None] | None
    _drain: asyncio.Future[None] | None
    _idle: list[asyncio.Future[None]] | None
    _lock_: _LedgerLock | None
    _start_failures: int
    _start_not_before: float
    _start_error: BaseException | None
    _dedup_store: TopicDedupManager | None
    _dedup_armed: bool
    _needs_arm: bool
    _since_snapshot: int
    _tasks: set[asyncio.Task[Any]] | None

    if TYPE_CHECKING:
        @property
        def dedup(self) -> ProducerDedup: ...

        def _index_of(self, ledger_id: int) -> EntryIndex | None: ...   # hub.log_reader.LogReader

        async def _new_ledger(self) -> None: ...

        async def _close_current(self) -> None: ...

        def _may_write(self) -> None: ...

    @property
    def _lock(self) -> contextlib.AbstractAsyncContextManager[None]:
        """``async with self._lock:`` ledger changes (roll, delete) one at a time.

        The lock exists only while a change holds or waits for it: an idle
        topic holds none (issue 34: about 100 bytes a topic once its first
        ledger was started)."""
        return self._ledger_change()

    @contextlib.asynccontextmanager
    async def _ledger_change(self) -> AsyncIterator[None]:
        lock = self._lock_
        if lock is None:
            lock = self._lock_ = _LedgerLock()
        lock.users += 1
        try:
            async with lock:
                yield
        finally:
            lock.users -= 1
            if not lock.users and self._lock_ is lock:
                self._lock_ = None   # nobody holds or waits: the next change builds another

    # --- publishing -----------------------------------------------------------------------------

    async def publish(self, message: pb.Message) -> int:
        """Persist ``message``; its seq id once acknowledged. ``ServiceDownError`` when not durable."""
        return await self.enqueue(message)

    def enqueue(self, message: pb.Message) -> asyncio.Future[int]:
        """Queue ``message`` now (publish order is call order); the future gets its seq id."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.submit(message, functools.partial(_resolve, fut))
        return fut

    def submit(self, message: Queued, done: Done, wire: bytes | None = None, *, sends: bool = False) -> None:
        """Queue ``message`` now; ``done(seq_id, None)`` once it is durable, else ``done(0, error)``.

        The callback form of ``enqueue`` (no future, no extra loop turn): the
        server answers a publish from inside the add's acknowledgement.
        ``done`` runs on the loop, in publish order, exactly once. ``wire``:
        the message serialized, as it will be stored, when the caller has it.
        ``sends``: the caller calls ``send_queued`` before this loop turn ends
        (the server does after each read), so no end-of-turn pump is scheduled.
        """
        if self.closed:
            done(0, errors.ServiceDownError(f"topic {self.topic!r} is being released"))
            return
        if self.gate is not None and not self.gate.admit(message, done):
            return     # held or refused by the backlog quota (hub.lifecycle)
        if message.producer:
            producer, sequence_id = message.producer, message.sequenceId
            if not self.dedup.admit(producer, sequence_id, done):
                return     # a duplicate: answered (or waiting for its original)
            done = functools.partial(self._dedup_settled, producer, sequence_id, done)
            if not self._dedup_armed:
                self._needs_arm = True
        queue = self._queue
        if queue is IDLE:
            queue = self._queue = collections.deque()
        queue.append((message, done, wire))
        self._queued_bytes += len(message.body)
        self._queued(sends)

    def _queued(self, sends: bool = False) -> None:
        """Publishes joined the queue: a pump at the end of this loop turn if they may go, else the hold's bound
        (``sends``: the caller's ``send_queued`` is that pump)."""
        n = len(inflight := self._inflight)   # _pipelined's test, without its call (once per publish)
        if (not self._pump_soon and self._slow is None
                and (not n or (n < self.conf.batch_hold_after_adds and len(inflight[-1].batch) <= LIGHT_ENTRY_MESSAGES)
                     or self._queued_bytes >= self.conf.batch_flush_bytes)):
            # at the end of this loop turn: one read's publishes share an entry (send_queued: none left if sent)
            self._pump_soon = True
            if not sends:   # issue 32: a loop callback a read less
                asyncio.get_running_loop().call_soon(self.send_queued)
        elif self._hold_timer is None and self.conf.batch_flush_delay_ms and self._inflight:
            self._hold_timer = asyncio.get_running_loop().call_later(
                self.conf.batch_flush_delay_ms / 1000.0, self._hold_expired)

    def submit_all(self, messages: Iterable[Queued], done: Done, nbytes: int,
                   wires: Iterable[bytes] | None = None, *, sends: bool = False) -> None:
        """``submit`` of each of ``messages`` (none carries a producer), in order, with the same ``done``.

        The server's path for a batched publish: the messages join the queue
        at once (``nbytes``: their bodies' total) when the gate admits them
        all (``gate.admits_all()``: no backlog quota holds them); otherwise, and on a
        closed log, each goes through ``submit``. ``done`` runs once per
        message, as ``submit``'s. ``wires``: each message serialized, as it
        will be stored (``hub.frames.stamped_wires``), when the caller has it. ``sends``: as ``submit``'s.
        """
        if self.closed or (self.gate is not None and not self.gate.admits_all()):
            submit = self.submit
            for message in messages:
                submit(message, done, sends=sends)
            return
        queue = self._queue
        if queue is IDLE:
            queue = self._queue = collections.deque()
        queue.extend(zip(messages, itertools.repeat(done), itertools.repeat(None) if wires is None else wires))
        self._queued_bytes += nbytes
        self._queued(sends)

    def _hold_expired(self) -> None:
        """``batch_flush_delay_ms`` passed since a publish queued behind the adds in flight: send the queue."""
        self._hold_timer = None
        if self._queue and not self._pump_soon and self._slow is None:
            self._hold_over = True
            self._pump()

    def _dedup_settled(self, producer: bytes, sequence_id: int, done: Done, seq: int,
                       error: BaseException | None) -> None:
        self.dedup.settle(producer, sequence_id, seq, error)
        done(seq, error)

    async def _arm_dedup(self) -> None:
        """Create the topic's ``topic_dedup`` record before its first producer message is sent."""
        store = self._dedup_store
        assert store is not None       # armed only when the hub keeps dedup records
        try:
            await store.write_snapshot(self.topic, self.dedup.snapshot(self.last_seq), create=True)
            self._dedup_armed = True
        except Exception as exc:
            self._fail_queue(self._error(exc))
        finally:
            self._needs_arm = False
            self._slow = None
        self._pump()

    def _snapshot_soon(self) -> None:
        """``dedup_snapshot_interval`` messages were stored since the last snapshot (``_acked`` counts): write one."""
        self._since_snapshot = 0
        if self._tasks is None:
            self._tasks = set()
        spawn(self._tasks, self._write_snapshot(self.dedup.snapshot(self.last_seq)))

    async def _write_snapshot(self, snap: pb.DedupSnapshot) -> None:
        store = self._dedup_store
        assert store is not None       # _snapshot_soon checked it
        try:
            await store.write_snapshot(self.topic, snap)
        except Exception as exc:   # the next owner reads a longer tail
            log.info("topic %r: dedup snapshot at seq id %d not written: %s", self.topic, snap.atSeqId, exc)

    def send_queued(self) -> None:
        """Send what ``submit`` queued for the end of this loop turn now (the server calls it after a read)."""
        if self._pump_soon:
            self._pump()

    def _settle(self, add: InflightAdd, entry_id: int, error: BaseException | None) -> None:
        """A ledger add's callback: complete what is acknowledged in order, send what may go."""
        add.settled = True
        add.error = error
        if self._pumping:
            return   # settled from inside _send (a refusal): the running _pump sees it next
        if self._slow is None:
            self._pump()
        elif self._drain is not None and all(a.settled for a in self._inflight) and not self._drain.done():
            self._drain.set_result(None)

    def _pump(self) -> None:
        """Complete the settled adds at the head, in order, then send batches (see the module docstring).

        Synchronous; a ledger roll or a failed add hands over to a task
        (``_slow``) that calls this again when done.
        """
        self._pump_soon = False
        if self._slow is not None or self._pumping:
            return
        self._pumping = True
        try:   # one call, not two, per ack and per read (issue 32): the loop is inline, hence the try
            inflight = self._inflight
            if inflight is IDLE:       # a deque of its own while it publishes (dropped once drained)
                inflight = self._inflight = collections.deque()
            conf = self.conf
            while True:
                while inflight and inflight[0].settled:
                    head = inflight[0]
                    if head.error is not None:
                        self._slow = asyncio.get_running_loop().create_task(self._add_failed(head))
                        return
                    inflight.popleft()
                    self._acked(head)
                queue = self._queue
                if not (queue and len(inflight) < conf.max_outstanding_adds
                        and (_pipelined(inflight, conf.batch_hold_after_adds) or self._hold_over
                             or self._queued_bytes >= conf.batch_flush_bytes)):
                    break
                if self._needs_arm:
                    self._slow = asyncio.get_running_loop().create_task(self._arm_dedup())
                    return
                maxe = conf.max_entries_per_ledger
                if self.lh is None or (maxe and self.entries_in_ledger >= maxe):
                    if not inflight:   # roll once the entries in flight are settled
                        loop = asyncio.get_running_loop()
                        wait = self._start_not_before - loop.time()
                        if wait > 0 and self.lh is None:
                            self._fail_queue(errors.ServiceDownError(
                                f"topic {self.topic!r}: no ledger ({self._start_error}); next attempt in "
                                f"{wait * 1000:.0f} ms"))
                            break
                        self._slow = loop.create_task(self._roll())
                    return
                # a hub that lost the topic sends nothing more (the entries in flight may land): _may_write's
                # test, without its call while the topic is writable
                if self._broken is not None or (self.owned is not None and not self.owned()):
                    try:
                        self._may_write()
                    except errors.ServiceDownError as exc:
                        self._fail_queue(exc)
                        break
                if len(queue) <= conf.max_batch_messages and self._queued_bytes <= conf.max_batch_bytes:
                    batch = list(queue)   # _take_batch's usual case (all of it fits one entry), without its call
                    queue.clear()
                    self._queued_bytes = 0
                else:
                    batch = self._take_batch()
                self._send(batch)
        finally:
            self._pumping = False
        # the loop ended without handing over to a task: the hold is over, an idle log drops its queues
        self._hold_over = False
        if not self._queue and self._hold_timer is not None:   # sent before its bound
            self._hold_timer.cancel()
            self._hold_timer = None
        if not inflight and not self._queue:
            self._queue = self._inflight = IDLE    # nothing held while idle
            idle, self._idle = self._idle, None
            for w in idle or ():
                if not w.done():
                    w.set_result(None)

    def _send(self, batch: Batch) -> None:
        inflight = self._inflight
        # the adds in flight hold consecutive seq ids: this entry's follow the newest's (no walk of them all)
        first = inflight[-1].first + len(inflight[-1].batch) if inflight else self.last_seq + 1
        if len(batch) == 1:   # the usual entry at a low rate: no comprehension's call
            message, _, wire = batch[0]
            wires = [message.SerializeToString() if wire is None else wire]
        else:
            wires = [message.SerializeToString() if wire is None else wire for message, _, wire in batch]
        entry = batch_entry(first, wires)
        lh = self.lh
        assert lh is not None          # _pump sends only into an open ledger
        add = InflightAdd(lh, first, batch, wires)
        inflight.append(add)
        self.entries_in_ledger += 1
        if tracing.MESSAGES:   # a sampled publish is in it (hub.tracing): watched before its frames are made
            try:
                tracing.sent(batch, lh.ledger_id, lh.next_entry_id)
            except Exception:   # the add below fails the same way, in order
                log.debug("topic %r: no entry id to trace", self.topic)
        try:
            add.lh.async_add_entry(entry, functools.partial(self._settle, add))
        except Exception as exc:   # refused before anything was sent: a failed add, in order
            add.settled, add.error = True, exc

    def _take_batch(self) -> Batch:
        queue = self._queue
        conf = self.conf
        if len(queue) <= conf.max_batch_messages and self._queued_bytes <= conf.max_batch_bytes:
            batch = list(queue)   # all of it fits one entry (the usual case): no look at each message
            queue.clear()
            self._queued_bytes = 0
            return batch
        batch = []
        size = 0
        while queue and len(batch) < self.conf.max_batch_messages:
            m = queue[0][0]
            if batch and size + len(m.body) > self.conf.max_batch_bytes:
                break
            batch.append(queue.popleft())
            size += len(m.body)
            self._queued_bytes -= len(m.body)
        return batch

    async def _roll(self) -> None:
        """Start the first ledger, or close the full one and start the next; then carry on publishing."""
        try:
            async with self._lock:
                if self.lh is not None:
                    await self._close_current()
                await self._new_ledger()
        except Exception as exc:
            self._start_failed(exc)
            self._fail_queue(self._error(exc))
        finally:
            self._slow = None
        self._pump()

    def _start_failed(self, exc: BaseException) -> None:
        """A ledger could not be started (or failed empty): back off before the next (module docstring)."""
        self._start_failures += 1
        delay = min(self.conf.ledger_create_backoff_ms * 2 ** min(self._start_failures - 1, 30),
                    self.conf.ledger_create_backoff_max_ms) / 1000.0
        self._start_not_before = asyncio.get_running_loop().time() + delay
        self._start_error = exc
        log.warning("topic %r: no ledger (%s); next attempt in %.0f ms", self.topic, exc, delay * 1000)

    async def _drained(self) -> None:
        """Return once nothing is queued or in flight."""
        while self._queue or self._inflight or self._slow is not None:
            if self._slow is not None:
                await asyncio.gather(self._slow, return_exceptions=True)
                continue
            idle: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if self._idle is None:
                self._idle = []
            self._idle.append(idle)
            if not self._pump_soon:
                self._pump()
            if not idle.done():
                await idle

    def _error(self, exc: BaseException) -> errors.PubSubError:
        if isinstance(exc, errors.PubSubError):
            return exc
        return errors.ServiceDownError(f"publish to {self.topic!r} not durable: {exc}")

    def _fail_queue(self, err: errors.PubSubError, batches: Iterable[Batch] = ()) -> None:
        for batch in batches:
            for _, done, _ in batch:
                _call(done, 0, err)
        while self._queue:
            _, done, _ = self._queue.popleft()
            _call(done, 0, err)
        self._queued_bytes = 0

    async def _add_failed(self, head: InflightAdd) -> None:
        """An add failed: the entries after it fail too; close the ledger at its last acknowledged entry."""
        lh, exc = head.lh, head.error
        assert exc is not None
        try:
            log.warning("topic %r: add to ledger %d failed: %s; rolling", self.topic, lh.ledger_id, exc)
            if not all(a.settled for a in self._inflight):   # the writer fails the adds after it
                self._drain = asyncio.get_running_loop().create_future()
                try:
                    await self._drain
                finally:
                    self._drain = None
            failed = [a.batch for a in self._inflight]
            self._inflight.clear()
            if not self._index_of(lh.ledger_id):   # nothing acknowledged on it: as good as never started
                self._start_failed(exc)
            self._fail_queue(self._error(exc), failed)
            try:
                async with self._lock:
                    await self._close_current()
            except Exception as exc2:
                log.warning("topic %r: closing ledger %d failed: %s", self.topic, lh.ledger_id, exc2)
                self.lh = None
                self.closed = True   # the owner must give the topic up; the next owner recovers the ledger
        finally:
            self._slow = None
        self._pump()

    def _acked(self, add: InflightAdd) -> None:
        self._start_failures = 0
        first, batch = add.first, add.batch
        idx = self._last_index   # _index_of's first look, without its call (the ledger written now)
        if idx is None or idx.ledger_id != add.lh.ledger_id:
            idx = self._index_of(add.lh.ledger_id)
        assert idx is not None   # started with the ledger (TopicLog._start_ledger)
        if not len(idx) and batch:   # the ledger's first message: its time goes in the range when closed (hub.seek)
            self._first_time_ms = int(batch[0][0].publishTimeMs)
        idx.append(first, len(batch))
        self.last_seq = first + len(batch) - 1
        self.last_write_ms = int(time.time() * 1000)   # the log's clock for TTL (hub.log_usage)
        if len(batch) > 1 and batch[0][1] is batch[1][1]:   # runs of one batched publish (submit_all)
            _settle_runs(batch, first)
        else:
            seq = first
            for _, done, _ in batch:   # answers first: deliveries (on_persisted) follow
                try:
                    done(seq, None)
                except Exception:
                    log.exception("publish completion callback raised")
                seq += 1
        if self._dedup_store is not None:   # else no snapshot to count towards
            self._since_snapshot += len(batch)
            if self._dedup_armed and self._since_snapshot >= self.conf.dedup_snapshot_interval:
                self._snapshot_soon()
        if self.on_persisted is not None:
            self.on_persisted(self.topic, first, list(map(_MESSAGE, batch)), add.wires)
