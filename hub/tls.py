"""TLS for hubs and hub clients: a server context from ``cert_path``, a client context.

    from hub.tls import server_context, client_context
    ctx = server_context("conf/hub.p12", password="secret")   # PKCS#12 (as Hedwig's server.p12)
    ctx = server_context("conf/hub.pem")                      # PEM: certificate and private key
    await loop.create_server(factory, host, ssl_port, ssl=ctx, ssl_handshake_timeout=10.0)
    await loop.create_connection(factory, host, port, ssl=client_context())

A PEM file holds the certificate chain and the private key (``password``
decrypts an encrypted key); anything else is read as PKCS#12 with
``password``, through the ``cryptography`` package, and handed to ``ssl``
through a private temporary file that is removed at once.

The client context verifies the hub's certificate against ``ca_file`` (the
client key ``ssl_ca_file``; empty: the system's CAs) and checks that it names
the host the client dialled (a SAN entry: DNS name or IP address).
``verify=False`` (``ssl_verify=false``) only encrypts, as Hedwig's client did,
and says so in the log as a warning: anyone on the path can then pose as a hub.

The hub's TLS port (``TlsListener``) looks at the first byte a client sends:
a TLS ClientHello gets the handshake; anything else is a plaintext client on
the TLS port, and each of its requests is answered ``COULD_NOT_CONNECT``
with a message saying the port serves TLS, then the connection is closed.
(A TLS client on a plaintext port fails its handshake; ``hub.client`` says so.)

Failure: a missing, unreadable or malformed file, a wrong password, or a
certificate without its key raises ``hub.errors.CertificateError`` (an
``OSError``) with one line naming ``cert_path`` and the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from hub.errors import CertificateError
from metastore.tasks import spawn

log = logging.getLogger(__name__)

__all__ = ["TlsListener", "client_context", "server_context"]

_TLS_HANDSHAKE = 0x16   # first byte of a TLS record carrying a ClientHello


def server_context(cert_path: str | os.PathLike[str], password: str = "") -> ssl.SSLContext:
    """A TLS server context with the certificate and key of ``cert_path``; ``CertificateError`` if unusable."""
    path = Path(cert_path)
    if not str(cert_path):
        raise CertificateError("ssl_enabled needs cert_path (a PEM or PKCS#12 certificate file)")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CertificateError(f"cert_path {path}: {exc.strerror or exc}") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if b"-----BEGIN" in data:
        _load_pem(ctx, path, password)
    else:
        _load_pkcs12(ctx, path, data, password)
    return ctx


def _load_pem(ctx: ssl.SSLContext, path: Path, password: str) -> None:
    try:
        ctx.load_cert_chain(str(path), password=password or None)
    except (ssl.SSLError, ValueError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CertificateError(f"cert_path {path}: not a usable PEM certificate and key ({reason})") from None


def _load_pkcs12(ctx: ssl.SSLContext, path: Path, data: bytes, password: str) -> None:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, pkcs12

    try:
        key, cert, extra = pkcs12.load_key_and_certificates(data, password.encode() if password else None)
    except (ValueError, TypeError):
        raise CertificateError(f"cert_path {path}: not a PEM file, and not a PKCS#12 file that opens with the "
                               "given password") from None
    if key is None or cert is None:
        raise CertificateError(f"cert_path {path}: the PKCS#12 file lacks a certificate or its private key")
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()) + cert.public_bytes(Encoding.PEM)
    for c in extra or ():
        pem += c.public_bytes(Encoding.PEM)
    fd, tmp = tempfile.mkstemp(prefix="quire-cert-", suffix=".pem")   # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        ctx.load_cert_chain(tmp)
    except (ssl.SSLError, OSError) as exc:
        raise CertificateError(f"cert_path {path}: unusable certificate ({exc})") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def client_context(ca_file: str = "", verify: bool = True) -> ssl.SSLContext:
    """A TLS client context that verifies the hub's certificate and host name against ``ca_file``.

    ``ca_file`` empty: the system's CAs. ``verify=False``: encrypt only, with a warning in the log.
    An unreadable or malformed ``ca_file`` raises ``CertificateError`` naming it.
    """
    if not verify:
        log.warning("ssl_verify=false: hub certificates are not verified; the connection is encrypted, "
                    "but anyone on the path can pose as a hub")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file or None)
        except (ssl.SSLError, OSError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0] or type(exc).__name__
            raise CertificateError(f"ssl_ca_file {ca_file}: {reason}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _PlaintextOnTlsPort(asyncio.Protocol):
    """A plaintext client on the TLS port: every request it sends is answered COULD_NOT_CONNECT, then it is closed."""

    def __init__(self, port: int, max_frame_size: int) -> None:
        from bookie.wire import FrameDecoder

        self.decoder = FrameDecoder(max_frame_size)
        self.port = port
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        from google.protobuf.message import DecodeError

        from hub import protocol
        from hub.proto import pubsub_pb2 as pb

        assert self.transport is not None
        try:
            frames = self.decoder.feed(data)
        except Exception:
            frames = []
        out = []
        for frame in frames:
            req = pb.PubSubRequest()
            with contextlib.suppress(DecodeError):
                req.ParseFromString(frame)
            out.append(protocol.encode(protocol.response(
                req.txnId, pb.COULD_NOT_CONNECT, f"port {self.port} serves TLS only: a plaintext client "
                f"cannot use it (set ssl_enabled=true, or use the hub's plaintext port)")))
        if out:
            self.transport.writelines(out)
        self.transport.close()


class TlsListener:
    """The hub's TLS port: TLS clients get ``factory()`` over TLS, plaintext ones an answer saying so.

    Stands in for the ``asyncio.Server`` of ``create_server(..., ssl=ctx)``: ``sockets``, ``close()``,
    ``wait_closed()``. A client that sends nothing within ``handshake_timeout`` seconds is dropped.
    """

    def __init__(self, factory: Callable[[], asyncio.Protocol], ctx: ssl.SSLContext, handshake_timeout: float,
                 max_frame_size: int) -> None:
        self._factory = factory
        self._ctx = ctx
        self._timeout = handshake_timeout
        self._max_frame_size = max_frame_size
        self.sockets: list[socket.socket] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    @classmethod
    async def start(cls, factory: Callable[[], asyncio.Protocol], host: str, port: int, ctx: ssl.SSLContext,
                    handshake_timeout: float, max_frame_size: int) -> TlsListener:
        """Listen on ``host:port`` (0: a free port); ``OSError`` if it cannot be bound."""
        self = cls(factory, ctx, handshake_timeout, max_frame_size)
        sock = socket.create_server((host, port), backlog=1024)
        sock.setblocking(False)
        self.sockets.append(sock)
        self._spawn(self._accept(sock))
        return self

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        spawn(self._tasks, coro)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                if self._closed:
                    return
                log.warning("TLS port: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            self._spawn(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        port = self.sockets[0].getsockname()[1]
        try:
            first = await asyncio.wait_for(self._peek(conn), self._timeout)
            if not first:
                conn.close()
            elif first[0] == _TLS_HANDSHAKE:
                await loop.connect_accepted_socket(self._factory, conn, ssl=self._ctx,
                                                   ssl_handshake_timeout=self._timeout)
            else:
                log.info("plaintext client on TLS port %d: answered that the port serves TLS only", port)
                await loop.connect_accepted_socket(lambda: _PlaintextOnTlsPort(port, self._max_frame_size), conn)
        except asyncio.CancelledError:
            conn.close()
            raise
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            log.info("TLS port %d: connection dropped (%s)", port, exc or type(exc).__name__)
            conn.close()

    @staticmethod
    async def _peek(conn: socket.socket) -> bytes:
        loop = asyncio.get_running_loop()
        fd = conn.fileno()
        while True:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _set_once, ready)
            try:
                await ready
            finally:
                loop.remove_reader(fd)
            try:
                return conn.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                continue

    def close(self) -> None:
        """Stop accepting; connections being classified are dropped (established ones are the caller's)."""
        self._closed = True
        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            if sock.fileno() >= 0:
                loop.remove_reader(sock.fileno())
            sock.close()
        for task in list(self._tasks):
            task.cancel()

    async def wait_closed(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
