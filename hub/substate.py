"""One stored subscription of a topic (``SubState``) and what it needs of its connection (``Attachment``).

    state = SubState(subscriber, data, version)   # from the stored SubscriptionData (hub.subscriptions)
    state.conn                                    # the attached connection, an Attachment (None: detached)
    state.dispatcher                              # consumers of a non-exclusive subscription (hub.dispatch)

Kept apart from ``hub.subscriptions`` so that its consumer side
(``hub.subscription_consumers``) reads the same state without importing it
back; ``hub.subscriptions`` re-exports both names.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hub.delivery import Delivery
    from hub.dispatch import ConsumerLink, ConsumerSlot, Dispatcher
    from hub.filters import ServerMessageFilter
    from hub.message import Message
    from hub.proto import pubsub_pb2 as pb
    from metastore import Version

__all__ = ["Attachment", "SubState"]


class Attachment(Protocol):
    """What a subscription needs of the connection it is attached to."""

    writable: asyncio.Event

    def send_delivery(self, topic: bytes, subscriber: bytes, messages: list[Message]) -> None: ...

    def send_event(self, topic: bytes, subscriber: bytes, event: int, consumer_id: int = 0) -> None: ...

    def send_consumer_delivery(self, topic: bytes, subscriber: bytes, consumer_id: int,
                               wires: list[bytes]) -> None: ...

    def attached(self, topic: bytes, subscriber: bytes, state: SubState | None) -> None: ...



class SubState:
    """One stored subscription and, when attached, its connection and delivery."""

    def __init__(self, subscriber: bytes, data: pb.SubscriptionData, version: Version) -> None:
        self.subscriber = subscriber
        self.prefs = data.preferences
        self.version = version
        self.consumed = data.state.msgId.localComponent
        self.persisted = self.consumed
        self.consumes_since_persist = 0
        self.conn: Attachment | None = None
        self.delivery: Delivery | None = None
        self.filter: ServerMessageFilter | None = None
        self.batch = 1                    # the attached client's maxBatchMessages (kept for a restart)
        self.persisting: asyncio.Task[None] | None = None   # the one pointer write loop in flight
        self.writing = asyncio.Lock()     # the subscription's record: one write at a time
        self.stype = data.preferences.subscriptionType
        self.ranges = [(r.first, r.last) for r in data.state.ackedRanges]   # until a dispatcher owns them
        self.dispatcher: Dispatcher | None = None
        self.acks_dirty = False           # acked ranges changed since the last write
        self.ack_timer: asyncio.TimerHandle | None = None

    @property
    def attached(self) -> bool:
        return self.conn is not None or bool(self.dispatcher is not None and self.dispatcher.consumers)

    def slot(self, conn: ConsumerLink, consumer_id: int) -> ConsumerSlot | None:
        return self.dispatcher.find(conn, consumer_id) if self.dispatcher is not None else None
