"""The python floor's processes (``tools.bench.floor``): its wire format, the sinks and the relay.

Each runs in a child process started by ``FloorPeer`` (``python -m tools.bench.floor sink|relay``,
whose ``main`` serves them); what they do and leave out is ``tools.bench.floor``'s module docstring.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import struct
import time
from collections.abc import Sequence
from typing import Any, cast

from tools.bench.peers import HOST

log = logging.getLogger("tools.bench.floor")

__all__ = ["HEADER", "KEY", "TRACE_BIT", "ClientConnection", "Relay", "SinkConnection", "SinkProtocol", "frame",
           "serve_relay", "serve_sink", "split_acks", "split_frames", "split_keys", "traced_ack"]

HEADER = struct.Struct(">IQ")
"""A frame's head: the length of what follows (key + payload), then the 8-byte key."""
KEY = struct.Struct(">Q")
"""An ack: the bare 8-byte key (sink -> relay: the relay's key; relay -> client: the client's id)."""
TRACE_BIT = 1 << 63
"""In a key: a traced frame, or a traced ack followed by its count and times (``split_acks``)."""


def split_frames(buf: bytearray) -> list[tuple[int, bytes]]:
    """Remove the complete frames at the start of ``buf``; return them as ``(key, payload)``.

    No I/O, no limits: a floor trusts its peers. A partial frame stays in ``buf``.
    """
    frames: list[tuple[int, bytes]] = []
    off, end = 0, len(buf)
    while end - off >= HEADER.size:
        size, key = HEADER.unpack_from(buf, off)
        stop = off + 4 + size
        if stop > end:
            break
        frames.append((key, bytes(buf[off + HEADER.size:stop])))
        off = stop
    del buf[:off]
    return frames


def split_keys(buf: bytearray) -> list[int]:
    """Remove the complete 8-byte keys at the start of ``buf`` and return them."""
    whole = len(buf) - len(buf) % KEY.size
    keys = [k for (k,) in KEY.iter_unpack(memoryview(buf)[:whole])]
    del buf[:whole]
    return keys


def split_acks(buf: bytearray) -> list[tuple[int, tuple[int, ...] | None]]:
    """``split_keys`` with traced acks: ``(key, None)``, or ``(key without TRACE_BIT, times)``; a partial
    record stays in ``buf``."""
    out: list[tuple[int, tuple[int, ...] | None]] = []
    off, end = 0, len(buf)
    while end - off >= KEY.size:
        (key,) = KEY.unpack_from(buf, off)
        if not key & TRACE_BIT:
            out.append((key, None))
            off += KEY.size
            continue
        if end - off < 2 * KEY.size:
            break
        (count,) = KEY.unpack_from(buf, off + KEY.size)
        stop = off + (2 + count) * KEY.size
        if stop > end:
            break
        out.append((key & ~TRACE_BIT, struct.unpack_from(f">{count}Q", buf, off + 2 * KEY.size)))
        off = stop
    del buf[:off]
    return out


def traced_ack(key: int, times: Sequence[int]) -> bytes:
    """A traced ack of ``key``: the key with ``TRACE_BIT``, the count of ``times``, the times."""
    return struct.pack(f">QQ{len(times)}Q", key | TRACE_BIT, len(times), *times)


def frame(key: int, payload: bytes) -> bytes:
    return HEADER.pack(KEY.size + len(payload), key) + payload


# -- sink -----------------------------------------------------------------------------------------


class SinkProtocol(asyncio.Protocol):
    """One relay connection of a sink: each read's frames -> one ``O_DSYNC`` write -> one write of their keys."""

    def __init__(self, fd: int, trace: bool = False) -> None:
        self._fd = fd
        self._trace = trace
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        read = time.monotonic_ns() if self._trace else 0
        self._buf += data
        frames = split_frames(self._buf)
        if not frames or self._transport is None:
            return
        # The sync happens here, on the loop thread: reads that arrive meanwhile form the next group.
        os.write(self._fd, b"".join(payload for _, payload in frames))
        if self._trace and any(key & TRACE_BIT for key, _ in frames):
            written = time.monotonic_ns()
            self._transport.write(b"".join(
                traced_ack(key & ~TRACE_BIT, (read, written, time.monotonic_ns())) if key & TRACE_BIT
                else KEY.pack(key) for key, _ in frames))
            return
        self._transport.write(b"".join(KEY.pack(key) for key, _ in frames))


async def serve_sink(port: int, path: str, trace: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_DSYNC, 0o644)
    try:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: SinkProtocol(fd, trace), HOST, port)
        await _serve(server, "sink")
    finally:
        os.close(fd)


# -- relay ----------------------------------------------------------------------------------------


class Relay:
    """The relay's state: the sink connections and, per relay key, who waits for how many acks."""

    def __init__(self, copies: int, trace: bool = False) -> None:
        self.copies = copies
        self.trace = trace
        self.sinks: list[SinkConnection] = []
        self.next_key = 0
        self.waiting: dict[int, list[Any]] = {}  # key -> [client, client id, acks missing]
        self.traces: dict[int, list[int]] = {}   # traced relay key -> [read, sent, then per sink ack 4 times]
        self.lost = asyncio.Event()


class ClientConnection(asyncio.Protocol):
    """A client of the relay: each message goes to ``copies`` sinks, round-robin over the relay's messages."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self._buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.acks: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        relay = self._relay
        if relay.trace:
            self._traced_data(data)
            return
        self._buf += data
        sinks, copies, waiting = relay.sinks, relay.copies, relay.waiting
        n = len(sinks)
        batches: list[list[bytes]] = [[] for _ in sinks]
        for client_id, payload in split_frames(self._buf):
            key = relay.next_key
            relay.next_key = key + 1
            head = HEADER.pack(KEY.size + len(payload), key)
            for c in range(copies):
                batch = batches[(key + c) % n]
                batch.append(head)
                batch.append(payload)
            waiting[key] = [self, KEY.pack(client_id), copies]
        for sink, batch in zip(sinks, batches, strict=True):
            if batch:
                sink.write(batch)

    def _traced_data(self, data: bytes) -> None:
        """``data_received`` with ``--trace``: a client key with ``TRACE_BIT`` is traced through the sinks."""
        read = time.monotonic_ns()
        self._buf += data
        relay = self._relay
        sinks, copies, waiting = relay.sinks, relay.copies, relay.waiting
        n = len(sinks)
        batches: list[list[bytes]] = [[] for _ in sinks]
        traced: list[int] = []
        for client_id, payload in split_frames(self._buf):
            key = relay.next_key
            relay.next_key = key + 1
            marked = key
            if client_id & TRACE_BIT:
                relay.traces[key] = [read, 0]
                traced.append(key)
                marked = key | TRACE_BIT
            head = HEADER.pack(KEY.size + len(payload), marked)
            for c in range(copies):
                batch = batches[(key + c) % n]
                batch.append(head)
                batch.append(payload)
            waiting[key] = [self, client_id, copies]
        if traced:   # "sent" as the writes start: a sink on the other core may read them before they return
            sent = time.monotonic_ns()
            for key in traced:
                relay.traces[key][1] = sent
        for sink, batch in zip(sinks, batches, strict=True):
            if batch:
                sink.write(batch)


class SinkConnection(asyncio.Protocol):
    """The relay's connection to one sink: acks complete messages; their clients get one write per sink read."""

    def __init__(self, relay: Relay, address: str) -> None:
        self._relay = relay
        self._address = address
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        log.error("lost sink %s (%s); the relay stops", self._address, exc)
        self._transport = None
        self._relay.lost.set()

    def write(self, chunks: list[bytes]) -> None:
        if self._transport is not None:
            self._transport.writelines(chunks)

    def data_received(self, data: bytes) -> None:
        if self._relay.trace:
            self._traced_data(data)
            return
        self._buf += data
        waiting = self._relay.waiting
        answered: dict[int, ClientConnection] = {}
        for key in split_keys(self._buf):
            entry = waiting[key]
            entry[2] -= 1
            if entry[2] == 0:
                del waiting[key]
                client: ClientConnection = entry[0]
                client.acks.append(entry[1])
                answered[id(client)] = client
        for client in answered.values():
            if client.transport is not None:
                client.transport.write(b"".join(client.acks))
            client.acks.clear()

    def _traced_data(self, data: bytes) -> None:
        """``data_received`` with ``--trace``: a traced ack's times go with the client's answer."""
        now = time.monotonic_ns()
        self._buf += data
        relay = self._relay
        waiting, traces = relay.waiting, relay.traces
        answered: dict[int, ClientConnection] = {}
        for key, times in split_acks(self._buf):
            entry = waiting[key]
            if times is not None and key in traces:
                traces[key].extend((*times, now))
            entry[2] -= 1
            if entry[2] == 0:
                del waiting[key]
                client: ClientConnection = entry[0]
                stages = traces.pop(key, None)
                client.acks.append(KEY.pack(entry[1]) if stages is None
                                   else traced_ack(entry[1], (*stages, time.monotonic_ns())))
                answered[id(client)] = client
        for client in answered.values():
            if client.transport is not None:
                client.transport.write(b"".join(client.acks))
            client.acks.clear()


async def serve_relay(port: int, sinks: Sequence[str], copies: int, trace: bool = False) -> None:
    if not 1 <= copies <= len(sinks):
        raise SystemExit(f"floor relay: --copies {copies} needs 1..{len(sinks)} sinks")
    loop = asyncio.get_running_loop()
    relay = Relay(copies, trace)
    for address in sinks:
        host, _, sink_port = address.rpartition(":")
        _, conn = await loop.create_connection(functools.partial(SinkConnection, relay, address), host,
                                               int(sink_port))
        relay.sinks.append(conn)
    server = await loop.create_server(lambda: ClientConnection(relay), HOST, port)
    await _serve(server, "relay", relay.lost)


async def _serve(server: asyncio.Server, role: str, lost: asyncio.Event | None = None) -> None:
    """Print the ready line (the harness waits for it), then serve until SIGTERM/SIGINT or ``lost``."""
    stop = lost or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    port = server.sockets[0].getsockname()[1]
    print(f"floor {role} ready {port}", flush=True)
    async with server:
        await stop.wait()
