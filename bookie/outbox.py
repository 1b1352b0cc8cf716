"""Outgoing frames of one connection, written with one ``writelines`` per loop turn.

Shared by the bookie server's connections, the ledger client's and the hub client's::

    outbox = Outbox(on_flush=state.flushed)     # on_flush: optional, called after each write
    outbox.attach(transport)                    # in connection_made
    outbox.put(frame)                           # queue; the caller flushes (end of data_received)
    outbox.send(frame)                          # queue and flush at the end of this loop turn
    outbox.flush()                              # write what is queued now
    outbox.detach()                             # in connection_lost: queued frames are dropped

Frames queued while no transport is attached, or once it is closing, are
dropped at the next flush (the connection is gone; its requests fail by
other means). ``queued_bytes`` is what waits for the next flush.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol


class _Transport(Protocol):
    def writelines(self, data: list[bytes]) -> None: ...

    def is_closing(self) -> bool: ...


class Outbox:
    """See the module docstring."""

    __slots__ = ("_frames", "_loop", "_on_flush", "_scheduled", "queued_bytes", "transport")

    def __init__(self, on_flush: Callable[[], None] | None = None) -> None:
        self._frames: list[bytes] = []
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_flush = on_flush
        self.queued_bytes = 0
        self.transport: _Transport | None = None

    def attach(self, transport: _Transport) -> None:
        self.transport = transport

    def detach(self) -> None:
        self.transport = None
        self._frames.clear()
        self.queued_bytes = 0

    def put(self, frame: bytes) -> None:
        """Queue ``frame``; it leaves at the caller's next ``flush``."""
        self._frames.append(frame)
        self.queued_bytes += len(frame)

    def send(self, frame: bytes) -> None:
        """Queue ``frame`` and make sure a flush runs at the end of this loop turn."""
        self._frames.append(frame)
        self.queued_bytes += len(frame)
        if not self._scheduled:
            self._scheduled = True
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write every queued frame in one ``writelines`` (or drop them when the transport is gone)."""
        self._scheduled = False
        frames = self._frames
        if not frames:
            return
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.writelines(frames)  # transports copy what they keep: the list is reused
        frames.clear()
        self.queued_bytes = 0
        if self._on_flush is not None:
            self._on_flush()

    def __len__(self) -> int:
        return len(self._frames)
