"""hub.server.HubConnection, the asyncio shell, on an unstarted HubServer and a fake transport (no processes)."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import struct
import weakref
from typing import Any

import pytest

from bookie.protocol import FrameDecoder
from hub.conf import load_hub_conf
from hub.proto import pubsub_pb2 as pb
from hub.server import HubConnection, HubServer

TIMEOUT = 10.0


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.reading = True
        self.paused_times = 0
        self.closing = False

    def write(self, data: Any) -> None:
        self.written += data

    def pause_reading(self) -> None:
        if self.reading:
            self.paused_times += 1
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def answers(data: bytes) -> list[pb.PubSubResponse]:
    return [pb.PubSubResponse.FromString(f) for f in FrameDecoder(1 << 20).feed(data)]


async def test_a_burst_of_empty_frames_yields_the_loop_between_budgets() -> None:
    server = HubServer(load_hub_conf(None, {"max_requests_per_turn": "100"}))   # not started: no I/O
    conn = HubConnection(server)
    transport = FakeTransport()
    conn.connection_made(transport)
    n = 100_000
    conn.data_received(b"\x00\x00\x00\x00" * n)          # one read: 100 000 requests
    assert server.stats.counters["requests_rejected"] == 100   # only this turn's budget was served
    assert not transport.reading                               # and reading stops until the rest is
    others_ran = 0

    async def other_client() -> None:    # another connection's work gets turns meanwhile
        nonlocal others_ran
        while server.stats.counters["requests_rejected"] < n:
            others_ran += 1
            await asyncio.sleep(0)

    async with asyncio.timeout(TIMEOUT):
        await other_client()
    assert others_ran >= n // 100 - 1
    await asyncio.sleep(0)
    got = answers(bytes(transport.written))
    assert transport.reading and len(got) == n and all(r.statusCode == pb.MALFORMED_REQUEST for r in got)


async def test_a_closed_connection_is_freed_at_once_with_its_partial_frame() -> None:
    server = HubServer(load_hub_conf(None, {}))
    conn = HubConnection(server)
    transport = FakeTransport()
    conn.connection_made(transport)
    conn.data_received(struct.pack(">I", 1_000_000) + b"x" * 500_000)   # most of a frame, then silence
    assert server.frame_budget.total == 500_004 and conn.partial_since is not None
    conn.send(pb.PubSubResponse())                                        # an answer queued, not yet written
    gone = weakref.ref(conn)
    gc.disable()
    try:
        conn.connection_lost(None)
        del conn, transport
        assert gone() is None     # freed by reference counting: no cycle keeps it (and its buffers) alive
    finally:
        gc.enable()
    assert server.frame_budget.total == 0
    await asyncio.sleep(0)        # the scheduled flush of the dropped answer finds nothing to write


async def test_partial_frames_over_the_hub_wide_budget_close_the_newest_holders() -> None:
    server = HubServer(load_hub_conf(None, {"max_message_size": "100000", "max_partial_frame_bytes": "1000000"}))
    aborted: list[int] = []

    def holder() -> HubConnection:
        conn = HubConnection(server)
        transport = FakeTransport()
        transport.abort = lambda: aborted.append(conn.key)   # type: ignore[method-assign]
        conn.connection_made(transport)
        conn.data_received(struct.pack(">I", 200_000) + b"x" * 199_000)   # 199 004 bytes held
        return conn

    first = [holder() for _ in range(5)]     # 995 020 bytes: within the budget
    assert not aborted and server.frame_budget.total == 5 * 199_004
    late = holder()                          # over it: the newest holder goes, the older ones stay
    assert aborted == [late.key] and late.machine.buffered == 0
    assert server.frame_budget.total == 5 * 199_004 and all(c.machine.buffered for c in first)
    assert server.stats.counters["connections_closed_partial_frame_budget"] == 1


def test_running_out_of_descriptors_is_counted_and_logged_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    server = HubServer(load_hub_conf(None, {}))
    loop = asyncio.new_event_loop()
    try:
        context = {"message": "socket.accept() out of system resource",
                   "exception": OSError(errno.EMFILE, "Too many open files")}
        with caplog.at_level(logging.ERROR, logger="hub.server"):
            for _ in range(5):
                server.loop_exception(loop, context)
        lines = [r for r in caplog.records if "cannot accept client connections" in r.getMessage()]
        assert len(lines) == 1 and "Too many open files" in lines[0].getMessage()
        assert server.stats.counters["accept_out_of_descriptors"] == 5
    finally:
        loop.close()


_OUT_OF_FDS_HUB = r"""
import asyncio, os, resource, sys, time
from hub.conf import load_hub_conf
from hub.server import HubServer

async def main() -> None:
    server = HubServer(load_hub_conf(None, {"server_port": "0"}))
    await server._listen()                      # the listener and the loop's exception handler, nothing else
    fds = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (fds + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(server.address, flush=True)
    deadline = time.monotonic() + 8
    while server.stats.counters["accept_out_of_descriptors"] < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)               # nothing to await: the counter is the observable
    print(server.stats.counters["accept_out_of_descriptors"], flush=True)

asyncio.run(main())
"""


async def test_a_hub_out_of_file_descriptors_says_so_and_counts_it() -> None:
    import os
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OUT_OF_FDS_HUB, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    writers = []
    try:
        async with asyncio.timeout(20):
            assert proc.stdout is not None
            host, port = (await proc.stdout.readline()).decode().strip().split(":")
            for _ in range(4):
                writers.append((await asyncio.open_connection(host, int(port)))[1])
            out, err = await proc.communicate()
    finally:
        for w in writers:
            w.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert int(out.decode().split()[-1]) >= 2, err      # accept() kept failing: counted every time ...
    said = [line for line in err.decode().splitlines() if "cannot accept client connections" in line]
    assert len(said) == 1 and "Too many open files" in said[0], err   # ... and said once, not at every retry


async def test_a_request_before_the_hub_has_registered_is_service_down_not_unexpected() -> None:
    """The port opens before the registration (it is named there): a client that connects in between is told
    to retry (SERVICE_DOWN), not UNEXPECTED_CONDITION, which a client gives up on (seen in a hub restart)."""
    from bookie.wire import encode_frame

    server = HubServer(load_hub_conf(None, {}))       # not started: listening, say, but not registered yet
    threshold = gc.get_threshold()
    conn = HubConnection(server)
    transport = FakeTransport()
    conn.connection_made(transport)
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=7, topic=b"t",
                           publishRequest=pb.PublishRequest(topic=b"t", msg=pb.Message(body=b"x")))
    written = asyncio.Event()
    write = transport.write

    def write_and_tell(data: Any) -> None:
        write(data)
        written.set()

    transport.write = write_and_tell  # type: ignore[method-assign]
    conn.data_received(encode_frame(req))
    await asyncio.wait_for(written.wait(), TIMEOUT)
    [got] = answers(bytes(transport.written))
    assert got.txnId == 7
    assert got.statusCode == pb.SERVICE_DOWN, pb.StatusCode.Name(got.statusCode)
    assert "starting" in got.statusMsg
    assert gc.get_threshold() == threshold, "refused before an acquisition: full collections never deferred"
