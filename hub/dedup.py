"""Producer deduplication (Pulsar's): a topic stores a (producer, sequence id) at most once.

    dedup = ProducerDedup(window=10000, max_producers=1000)
    dedup.restore(snapshot)                      # acquiring a topic: its last snapshot, then ...
    dedup.stored(b"orders-1", 41, seq)           # ... every producer message of the log after it
    if dedup.admit(b"orders-1", 42, done):       # True: new, store it and call dedup.settle(...) after
        ...
    dedup.settle(b"orders-1", 42, seq, None)     # durable as ``seq`` (or ``(0, error)``: not stored)
    snap = dedup.snapshot(at_seq)                # pb.DedupSnapshot for the metastore

Per producer the owner keeps, for the last ``window`` sequence ids stored,
the local seq id each got, and the floor: the highest sequence id that fell
out of that window. ``admit`` decides for a publish carrying (producer,
sequence id):

* one in flight (a retry racing its original): ``done`` waits for the
  original's outcome and gets the same answer;
* one in the window: ``done(seq)`` at once with the original's seq id;
* one at or below the floor: ``DuplicatePublishError`` (it may have been
  stored, its seq id is no longer known), nothing stored;
* any other: never stored (it would be in the window or under the floor):
  new, the caller stores it.

So producers should number their publishes increasingly (as Pulsar's), but
retries may arrive out of order (several in flight when an owner died) as
long as they stay within the window.

Memory is bounded: a topic keeps at most ``max_producers`` producers (the
hub's ``dedup_max_producers``, Pulsar's
``brokerDeduplicationMaxNumberOfProducers``), each with at most ``window``
sequence ids (about 140 bytes each). A new producer past that forgets the
one that published least recently (and has nothing in flight): a retry of
its old publishes is then stored again, as after Pulsar drops an inactive
producer. ``len(dedup)`` counts the sequence ids held, ``producers`` the
producers. A failed store (``settle`` with an
error) forgets the in-flight entry, so a retry can store it. No I/O here:
``hub.persistence.TopicLog`` feeds it and persists snapshots.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

from hub.errors import DuplicatePublishError
from hub.proto import pubsub_pb2 as pb

__all__ = ["ProducerDedup"]

log = logging.getLogger(__name__)

Done = Callable[[int, BaseException | None], None]


class _Producer:
    __slots__ = ("floor", "pending", "window")

    def __init__(self) -> None:
        self.floor = -1                   # highest sequence id evicted from the window
        self.window: collections.OrderedDict[int, int] = collections.OrderedDict()   # sequence id -> seq id
        self.pending: dict[int, list[Done]] = {}                                     # in flight -> waiters


class ProducerDedup:
    """See the module docstring."""

    def __init__(self, window: int, max_producers: int = 1000) -> None:
        self.window = window
        self.max_producers = max_producers
        self.evicted = 0      # producers forgotten to stay within max_producers
        self._producers: collections.OrderedDict[bytes, _Producer] = collections.OrderedDict()   # least recent first
        self._held = 0        # sequence ids in every window

    @property
    def producers(self) -> int:
        return len(self._producers)

    def __len__(self) -> int:
        """Sequence ids held (stored in a window, or in flight)."""
        return self._held + sum(len(p.pending) for p in self._producers.values())

    def _get(self, producer: bytes) -> _Producer:
        producers = self._producers
        p = producers.get(producer)
        if p is None:
            if len(producers) >= self.max_producers:
                self._evict()
            p = producers[producer] = _Producer()
        else:
            producers.move_to_end(producer)
        return p

    def _evict(self) -> None:
        """Forget the least recently used producer with nothing in flight (none such: keep them all)."""
        for name, p in self._producers.items():
            if not p.pending:
                del self._producers[name]
                self._held -= len(p.window)
                self.evicted += 1
                log.debug("dedup: forgot producer %r (max_producers %d)", name, self.max_producers)
                return

    def admit(self, producer: bytes, sequence_id: int, done: Done) -> bool:
        """True if the publish is new (store it, then ``settle``); else ``done`` is (or will be) answered."""
        p = self._get(producer)
        waiters = p.pending.get(sequence_id)
        if waiters is not None:
            waiters.append(done)
            return False
        seq = p.window.get(sequence_id)
        if seq is not None:
            done(seq, None)
            return False
        if sequence_id <= p.floor:
            done(0, DuplicatePublishError(
                f"producer {producer!r}: sequence id {sequence_id} is older than its last {self.window} publishes "
                f"(at or below {p.floor}); it may have been stored, its seq id is no longer known"))
            return False
        p.pending[sequence_id] = []
        return True

    def settle(self, producer: bytes, sequence_id: int, seq: int, error: BaseException | None) -> None:
        """The outcome of an admitted publish: stored as ``seq``, or not stored (``error``)."""
        p = self._get(producer)
        waiters = p.pending.pop(sequence_id, [])
        if error is None:
            self.stored(producer, sequence_id, seq)
        for done in waiters:
            done(seq, error)

    def stored(self, producer: bytes, sequence_id: int, seq: int) -> None:
        """Record a (producer, sequence id) durable as ``seq`` (also: replaying the log)."""
        p = self._get(producer)
        window = p.window
        held = len(window)
        window[sequence_id] = seq
        window.move_to_end(sequence_id)
        while len(window) > self.window:
            evicted, _ = window.popitem(last=False)
            p.floor = max(p.floor, evicted)
        self._held += len(window) - held

    def snapshot(self, at_seq: int) -> pb.DedupSnapshot:
        """What is stored, as of the topic's seq id ``at_seq`` (in-flight publishes are not)."""
        snap = pb.DedupSnapshot(atSeqId=at_seq)
        for name, p in self._producers.items():
            if not p.window and p.floor < 0:
                continue
            w = snap.producers.add(producer=name, floor=p.floor + 1)
            w.sequenceIds.extend(p.window.keys())
            w.localSeqIds.extend(p.window.values())
        return snap

    def restore(self, snap: pb.DedupSnapshot) -> None:
        """Start from ``snap`` (then replay the log after ``snap.atSeqId`` with ``stored``)."""
        for w in snap.producers:
            p = self._get(w.producer)
            for sequence_id, seq in zip(w.sequenceIds, w.localSeqIds, strict=False):
                self.stored(w.producer, sequence_id, seq)
            p.floor = max(p.floor, w.floor - 1)
