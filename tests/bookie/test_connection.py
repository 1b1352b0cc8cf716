"""The client connection pool against a real bookie process: reuse, loss, reconnect, pre-encoded adds."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bookie import protocol
from bookie.connection import BookieConnectionPool
from bookie.digest import encode_entry, master_key
from bookie.errors import BKError, BookieUnavailableError
from bookie.testing import BookieProcess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_pool_reuses_reconnects_and_names_unreachable_bookies(shared_bookie: BookieProcess) -> None:
    pool = BookieConnectionPool(connect_timeout=2.0)
    addr = shared_bookie.address
    try:
        assert pool.connected(addr) is None
        conn = await pool.get(addr)
        assert pool.connected(addr) is conn and await pool.get(addr) is conn
        pending = conn.send(protocol.read_lac_request(0, 424242))
        conn.close()
        with pytest.raises(BookieUnavailableError):
            await asyncio.wait_for(pending, 5)
        assert conn.is_closed and pool.connected(addr) is None
        again = await pool.get(addr)
        assert again is not conn
        resp = await again.request(protocol.read_lac_request(again.next_txn_id(), 424242), timeout=5)
        assert resp.status in (protocol.NO_LEDGER, protocol.OK)
        dead = f"127.0.0.1:{_free_port()}"
        with pytest.raises(BookieUnavailableError, match=dead):
            await pool.get(dead)
    finally:
        pool.close()


async def test_pre_encoded_adds_are_answered_in_any_order(shared_bookie: BookieProcess) -> None:
    pool = BookieConnectionPool()
    try:
        conn = await pool.get(shared_bookie.address)
        key = master_key(b"conn-test")
        answers: dict[int, protocol.Response | BKError] = {}
        all_in = asyncio.get_running_loop().create_future()

        def answered(result: protocol.Response | BKError) -> None:
            assert isinstance(result, protocol.Response)
            answers[result.entry_id] = result
            if len(answers) == 50 and not all_in.done():
                all_in.set_result(None)

        for e in range(50):
            body = protocol.add_request_body(77001, e, key, encode_entry(77001, e, e - 1, e + 1, b"x"))
            conn.submit_add(body, answered)
        await asyncio.wait_for(all_in, 10)
        assert sorted(answers) == list(range(50))
        assert all(isinstance(r, protocol.Response) and r.status == protocol.OK for r in answers.values())
        resp = await conn.request(protocol.read_request(conn.next_txn_id(), 77001, 49), timeout=5)
        assert protocol.raise_for_status(resp).body == encode_entry(77001, 49, 48, 50, b"x")
    finally:
        pool.close()


async def test_pool_flush_writes_queued_requests_without_waiting_for_the_loop_turn(
        shared_bookie: BookieProcess) -> None:
    pool = BookieConnectionPool()
    try:
        conn = await pool.get(shared_bookie.address)
        pending = conn.send(protocol.read_lac_request(conn.next_txn_id(), 424243))
        assert conn._outbox.queued_bytes > 0      # queued for the end of this loop turn
        pool.flush()
        assert conn._outbox.queued_bytes == 0     # written now
        resp = await asyncio.wait_for(pending, 5)
        assert resp.status in (protocol.NO_LEDGER, protocol.OK)
    finally:
        pool.close()
