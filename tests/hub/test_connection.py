"""hub.server.HubConnection, the asyncio shell, against a stub server and a fake transport (no processes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from bookie.protocol import FrameDecoder
from hub.conf import load_hub_conf
from hub.proto import pubsub_pb2 as pb
from hub.server import HubConnection, HubStats

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


class StubServer:
    """What a HubConnection uses of its HubServer when it only answers bad requests."""

    def __init__(self, **conf: str) -> None:
        self.conf = load_hub_conf(None, conf)
        self.stats = HubStats()
        self.connections: set[HubConnection] = set()
        self.topics: dict[bytes, Any] = {}

    def flush_soon(self, flush: Callable[[], None]) -> None:
        asyncio.get_running_loop().call_soon(flush)


def answers(data: bytes) -> list[pb.PubSubResponse]:
    return [pb.PubSubResponse.FromString(f) for f in FrameDecoder(1 << 20).feed(data)]


async def test_a_burst_of_empty_frames_yields_the_loop_between_budgets() -> None:
    server = StubServer(max_requests_per_turn="100")
    conn = HubConnection(server)   # type: ignore[arg-type]
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
