"""The hub client library: ``HedwigClient`` (DESIGN.md section 6).

    c = await HedwigClient.connect("localhost:4080", conf={"max_server_redirects": 3})
    seq = await c.publish(b"topic", b"body", properties={"type": b"History"})
    await c.subscribe(b"topic", b"sub1", create_or_attach="CREATE_OR_ATTACH")
    await c.start_delivery(b"topic", b"sub1", handler)
    ...
    await c.close_subscription(b"topic", b"sub1"); await c.close()

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
before the handler; dropped messages count as consumed.

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
import functools
import inspect
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential, wait_random

from hub import errors
from hub.channel import Deadlines, HubChannel
from hub.client_consumers import ClientConsumers
from hub.client_subscription import ClientSubscription, Handler
from hub.conf import HubClientConf, client_conf
from hub.consumer import Consumer, subscription_type_value
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

__all__ = ["Consumer", "Handler", "HedwigClient", "Message", "MessageId", "SubscriptionPreferences"]

# the names these had when they lived here
_Deadlines = Deadlines
_Conn = HubChannel
_Sub = ClientSubscription

SubscriptionListener = Callable[[bytes, bytes, str], Any]
"""``cb(topic, subscriber_id, event_name)``; may be a plain function or return an awaitable."""
_MODES = {"CREATE": pb.SubscribeRequest.CREATE, "ATTACH": pb.SubscribeRequest.ATTACH,
          "CREATE_OR_ATTACH": pb.SubscribeRequest.CREATE_OR_ATTACH}
_RETRY_WAIT = 0.05          # seconds before the first retry of a request; doubles up to _MAX_RETRY_WAIT
_MAX_RETRY_WAIT = 1.0
_LAST_TRY = 0.01            # seconds: a retry is not started with less than this left before the deadline
_SERVICE_DOWN_RETRY = 5.0   # seconds of SERVICE_DOWN answers (an owner's lease running out) before giving up


class _ServiceDownAnswer(errors.ServiceDownError):
    """A SERVICE_DOWN answer inside ``_call``'s retries (raised to the caller as ``ServiceDownError``)."""


def _event_name(event: int) -> str:
    try:
        return pb.SubscriptionEvent.Event.Name(event)
    except ValueError:
        return f"EVENT_{event}"


class _Batch:
    """Publishes to one topic waiting to leave as one request (``HedwigClient._batched``)."""

    __slots__ = ("bytes", "conn", "futures", "req", "timer")

    def __init__(self, conn: _Conn, req: pb.PubSubRequest) -> None:
        self.conn = conn
        self.req = req
        self.futures: list[asyncio.Future[int]] = []
        self.bytes = 0
        self.timer: asyncio.TimerHandle | asyncio.Handle | None = None   # the flush to come, when delayed


def _publish_request(topic: bytes) -> pb.PubSubRequest:
    req = pb.PubSubRequest(type=pb.PUBLISH, topic=topic)
    req.publishRequest.topic = topic
    return req


def _fill(msg: pb.Message, body: bytes, properties: Mapping[str, bytes] | None, message_type: str,
          key: bytes | None = None) -> pb.Message:
    msg.body = body
    if key is not None:
        msg.key = key
    if message_type:
        msg.header.messageType = message_type
    if properties:
        entries = msg.header.properties.entries
        for k, v in properties.items():
            entries.add(key=k, value=v)
    return msg


def _publish_settled(futures: list[asyncio.Future[int]], resp: pb.PubSubResponse) -> None:
    """Each publish of the answered request gets its seq id, or the answer's error if it was not stored."""
    status = resp.statusCode
    first = int(resp.publishResponse.publishedMsgId.localComponent)
    stored = len(futures) if status == pb.SUCCESS else resp.publishResponse.stored
    for i, fut in enumerate(futures):
        if fut.done():       # the caller cancelled it
            continue
        if i < stored:
            fut.set_result(first + i)
        else:
            fut.set_exception(errors.error_for_status(status_name(status), resp.statusMsg or status_name(status)))


def _fail_all(futures: list[asyncio.Future[int]], exc: BaseException | None) -> None:
    """``exc`` for each publish still waiting (None: cancel them)."""
    for fut in futures:
        if not fut.done():
            if exc is None:
                fut.cancel()
            else:
                fut.set_exception(exc)


def _answer_of(futures: list[asyncio.Future[int]], done: asyncio.Future[Any]) -> Any | None:
    """``done``'s result; when it was cancelled or failed, so are the publishes, and None is returned."""
    if done.cancelled():
        _fail_all(futures, None)
        return None
    exc = done.exception()
    if exc is not None:
        _fail_all(futures, exc)
        return None
    return done.result()


def _long_answered(futures: list[asyncio.Future[int]], task: asyncio.Future[tuple[Any, pb.PubSubResponse]]) -> None:
    got = _answer_of(futures, task)
    if got is not None:
        _publish_settled(futures, got[1])


async def _logged(awaitable: Awaitable[Any], what: str) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("%s raised", what)


class HedwigClient(ClientConsumers):
    """See the module docstring. Consumers (``consumer``) come from ``hub.client_consumers``."""

    def __init__(self, addresses: list[str], conf: HubClientConf) -> None:
        self.conf = conf
        self.addresses = addresses
        self._default = 0
        self.conns: dict[str, _Conn] = {}
        self._connecting: dict[str, asyncio.Task[_Conn]] = {}
        self._tls: ssl.SSLContext | None = None      # built once, at the first TLS connection
        self._sequences: dict[tuple[bytes, bytes], int] = {}   # (topic, producer) -> next sequence id
        self._batches: dict[bytes, _Batch] = {}   # topic -> publishes waiting to leave together
        self._publishing: set[asyncio.Task[Any]] = set()   # publishes going the long way (_call)
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

    # --- publish ----------------------------------------------------------------------------------
    async def publish(self, topic: bytes, body: bytes, properties: Mapping[str, bytes] | None = None, *,
                      message_type: str = "", producer: bytes | None = None,
                      sequence_id: int | None = None, key: bytes | None = None) -> int:
        """Publish durably; the message's local seq id. ``MessageTooLargeError`` over ``max_message_size``.

        ``message_type`` sets the header's system property ``messageType`` (seen by filters as
        ``Message.message_type``). ``key`` (Pulsar's message key) is stored with the message: a
        KEY_SHARED subscription hands all messages of one key to one consumer.

        Exactly once (Pulsar's producer deduplication): with ``producer`` (or the client conf's
        ``producer_name``) the owner stores (producer, ``sequence_id``) at most once per topic and
        answers a duplicate with the seq id the original got; ``DuplicatePublishError`` when the
        sequence id is older than the producer's last ``dedup_window`` publishes. Without
        ``sequence_id`` the client numbers the producer's publishes to the topic itself, increasing,
        from the time in microseconds at its first one (so a restarted client continues above its
        earlier numbers). Such a publish is retried with the same sequence id when its answer is lost
        (a connection dropped, an owner failed) until ``server_ack_response_timeout``, instead of
        raising ``UncertainStateError``; when its answer timed out on a silent hub (the connection
        dropped, see ``hub.channel``) it is asked once more, through the default hub and its redirect
        to the topic's current owner, with a fresh ``server_ack_response_timeout``: such a publish
        fails over within about twice that time and is still stored at most once.

        With ``batching_max_publish_delay_ms``, an awaited publish does not wait for the delay: the
        topic's batch leaves at the end of this event-loop turn, with whatever else the turn added
        (Pulsar's synchronous ``send`` flushes the batch too); the delay is for ``publish_async``.
        """
        fut = self.publish_async(topic, body, properties, message_type=message_type, producer=producer,
                                 sequence_id=sequence_id, key=key)
        batch = self._batches.get(topic)
        if batch is not None and batch.timer is not None:
            batch.timer.cancel()
            batch.timer = asyncio.get_running_loop().call_soon(self._flush_batch, topic, batch)
        return await fut

    def publish_async(self, topic: bytes, body: bytes, properties: Mapping[str, bytes] | None = None, *,
                      message_type: str = "", producer: bytes | None = None,
                      sequence_id: int | None = None, key: bytes | None = None) -> asyncio.Future[int]:
        """``publish`` started now; a future of its seq id (Pulsar's ``send_async``, Hedwig's ``asyncPublish``).

        Same arguments, ordering and errors as ``publish``, but a bad argument (a name the hub would
        refuse, a message over ``max_message_size``) raises here, before anything is sent, and the
        publish's own outcome comes through the future. Publishes started one after another on a
        topic are sent, stored and answered in that order; cancelling the future does not recall a
        publish already sent.

        Producer batching (Pulsar's, on by default: ``batching_enabled``): to an owner the client
        knows, the publishes a topic gets during one event-loop turn (or within
        ``batching_max_publish_delay_ms``) leave as one request of up to ``batching_max_messages``
        messages and ``batching_max_bytes`` of bodies. The owner stores them in order with
        consecutive seq ids, each future gets its own, and a failure fails exactly the messages
        that were not stored (the stored ones are always the first: its answer says how many). A
        producer's (deduplicated) publish goes alone, after whatever the topic had batched.
        """
        self._check_open()
        self._check_names(topic)
        if len(body) > self.conf.max_message_size:
            raise errors.MessageTooLargeError(f"message of {len(body)} bytes exceeds max_message_size "
                                              f"{self.conf.max_message_size}")
        if producer is None and self.conf.producer_name:
            producer = self.conf.producer_name.encode()
        if sequence_id is not None and not producer:
            raise ValueError("sequence_id needs a producer (or the client conf's producer_name)")
        if producer:
            if sequence_id is None:
                numbered = (topic, producer)
                sequence_id = self._sequences.get(numbered) or time.time_ns() // 1000
                self._sequences[numbered] = sequence_id + 1
            elif sequence_id < 0:
                raise ValueError(f"sequence_id must be >= 0, not {sequence_id}")
            req = _publish_request(topic)
            msg = _fill(req.publishRequest.msg, body, properties, message_type, key)
            msg.producer = producer
            msg.sequenceId = sequence_id
            self._flush_batch(topic)     # what the topic has batched goes first
            return spawn(self._publishing, self._publish_once(topic, req))
        if self.conf.batching_enabled:
            conn = self.conns.get(self.owner.get(topic, ""))
            if conn is not None and conn.alive:
                return self._batched(topic, conn, body, properties, message_type, key)
        self._flush_batch(topic)     # (batched on a connection that has closed since: those go first)
        req = _publish_request(topic)
        _fill(req.publishRequest.msg, body, properties, message_type, key)
        return self._publish_future(topic, req)

    def _batched(self, topic: bytes, conn: _Conn, body: bytes, properties: Mapping[str, bytes] | None,
                 message_type: str, key: bytes | None = None) -> asyncio.Future[int]:
        batch = self._batches.get(topic)
        if batch is not None and (batch.conn is not conn or batch.bytes + len(body) > self.conf.batching_max_bytes):
            self._flush_batch(topic)
            batch = None
        loop = asyncio.get_running_loop()
        if batch is None:
            batch = self._batches[topic] = _Batch(conn, _publish_request(topic))
            delay = self.conf.batching_max_publish_delay_ms
            if delay:
                batch.timer = loop.call_later(delay / 1000.0, self._flush_batch, topic, batch)
            else:
                loop.call_soon(self._flush_batch, topic, batch)
        _fill(batch.req.publishRequest.msgs.add(), body, properties, message_type, key)
        fut: asyncio.Future[int] = loop.create_future()
        batch.futures.append(fut)
        batch.bytes += len(body)
        if len(batch.futures) >= self.conf.batching_max_messages:
            self._flush_batch(topic)
        return fut

    def _flush_batch(self, topic: bytes, only: _Batch | None = None) -> None:
        """Send what ``topic`` has batched (``only``: if it is still that batch)."""
        batch = self._batches.get(topic)
        if batch is None or (only is not None and batch is not only):
            return
        del self._batches[topic]
        if batch.timer is not None:
            batch.timer.cancel()
        req = batch.req
        pub = req.publishRequest
        if len(pub.msgs) == 1:    # alone: a plain publish
            pub.msg.CopyFrom(pub.msgs[0])
            del pub.msgs[:]
        self._send_publish(topic, req, batch.futures, batch.conn)

    def _publish_future(self, topic: bytes, req: pb.PubSubRequest) -> asyncio.Future[int]:
        """A future of the seq id of the publish ``req`` (one message)."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._send_publish(topic, req, [fut], self.conns.get(self.owner.get(topic, "")))
        return fut

    def _send_publish(self, topic: bytes, req: pb.PubSubRequest, futures: list[asyncio.Future[int]],
                      conn: _Conn | None) -> None:
        """To the owner's open connection: one request and a callback. The first publish to a topic,
        and an answer that stored nothing and is not SUCCESS, go the long way (``_call``: redirects,
        retries) in a task."""
        if conn is None or not conn.alive:
            self._publish_long(topic, req, futures)
            return
        conn.request(req, self.conf.server_ack_response_timeout / 1000.0).add_done_callback(
            functools.partial(self._publish_answered, topic, req, futures))

    def _publish_answered(self, topic: bytes, req: pb.PubSubRequest, futures: list[asyncio.Future[int]],
                          answer: asyncio.Future[pb.PubSubResponse]) -> None:
        resp = _answer_of(futures, answer)
        if resp is None:
            return
        if resp.statusCode != pb.SUCCESS and not resp.publishResponse.stored:
            self._publish_long(topic, req, futures)
            return
        _publish_settled(futures, resp)

    def _publish_long(self, topic: bytes, req: pb.PubSubRequest, futures: list[asyncio.Future[int]]) -> None:
        # held in _publishing until done (close does not cancel publishes; they fail with their connection)
        spawn(self._publishing, self._call(topic, req)).add_done_callback(functools.partial(_long_answered, futures))

    async def _publish_once(self, topic: bytes, req: pb.PubSubRequest) -> int:
        """A producer's publish: a lost answer is asked again with the same sequence id (the owner dedups)."""
        timeout = self.conf.server_ack_response_timeout / 1000.0
        deadline = time.monotonic() + timeout
        failed_over = False
        while True:
            try:
                return await self._publish_future(topic, req)
            except errors.ResponseTimeoutError as exc:
                if not exc.channel_dropped or failed_over:
                    raise
                failed_over = True      # once: a second silent hub in a row is reported to the caller
                deadline = time.monotonic() + timeout
                log.info("publish of %r sequence id %d: %s; asking again elsewhere",
                         req.publishRequest.msg.producer, req.publishRequest.msg.sequenceId, exc)
                self.owner.pop(topic, None)
            except errors.UncertainStateError as exc:
                if time.monotonic() >= deadline:
                    raise
                log.info("publish of %r sequence id %d: %s; asking again", req.publishRequest.msg.producer,
                         req.publishRequest.msg.sequenceId, exc)
                self.owner.pop(topic, None)
                await asyncio.sleep(_RETRY_WAIT)

    # --- subscriptions ----------------------------------------------------------------------------
    async def subscribe(self, topic: bytes, subscriber_id: bytes, create_or_attach: str = "CREATE_OR_ATTACH",
                        message_bound: int = 0, message_window_size: int = 0,
                        options: Mapping[str, bytes] | None = None, message_filter: str | None = None,
                        *, force_attach: bool = False, synchronous: bool = False,
                        hub_subscriber: bool = False, subscription_type: str = "EXCLUSIVE") -> SubscriptionPreferences:
        """Subscribe; returns the stored preferences (those given replace them).

        ``synchronous``: the hub answers only once its remote-region subscriptions are made (or
        fails with their error); ``hub_subscriber`` marks a hub subscribing for its region.
        ``subscription_type`` other than EXCLUSIVE: a consumer underneath (``hub.client_consumers``);
        ``start_delivery`` handlers work the same, a handler's return acknowledges its message."""
        self._check_open()
        self._check_names(topic, subscriber_id)
        if create_or_attach not in _MODES:
            raise ValueError(f"create_or_attach must be one of {sorted(_MODES)}")
        if subscription_type_value(subscription_type) != pb.EXCLUSIVE:
            return await self._subscribe_typed(topic, subscriber_id, subscription_type, create_or_attach,
                                               SubscriptionPreferences(
                                                   options=dict(options or {}), message_bound=message_bound,
                                                   message_filter=message_filter or "",
                                                   message_window_size=message_window_size), force_attach)
        sreq = pb.SubscribeRequest(topic=topic, subscriberId=subscriber_id, createOrAttach=_MODES[create_or_attach],
                                   forceAttach=force_attach, synchronous=synchronous,
                                   hubSubscriber=hub_subscriber)
        sreq.preferences.CopyFrom(SubscriptionPreferences(
            options=dict(options or {}), message_bound=message_bound, message_filter=message_filter or "",
            message_window_size=message_window_size).to_proto())
        s = _Sub(topic, subscriber_id, sreq)
        old = self.subs.get((topic, subscriber_id))
        if old is not None:
            s.last_handled = old.last_handled
            await self._stop_task(old)
        conn, resp = await self._call(topic, self._sub_request(sreq))
        s.conn = conn
        s.prefs = SubscriptionPreferences.from_proto(resp.subscribeResponse.preferences)
        s.req.createOrAttach = pb.SubscribeRequest.ATTACH
        s.req.forceAttach = True    # re-attaching after a failure takes over a stale attachment
        self.subs[(topic, subscriber_id)] = s
        return s.prefs

    @staticmethod
    def _sub_request(sreq: pb.SubscribeRequest) -> pb.PubSubRequest:
        req = pb.PubSubRequest(type=pb.SUBSCRIBE, topic=sreq.topic)
        req.subscribeRequest.CopyFrom(sreq)
        return req

    def _get(self, topic: bytes, sub: bytes) -> _Sub:
        s = self.subs.get((topic, sub))
        if s is None:
            raise errors.ClientNotSubscribedError(f"{sub!r} is not subscribed to {topic!r} on this client")
        return s

    async def _sub_call(self, s: _Sub, op: int, field: str) -> None:
        req = pb.PubSubRequest(topic=s.topic)
        req.type = op  # type: ignore[assignment]
        body = getattr(req, field)
        body.topic = s.topic
        body.subscriberId = s.sub
        if op == pb.START_DELIVERY:   # deliveries may carry a run of messages, as many as the queue holds
            body.maxBatchMessages = self.conf.max_outstanding_messages
        await self._call(s.topic, req)

    async def start_delivery(self, topic: bytes, subscriber_id: bytes, handler: Handler,
                             message_filter: Any = None) -> None:
        """Deliver to ``handler`` (see the handler contract); ``PubSubError`` ALREADY_DELIVERING if started."""
        typed = self.typed.get((topic, subscriber_id))
        if typed is not None:
            await self._start_typed(typed, handler)
            return
        s = self._get(topic, subscriber_id)
        if s.handler is not None:
            raise errors.PubSubError(f"{subscriber_id!r} on {topic!r} is already delivering",
                                     status="ALREADY_DELIVERING")
        if message_filter is not None:
            message_filter.set_subscription_preferences(topic, subscriber_id, s.prefs)
        s.handler, s.filter = handler, message_filter
        s.task = asyncio.get_running_loop().create_task(self._run_handler(s))
        try:
            await self._sub_call(s, pb.START_DELIVERY, "startDeliveryRequest")
        except BaseException:
            await self._stop_task(s)
            raise

    async def _run_handler(self, s: _Sub) -> None:
        conf = self.conf
        auto_consume, per_consume = conf.auto_send_consume_message_enabled, conf.consumed_messages_buffer_size
        most = conf.max_outstanding_messages
        queue = s.queue                # cleared in place on a reset, never replaced
        while True:
            while not queue:
                s.wake.clear()
                await s.wake.wait()
            msg = queue[0]
            resets = s.resets
            if msg.seq_id > s.last_handled:
                ok = True
                if s.filter is not None:
                    try:
                        ok = bool(s.filter.test_message(msg))
                    except Exception:
                        log.exception("client filter of %r/%r raised", s.topic, s.sub)
                        ok = False
                if ok and s.handler is not None:
                    try:
                        await s.handler(s.topic, s.sub, msg)
                    except Exception:
                        log.exception("handler of %r/%r raised on seq %d; delivery stops", s.topic, s.sub,
                                      msg.seq_id)
                        s.handler = None
                        return
                if s.resets != resets:
                    continue           # reset while handled: the queue was emptied, redelivery follows
                s.last_handled = msg.seq_id
                if auto_consume:
                    s.unsent_consumes += 1
                    if s.unsent_consumes >= per_consume:
                        self._send_consume(s, s.last_handled)
            queue.popleft()
            if s.conn is not None and s.conn.paused_by and len(queue) < most:
                s.conn.paused_by.discard((s.topic, s.sub))
                if not s.conn.paused_by and s.conn.transport is not None:
                    s.conn.transport.resume_reading()

    def _send_consume(self, s: _Sub, seq: int) -> None:
        s.unsent_consumes = 0
        if s.conn is None:
            return
        req = pb.PubSubRequest(type=pb.CONSUME, topic=s.topic)
        req.consumeRequest.topic = s.topic
        req.consumeRequest.subscriberId = s.sub
        req.consumeRequest.msgId.localComponent = seq
        s.conn.one_way(req)

    def _delivered(self, conn: _Conn, topic: bytes, sub: bytes, protos: Sequence[pb.Message]) -> None:
        """Queue the messages of one delivery frame (seq order) for the subscription's handler task."""
        s = self.subs.get((topic, sub))
        if s is None or s.handler is None:
            return
        queue = s.queue
        last = s.last_queued
        from_proto = Message.from_proto
        for proto in protos:
            msg = from_proto(proto)
            seq = msg.seq_id
            if seq <= last:
                continue               # redelivered after a resubscribe: already queued or handled
            last = seq
            queue.append(msg)
        s.last_queued = last
        s.wake.set()
        if len(queue) >= self.conf.max_outstanding_messages and conn.transport is not None:
            conn.paused_by.add((topic, sub))
            conn.transport.pause_reading()

    def add_subscription_listener(self, listener: SubscriptionListener) -> None:
        """Call ``listener(topic, subscriber_id, event)`` on every subscription event of this client.

        ``event`` is the name of Hedwig's ``SubscriptionEvent``: ``"SUBSCRIPTION_FORCED_CLOSED"``
        (another client attached with force or unsubscribed it, or its server filter failed; the
        client has dropped the subscription, so ``consume`` and ``start_delivery`` on it raise
        ``ClientNotSubscribedError``) or ``"TOPIC_MOVED"`` (its topic changed owner; with
        ``enable_resubscribe`` the client attaches again by itself). A listener may be a plain
        function or return an awaitable (run as a task); what it raises is logged and ignored.
        """
        self._listeners.append(listener)

    def remove_subscription_listener(self, listener: SubscriptionListener) -> None:
        """Stop calling ``listener``; ``ValueError`` if it was not added."""
        self._listeners.remove(listener)

    def _notify(self, topic: bytes, sub: bytes, event: str) -> None:
        for listener in list(self._listeners):
            try:
                got = listener(topic, sub, event)
                if inspect.isawaitable(got):
                    self._spawn(_logged(got, f"subscription listener ({event} of {topic!r}/{sub!r})"))
            except Exception:
                log.exception("subscription listener raised on %s of %r/%r", event, topic, sub)

    def _sub_event(self, conn: _Conn, topic: bytes, sub: bytes, event: int) -> None:
        s = self.subs.get((topic, sub))
        if s is None or s.conn is not conn:
            return
        if event == pb.SubscriptionEvent.SUBSCRIPTION_RESET:
            log.info("subscription %r/%r was reset by an operator: redelivery follows", topic, sub)
            s.resets += 1
            s.queue.clear()
            s.last_queued = s.last_handled = s.unsent_consumes = 0
            if (topic, sub) in conn.paused_by:    # the queue that paused reading is gone
                conn.paused_by.discard((topic, sub))
                if not conn.paused_by and conn.transport is not None:
                    conn.transport.resume_reading()
            return
        s.conn = None
        if event == pb.SubscriptionEvent.SUBSCRIPTION_FORCED_CLOSED:
            log.warning("subscription %r/%r was closed by the hub (another attach, an unsubscribe elsewhere "
                        "or a bad filter)", topic, sub)
            self._forced_closed(s)
            return
        self.owner.pop(topic, None)
        self._maybe_resubscribe(s)
        self._notify(topic, sub, _event_name(event))

    def _forced_closed(self, s: _Sub) -> None:
        """The hub closed ``s``: drop it (its consumes would go nowhere) and tell the listeners."""
        s.closed = True
        s.conn = None
        s.handler = None
        task, s.task = s.task, None
        if task is not None:
            task.cancel()
        s.queue.clear()
        if self.subs.get((s.topic, s.sub)) is s:
            del self.subs[(s.topic, s.sub)]
        self._notify(s.topic, s.sub, "SUBSCRIPTION_FORCED_CLOSED")

    def _maybe_resubscribe(self, s: _Sub) -> None:
        if self.closed or s.closed or not self.conf.enable_resubscribe or s.resubscribing:
            return
        s.resubscribing = True
        self._spawn(self._resubscribe(s))

    async def _resubscribe(self, s: _Sub) -> None:
        wait = self.conf.subscribe_reconnect_retry_wait_time / 1000.0
        try:
            while not self.closed and not s.closed and self.subs.get((s.topic, s.sub)) is s:
                try:
                    conn, resp = await self._call(s.topic, self._sub_request(s.req))
                    s.conn = conn
                    s.prefs = SubscriptionPreferences.from_proto(resp.subscribeResponse.preferences)
                    if s.handler is not None:
                        await self._sub_call(s, pb.START_DELIVERY, "startDeliveryRequest")
                    log.info("resubscribed %r/%r at %s", s.topic, s.sub, conn.address)
                    return
                except errors.ClientNotSubscribedError:
                    # removed while we were away (an unsubscribe elsewhere): as if the hub had closed it
                    log.warning("subscription %r/%r is gone; not resubscribing", s.topic, s.sub)
                    self._forced_closed(s)
                    return
                except errors.PubSubError as exc:
                    log.info("resubscribe %r/%r failed: %s", s.topic, s.sub, exc)
                    await asyncio.sleep(wait)
        finally:
            s.resubscribing = False

    async def consume(self, topic: bytes, subscriber_id: bytes, seq_id: int) -> None:
        """Consume up to ``seq_id`` (one-way; the hub applies requests of a connection in order)."""
        typed = self.typed.get((topic, subscriber_id))
        if typed is not None:   # a cumulative ack (NOT_ALLOWED on SHARED and KEY_SHARED)
            await typed.ack_cumulative(Message(b"", msg_id=MessageId(seq_id)))
            return
        s = self._get(topic, subscriber_id)
        if s.conn is None:
            raise errors.ServiceDownError(f"{subscriber_id!r} on {topic!r} is reconnecting")
        self._send_consume(s, seq_id)

    async def _stop_task(self, s: _Sub) -> None:
        s.handler = None
        task, s.task = s.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        s.queue.clear()

    async def stop_delivery(self, topic: bytes, subscriber_id: bytes) -> None:
        typed = self.typed.get((topic, subscriber_id))
        if typed is not None:
            await self._stop_typed(typed)
            return
        s = self._get(topic, subscriber_id)
        await self._stop_task(s)
        if s.conn is not None:
            await self._sub_call(s, pb.STOP_DELIVERY, "stopDeliveryRequest")

    def _flush(self, s: _Sub) -> None:
        if s.unsent_consumes and s.last_handled:
            self._send_consume(s, s.last_handled)

    async def close_subscription(self, topic: bytes, subscriber_id: bytes) -> None:
        """Flush buffered consumes, stop delivery, detach (the subscription stays stored)."""
        typed = self.typed.pop((topic, subscriber_id), None)
        if typed is not None:
            await self._close_typed(typed)
            return
        s = self._get(topic, subscriber_id)
        s.closed = True
        await self._stop_task(s)
        self._flush(s)
        self.subs.pop((topic, subscriber_id), None)
        if s.conn is not None:
            await self._sub_call(s, pb.CLOSESUBSCRIPTION, "closeSubscriptionRequest")

    async def unsubscribe(self, topic: bytes, subscriber_id: bytes) -> None:
        """Remove the subscription; ``ClientNotSubscribedError`` when it does not exist."""
        self._check_names(topic, subscriber_id)
        typed = self.typed.pop((topic, subscriber_id), None)
        if typed is not None:
            await self._close_typed(typed)
        s = self.subs.pop((topic, subscriber_id), None)
        if s is not None:
            s.closed = True
            await self._stop_task(s)
        req = pb.PubSubRequest(type=pb.UNSUBSCRIBE, topic=topic)
        req.unsubscribeRequest.topic = topic
        req.unsubscribeRequest.subscriberId = subscriber_id
        await self._call(topic, req)

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
        waiting: list[asyncio.Future[Any]] = [
            f for conn in self.conns.values() if conn.alive for f in conn.machine.pending() if not f.done()]
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
