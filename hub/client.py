"""The hub client library: ``HedwigClient`` (DESIGN.md section 6).

    c = await HedwigClient.connect("localhost:4080", conf={"max_server_redirects": 3})
    seq = await c.publish(b"topic", b"body", properties={"type": b"History"})
    await c.subscribe(b"topic", b"sub1", create_or_attach="CREATE_OR_ATTACH")
    await c.start_delivery(b"topic", b"sub1", handler)
    ...
    await c.close_subscription(b"topic", b"sub1"); await c.close()
    consumer = await c.consumer(b"jobs", b"workers", subscription_type="SHARED")   # DESIGN 6b, hub.consumer
    async with await HedwigClient.connect(addr) as c: ...                          # closes on exit

The client is a facade: connections and requests (redirects, retries) are
here, publishing in ``hub.client_publish``, Hedwig subscriptions in
``hub.client_hedwig``, consumers (SHARED, FAILOVER, KEY_SHARED, and
EXCLUSIVE with individual acks) in ``hub.client_consumers`` and ``hub.consumer``.

Handler contract: ``await handler(topic, subscriber_id, message)`` is called
for one message at a time per subscription, in seq-id order. When it
returns, the message counts as consumed: with
``auto_send_consume_message_enabled`` (default) the client sends a consume
for every ``consumed_messages_buffer_size`` handled messages (and flushes the
rest on ``close_subscription`` and ``close``). With it off, nothing is
consumed until the application calls ``consume``. If the handler raises, the
error is logged, the message is not consumed and delivery of that
subscription stops. A client-side filter passed to ``start_delivery``
(``set_subscription_preferences`` then ``test_message``) drops messages
before the handler; dropped messages count as consumed. The message a
handler gets is immutable and may be the very object other subscriptions of
the same process get for that message (``hub.client_decode`` decodes each
once): a frozen ``Message`` whose ``properties`` (and ``msg_id.remote``) are
read-only dicts (``hub.message.ReadOnlyDict``; ``dict(m.properties)`` gives a
writable copy).

At most ``max_outstanding_messages`` delivered messages wait for handlers
per subscription before the client stops reading from that hub.

Many publishes may be in flight on one connection (pipelining). Requests
follow NOT_RESPONSIBLE_FOR_TOPIC redirects up to ``max_server_redirects``
(then ``TooManyRedirectsError``), retry unreachable hubs until
``server_ack_response_timeout`` (then ``ResponseTimeoutError`` or
``CouldNotConnectError``) and retry SERVICE_DOWN answers for up to 5 s
(a dead owner's lease running out; then ``ServiceDownError``).
``connect`` accepts several comma-separated hubs; the next is tried when one
is unreachable. A request in flight when its connection drops fails with
``UncertainStateError`` (a publish may or may not have been persisted). A
request that times out on a connection that heard nothing since it was sent
drops that connection as silent (the rule is in ``hub.channel``): the client
forgets the owners it learned through it and goes to the default hub next. With
``enable_resubscribe`` the client re-attaches its subscriptions after a hub
failure or a topic move and resumes delivery, skipping messages it already
handled — except after a SUBSCRIPTION_RESET event (an operator moved the
consume pointer through the hub's admin API): the client then drops the
messages it queued and hands the redelivered ones to the handler again.

A topic or subscriber id the hub would refuse (``hub.protocol.name_problem``:
empty, not UTF-8, holding NUL, over 255 bytes) raises
``MalformedRequestError`` naming the limit before anything is sent.

Errors are ``hub.errors.PubSubError`` subclasses carrying the status name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, cast

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential, wait_random

from hub import errors
from hub.channel import Deadlines, HubChannel
from hub.client_answers import PUBLISH_ANSWERS, _publish_settled  # noqa: F401 (_publish_settled: its old home)
from hub.client_hedwig import ClientSubscriptions, SubscriptionListener
from hub.client_publish import _RETRY_WAIT, ClientPublishing
from hub.client_reader import ClientReaders, Reader  # noqa: F401 (Reader: the type reader() returns)
from hub.client_subscription import ClientSubscription, Handler
from hub.conf import HubClientConf, client_conf
from hub.consumer import Consumer
from hub.message import Message, MessageId, SubscriptionPreferences
from hub.proto import pubsub_pb2 as pb
from hub.protocol import (
    MAX_SUBSCRIBER_BYTES,
    MAX_TOPIC_BYTES,
    name_problem,
    status_name,
)
from metastore.tasks import spawn

log = logging.getLogger(__name__)

__all__ = ["Consumer", "Handler", "HedwigClient", "Message", "MessageId", "SubscriptionListener",
           "SubscriptionPreferences"]

# the names these had when they lived here
_Deadlines = Deadlines
_Conn = HubChannel
_Sub = ClientSubscription
_MAX_RETRY_WAIT = 1.0
_LAST_TRY = 0.01            # seconds: a retry is not started with less than this left before the deadline
_SERVICE_DOWN_RETRY = 5.0   # seconds of SERVICE_DOWN answers (an owner's lease running out) before giving up


class _ServiceDownAnswer(errors.ServiceDownError):
    """A SERVICE_DOWN answer inside ``_call``'s retries (raised to the caller as ``ServiceDownError``)."""



class HedwigClient(ClientPublishing, ClientReaders, ClientSubscriptions):
    """See the module docstring: a facade over the connections (``hub.channel``) and requests here, publishing
    (``hub.client_publish``), Hedwig subscriptions (``hub.client_hedwig``) and consumers (``hub.consumer``)."""

    def __init__(self, addresses: list[str], conf: HubClientConf) -> None:
        self.conf = conf
        self.addresses = addresses
        self._default = 0
        self.conns: dict[str, _Conn] = {}
        self._connecting: dict[str, asyncio.Task[_Conn]] = {}
        self._tls: ssl.SSLContext | None = None      # built once, at the first TLS connection
        self._init_publishing()
        self._token = conf.auth_token
        if not self._token and conf.auth_token_file:
            try:
                self._token = Path(conf.auth_token_file).read_text().strip()
            except OSError as exc:
                raise errors.AuthenticationError(f"auth_token_file {conf.auth_token_file}: "
                                                 f"{exc.strerror or exc}") from None
        self.owner: dict[bytes, str] = {}
        self.subs: dict[tuple[bytes, bytes], _Sub] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._listeners: list[SubscriptionListener] = []
        self.closed = False
        self._init_consumers()

    @classmethod
    async def connect(cls, address: str | None = None, conf: Mapping[str, Any] | HubClientConf | None = None
                      ) -> HedwigClient:
        """A client whose default hub is ``address`` ("host:port", or several comma separated).

        Raises ``CouldNotConnectError`` when no hub answers, ``ConfError`` for a bad conf.
        """
        cconf = client_conf(conf)
        addrs = [a.strip() for a in (address or cconf.default_server_host).split(",") if a.strip()]
        self = cls(addrs, cconf)
        last: Exception | None = None
        for i in range(len(addrs)):
            try:
                await self._conn(addrs[i])
                self._default = i
                return self
            except errors.CouldNotConnectError as exc:
                last = exc
        raise last or errors.CouldNotConnectError("no hub address given")

    # --- connections ------------------------------------------------------------------------------
    def _host_port(self, address: str) -> tuple[str, int]:
        """``host:port``, or a hub's ``host:port:sslport``: with ``ssl_enabled`` the TLS port."""
        parts = address.split(":")
        if self.conf.ssl_enabled and len(parts) >= 3 and parts[2] in ("", "0"):
            raise errors.CouldNotConnectError(f"hub {address} serves no TLS (ssl_enabled is set)", permanent=True)
        try:
            host, port = parts[0], int(parts[2] if self.conf.ssl_enabled and len(parts) >= 3 else parts[1])
        except (ValueError, IndexError):
            host, port = "", 0
        if not host or not 0 < port < 65536:
            raise errors.CouldNotConnectError(f"bad hub address {address!r} (expected host:port)", permanent=True)
        return host, port

    async def _conn(self, address: str) -> _Conn:
        """The one connection to ``address`` (concurrent callers share one attempt)."""
        conn = self.conns.get(address)
        if conn is not None and conn.alive:
            return conn
        pending = self._connecting.get(address)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._open(address))
            self._connecting[address] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(address, None))
        return await asyncio.shield(pending)

    async def _open(self, address: str) -> _Conn:
        host, port = self._host_port(address)
        loop = asyncio.get_running_loop()
        tls = None
        if self.conf.ssl_enabled:
            if self._tls is None:
                from hub.tls import client_context

                try:
                    self._tls = client_context(self.conf.ssl_ca_file, self.conf.ssl_verify)
                except errors.CertificateError as exc:
                    raise errors.CouldNotConnectError(str(exc)) from None
            tls = self._tls
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self, address), host, port, ssl=tls,
                                       server_hostname=host if tls is not None else None), 5.0)
        except ssl.SSLCertVerificationError as exc:   # retrying does not make a certificate trusted
            raise errors.UntrustedCertificateError(
                f"hub {address}: its TLS certificate is not trusted ({exc.verify_message or exc}); ssl_ca_file "
                f"names the CA that signs hub certificates, ssl_verify=false skips the check",
                permanent=True) from None
        except ssl.SSLError as exc:   # the hub answered, but not with TLS we can use: no retry helps
            transient = isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError)
            raise errors.CouldNotConnectError(
                f"TLS handshake with hub {address} failed ({exc}): does port {port} serve TLS? "
                f"(a plaintext port drops a TLS client)", permanent=not transient) from None
        except (OSError, TimeoutError, ValueError) as exc:
            if tls is not None and isinstance(exc, (ssl.SSLError, ConnectionResetError, ConnectionAbortedError)):
                raise errors.CouldNotConnectError(
                    f"TLS handshake with hub {address} failed ({exc or type(exc).__name__}): does port {port} "
                    f"serve TLS? (a plaintext port drops a TLS client)") from None
            raise errors.CouldNotConnectError(f"cannot connect to hub {address}: {exc}") from None
        if self._token:
            await self._authenticate(proto)
        self.conns[address] = proto
        return proto

    async def _authenticate(self, conn: _Conn) -> None:
        """Present the token on a new connection; ``AuthenticationError`` (connection closed) if refused."""
        req = pb.PubSubRequest(type=pb.AUTHENTICATE)
        req.authenticateRequest.token = self._token.encode()
        try:
            resp = await conn.request(req, self.conf.server_ack_response_timeout / 1000.0)
        except errors.PubSubError:
            if conn.transport is not None:
                conn.transport.close()
            raise
        if resp.statusCode != pb.SUCCESS:
            if conn.transport is not None:
                conn.transport.close()
            raise errors.error_for_status(status_name(resp.statusCode), resp.statusMsg)

    def _conn_lost(self, conn: _Conn) -> None:
        """``conn`` is gone (lost, or dropped as silent): forget the topics routed through it, resubscribe.

        A default hub dropped as silent stops being the default (the next hub given to ``connect`` is),
        so that new requests do not reconnect to a hub that accepts connections but does not answer.
        """
        if self.conns.get(conn.address) is conn:
            del self.conns[conn.address]
        if conn.dropped is not None and len(self.addresses) > 1 and self.addresses[self._default] == conn.address:
            self._default = (self._default + 1) % len(self.addresses)
        for topic in [t for t, a in self.owner.items() if a == conn.address]:
            del self.owner[topic]
        for s in list(self.subs.values()):
            if s.conn is conn:
                s.conn = None
                self._maybe_resubscribe(s)
        self._consumers_lost(conn)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        spawn(self._tasks, coro)

    # --- requests ---------------------------------------------------------------------------------
    async def _call(self, topic: bytes, req: pb.PubSubRequest) -> tuple[_Conn, pb.PubSubResponse]:
        """Send ``req`` to the topic's owner, following redirects and retrying what may succeed later.

        Retried, with exponential backoff (``_RETRY_WAIT`` doubling up to ``_MAX_RETRY_WAIT``, jittered)
        until ``server_ack_response_timeout``: a hub that cannot be reached now, and SERVICE_DOWN
        answers for up to ``_SERVICE_DOWN_RETRY``. Raised at once: a permanent
        ``CouldNotConnectError`` (a bad address, a hub without TLS for a TLS client, a failed TLS
        handshake), a hub's COULD_NOT_CONNECT answer (a synchronous subscribe whose remote region
        subscription failed: the hub keeps retrying that itself) and every other error status.
        """
        timeout = self.conf.server_ack_response_timeout / 1000.0
        deadline = time.monotonic() + timeout
        address = self.owner.get(topic) or self.addresses[self._default]
        down_since: float | None = None
        last_down: _ServiceDownAnswer | None = None

        def retryable(exc: BaseException) -> bool:
            if isinstance(exc, errors.CouldNotConnectError):
                return not exc.permanent
            return isinstance(exc, _ServiceDownAnswer) and down_since is not None \
                and time.monotonic() - down_since < _SERVICE_DOWN_RETRY

        async def attempt() -> tuple[_Conn, pb.PubSubResponse]:
            nonlocal address, down_since, last_down
            redirects = 0
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 and last_down is not None:
                    raise last_down   # a retry's wait overran the deadline: the hub's last answer stands
                if remaining <= 0:
                    raise errors.ResponseTimeoutError(f"no answer for {topic!r} within "
                                                      f"{self.conf.server_ack_response_timeout} ms")
                try:
                    conn = self.conns.get(address)
                    if conn is None or not conn.alive:
                        try:
                            conn = await asyncio.wait_for(self._conn(address), remaining)
                        except TimeoutError:   # a host that drops SYNs: give up at the request's deadline
                            raise errors.CouldNotConnectError(f"cannot connect to hub {address}: no answer "
                                                              f"within {remaining:.1f} s") from None
                except errors.CouldNotConnectError:
                    self.owner.pop(topic, None)   # the owner we were sent to is gone: start over at a live hub
                    if len(self.addresses) > 1:
                        self._default = (self._default + 1) % len(self.addresses)
                    address = self.addresses[self._default]
                    req.shouldClaim = False
                    raise
                try:
                    resp = await conn.request(req, remaining)
                except errors.ResponseTimeoutError as exc:
                    raise errors.ResponseTimeoutError(f"{exc} (request for {topic!r})",
                                                      channel_dropped=exc.channel_dropped) from None
                status = resp.statusCode
                if status == pb.SUCCESS:
                    self.owner[topic] = address
                    return conn, resp
                if resp.publishResponse.stored:   # part of a batched publish stored: final, not retried
                    return conn, resp
                if status == pb.NOT_RESPONSIBLE_FOR_TOPIC:
                    redirects += 1
                    if redirects > self.conf.max_server_redirects:
                        raise errors.TooManyRedirectsError(
                            f"{topic!r}: more than {self.conf.max_server_redirects} redirects "
                            f"(last to {resp.redirect_to or '?'})")
                    target = resp.redirect_to or resp.statusMsg
                    if target:   # "host:port:sslport": over TLS the client stays on TLS
                        parts = target.split(":")
                        address = ":".join(parts[:3] if self.conf.ssl_enabled else parts[:2])
                        req.shouldClaim = True
                    continue
                if status == pb.SERVICE_DOWN:
                    down_since = time.monotonic() if down_since is None else down_since
                    last_down = _ServiceDownAnswer(resp.statusMsg or "SERVICE_DOWN")
                    raise last_down
                err = errors.error_for_status(status_name(status), resp.statusMsg or status_name(status))
                if isinstance(err, errors.NotResponsibleForTopicError):
                    err.owner = resp.redirect_to
                if isinstance(err, errors.CouldNotConnectError):
                    # the hub's answer (a region it could not subscribe in, say), not ours: the hub
                    # retries its own connections, and a refusal (a bad region token) stays one
                    err.permanent = True
                raise err

        def out_of_time(state: RetryCallState) -> bool:
            # the request's own deadline, not tenacity's start: a retry that would begin after it raises
            # the last answer (SERVICE_DOWN, say) rather than an empty "no answer within" timeout
            return time.monotonic() + (state.upcoming_sleep or 0.0) >= deadline - _LAST_TRY

        retrying = AsyncRetrying(
            retry=retry_if_exception(retryable),
            wait=wait_exponential(multiplier=_RETRY_WAIT, max=_MAX_RETRY_WAIT) + wait_random(0, _RETRY_WAIT),
            stop=out_of_time, reraise=True)
        try:
            async for tried in retrying:
                with tried:
                    return await attempt()
        except _ServiceDownAnswer as exc:
            raise errors.ServiceDownError(str(exc)) from None
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    def _check_open(self) -> None:
        if self.closed:
            raise errors.PubSubError("client is closed", status="CLIENT_CLOSED")

    @staticmethod
    def _check_names(topic: bytes, subscriber_id: bytes | None = None) -> None:
        """``MalformedRequestError`` (naming the limit) for a name the hub would refuse; nothing is sent."""
        problem = name_problem(topic, "topic", MAX_TOPIC_BYTES)
        if problem is None and subscriber_id is not None:
            problem = name_problem(subscriber_id, "subscriber id", MAX_SUBSCRIBER_BYTES)
        if problem is not None:
            raise errors.MalformedRequestError(problem)

    async def close(self) -> None:
        """Send batched publishes and wait for the answers in flight, flush buffered consumes, close every
        subscription and connection."""
        if self.closed:
            return
        for topic in list(self._batches):   # batched publishes leave before the connections close ...
            self._flush_batch(topic)
        # ... and the publishes in flight are answered first (a Pulsar producer's close waits for its
        # pending sends), for at most server_ack_response_timeout
        waiting: list[asyncio.Future[Any]] = [   # a request's future, or a publish batch's (its Answer's futures)
            f for conn in self.conns.values() if conn.alive for answer in conn.machine.pending() if not answer.done()
            for f in (answer.futures if isinstance(answer, PUBLISH_ANSWERS) else (cast(asyncio.Future[Any], answer),))]
        waiting += self._publishing
        if waiting:
            await asyncio.wait(waiting, timeout=self.conf.server_ack_response_timeout / 1000.0)
        for (topic, sub), s in list(self.subs.items()):
            with contextlib.suppress(errors.PubSubError):
                await asyncio.wait_for(self.close_subscription(topic, sub), 5.0)
            s.closed = True
        await self._close_consumers()
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        for conn in list(self.conns.values()):
            if conn.transport is not None:
                conn.outbox.flush()   # what this turn queued (consumes) goes before the close
                conn.transport.close()
        for conn in list(self.conns.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.lost, 2.0)
        self.conns.clear()

    async def __aenter__(self) -> HedwigClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
