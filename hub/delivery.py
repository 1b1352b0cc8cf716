"""Delivery of one subscription's messages over its connection, through the read-ahead cache.

    d = Delivery(sub, cache, last_seq=lambda: log.last_seq, send=conn.send_delivery,
                 writable=conn.writable_event, window=conf.default_message_window_size, batch=64)
    d.start()        # a task: delivers next..last_seq, pausing at the window and while the client is slow
    d.wake()         # new messages persisted, a consume arrived, or the connection drained
    await d.stop()

Delivery starts after the subscription's consume pointer, or, with a
``messageBound`` N, at the newest N messages. At most ``window`` messages
(``messageWindowSize``, else ``default_message_window_size``; 0 unlimited)
are delivered and unconsumed at once. A server-side filter that rejects a
message skips it; one that raises ends the delivery with
``InvalidMessageFilterError`` reported through ``on_error``.

``send(topic, subscriber, messages)`` gets the messages in seq order, at
most ``batch`` at a time (what the client's ``maxBatchMessages`` asked
for, up to ``MAX_BATCH``; 1 = one at a time) and about ``BATCH_BYTES`` of them (a message
larger than that goes alone). A batch holds only what is ready at once: it
is sent before the delivery waits for anything (a message read from the
bookies, the window, the connection draining, the loop's turn), so
batching adds no latency.

A bounded subscription's messages outside its bound may be deleted while
it lags (retention counts it as consumed up to ``last_seq - messageBound``):
a read that finds its message deleted skips to the newest N instead of
stalling or failing.

Skipped messages count as consumed (the client never sees them, so it
never consumes them): once every delivered message before them is
consumed, ``on_filtered(seq)`` moves the subscription's pointer through
them (reported when delivery pauses, before the next delivered message,
at a consume, and every so often during a long run).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from hub import errors
from hub.dispatch import OutRate
from hub.filters import ServerMessageFilter, safe_test
from hub.message import Message

if TYPE_CHECKING:
    from hub.readahead import ReadAheadCache

log = logging.getLogger(__name__)

__all__ = ["Delivery"]

_YIELD_EVERY = 64   # cache hits delivered without awaiting before the task yields once
BATCH_BYTES = 64 * 1024   # a delivery batch is sent before its serialized messages would pass this
MAX_BATCH = 1024          # messages per delivery batch at most, whatever the client asks


class Delivery:
    """See the module docstring."""

    def __init__(self, topic: bytes, subscriber: bytes, start_after: int, *, cache: ReadAheadCache,
                 last_seq: Callable[[], int], send: Callable[[bytes, bytes, list[Message]], None],
                 writable: asyncio.Event, window: int, batch: int = 1, message_bound: int = 0,
                 server_filter: ServerMessageFilter | None = None,
                 on_error: Callable[[Exception], None] | None = None,
                 on_filtered: Callable[[int], None] | None = None,
                 first_kept: Callable[[], int] | None = None) -> None:
        self.topic = topic
        self.subscriber = subscriber
        self.cache = cache
        self.last_seq = last_seq
        self.send = send
        self.writable = writable
        self.window = window
        self.batch = max(1, min(batch, MAX_BATCH))
        self.filter = server_filter
        self.on_error = on_error
        self.on_filtered = on_filtered
        self.message_bound = message_bound
        self.first_kept = first_kept
        self._filtered = 0                # the newest seq id the filter rejected
        nxt = start_after + 1
        if message_bound:
            nxt = max(nxt, last_seq() - message_bound + 1)
        self.next_seq = nxt
        self.consumed = start_after
        self.outstanding: collections.deque[int] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.out = OutRate()              # messages sent (the admin API's msg_rate_out)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    def consumed_up_to(self, seq: int) -> None:
        if seq > self.consumed:
            self.consumed = seq
        outstanding = self.outstanding       # seq order: the consumed ones are a prefix
        if outstanding and outstanding[0] <= self.consumed:
            if outstanding[-1] <= self.consumed:
                outstanding.clear()
            else:
                for _ in range(bisect.bisect_right(outstanding, self.consumed)):
                    outstanding.popleft()
        self._skip_through(self.next_seq - 1)
        self._wake.set()

    def _skip_through(self, upto: int) -> None:
        """Count the filtered messages up to ``upto`` as consumed once no delivered one before them is pending."""
        if self._filtered <= self.consumed:
            return
        through = min(upto, self.outstanding[0] - 1) if self.outstanding else upto
        if through > self.consumed:
            self.consumed = through          # first, so the callback's consumed_up_to is a no-op
            if self.on_filtered is not None:
                self.on_filtered(through)

    def _skip_trimmed(self, seq: int) -> None:
        """``seq`` was deleted under a bounded subscriber: go on from the oldest message still kept.

        Retention keeps every message after ``last_seq - message_bound`` for it
        (``TopicSubscriptions.retained_after``), so that is at most its newest
        ``message_bound`` (``first_kept``, when known, covers a bound raised
        since the deletion); the dropped ones count as consumed, like filtered
        ones.
        """
        nxt = max(seq + 1, self.last_seq() - self.message_bound + 1,
                  self.first_kept() if self.first_kept is not None else 0)
        log.info("%r/%r: messages %d..%d were trimmed to the message bound %d; skipped",
                 self.topic, self.subscriber, seq, nxt - 1, self.message_bound)
        self.next_seq = nxt
        self._filtered = nxt - 1

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def _ready(self) -> bool:
        if self.next_seq > self.last_seq():
            return False
        return not (self.window and len(self.outstanding) >= self.window)

    def _flush(self, batch: list[Message]) -> None:
        """Send what ``batch`` holds and empty it (first: a failing send leaves nothing to send again)."""
        if batch:
            out = batch[:]
            batch.clear()
            self.send(self.topic, self.subscriber, out)
            self.out.add(len(out))

    async def _run(self) -> None:
        run = 0
        batch: list[Message] = []      # ready and not sent yet: leaves before any wait (``_flush``)
        size = 0                       # its serialized bytes
        most = self.batch
        flush, topic, subscriber = self._flush, self.topic, self.subscriber
        try:
            while True:
                if not self._ready():
                    flush(batch)
                    while not self._ready():
                        self._skip_through(self.next_seq - 1)
                        self._wake.clear()
                        await self._wake.wait()
                if not self.writable.is_set():
                    flush(batch)
                    await self.writable.wait()
                seq = self.next_seq
                msg = self.cache.cached(topic, seq)
                if msg is None:
                    flush(batch)
                    try:
                        msg = await self.cache.scan_single(topic, seq)
                    except errors.NoTopicPersistenceInfoError:
                        if not self.message_bound:
                            log.warning("%r/%r: message %d was deleted before this unbounded subscriber "
                                        "consumed it; delivery stops", topic, subscriber, seq)
                            raise
                        self._skip_trimmed(seq)
                        continue
                    run = 0
                else:
                    run += 1
                    if run >= _YIELD_EVERY:   # a long run of cache hits: let the loop breathe
                        run = 0
                        flush(batch)
                        self._skip_through(seq - 1)
                        await asyncio.sleep(0)
                self.next_seq = seq + 1
                if self.filter is not None and not safe_test(self.filter, msg):
                    self._filtered = seq
                    continue
                self._skip_through(seq - 1)
                self.outstanding.append(seq)
                wire = len(msg.wire)
                if batch and size + wire > BATCH_BYTES:
                    flush(batch)
                size = size + wire if batch else wire
                batch.append(msg)
                if len(batch) < most and self.filter is None:
                    run, size = self._take_hits(batch, run, size)
                if len(batch) >= most:
                    flush(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            flush(batch)   # what passed before the failure is delivered, as it would have been one by one
            if not isinstance(exc, errors.PubSubError):
                log.exception("delivery of %r/%r failed", self.topic, self.subscriber)
            if self.on_error is not None:
                self.on_error(exc)

    def _take_hits(self, batch: list[Message], run: int, size: int) -> tuple[int, int]:
        """After a cache hit: add the cached messages that follow to ``batch`` while ``_run`` would add them
        without a wait, a flush or a filter (the usual case at the tail, per message per subscriber: the
        same checks as ``_run``'s, on locals); returns ``run`` and ``size`` as ``_run`` keeps them.

        Nothing here sends or waits, so ``last_seq``, the connection's ``writable`` and the skipped messages
        stay as they are: each is checked once. Without a filter, moving past a message needs no
        ``_skip_through`` unless a trim left skipped messages (then ``_run`` goes on by itself).
        """
        nxt = self.next_seq
        end = min(self.last_seq(), nxt + self.batch - len(batch) - 1, nxt + _YIELD_EVERY - run - 2)
        if self.window:
            end = min(end, nxt + self.window - len(self.outstanding) - 1)
        if nxt > end or self._filtered > self.consumed or not self.writable.is_set():
            return run, size
        cached, topic, outstanding = self.cache.cached, self.topic, self.outstanding
        while nxt <= end:
            msg = cached(topic, nxt)
            if msg is None:
                break
            wire = len(msg.wire)
            if size + wire > BATCH_BYTES:
                break
            size += wire
            batch.append(msg)
            outstanding.append(nxt)
            nxt += 1
        run += nxt - self.next_seq
        self.next_seq = nxt
        return run, size

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
