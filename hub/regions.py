"""Cross-region subscriptions: a topic with local subscribers pulls every other region's messages.

    # hw_server.conf                       # hw_region_client.conf (region_client_conf=PATH)
    region=r1                              ssl_enabled=false
    regions=r2 r3                          remote_hubs=r2=10.0.0.2:4080 r3=10.0.0.3:4080,10.0.0.4:4080

    manager = RegionManager(server)        # HubServer builds one; a no-op without ``regions``
    await manager.subscribers_changed(topic, synchronous=False)   # after a local (un)subscribe
    manager.stamp(topic, msg)              # every local publish carries the topic's vector-max

Hedwig's design (hedwig-docs-and-metastore.txt, "Design"): when a topic has
at least one local subscriber, the hub that owns it subscribes to the topic
in every other region as a *hub subscriber* (subscriber id
``__region_<this region>``, ``hubSubscriber`` set) and persists what it
receives in the local topic, keeping ``srcRegion``. When the last local
subscriber leaves, the remote subscriptions are removed (unsubscribed).
When the topic moves to another hub, the remote subscriptions are only
closed: the new owner attaches to them with the same id and resumes from
their consume pointers.

Version vectors: a message's seq id is its local component plus one
component per other region (``MessageSeqId.remoteComponents``); a region's
component is that region's local seq id on the topic. The owner keeps the
component-wise maximum per topic (recovered from the topic's last message
when it acquires the topic) and stamps it on every message it persists.
A message from region R whose R component is not above the vector-max was
persisted already (a redelivery after a crash) and is skipped, so a
remote message is persisted once.

No loops: the remote subscription carries the server filter
``hub.regions.RegionFilter`` with option ``quire.region=R``, so region R's
hub forwards only messages that originated in R (not those it received from
a third region). With all-to-all subscriptions each message reaches each
region exactly once.

Who may hold a region subscription (``__region_*``, or ``hubSubscriber``
set): with ``authentication_enabled``, roles in ``region_roles`` or
``superuser_roles`` only (``hub.permissions``). Without it a hub has only
the peer's address to go by: such a request is served only when it comes
from a configured region hub, an address of one of the hubs that
``regions`` / the region client conf's ``remote_hubs`` name (host names
resolved when the hub starts; when one of them is a loopback address, any
loopback address, as when every region runs on one machine), and refused
with NOT_AUTHORIZED otherwise; a hub without ``regions`` refuses them all.
This trusts the network (addresses can be shared or translated): regions
that talk through NAT, or that share hosts with untrusted clients, need
authentication with ``region_roles`` and a region token.

Failure: a remote subscription that fails (remote region down, redirect
loop, local persistence failure) or that the remote hub closes under us
(``SUBSCRIPTION_FORCED_CLOSED``: an attach with force, an operator's
``DELETE .../subscriptions/__region_R?force=true``, a forced topic delete)
is logged and made again every ``retry_remote_subscribe_thread_run_interval``
ms while the topic has local subscribers (after a forced close the next
round re-attaches, with force, from the stored consume pointer; after a
delete it subscribes anew from the remote topic's end, so what the remote
region published in between is not pulled); local publishes and
subscriptions never wait on a remote region unless the subscriber asked for
``synchronous``, whose subscribe then fails with ``COULD_NOT_CONNECT`` naming
the region (after at most the region client's ``server_ack_response_timeout``;
the local subscription stays, and the remote one is retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import logging
import os
import socket
from collections.abc import Awaitable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hub import errors
from hub.conf import HubClientConf
from hub.message import Message, SubscriptionPreferences
from hub.proto import pubsub_pb2 as pb
from metastore.conf import ConfError, load_conf, setting

if TYPE_CHECKING:
    from hub.client import HedwigClient
    from hub.client_subscription import Handler
    from hub.conf import HubConf
    from hub.persistence import TopicLog
    from hub.stats import HubStats
    from hub.topic import Topic

__all__ = ["HUB_SUBSCRIBER_PREFIX", "RegionClientConf", "RegionFilter", "RegionHost", "RegionManager",
           "is_hub_subscriber", "load_region_client_conf", "parse_regions"]

log = logging.getLogger(__name__)

HUB_SUBSCRIBER_PREFIX = b"__region_"
REGION_OPTION = "quire.region"


@dataclass(frozen=True)
class RegionClientConf(HubClientConf):
    """``hw_region_client.conf``: the client keys used between regions, and each remote region's hubs."""

    remote_hubs: tuple[str, ...] = setting(
        (), "default hubs of each remote region, space separated NAME=HOST:PORT[,HOST:PORT] entries")


def load_region_client_conf(path: str | os.PathLike[str] | None = None,
                            overrides: Mapping[str, Any] | None = None) -> RegionClientConf:
    """Read ``hw_region_client.conf`` (None: defaults); ``ConfError`` (one line) when invalid."""
    return load_conf(RegionClientConf, path, overrides)


def parse_regions(entries: tuple[str, ...] | list[str], remote_hubs: tuple[str, ...] | list[str] = (),
                  own: str = "") -> dict[str, str]:
    """Region name -> comma separated hub addresses, from ``regions`` (``NAME`` or ``NAME=ADDRS``)
    and the region client conf's ``remote_hubs``; ``ConfError`` naming the bad entry."""
    known: dict[str, str] = {}
    for entry in remote_hubs:
        name, sep, addrs = entry.partition("=")
        if not sep or not name or not addrs:
            raise ConfError(f"remote_hubs: bad entry {entry!r}: use NAME=HOST:PORT[,HOST:PORT]")
        known[name] = addrs
    out: dict[str, str] = {}
    for entry in entries:
        name, sep, addrs = entry.partition("=")
        if not name or (sep and not addrs):
            raise ConfError(f"regions: bad entry {entry!r}: use NAME or NAME=HOST:PORT[,HOST:PORT]")
        if name == own:
            continue
        addrs = addrs or known.get(name, "")
        if not addrs:
            raise ConfError(f"regions: no hub address for region {name!r} (give NAME=HOST:PORT, or "
                            "remote_hubs in the region client conf)")
        out[name] = addrs
    return out


def is_hub_subscriber(subscriber: bytes) -> bool:
    """True for the subscriptions hubs of other regions hold (they are not local subscribers)."""
    return subscriber.startswith(HUB_SUBSCRIBER_PREFIX)


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def ip_of(host: str) -> IPAddress | None:
    """``host`` as an IP address (an IPv4-mapped IPv6 address as IPv4); None when it is a name."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class RegionFilter:
    """Server filter for hub subscribers: pass only messages that originated in this region.

    The subscribing hub names the region it subscribes to in the option
    ``quire.region``; messages whose ``src_region`` differs came from a third
    region (which the subscriber gets directly) and are not forwarded.
    """

    def __init__(self) -> None:
        self.region = ""

    def initialize(self, conf: Mapping[str, str]) -> RegionFilter:
        return self

    def set_subscription_preferences(self, topic: bytes, subscriber_id: bytes,
                                     preferences: SubscriptionPreferences) -> RegionFilter:
        region = preferences.options.get(REGION_OPTION)
        if not region:
            raise ValueError(f"RegionFilter needs the subscription option {REGION_OPTION}")
        self.region = region.decode()
        return self

    def test_message(self, message: Message) -> bool:
        return message.src_region == self.region

    def uninitialize(self) -> None:
        pass


class _Remote:
    """One remote subscription: (topic, region)."""

    def __init__(self) -> None:
        self.ok = False
        self.closes = 0          # forced closes seen: one during a (re)subscribe means it is not made
        self.task: asyncio.Task[None] | None = None


def region_token(cconf: RegionClientConf, token: str, token_file: str) -> RegionClientConf:
    """The region client conf with the hub's ``region_auth_token`` (else ``region_auth_token_file``) as the
    token it presents to other regions' hubs; unchanged when both are empty. ``ConfError`` when the file
    cannot be read (it is read again at every connect, so a rotated token is picked up)."""
    if token:
        return dataclasses.replace(cconf, auth_token=token, auth_token_file="")
    if token_file:
        if not os.access(token_file, os.R_OK):
            raise ConfError(f"region_auth_token_file: cannot read {token_file}")
        return dataclasses.replace(cconf, auth_token="", auth_token_file=token_file)
    return cconf


class RegionHost(Protocol):
    """What a ``RegionManager`` uses of its hub (a ``hub.server.HubServer``)."""

    @property
    def conf(self) -> HubConf: ...

    @property
    def topics(self) -> Mapping[bytes, Topic]: ...

    @property
    def stats(self) -> HubStats: ...

    def track(self, task: asyncio.Task[Any]) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...


class RegionManager:
    """See the module docstring. ``server`` is the hub it works for (``RegionHost``)."""

    def __init__(self, server: RegionHost) -> None:
        self.server = server
        conf = server.conf
        self.region = conf.region
        cconf = load_region_client_conf(conf.region_client_conf or None)
        if conf.inter_region_ssl_enabled and not cconf.ssl_enabled:   # Hedwig's older switch for the same
            cconf = dataclasses.replace(cconf, ssl_enabled=True)
        self.client_conf = region_token(cconf, conf.region_auth_token, conf.region_auth_token_file)
        # standalone mode: no regions, whatever ``regions`` says
        self.remotes = {} if conf.standalone else parse_regions(conf.regions, cconf.remote_hubs, own=conf.region)
        self.subscriber_id = HUB_SUBSCRIBER_PREFIX + conf.region.encode()
        self.vectors: dict[bytes, dict[str, int]] = {}
        self.subs: dict[tuple[bytes, str], _Remote] = {}
        self.clients: dict[str, HedwigClient] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._retry_task: asyncio.Task[None] | None = None
        self._resolve_task: asyncio.Task[None] | None = None
        # the hosts of the other regions' hubs (regions, remote_hubs) and their addresses (is_region_peer)
        self.region_hosts = sorted({a.split(":", 1)[0] for addrs in self.remotes.values()
                                    for a in addrs.split(",") if a.strip()})
        self.region_ips: set[IPAddress] = {ip for ip in map(ip_of, self.region_hosts) if ip is not None}

    @property
    def enabled(self) -> bool:
        return bool(self.remotes)

    def remote_subscriptions(self) -> int:
        """Remote subscriptions currently made (for the stats endpoint)."""
        return sum(1 for rs in self.subs.values() if rs.ok)

    def start(self) -> None:
        if self.enabled:
            loop = asyncio.get_running_loop()
            self._retry_task = loop.create_task(self._retry_loop())
            if any(ip_of(h) is None for h in self.region_hosts):
                self._resolve_task = loop.create_task(self._resolve_region_hosts())
            log.info("region %s: remote regions %s", self.region, ", ".join(sorted(self.remotes)))

    async def _resolve_region_hosts(self) -> None:
        """Add the addresses the other regions' hub host names resolve to (once, when the hub starts)."""
        loop = asyncio.get_running_loop()
        for host in self.region_hosts:
            if ip_of(host) is not None:
                continue
            try:
                infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("region %s: cannot resolve region hub host %s (its unauthenticated region "
                            "subscriptions are refused): %s", self.region, host, exc)
                continue
            self.region_ips.update(ip for ip in (ip_of(str(info[4][0])) for info in infos) if ip is not None)

    def is_region_peer(self, host: str) -> bool:
        """Whether a connection from ``host`` (an IP address) comes from a configured region hub.

        Without ``authentication_enabled`` this is all a hub knows of who may hold a region
        subscription: the peer's address is one of the addresses of the other regions' hubs named
        in ``regions`` / the region client conf's ``remote_hubs`` (host names resolved when the hub
        starts), or, when one of those is a loopback address, any loopback address (every region on
        one machine). The port is not compared: a hub connects from an ephemeral port."""
        ip = ip_of(host)
        if ip is None:
            return False
        return ip in self.region_ips or (ip.is_loopback and any(r.is_loopback for r in self.region_ips))

    # --- version vectors --------------------------------------------------------------------------
    def stamps(self, topic: bytes) -> bool:
        """Whether ``stamp`` puts anything in the messages of ``topic`` (it has a vector-max)."""
        return bool(self.vectors.get(topic))

    def stamp(self, topic: bytes, msg: pb.Message) -> None:
        """Put the topic's vector-max in ``msg.msgId.remoteComponents`` (no-op without regions)."""
        vec = self.vectors.get(topic)
        if not vec:
            return
        del msg.msgId.remoteComponents[:]
        for region, seq in sorted(vec.items()):
            msg.msgId.remoteComponents.add(region=region.encode(), seqId=seq)

    async def recover_vector(self, topic: bytes, topic_log: TopicLog) -> None:
        """On acquisition, before any publish: the vector-max is the last message's remote components."""
        if not self.enabled:
            return
        vec = self.vectors.setdefault(topic, {})
        if topic_log.last_seq > 0:
            try:
                last = await topic_log.scan(topic_log.last_seq, 1, 1 << 20)
            except Exception as exc:
                log.warning("topic %r: cannot read its last message for the vector-max: %s", topic, exc)
                return
            for region, seq in (last[0].msg_id.remote.items() if last else ()):
                vec[region] = max(vec.get(region, 0), seq)

    async def topic_acquired(self, topic: bytes) -> None:
        """The topic is owned here now: subscribe remotely when it has local subscribers."""
        if self.enabled and self._has_local_subscribers(topic):
            await self._quiet(self.subscribers_changed(topic))

    # --- following local subscribers --------------------------------------------------------------
    def _has_local_subscribers(self, topic: bytes) -> bool:
        t = self.server.topics.get(topic)
        return t is not None and any(not is_hub_subscriber(s) for s in t.subs.subs)

    async def subscribers_changed(self, topic: bytes, synchronous: bool = False) -> None:
        """After a local subscribe/unsubscribe: add or remove the remote subscriptions of ``topic``.

        With ``synchronous`` the remote subscriptions are made before returning, and the first
        failure is raised (it is still retried in the background)."""
        if not self.enabled:
            return
        if self._has_local_subscribers(topic):
            self.vectors.setdefault(topic, {})
            loop = asyncio.get_running_loop()
            by_task = {loop.create_task(self._quiet(self._ensure(topic, region), reraise=synchronous)): region
                       for region in self.remotes}
            tasks = list(by_task)
            for task in tasks:
                self.server.track(task)
            if synchronous:    # bounded by the region client's response timeout; the rest goes on
                limit = self.client_conf.server_ack_response_timeout / 1000.0
                done, pending = await asyncio.wait(tasks, timeout=limit)
                for task in done:
                    if task.exception() is not None:
                        raise errors.CouldNotConnectError(f"{task.exception()}")
                if pending:
                    late = ", ".join(sorted(by_task[t] for t in pending))
                    raise errors.CouldNotConnectError(f"remote subscriptions of {topic!r} in region(s) {late} not "
                                                      f"made within {limit:g} s (retried in the background)")
        else:
            for region in self.remotes:
                self.server.spawn(self._remove(topic, region, unsubscribe=True))

    async def _quiet(self, coro: Awaitable[object], reraise: bool = False) -> None:
        try:
            await coro
        except Exception as exc:
            if reraise:
                raise
            log.warning("%s (retried every %d ms)", exc, self.server.conf.retry_remote_subscribe_thread_run_interval)

    async def _client(self, region: str) -> HedwigClient:
        from hub.client import HedwigClient

        c = self.clients.get(region)
        if c is None:
            c = await HedwigClient.connect(self.remotes[region], conf=self.client_conf)
            c.add_subscription_listener(functools.partial(self._subscription_event, region))
            self.clients[region] = c
        return c

    def _subscription_event(self, region: str, topic: bytes, subscriber: bytes, event: str) -> None:
        """A remote hub closed our subscription under us (an attach with force, an operator's forced
        delete of it or of its topic, a failing filter): the client has dropped it, so the retry loop
        makes it again while the topic has local subscribers (within one retry interval). Any other
        event detaches it too (``TOPIC_MOVED``): the client re-attaches by itself unless the region
        client conf turns ``enable_resubscribe`` off, and then the retry loop does."""
        if subscriber != self.subscriber_id:
            return
        if event != "SUBSCRIPTION_FORCED_CLOSED" and self.client_conf.enable_resubscribe:
            return
        rs = self.subs.get((topic, region))
        if rs is None:
            return        # we removed it ourselves (the last local subscriber left, the topic moved)
        rs.ok = False
        rs.closes += 1
        log.warning("region %s: the subscription to %r in region %s was closed by that region's hub (%s); "
                    "subscribing again within %d ms", self.region, topic, region, event,
                    self.server.conf.retry_remote_subscribe_thread_run_interval)

    async def _ensure(self, topic: bytes, region: str) -> None:
        key = (topic, region)
        lock = self._locks.setdefault(f"{topic!r}/{region}", asyncio.Lock())
        async with lock:
            rs = self.subs.setdefault(key, _Remote())
            if rs.ok:
                return
            closes = rs.closes
            try:
                c = await self._client(region)
                await c.subscribe(topic, self.subscriber_id, "CREATE_OR_ATTACH", force_attach=True,
                                  options={REGION_OPTION: region.encode()},
                                  message_filter="hub.regions.RegionFilter", hub_subscriber=True)
                with contextlib.suppress(errors.PubSubError):
                    await c.stop_delivery(topic, self.subscriber_id)
                await c.start_delivery(topic, self.subscriber_id, self._handler(topic, region))
            except Exception as exc:
                if isinstance(exc, errors.CouldNotConnectError):
                    self.clients.pop(region, None)
                raise errors.ServiceDownError(f"region {self.region}: subscribing to {topic!r} in region "
                                              f"{region} failed: {exc}") from None
            if not self._has_local_subscribers(topic):   # the last one left meanwhile
                await self._remove_locked(topic, region, c, unsubscribe=True)
                return
            if rs.closes != closes:   # closed under us meanwhile: the retry loop makes it again
                return
            rs.ok = True
            log.info("region %s: subscribed to %r in region %s", self.region, topic, region)

    def _handler(self, topic: bytes, region: str) -> Handler:
        async def handle(t: bytes, s: bytes, message: Message) -> None:
            try:
                await self._persist_remote(topic, region, message)
            except BaseException:
                rs = self.subs.get((topic, region))
                if rs is not None:
                    rs.ok = False       # delivery stops; the retry loop attaches again
                raise
        return handle

    async def _persist_remote(self, topic: bytes, region: str, message: Message) -> None:
        t = self.server.topics.get(topic)
        if t is None:
            raise errors.ServiceDownError(f"topic {topic!r} is no longer owned here")
        vec = self.vectors.setdefault(topic, {})
        remote_seq = message.msg_id.local
        if remote_seq <= vec.get(region, 0):
            return                          # persisted before (a redelivery): skip
        vec[region] = remote_seq
        for r, seq in message.msg_id.remote.items():
            if r != self.region:
                vec[r] = max(vec.get(r, 0), seq)
        msg = message.to_proto()
        msg.srcRegion = region.encode()
        msg.msgId.Clear()
        self.stamp(topic, msg)
        self.server.stats.incr("remote_messages_persisted")
        try:
            await t.log.enqueue(msg)
        except BaseException:
            if vec.get(region) == remote_seq:
                vec[region] = remote_seq - 1    # not persisted: take it again on redelivery
            raise

    async def _remove(self, topic: bytes, region: str, unsubscribe: bool) -> None:
        lock = self._locks.setdefault(f"{topic!r}/{region}", asyncio.Lock())
        async with lock:
            c = self.clients.get(region)
            await self._remove_locked(topic, region, c, unsubscribe)

    async def _remove_locked(self, topic: bytes, region: str, c: HedwigClient | None, unsubscribe: bool) -> None:
        rs = self.subs.pop((topic, region), None)
        if c is None or (rs is None and not unsubscribe):
            return
        try:
            if unsubscribe:
                await c.unsubscribe(topic, self.subscriber_id)
            else:
                await c.close_subscription(topic, self.subscriber_id)
            log.info("region %s: %s %r in region %s", self.region,
                     "unsubscribed from" if unsubscribe else "closed", topic, region)
        except errors.ClientNotSubscribedError:
            pass
        except Exception as exc:
            log.warning("region %s: removing the subscription to %r in region %s: %s", self.region, topic,
                        region, exc)

    async def topic_released(self, topic: bytes) -> None:
        """The topic moved away: close (not remove) its remote subscriptions; forget its vector."""
        if not self.enabled:
            return
        self.vectors.pop(topic, None)
        for region in self.remotes:
            await self._remove(topic, region, unsubscribe=False)
            key = f"{topic!r}/{region}"
            lock = self._locks.get(key)
            if lock is not None and not lock.locked():
                del self._locks[key]

    async def _retry_loop(self) -> None:
        every = self.server.conf.retry_remote_subscribe_thread_run_interval / 1000.0
        while True:
            await asyncio.sleep(every)
            retries = []
            for topic in list(self.server.topics):
                if not self._has_local_subscribers(topic):
                    continue
                for region in self.remotes:
                    rs = self.subs.get((topic, region))
                    lock = self._locks.get(f"{topic!r}/{region}")
                    if (rs is None or not rs.ok) and not (lock is not None and lock.locked()):
                        retries.append(self._quiet(self._ensure(topic, region)))
            await asyncio.gather(*retries)      # at most one round in flight

    async def close(self) -> None:
        for task in (self._retry_task, self._resolve_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        for c in list(self.clients.values()):
            with contextlib.suppress(Exception):
                await c.close()
        self.clients.clear()
