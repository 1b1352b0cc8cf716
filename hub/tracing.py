"""Stage times of sampled publishes in the hub (the bench's per-stage breakdown, ``quire bench publish``).

    trace = start(message)                   # a publish with PublishRequest.trace: the hub read it
    sent(batch, ledger_id, entry_id)         # the topic log sends the entry holding it (watched by bookie.tracing)
    answer = finish(trace)                   # its add completed: a PublishTrace for the answer

A client samples a publish by setting ``PublishRequest.trace`` on a
single-message publish (``HedwigClient.publish_traced``); the hub answers it
with ``PublishResponse.trace``: when it read the request, when the entry
holding the message was framed for each bookie, each bookie's read, journal
write and answer (``bookie.tracing``), when the hub read each answer, when
the add completed and when the answer was queued for the client.

Clocks: ``time.monotonic_ns()`` (CLOCK_MONOTONIC) everywhere. The hub, the
bookies and the bench client run on one machine in the bench, so their
times compare directly; the answer carries them all, so nothing is
collected from the servers afterwards. "Framed" and "queued" times are
stamped when the bytes enter a connection's outbox, which writes them at
the end of that loop turn.

Cost when no publish is traced: one test of an empty dict per entry sent
(and per add of 64 KiB or more in the ledger client).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bookie import tracing as bookie_tracing
from hub.proto import pubsub_pb2 as pb

__all__ = ["MESSAGES", "HubTrace", "finish", "sent", "start"]


class HubTrace:
    """One traced publish on its way through the hub."""

    __slots__ = ("add", "entry", "read_ns")

    def __init__(self, read_ns: int) -> None:
        self.read_ns = read_ns
        self.entry: tuple[int, int] | None = None     # (ledger id, entry id) once sent
        self.add: bookie_tracing.AddTrace | None = None


MESSAGES: dict[int, HubTrace] = {}
"""``id()`` of a traced message queued on a topic log -> its trace, until its entry is sent."""


def start(message: pb.Message) -> HubTrace:
    """The hub read a traced publish of ``message`` (queued next on its topic log)."""
    trace = MESSAGES[id(message)] = HubTrace(time.monotonic_ns())
    return trace


def sent(batch: Sequence[tuple[object, Any, Any]], ledger_id: int, entry_id: int) -> None:
    """The entry ``(ledger_id, entry_id)`` of ``batch`` is about to be added: watch its traced messages' adds."""
    add: bookie_tracing.AddTrace | None = None
    for item in batch:
        trace = MESSAGES.pop(id(item[0]), None)
        if trace is not None:   # several traced messages in one entry (a backlog) share its add's trace
            if add is None:
                add = bookie_tracing.AddTrace()
                bookie_tracing.watch(ledger_id, entry_id, add)
            trace.entry = (ledger_id, entry_id)
            trace.add = add


def forget(message: pb.Message) -> None:
    """``message`` failed before its entry was sent."""
    MESSAGES.pop(id(message), None)


def finish(trace: HubTrace) -> pb.PublishTrace:
    """The traced publish's add completed now: its stages for the answer (``answer_sent_ns`` left to the caller)."""
    out = pb.PublishTrace(hub_read_ns=trace.read_ns, hub_ack_read_ns=time.monotonic_ns())
    if trace.entry is not None:
        bookie_tracing.unwatch(*trace.entry)
    if trace.add is not None:
        for copy in trace.add.bookies:
            sent_ns, read, written, acked, ack_read = copy.times
            out.bookies.add(bookie=copy.address, add_sent_ns=sent_ns, read_ns=read, journal_written_ns=written,
                            ack_sent_ns=acked, ack_read_ns=ack_read)
        if trace.add.bookies:
            out.add_sent_ns = min(copy.times[0] for copy in trace.add.bookies)
    return out
