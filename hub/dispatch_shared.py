"""SHARED (and a consumer-API EXCLUSIVE) subscriptions: round-robin among consumers with permits.

    d = SharedDispatcher(topic, sub, cursor, cache=cache, last_seq=last_seq)

Pulsar's ``PersistentDispatcherMultipleConsumers``: each message goes to the
next attached consumer (in attach order, round-robin) that has a free
permit, up to ``hub.dispatch.ROUND_ROBIN_BATCH`` (100; Pulsar's
``dispatcherMaxRoundRobinBatchSize`` is 20) in a row while it has permits within
one dispatch pass (the next pass starts with the next consumer), so frames and
acks carry runs; a consumer without permits is passed over, so one that stops
receiving stops getting messages while the others keep going. Messages
waiting for redelivery go first, in seq order. An EXCLUSIVE subscription
used through ``HedwigClient.consumer`` is this dispatcher with its one
consumer (``hub.subscriptions`` refuses a second).
"""

from __future__ import annotations

from hub.dispatch import ConsumerSlot, Dispatcher
from hub.message import Message

__all__ = ["SharedDispatcher"]


class SharedDispatcher(Dispatcher):
    kind = "SHARED"
    wake_on_ack = False      # its choice depends on permits alone
    gives_runs = True

    def choose(self, seq: int, msg: Message, blocked: set[int]) -> ConsumerSlot | None:
        return self._round_robin()

    def _give_run(self, run: list[Message], seq: int, out: dict[ConsumerSlot, list[bytes]]) -> int:
        """``choose`` and ``_give`` of each message of ``run``, a consumer's share at a time: the first of a
        share is chosen as one message is, the rest of it are the ones ``_round_robin`` would give the same
        consumer next (while its run and its permits last), so the order, frames and state are the same."""
        pending = self.pending
        i, n = 0, len(run)
        while i < n:
            slot = self._round_robin()
            if slot is None:
                break
            more = min(self._run_left, slot.permits - 1, n - i - 1)
            self._run_left -= more
            k = more + 1
            seqs = range(seq, seq + k)
            slot.permits -= k
            slot.delivered += k
            slot.unacked.update(seqs)
            for s in seqs:
                pending[s] = slot
            wires = out.get(slot)
            if wires is None:
                wires = out[slot] = []
            room = 256 - len(wires)          # _give sends a frame once it holds 256
            if k < room:
                wires.extend([m.wire for m in run[i:i + k]])
            else:
                wires.extend([m.wire for m in run[i:i + room]])
                self._flush(out)
                if k > room:
                    out[slot] = [m.wire for m in run[i + room:i + k]]
            i += k
            seq += k
        return i
