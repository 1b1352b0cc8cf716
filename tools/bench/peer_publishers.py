"""The comparison peers under load in ``quire bench publish`` (and ``fanout``, ``queue``): pipelined
Redis Streams XADDs and NATS JetStream publishes, one connection and stream key/subject per publisher.

    async with redis_publishers(url, n, body, run_id) as submits:   # each submit: one publish, acked
        await submits[0]()

``tools.bench.publish`` re-exports every name here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

from tools.bench.load import Submit

__all__ = ["RedisPipe", "nats_publishers", "redis_publishers"]


class RedisPipe:
    """XADDs pipelined on one redis.asyncio connection: writes in order, one task reads replies in order."""

    def __init__(self, url: str, key: str) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.connection import parse_url

        self._conn = aioredis.Connection(**parse_url(url))
        self.key = key
        self._pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._reader: asyncio.Task[None] | None = None

    async def open(self) -> RedisPipe:
        await self._conn.connect()  # type: ignore[no-untyped-call]
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        while True:
            try:
                reply = await self._conn.read_response(disconnect_on_error=False)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the connection failed: fail everything in flight
                import redis.exceptions

                if isinstance(exc, redis.exceptions.ResponseError) and self._pending:
                    self._pending.popleft().set_exception(exc)
                    continue
                while self._pending:
                    self._pending.popleft().set_exception(exc)
                return
            if self._pending:
                self._pending.popleft().set_result(reply)

    async def xadd(self, body: bytes) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(fut)  # before the write: replies come back in write order
        await self._conn.send_packed_command(self._conn.pack_command("XADD", self.key, "*", "b", body),
                                             check_health=False)
        return await fut

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self._conn.disconnect()


@contextlib.asynccontextmanager
async def redis_publishers(url: str, n: int, body: bytes, run_id: str) -> AsyncIterator[list[Submit]]:
    pipes = [await RedisPipe(url, f"bench-{run_id}-{i}").open() for i in range(n)]
    try:
        for p in pipes:
            await p.xadd(body)
        yield [functools.partial(p.xadd, body) for p in pipes]
    finally:
        for p in pipes:
            await p.close()


@contextlib.asynccontextmanager
async def nats_publishers(url: str, n: int, body: bytes, run_id: str) -> AsyncIterator[list[Submit]]:
    import nats

    conns = [await nats.connect(url) for _ in range(n)]
    stream = f"BENCH_{run_id}"
    try:
        jss = [c.jetstream() for c in conns]
        await jss[0].add_stream(name=stream, subjects=[f"bench.{run_id}.>"], storage="file")
        submits: list[Submit] = []
        for i, js in enumerate(jss):
            await js.publish(f"bench.{run_id}.{i}", body)
            submits.append(functools.partial(js.publish, f"bench.{run_id}.{i}", body))
        yield submits
        await jss[0].delete_stream(stream)
    finally:
        for c in conns:
            await c.close()
