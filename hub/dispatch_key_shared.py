"""KEY_SHARED subscriptions: all messages of one key go to one consumer, in order, while it stays.

    d = KeySharedDispatcher(topic, sub, cursor, cache=cache, last_seq=last_seq)

Keys are hashed (CRC-32) onto a ring on which every attached consumer has
``RING_POINTS`` points (consistent hashing, as Pulsar's
``ConsistentHashingStickyKeyConsumerSelector``): a consumer owns the hash
ranges that end at its points, so one joining or leaving moves only its
share of the keys. Messages without a key are spread round-robin.

The ordering rule (what Pulsar's "recently joined consumers" and, since
4.0, its "draining hashes" enforce): a message is handed to its key's
consumer only when no other consumer still holds an unacknowledged message
of that key hash, and never before an earlier message of that hash that
waits for redelivery. While a hash drains, its messages wait in the replay
set; every ack wakes the dispatcher, so a hash is released as soon as its
last outstanding message elsewhere is acknowledged, redelivered or its
consumer leaves (the failure Pulsar users report as consumers stuck for
good, apache/pulsar #8115 and #23999, is a hash that nothing wakes). A
consumer that holds a key's messages and never acknowledges them holds that
key until it leaves or its ack timeout redelivers them.
"""

from __future__ import annotations

import bisect
import zlib

from hub.dispatch import ConsumerSlot, Dispatcher
from hub.message import Message

__all__ = ["RING_POINTS", "KeySharedDispatcher", "key_hash"]

RING_POINTS = 100


def key_hash(key: bytes) -> int:
    """A key's place on the ring (32 bits)."""
    return zlib.crc32(key)


class KeySharedDispatcher(Dispatcher):
    kind = "KEY_SHARED"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._points: list[int] = []
        self._owners: list[ConsumerSlot] = []
        self._hash_of: dict[int, int] = {}                       # pending seq -> its key hash
        self._holders: dict[int, dict[ConsumerSlot, int]] = {}   # key hash -> consumer -> pending count

    def _rebuild(self) -> None:
        ring = sorted((zlib.crc32(f"{slot.name}#{i}".encode()), n)
                      for n, slot in enumerate(self.consumers) for i in range(RING_POINTS))
        self._points = [p for p, _ in ring]
        self._owners = [self.consumers[n] for _, n in ring]

    def _joined(self, slot: ConsumerSlot) -> None:
        self._rebuild()

    def _left(self, slot: ConsumerSlot) -> None:
        self._rebuild()

    def owner_of(self, h: int) -> ConsumerSlot | None:
        if not self._points:
            return None
        i = bisect.bisect_left(self._points, h)
        return self._owners[i if i < len(self._points) else 0]

    def choose(self, seq: int, msg: Message, blocked: set[int]) -> ConsumerSlot | None:
        if msg.key is None:
            return self._round_robin()
        h = key_hash(msg.key)
        if h in blocked:
            return None
        target = self.owner_of(h)
        holders = self._holders.get(h)
        if target is None or target.permits <= 0 or (holders and any(s is not target for s in holders)):
            blocked.add(h)
            return None
        return target

    def _given(self, slot: ConsumerSlot, seq: int, msg: Message) -> None:
        if msg.key is None:
            return
        h = key_hash(msg.key)
        self._hash_of[seq] = h
        holders = self._holders.setdefault(h, {})
        holders[slot] = holders.get(slot, 0) + 1

    def _released(self, slot: ConsumerSlot, seq: int) -> None:
        h = self._hash_of.pop(seq, None)
        if h is None:
            return
        holders = self._holders.get(h)
        if holders is None:
            return
        left = holders.get(slot, 0) - 1
        if left > 0:
            holders[slot] = left
        else:
            holders.pop(slot, None)
            if not holders:
                del self._holders[h]
