"""FAILOVER subscriptions: one active consumer, the first attached; the next takes over.

    d = FailoverDispatcher(topic, sub, cursor, cache=cache, last_seq=last_seq)

Of the attached consumers only the first attached (still attached) gets
messages. When it detaches or its connection drops, what it held
unacknowledged goes back (``Dispatcher.remove``) and the next in attach
order becomes active: it gets those first, in seq order, so delivery
continues from the first unacknowledged message. Pulsar orders failover
consumers by priority and name; Quire by attach time, as DESIGN 6b says.
"""

from __future__ import annotations

from hub.dispatch import ConsumerSlot, Dispatcher
from hub.message import Message

__all__ = ["FailoverDispatcher"]


class FailoverDispatcher(Dispatcher):
    kind = "FAILOVER"
    wake_on_ack = False      # its choice depends on permits alone

    @property
    def active(self) -> ConsumerSlot | None:
        return self.consumers[0] if self.consumers else None

    def has_permits(self) -> bool:
        active = self.active
        return active is not None and active.permits > 0

    def choose(self, seq: int, msg: Message, blocked: set[int]) -> ConsumerSlot | None:
        active = self.active
        return active if active is not None and active.permits > 0 else None
