"""What the client retries: only failures that may pass, with exponential backoff; permanent ones at once.

A scripted in-process "hub" (hub.protocol on a plain asyncio server) answers every request the same way.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from hub import errors, protocol
from hub.client import HedwigClient
from hub.proto import pubsub_pb2 as pb
from hub.tls import server_context

TIMEOUT = 10.0


@asynccontextmanager
async def scripted_hub(answer: Callable[[pb.PubSubRequest], pb.PubSubResponse],
                       tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[str, list[float]]]:
    """A hub answering every request with ``answer(request)``; yields its address and the request times."""
    seen: list[float] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        machine = protocol.ServerConnection(1 << 20, 1 << 20)
        while data := await reader.read(65536):
            for ev in machine.receive_data(data):
                if isinstance(ev, protocol.RequestReceived):
                    seen.append(time.monotonic())
                    writer.write(protocol.encode(answer(ev.request)))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}", seen
    finally:
        server.close()


def redirect_to(target: str) -> Callable[[pb.PubSubRequest], pb.PubSubResponse]:
    return lambda req: protocol.response(req.txnId, pb.NOT_RESPONSIBLE_FOR_TOPIC, target, topic=req.topic,
                                         redirect_to=target)


async def test_tls_client_redirected_to_a_hub_without_tls_fails_at_once(tmp_path: Path) -> None:
    from tests.hub.test_tls import make_cert

    pem, _ = make_cert(tmp_path)
    async with scripted_hub(redirect_to("127.0.0.1:4080:0"), tls=server_context(pem)) as (address, _seen):
        async with await HedwigClient.connect(address, conf={"ssl_enabled": "true", "ssl_verify": "false"}) as c:
            t0 = time.monotonic()
            with pytest.raises(errors.CouldNotConnectError, match="serves no TLS") as info:
                await asyncio.wait_for(c.publish(b"t", b"x"), TIMEOUT)
            assert info.value.permanent and time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("target", ["no-port-here", "127.0.0.1:notaport", "127.0.0.1:70000"])
async def test_a_redirect_to_a_bad_address_fails_at_once(target: str) -> None:
    async with scripted_hub(redirect_to(target)) as (address, seen):
        async with await HedwigClient.connect(address) as c:
            t0 = time.monotonic()
            with pytest.raises(errors.CouldNotConnectError, match="bad hub address"):
                await asyncio.wait_for(c.publish(b"t", b"x"), TIMEOUT)
            assert time.monotonic() - t0 < 2.0 and len(seen) == 1


async def test_a_hubs_could_not_connect_answer_is_final() -> None:
    """A synchronous subscribe whose region subscription failed: the hub answered, and retries the region
    itself. Retrying the answer only made a refused region token take the whole 30 s timeout to show."""
    def region_refused(req: pb.PubSubRequest) -> pb.PubSubResponse:
        return protocol.response(req.txnId, pb.COULD_NOT_CONNECT, "region r2: subscribing in region r1 failed: "
                                 "this hub requires authentication", topic=req.topic)

    async with scripted_hub(region_refused) as (address, seen):
        async with await HedwigClient.connect(address, conf={"server_ack_response_timeout": "5000"}) as c:
            t0 = time.monotonic()
            with pytest.raises(errors.CouldNotConnectError, match="requires authentication") as info:
                await asyncio.wait_for(c.subscribe(b"t", b"s", synchronous=True), TIMEOUT)
            assert info.value.permanent and time.monotonic() - t0 < 2.0 and len(seen) == 1


async def test_service_down_is_retried_with_growing_waits_until_it_gives_up() -> None:
    def down(req: pb.PubSubRequest) -> pb.PubSubResponse:
        return protocol.response(req.txnId, pb.SERVICE_DOWN, "no bookies", topic=req.topic)

    async with scripted_hub(down) as (address, seen):
        async with await HedwigClient.connect(address, conf={"server_ack_response_timeout": "3000"}) as c:
            with pytest.raises(errors.ServiceDownError, match="no bookies"):
                await asyncio.wait_for(c.publish(b"t", b"x"), TIMEOUT)
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    # a fixed 50 ms wait would have asked ~60 times in 3 s; doubling waits ask about 7 times
    assert 4 <= len(seen) <= 10, gaps
    assert gaps[-1] > 4 * gaps[0], gaps


async def test_an_unreachable_hub_is_retried_until_it_comes_back() -> None:
    def ok(req: pb.PubSubRequest) -> pb.PubSubResponse:
        resp = protocol.response(req.txnId, topic=req.topic)
        resp.publishResponse.publishedMsgId.localComponent = 7
        return resp

    async with scripted_hub(ok) as (good, _seen):
        async with scripted_hub(redirect_to("127.0.0.1:1")) as (first, _):   # port 1: refused, transient
            async with await HedwigClient.connect(first, conf={"max_server_redirects": "5"}) as c:
                c.addresses.append(good)      # the next hub to try once the owner is unreachable
                assert await asyncio.wait_for(c.publish(b"t", b"x"), TIMEOUT) == 7


async def test_a_retry_that_would_start_after_the_deadline_raises_the_last_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a CI flake: a retry's wait overran a 100 ms deadline on a busy machine, and the caller got
    # "no answer within 100 ms" although the hub had answered SERVICE_DOWN in time
    import hub.client

    def down(req: pb.PubSubRequest) -> pb.PubSubResponse:
        return protocol.response(req.txnId, pb.SERVICE_DOWN, "no ledger; next attempt in 900 ms", topic=req.topic)

    monkeypatch.setattr(hub.client, "_LAST_TRY", -1.0)   # let the last wait run past the deadline
    async with scripted_hub(down) as (address, seen):
        async with await HedwigClient.connect(address, conf={"server_ack_response_timeout": "100"}) as c:
            with pytest.raises(errors.ServiceDownError, match="next attempt in"):
                await asyncio.wait_for(c.publish(b"t", b"x"), TIMEOUT)
    assert len(seen) >= 1
