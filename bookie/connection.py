"""Client connections to bookies: one pipelined ``asyncio.Protocol`` per bookie address.

    pool = BookieConnectionPool(connect_timeout=3.0)
    conn = await pool.get("127.0.0.1:3181")     # BookieUnavailableError if it cannot connect
    response = await conn.request(add_request(conn.next_txn_id(), ...))

Requests written in one loop turn leave in one ``writelines`` call; responses
are matched by txn id (``bookie.protocol.PendingRequests``) in whatever order
they come. When the connection drops every outstanding request fails with
``BookieUnavailableError``; the next ``pool.get`` reconnects.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from bookie import protocol
from bookie.errors import BookieUnavailableError, ProtocolError

log = logging.getLogger(__name__)


class BookieConnection(asyncio.Protocol):
    """One TCP connection to one bookie; requests pipeline, responses match by txn id."""

    def __init__(self, address: str, max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE) -> None:
        self.address = address
        self._decoder = protocol.FrameDecoder(max_frame_size)
        self._pending: protocol.PendingRequests[asyncio.Future[protocol.Response]] = protocol.PendingRequests()
        self._transport: asyncio.Transport | None = None
        self._outbox: list[bytes] = []
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        self.closed = False

    # asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            log.warning("bookie %s sent a bad frame: %s", self.address, exc)
            self._fail(BookieUnavailableError(f"bookie {self.address}: {exc}"))
            return
        for frame in frames:
            try:
                response = protocol.parse_response(frame)
                fut = self._pending.complete(response)
            except ProtocolError as exc:
                log.warning("bookie %s: %s", self.address, exc)
                continue
            if not fut.done():
                fut.set_result(response)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(BookieUnavailableError(f"connection to bookie {self.address} lost"
                                          + (f": {exc}" if exc else "")))

    # API -------------------------------------------------------------------------------------
    def next_txn_id(self) -> int:
        return self._pending.next_txn_id()

    def send(self, request: protocol.Request) -> asyncio.Future[protocol.Response]:
        """Queue ``request``; the future resolves to its response (any status) or fails."""
        fut: asyncio.Future[protocol.Response] = self._loop.create_future()
        if self.closed or self._transport is None:
            fut.set_exception(BookieUnavailableError(f"connection to bookie {self.address} is closed"))
            return fut
        self._pending.add(request, fut)
        self._outbox.append(protocol.encode_frame(request))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return fut

    async def request(self, request: protocol.Request, timeout: float | None = None) -> protocol.Response:
        fut = self.send(request)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self._pending.pop(request.txn_id)
            raise

    def forget(self, txn_id: int) -> None:
        self._pending.pop(txn_id)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._outbox and self._transport is not None and not self.closed:
            out, self._outbox = self._outbox, []
            self._transport.writelines(out)

    def _fail(self, exc: BookieUnavailableError) -> None:
        self.closed = True
        self._outbox.clear()
        for fut in self._pending.drain():
            if not fut.done():
                fut.set_exception(exc)
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self._fail(BookieUnavailableError(f"connection to bookie {self.address} closed"))


class BookieConnectionPool:
    """Connections by bookie address, opened on first use and re-opened after a loss."""

    def __init__(self, connect_timeout: float = 3.0,
                 max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE) -> None:
        self.connect_timeout = connect_timeout
        self.max_frame_size = max_frame_size
        self._conns: dict[str, BookieConnection] = {}
        self._connecting: dict[str, asyncio.Future[BookieConnection]] = {}

    async def get(self, address: str) -> BookieConnection:
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[BookieConnection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = fut
        try:
            conn = await self._connect(address)
            self._conns[address] = conn
            fut.set_result(conn)
            return conn
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            self._connecting.pop(address, None)

    async def _connect(self, address: str) -> BookieConnection:
        host, _, port = address.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: BookieConnection(address, self.max_frame_size), host, int(port)),
                self.connect_timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            raise BookieUnavailableError(f"cannot connect to bookie {address}: {exc or 'timeout'}") from None
        return proto

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
