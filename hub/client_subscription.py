"""The client-side state of one subscription (``HedwigClient`` keeps one per topic and subscriber).

    s = ClientSubscription(topic, subscriber_id, subscribe_request)
    s.conn                       # the HubChannel it is attached through (None: detached)
    s.handler, s.filter          # set by start_delivery
    s.queue, s.wake              # delivered messages waiting for the handler task (s.task)
    s.last_handled, s.last_queued, s.unsent_consumes   # consume bookkeeping

Plain state, no I/O; ``HedwigClient`` acts on it. Failure: nothing here raises.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

from hub.channel import HubChannel
from hub.filters import ClientMessageFilter
from hub.message import Message, SubscriptionPreferences
from hub.proto import pubsub_pb2 as pb

__all__ = ["ClientSubscription", "Handler"]

Handler = Callable[[bytes, bytes, Message], Awaitable[Any]]


class ClientSubscription:
    """One subscription of a ``HedwigClient``: its request, connection, handler, queue and consume state."""

    def __init__(self, topic: bytes, sub: bytes, req: pb.SubscribeRequest) -> None:
        self.topic = topic
        self.sub = sub
        self.req = req
        self.conn: HubChannel | None = None
        self.prefs = SubscriptionPreferences()
        self.handler: Handler | None = None
        self.filter: ClientMessageFilter | None = None
        self.queue: collections.deque[Message] = collections.deque()
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.last_handled = 0
        self.last_queued = 0
        self.unsent_consumes = 0
        self.resets = 0               # SUBSCRIPTION_RESET events seen (the handler loop notices one)
        self.closed = False
        self.resubscribing = False
