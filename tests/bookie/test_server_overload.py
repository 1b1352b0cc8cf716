"""Hostile clients against a real bookie process: memory stays bounded, the loop keeps answering.

Each test measures the bookie's resident memory (``/proc/PID/status``) before
and after the attack, and times requests of a well-behaved client made
while the attack goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time

import pytest

from bookie import protocol as proto
from bookie.registration import list_bookies
from bookie.testing import BookieProcess, RawBookieClient
from metastore import open_metastore
from tests.bookie.conftest import StartBookie, add_req

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(not hasattr(socket, "SO_RCVBUF"), reason="POSIX")]

MiB = 1024 * 1024


async def _responsive(bookie: BookieProcess, rounds: int = 20) -> float:
    """The slowest of ``rounds`` GET_BOOKIE_INFO round trips on a fresh connection (seconds)."""
    c = await RawBookieClient.connect(bookie.address)
    worst = 0.0
    try:
        for _ in range(rounds):
            t = time.perf_counter()
            assert (await c.call(proto.bookie_info_request(0), timeout=5)).status == proto.OK
            worst = max(worst, time.perf_counter() - t)
            await asyncio.sleep(0.02)
    finally:
        await c.close()
    return worst


def _lazy_socket(address: str) -> socket.socket:
    """A client socket that sends and never reads (small receive buffer)."""
    host, _, port = address.rpartition(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect((host, int(port)))
    return s


async def _rss_settles(bookie: BookieProcess, seconds: float = 1.0) -> int:
    """RSS once it stopped growing for ``seconds`` (bounded wait)."""
    last = bookie.rss()
    async with asyncio.timeout(30):
        while True:
            await asyncio.sleep(seconds)
            now = bookie.rss()
            if now <= last + MiB:
                return now
            last = now


async def test_unread_responses_do_not_pile_up(start_bookie: StartBookie, metastore_uri: str) -> None:
    """1 000 READs of a 1 MiB entry whose responses are never read: RSS bounded, loop and registration fine."""
    bookie = start_bookie("reads", session_timeout=1000)
    c = await RawBookieClient.connect(bookie.address)
    try:
        assert (await c.call(add_req(1, 0, b"e" * MiB))).status == proto.OK
        assert (await c.call(proto.read_request(0, 1, 0))).status == proto.OK  # page the entry in
    finally:
        await c.close()
    before = await _rss_settles(bookie, 0.3)

    lazy = _lazy_socket(bookie.address)
    try:
        lazy.sendall(b"".join(proto.encode_frame(proto.read_request(i + 1, 1, 0)) for i in range(1000)))
        worst = await _responsive(bookie)
        await asyncio.sleep(2.5)  # > session_timeout: the registration must survive
        after = await _rss_settles(bookie)
        ms = await open_metastore(metastore_uri)
        try:
            assert bookie.address in await list_bookies(ms)
        finally:
            await ms.close()
    finally:
        lazy.close()
    assert bookie.alive()
    assert worst < 1.0, f"the loop stalled {worst:.2f} s"
    assert after - before < 150 * MiB, f"RSS grew by {(after - before) / MiB:.0f} MiB (unbounded: ~1000 MiB)"


async def test_partial_frames_share_one_budget(start_bookie: StartBookie) -> None:
    """100 connections each holding 5 MiB of an unfinished frame: the newest are closed, RSS bounded."""
    bookie = start_bookie("partial", max_partial_frame_bytes=32 * MiB)
    before = await _rss_settles(bookie, 0.3)
    body = b"p" * (5 * MiB - 64)
    header = struct.pack(">I", 5 * MiB - 16)  # announces a bit more than is sent: the frame stays partial
    socks: list[socket.socket] = []

    def attack() -> None:
        for _ in range(100):
            s = _lazy_socket(bookie.address)
            socks.append(s)
            with contextlib.suppress(OSError):  # closed by the bookie over budget
                s.sendall(header + body)

    def was_closed(s: socket.socket) -> bool:
        s.setblocking(False)
        try:
            return s.recv(1) == b""
        except BlockingIOError:
            return False  # open, nothing to read
        except OSError:
            return True  # reset by the bookie

    try:
        attack_task = asyncio.create_task(asyncio.to_thread(attack))
        worst = await _responsive(bookie, rounds=30)
        await asyncio.wait_for(attack_task, 90)
        after = await _rss_settles(bookie)
        closed = sum(was_closed(s) for s in socks)
    finally:
        for s in socks:
            s.close()
    assert bookie.alive()
    assert worst < 1.0, f"the loop stalled {worst:.2f} s"
    assert closed >= 90, f"only {closed} of 100 connections were closed over the budget"
    assert after - before < 100 * MiB, f"RSS grew by {(after - before) / MiB:.0f} MiB (unbounded: ~500 MiB)"
    assert "max_partial_frame_bytes" in bookie.log_path.read_text()


async def test_in_flight_cap_loses_no_request(start_bookie: StartBookie) -> None:
    """With 10 requests in flight at most, 2 000 pipelined adds on one connection are all acknowledged."""
    bookie = start_bookie("capped", max_pending_requests=10, max_pending_response_bytes=65536)
    c = await RawBookieClient.connect(bookie.address)
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(c.call(add_req(3, i, b"c" * 100, lac=i - 1), timeout=60) for i in range(2000))), 60)
        assert [r.status for r in results] == [proto.OK] * 2000
        last = await c.call(proto.read_request(0, 3, proto.LAST_ENTRY))
        assert (last.status, last.entry_id) == (proto.OK, 1999)
    finally:
        await c.close()
    assert bookie.alive()
