"""SHARED (and a consumer-API EXCLUSIVE) subscriptions: round-robin among consumers with permits.

    d = SharedDispatcher(topic, sub, cursor, cache=cache, last_seq=last_seq)

Pulsar's ``PersistentDispatcherMultipleConsumers``: each message goes to the
next attached consumer (in attach order, round-robin) that has a free
permit, up to ``hub.dispatch.ROUND_ROBIN_BATCH`` (50; Pulsar's
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

    def choose(self, seq: int, msg: Message, blocked: set[int]) -> ConsumerSlot | None:
        return self._round_robin()
