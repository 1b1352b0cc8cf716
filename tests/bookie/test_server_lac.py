"""WRITE_LAC and long-poll READ_LAC against a real bookie process, and the server's parked reads in process.

Ordering proofs use the bookie's in-order serving of one connection: once
the answer to a later request on the same connection (GET_BOOKIE_INFO)
arrives, the long poll before it has been served, that is parked.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from bookie import protocol as proto
from bookie.conf import BookieConf
from bookie.digest import master_key
from bookie.server import BookieServer
from bookie.testing import BookieProcess, RawBookieClient
from tests.bookie.conftest import KEY, add_req

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0  # every await of an answer is bounded by this


def long_poll(ledger_id: int, previous: int, timeout_ms: int = 30_000) -> proto.Request:
    return proto.read_lac_request(0, ledger_id, previous_lac=previous, timeout_ms=timeout_ms)


async def parked(client: RawBookieClient, req: proto.Request) -> asyncio.Future[proto.Response]:
    """Send ``req``; return its future once a later request on the connection was answered (it is parked)."""
    req.txn_id = client.conn.next_txn_id()
    fut = client.conn.send(req)
    assert (await client.call(proto.bookie_info_request(0), timeout=WAIT)).status == proto.OK
    assert not fut.done(), f"answered at once: {fut.result() if not fut.exception() else fut.exception()}"
    return fut


async def lac_of(client: RawBookieClient, ledger_id: int) -> int:
    resp = await client.call(proto.read_lac_request(0, ledger_id), timeout=WAIT)
    assert resp.status == proto.OK, resp
    return resp.lac


# --- against the shared bookie process -------------------------------------------------------------


async def test_write_lac_raises_the_served_lac_and_never_lowers_it(client: RawBookieClient) -> None:
    for i in range(3):  # piggybacked LAC 1 (entry 2 carries it)
        assert (await client.call(add_req(301, i, lac=i - 1))).status == proto.OK
    assert await lac_of(client, 301) == 1
    resp = await client.call(proto.write_lac_request(0, 301, KEY, 2))
    assert (resp.status, resp.op, resp.lac) == (proto.OK, proto.WRITE_LAC, 2)
    assert await lac_of(client, 301) == 2          # the explicit one is larger
    assert (await client.call(proto.write_lac_request(0, 301, KEY, 0))).status == proto.OK
    assert await lac_of(client, 301) == 2          # a lower explicit LAC changes nothing


async def test_write_lac_with_the_wrong_master_key_is_refused(client: RawBookieClient) -> None:
    assert (await client.call(add_req(302, 0))).status == proto.OK
    assert (await client.call(add_req(302, 1, lac=0))).status == proto.OK
    bad = await client.call(proto.write_lac_request(0, 302, master_key(b"wrong"), 1))
    assert bad.status == proto.UNAUTHORIZED
    assert await lac_of(client, 302) == 0
    # the refused write left no trace: the right key still works
    assert (await client.call(proto.write_lac_request(0, 302, KEY, 1))).status == proto.OK
    assert await lac_of(client, 302) == 1


async def test_long_poll_is_answered_by_the_next_add(client: RawBookieClient,
                                                     shared_bookie: BookieProcess) -> None:
    assert (await client.call(add_req(303, 0))).status == proto.OK
    assert (await client.call(add_req(303, 1, lac=0))).status == proto.OK
    fut = await parked(client, long_poll(303, previous=0))
    writer = await RawBookieClient.connect(shared_bookie.address)
    try:
        assert (await writer.call(add_req(303, 2, lac=1))).status == proto.OK   # carries LAC 1
        started = time.monotonic()
        resp = await asyncio.wait_for(fut, WAIT)
        assert time.monotonic() - started < WAIT / 2
    finally:
        await writer.close()
    assert (resp.status, resp.op, resp.lac) == (proto.OK, proto.READ_LAC, 1)
    assert resp.entry_id in (1, 2)  # answered as the add arrived: entry 2 may not be committed yet


async def test_long_poll_is_answered_by_a_write_lac(client: RawBookieClient, shared_bookie: BookieProcess) -> None:
    assert (await client.call(add_req(304, 0))).status == proto.OK
    fut = await parked(client, long_poll(304, previous=-1))
    writer = await RawBookieClient.connect(shared_bookie.address)
    try:
        assert (await writer.call(proto.write_lac_request(0, 304, KEY, 0))).status == proto.OK
        resp = await asyncio.wait_for(fut, WAIT)
    finally:
        await writer.close()
    assert (resp.status, resp.lac) == (proto.OK, 0)


async def test_long_poll_answers_at_once_when_the_lac_is_past_and_times_out_cleanly(
        client: RawBookieClient) -> None:
    assert (await client.call(add_req(305, 0))).status == proto.OK
    assert (await client.call(add_req(305, 1, lac=0))).status == proto.OK
    now = await client.call(long_poll(305, previous=-1), timeout=WAIT)
    assert (now.status, now.lac) == (proto.OK, 0)
    started = time.monotonic()
    late = await client.call(long_poll(305, previous=0, timeout_ms=300), timeout=WAIT)
    elapsed = time.monotonic() - started
    assert (late.status, late.lac, late.entry_id) == (proto.OK, 0, 1)
    assert 0.29 <= elapsed < 5.0


async def test_long_poll_on_a_ledger_the_bookie_does_not_know(client: RawBookieClient,
                                                              shared_bookie: BookieProcess) -> None:
    timed_out = await client.call(long_poll(306, previous=-1, timeout_ms=100), timeout=WAIT)
    assert timed_out.status == proto.NO_LEDGER
    fut = await parked(client, long_poll(307, previous=-1))
    writer = await RawBookieClient.connect(shared_bookie.address)
    try:  # the ledger's first adds reach the bookie after the poll: the second one's LAC answers it
        assert (await writer.call(add_req(307, 0))).status == proto.OK
        assert not fut.done()   # entry 0 carries LAC -1: no rise
        assert (await writer.call(add_req(307, 1, lac=0))).status == proto.OK
        resp = await asyncio.wait_for(fut, WAIT)
    finally:
        await writer.close()
    assert (resp.status, resp.lac) == (proto.OK, 0)


async def test_a_connection_parks_a_bounded_number_per_ledger(client: RawBookieClient,
                                                             shared_bookie: BookieProcess) -> None:
    limit = BookieConf().max_long_poll_reads_per_ledger
    assert (await client.call(add_req(308, 0))).status == proto.OK
    futs = [client.conn.send(_with_txn(client, long_poll(308, previous=-1))) for _ in range(limit)]
    refused = await client.call(long_poll(308, previous=-1), timeout=WAIT)
    assert refused.status == proto.TOO_MANY_REQUESTS, refused
    assert not any(f.done() for f in futs)
    # another ledger on the same connection still parks, and plain requests are served
    other = await parked(client, long_poll(309, previous=-1, timeout_ms=200))
    writer = await RawBookieClient.connect(shared_bookie.address)
    try:
        assert (await writer.call(add_req(308, 1, lac=0))).status == proto.OK
        answers = await asyncio.wait_for(asyncio.gather(*futs), WAIT)
    finally:
        await writer.close()
    assert [(r.status, r.lac) for r in answers] == [(proto.OK, 0)] * limit
    assert (await asyncio.wait_for(other, WAIT)).status == proto.NO_LEDGER   # timed out, unknown ledger
    assert (await client.call(long_poll(308, previous=0, timeout_ms=50), timeout=WAIT)).status == proto.OK


def _with_txn(client: RawBookieClient, req: proto.Request) -> proto.Request:
    req.txn_id = client.conn.next_txn_id()
    return req


# --- the server in process: connection loss and stop --------------------------------------------------


async def test_a_lost_connection_drops_its_parked_reads(server: BookieServer) -> None:
    c = await RawBookieClient.connect(server.address)
    assert (await c.call(add_req(1, 0))).status == proto.OK
    await parked(c, long_poll(1, previous=-1))
    await parked(c, long_poll(2, previous=-1))
    assert len(server.long_polls) == 2
    (conn,) = server.connections
    assert conn.state.in_flight == 2          # parked reads count as requests in flight
    dropped = asyncio.Event()
    drop = server.drop_long_polls

    def drop_and_tell(c: object) -> None:
        drop(c)  # type: ignore[arg-type]
        dropped.set()

    server.drop_long_polls = drop_and_tell  # type: ignore[method-assign]
    await c.close()
    await asyncio.wait_for(dropped.wait(), WAIT)
    assert len(server.long_polls) == 0 and not server.long_polls.watched(1)
    assert conn.state.in_flight == 0
    # a later rise finds nobody to answer, and the bookie serves on
    c2 = await RawBookieClient.connect(server.address)
    try:
        assert (await c2.call(add_req(1, 1, lac=0))).status == proto.OK
        assert await lac_of(c2, 1) == 0
    finally:
        await c2.close()


async def test_stop_answers_parked_reads_with_the_lac_it_has(server: BookieServer) -> None:
    c = await RawBookieClient.connect(server.address)
    try:
        assert (await c.call(add_req(5, 0))).status == proto.OK
        assert (await c.call(add_req(5, 1, lac=0))).status == proto.OK
        fut = await parked(c, long_poll(5, previous=0))
        in_flight_add = c.conn.send(_with_txn(c, add_req(5, 2, lac=0)))
        await server.stop()
        resp = await asyncio.wait_for(fut, WAIT)
        assert (resp.status, resp.lac) == (proto.OK, 0) and resp.entry_id in (1, 2)
        assert (await asyncio.wait_for(in_flight_add, WAIT)).status == proto.OK
        assert len(server.long_polls) == 0
    finally:
        await c.close()
