"""The client's one-timer-per-connection response timeouts (``hub.client._Deadlines``)."""

from __future__ import annotations

import asyncio

import pytest

from hub import errors
from hub.client import HedwigClient, _Deadlines


async def test_unanswered_requests_expire_in_deadline_order_answered_ones_never() -> None:
    loop = asyncio.get_running_loop()
    expired: list[int] = []
    all_done = asyncio.Event()

    def on_expired(txn: int, fut: asyncio.Future, sent_at: float) -> None:
        assert sent_at <= loop.time()
        expired.append(txn)
        fut.set_exception(errors.ResponseTimeoutError("late"))
        if len(expired) == 3:
            all_done.set()

    d = _Deadlines(on_expired)
    futs = {i: loop.create_future() for i in range(1, 6)}
    d.watch(1, futs[1], 0.20)
    d.watch(2, futs[2], 0.20)   # answered below
    d.watch(3, futs[3], 0.30)
    d.watch(4, futs[4], 0.05)   # a retry with less time left: earlier than those before it
    d.watch(5, futs[5], 0.25)   # answered below
    futs[2].set_result(None)
    futs[5].set_result(None)
    await asyncio.wait_for(all_done.wait(), 5.0)
    assert expired == [4, 1, 3]
    assert all(isinstance(futs[i].exception(), errors.ResponseTimeoutError) for i in (1, 3, 4))
    d.close()


async def test_a_hub_that_never_answers_gives_response_timeout_and_the_client_recovers() -> None:
    silent: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await HedwigClient.connect(f"127.0.0.1:{port}", conf={"server_ack_response_timeout": "300"})
    try:
        for i in range(2):   # a silent connection is dropped; the client connects again for the next request
            with pytest.raises(errors.ResponseTimeoutError, match=f"no answer from 127.0.0.1:{port}") as got:
                await asyncio.wait_for(client.publish(b"t", b"x"), 10.0)
            assert got.value.channel_dropped
            assert f"127.0.0.1:{port}" not in client.conns
            assert len(silent) == i + 1
    finally:
        await client.close()
        for w in silent:
            w.close()
        server.close()
        await server.wait_closed()
