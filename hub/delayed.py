"""Delayed delivery (DESIGN.md section 6b; Pulsar's ``DelayedDeliveryTracker``): the publish check and the index.

    problem = delay_problem(msg, now_ms, max_delay_ms)     # a publish's delay fields: None or (status, text)
    resolve_due(msg)                     # the owner, when it stamps a message: deliverAfterMs -> deliverAtMs
    index = DelayIndex(capacity=100_000) # one per SHARED / KEY_SHARED subscription (its dispatcher's)
    index.defer(seq, due_ms)             # not due yet: held back (tracked, or past the capacity: found later)
    index.next_due()                     # the earliest due time: the subscription's one timer
    index.pop_due(now_ms())              # seq ids due now, earliest first: handed out like redeliveries

A publisher sets ``deliver_after_ms`` or ``deliver_at_ms`` (epoch ms). The
owner stores the message at once (it is durable and in the backlog), with
its due time ``deliverAtMs`` (for ``deliver_after_ms``: the owner's publish
time plus the delay, so the publisher's clock does not matter). Refused,
with nothing stored and the connection serving on: both fields, or a
negative one (``MALFORMED_REQUEST``); a due time more than
``max_delivery_delay_ms`` after the owner's clock when that is not 0
(``DELIVERY_DELAY_TOO_LONG``, ``DeliveryDelayTooLongError``, Pulsar's
``delayedDeliveryMaxDelayInMillis``). A due time in the past delivers at
once. Due times are strict: never early (Pulsar's
``isDelayedDeliveryDeliverAtTimeStrict=true``; by default Pulsar may deliver
up to its 1 s tick early), usually within a few ms after.

Only SHARED and KEY_SHARED subscriptions hold a message back until it is due,
as in Pulsar; EXCLUSIVE and FAILOVER subscriptions (and Hedwig subscribers)
get it in order at once. The dispatcher (``hub.dispatch``) reads forward from
the first unacknowledged message: a message not yet due goes into this index
instead of to a consumer, and the messages after it go on being delivered.
When it is due, it is handed out before newer messages, as a redelivery is,
with ``redelivery_count`` 0 (in KEY_SHARED, to its key's consumer; the
messages of its key published after it and not delayed went out earlier —
a delay takes a message out of its key's order, as in Pulsar). Nothing here
is persisted: the message carries its due time, and a new owner (or a
restarted hub) rebuilds the index as its dispatcher reads forward from the
first unacknowledged message again (a message whose time has come meanwhile
is delivered at once). Once delivered, acks, nacks, ack timeouts, redelivery
and the dead-letter topic treat it as any other message.

Memory (Pulsar's in-memory tracker grows without bound; its bucket tracker
spills to ledgers): the index holds at most ``capacity`` messages (hub conf
``max_tracked_delayed_messages``, per subscription; about 130 bytes each).
A message not due yet that finds the index full is not held in memory: the
index remembers only the first such seq id (``overflow_from``), and from
then on every later not-yet-due message is left to the log as well, while
the messages that are not delayed go on flowing. Once the index has drained to half
its capacity, the dispatcher reads the log again from ``overflow_from``
(``rescan_from``) and indexes what it finds there, seq order, until the
index is full again or it reaches where it had read. So the log is the
spill store: nothing is lost or delivered early, but past the capacity a
message may be delivered after its time (when room comes), in seq order
rather than due order.

Everything here is plain state, no I/O (``DelayIndex`` reads no clock:
callers pass the time); nothing raises.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

from hub.proto import pubsub_pb2 as pb

__all__ = ["DelayIndex", "delay_problem", "now_ms", "resolve_due"]


def now_ms() -> int:
    """The wall clock in epoch milliseconds (the clock of ``publish_time_ms`` and due times)."""
    return time.time_ns() // 1_000_000


def delay_problem(msg: pb.Message, clock_ms: Callable[[], int], max_delay_ms: int) -> tuple[int, str] | None:
    """Why ``msg``'s delay fields are refused (status, text), or None. ``max_delay_ms`` 0: no limit;
    ``clock_ms`` (epoch ms) is read only for a ``deliverAtMs`` checked against a limit."""
    at = msg.HasField("deliverAtMs")
    after = msg.HasField("deliverAfterMs")
    if not (at or after):
        return None
    if at and after:
        return pb.MALFORMED_REQUEST, "a message carries deliver_at_ms or deliver_after_ms, not both"
    if after and msg.deliverAfterMs < 0:
        return pb.MALFORMED_REQUEST, f"deliver_after_ms must be >= 0, not {msg.deliverAfterMs}"
    if at and msg.deliverAtMs < 0:
        return pb.MALFORMED_REQUEST, f"deliver_at_ms must be >= 0 (epoch ms), not {msg.deliverAtMs}"
    if max_delay_ms > 0:
        delay = msg.deliverAfterMs if after else msg.deliverAtMs - clock_ms()
        if delay > max_delay_ms:
            return pb.DELIVERY_DELAY_TOO_LONG, (f"a delivery delay of {delay} ms exceeds this hub's "
                                                f"max_delivery_delay_ms {max_delay_ms}")
    return None


def resolve_due(msg: pb.Message) -> None:
    """Turn ``deliverAfterMs`` into ``deliverAtMs`` (``publishTimeMs`` plus the delay); the owner's stamp."""
    if msg.HasField("deliverAfterMs"):
        after = msg.deliverAfterMs
        msg.ClearField("deliverAfterMs")
        if after > 0:
            msg.deliverAtMs = msg.publishTimeMs + after
    if msg.HasField("deliverAtMs") and msg.deliverAtMs <= 0:
        msg.ClearField("deliverAtMs")


class DelayIndex:
    """One subscription's messages held back until due: a heap of (due ms, seq id). See the module docstring."""

    __slots__ = ("_heap", "capacity", "overflow_from")

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._heap: list[tuple[int, int]] = []
        self.overflow_from: int | None = None   # first seq id held back but not indexed (the log has it)

    def __len__(self) -> int:
        return len(self._heap)

    def defer(self, seq: int, due: int) -> bool:
        """Hold ``seq`` back until ``due``, read in seq order; False when it is left to the log (full)."""
        if self.overflow_from is not None or len(self._heap) >= self.capacity:
            if self.overflow_from is None:
                self.overflow_from = seq
            return False
        heapq.heappush(self._heap, (due, seq))
        return True

    def next_due(self) -> int | None:
        """The earliest due time held (epoch ms), None when nothing is."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: int) -> list[int]:
        """The seq ids due at ``now`` (earliest due first), no longer held."""
        heap = self._heap
        out: list[int] = []
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[1])
        return out

    # --- past the capacity ----------------------------------------------------------------------------
    def rescan_from(self) -> int | None:
        """Where to read the log again for messages left to it, once the index has drained to half; else None."""
        if self.overflow_from is None or len(self._heap) > self.capacity // 2:
            return None
        return self.overflow_from

    def track(self, seq: int, due: int) -> bool:
        """A rescan found ``seq`` not due yet: index it (True), or, full again, resume there later (False)."""
        if len(self._heap) >= self.capacity:
            self.overflow_from = seq
            return False
        heapq.heappush(self._heap, (due, seq))
        return True

    def rescanned(self, upto: int, done: bool) -> None:
        """A rescan read up to ``upto`` (excluded); ``done``: it reached where the dispatcher had read."""
        self.overflow_from = None if done else upto

    def forget_through(self, seq: int) -> None:
        """Forget the messages up to ``seq`` (acknowledged on the subscription's behalf: message TTL, eviction)."""
        kept = [(due, s) for due, s in self._heap if s > seq]
        if len(kept) != len(self._heap):
            heapq.heapify(kept)
            self._heap = kept
        if self.overflow_from is not None and self.overflow_from <= seq:
            self.overflow_from = seq + 1

    def clear(self) -> None:
        """Forget everything (the subscription was reset: the dispatcher reads again from its new pointer)."""
        self._heap.clear()
        self.overflow_from = None
