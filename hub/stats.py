"""Prometheus metrics of one hub: the seed's JMX beans, served at ``/metrics`` by the hub's HTTP server.

    metrics = HubMetrics(server)              # reads server.stats, topics, connections, cache
    metrics.registry                          # what bookie.http.HttpServer serves (hub.server._start_http)
    server.stats = HubStats()                 # the counters: server.stats.incr("packets_sent")
    server.stats.observe("publish", 0.002)    # latency, handed to HubMetrics.observe once it is on

What the seed's MBeans report, with the names of ``bookie.metrics``' scheme:

* PubSubServer: ``hub_packets_received_total``, ``hub_packets_sent_total``,
  ``hub_packets_redirected_total``, ``hub_requests_total{op}`` and the
  histogram ``hub_request_seconds{op}`` for publish, subscribe,
  unsubscribe and consume;
* NettyHandlers: ``hub_subscription_channels`` (attached subscriptions),
  ``hub_connections``;
* ReadAheadCache: ``hub_readahead_cache_bytes``, ``..._entries``,
  ``..._stubs``, ``hub_readahead_cache_hits_total``, ``..._misses_total``;
* and ``hub_messages_delivered_total``, ``hub_topics_owned``,
  ``hub_backlog_messages`` (published but not yet consumed, summed over
  subscriptions), ``hub_remote_subscriptions`` (held in other regions),
  ``hub_events_total{event}`` for every other counter (e.g.
  ``remote_messages_persisted``);
* memory, one gauge per bounded table (README "Memory"):
  ``hub_publish_queue_messages``, ``hub_publish_queue_bytes``,
  ``hub_adds_in_flight``, ``hub_messages_in_flight``,
  ``hub_entry_index_bytes``, ``hub_dedup_producers``, ``hub_dedup_entries``
  (summed over the topics' logs, ``TopicLog.memory``),
  ``hub_partial_frame_bytes`` and ``hub_outbound_buffer_bytes`` (the
  connections' buffers), ``hub_delayed_messages`` (delayed messages held
  until due, ``hub.delayed``);
* the event loop: ``hub_loop_tasks`` (asyncio tasks alive) and
  ``hub_loop_timers`` (timers scheduled, not cancelled): an idle topic
  holds neither (issue 34), so neither grows with the topics owned.

Counters are plain integers on the hot path (``HubStats.incr``), exported at
scrape time; so are the latency histograms (``HubMetrics.observe``: a bucket
index and two additions per request, where ``prometheus_client``'s
``Histogram.observe`` took three locks, about 4 µs of every publish). A scrape never fails
because of one broken source: a gauge that cannot be read is skipped.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sized
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from bookie.metrics import metric_name

if TYPE_CHECKING:
    import asyncio

    from bookie.wire import FrameBudget
    from hub.readahead import ReadAheadCache
    from hub.topic import Topic

__all__ = ["LATENCY_BUCKETS", "OPS", "HubMetrics", "HubStats", "MeteredConnection", "MetricsSource",
           "RemoteSubscriptions", "loop_tasks", "loop_timers"]

log = logging.getLogger(__name__)

OPS = ("publish", "subscribe", "unsubscribe", "consume")
# HubStats counter -> (metric subject, help)
_PACKETS = {
    "packets_received": ("packets_received", "requests received (PubSubServer)"),
    "packets_sent": ("packets_sent", "responses sent (PubSubServer)"),
    "redirects": ("packets_redirected", "requests redirected to the owner hub (PubSubServer)"),
    "messages_delivered": ("messages_delivered", "messages delivered to subscribers"),
}
_OP_COUNTERS = {"publishes": "publish", "subscribes": "subscribe", "unsubscribes": "unsubscribe",
                "consumes": "consume"}
_MEMORY_GAUGES = (
    ("publish_queue_messages", "queued_messages", "publishes waiting for a ledger entry, all topics"),
    ("publish_queue_bytes", "queued_bytes", "bytes of the publishes waiting for a ledger entry, all topics"),
    ("adds_in_flight", "adds_in_flight", "ledger entries sent and not yet acknowledged, all topics "
                                         "(at most max_outstanding_adds per topic)"),
    ("messages_in_flight", "messages_in_flight", "messages in ledger entries not yet acknowledged, all topics"),
    ("entry_index_bytes", "index_bytes", "bytes of the topics' ledger entry indexes (about one per entry, "
                                         "dropped with the ledger)"),
    ("dedup_producers", "dedup_producers", "producers remembered for deduplication, all topics "
                                           "(at most dedup_max_producers per topic)"),
    ("dedup_entries", "dedup_entries", "sequence ids remembered for deduplication, all topics "
                                       "(at most dedup_window per producer; about 140 bytes each)"),
)
"""Gauges of what the topics' logs hold (``TopicLog.memory``): hub_<subject>, the key summed, help."""
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class HubStats:
    """Every counter of the hub, updated in this one place (the stats endpoint reads ``counters``)."""

    def __init__(self) -> None:
        self.counters: collections.Counter[str] = collections.Counter()

    def incr(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    observer: Callable[[str, float], None] | None = None   # HubMetrics.observe when the stats endpoint is on

    def observe(self, op: str, seconds: float) -> None:
        """A request's latency (``op``: publish, subscribe, unsubscribe, consume)."""
        if self.observer is not None:
            self.observer(op, seconds)


def loop_tasks() -> int:
    """asyncio tasks alive in the running loop."""
    return len(asyncio.all_tasks())


def loop_timers() -> int:
    """Timers scheduled in the running loop and not cancelled (0 on a loop that does not say)."""
    scheduled = getattr(asyncio.get_running_loop(), "_scheduled", ())   # asyncio's heap of TimerHandles
    return sum(1 for h in scheduled if not h.cancelled())


def _name(subject: str) -> str:
    return metric_name("hub", subject)


class MeteredConnection(Protocol):
    """What ``HubMetrics`` reads of a client connection (a ``hub.connection.HubConnection``)."""

    @property
    def subs(self) -> Sized: ...

    @property
    def transport(self) -> asyncio.WriteTransport | None: ...


class RemoteSubscriptions(Protocol):
    """What ``HubMetrics`` reads of the hub's regions (a ``hub.regions.RegionManager``)."""

    def remote_subscriptions(self) -> int: ...


class MetricsSource(Protocol):
    """What ``HubMetrics`` reads of its hub at scrape time (a ``hub.server.HubServer``)."""

    @property
    def stats(self) -> HubStats: ...

    @property
    def connections(self) -> Collection[MeteredConnection]: ...

    @property
    def topics(self) -> Mapping[bytes, Topic]: ...

    @property
    def regions(self) -> RemoteSubscriptions | None: ...

    @property
    def cache(self) -> ReadAheadCache | None: ...

    @property
    def frame_budget(self) -> FrameBudget: ...


class _Latency:
    """One operation's latency histogram as plain numbers: per-bucket (not cumulative) counts, the last
    one past every bound, and the sum of the seconds observed."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0


class HubMetrics(Collector):
    """See the module docstring. ``server`` is the hub it reports on (``MetricsSource``)."""

    def __init__(self, server: MetricsSource) -> None:
        self.server = server
        self.registry = CollectorRegistry()
        self._by_op = {op: _Latency() for op in OPS}   # every op present from the first scrape
        self.registry.register(self)

    def observe(self, op: str, seconds: float) -> None:
        latency = self._by_op[op]
        latency.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1   # the first bound >= seconds
        latency.sum += seconds

    def _latency(self) -> Metric:
        """``hub_request_seconds{op}``: the histogram ``prometheus_client.Histogram`` would export."""
        family = HistogramMetricFamily(_name("request_seconds"), "request latency by operation (PubSubServer)",
                                       labels=["op"])
        bounds = [*map(floatToGoString, LATENCY_BUCKETS), "+Inf"]
        for op, latency in self._by_op.items():
            family.add_metric([op], list(zip(bounds, itertools.accumulate(latency.counts), strict=True)),
                              latency.sum)
        return family

    def collect(self) -> Iterable[Metric]:
        yield self._latency()
        counters = dict(self.server.stats.counters)
        for key, (subject, doc) in _PACKETS.items():
            yield CounterMetricFamily(_name(subject), doc, value=counters.get(key, 0))
        reqs = CounterMetricFamily(_name("requests"), "requests handled, by operation (PubSubServer)",
                                   labels=["op"])
        for key, op in _OP_COUNTERS.items():
            reqs.add_metric([op], counters.get(key, 0))
        yield reqs
        other = CounterMetricFamily(_name("events"), "other hub events, by name", labels=["event"])
        for key in sorted(counters):
            if key not in _PACKETS and key not in _OP_COUNTERS:
                other.add_metric([key], counters[key])
        yield other
        yield from self._gauges()

    def _gauges(self) -> Iterable[Metric]:
        server = self.server
        gauges: list[tuple[str, str, Callable[[], float]]] = [
            ("connections", "open client connections (NettyHandlers)", lambda: len(server.connections)),
            ("subscription_channels", "attached subscriptions (NettyHandlers)",
             lambda: sum(len(c.subs) for c in list(server.connections))),
            ("topics_owned", "topics this hub owns", lambda: len(server.topics)),
            ("backlog_messages", "published messages not yet consumed, summed over subscriptions",
             self._backlog),
            ("remote_subscriptions", "subscriptions this hub holds in other regions (RegionManager)",
             lambda: server.regions.remote_subscriptions() if server.regions is not None else 0),
            ("loop_tasks", "asyncio tasks alive in the hub's event loop (none per idle topic)", loop_tasks),
            ("loop_timers", "timers scheduled in the hub's event loop (none per idle topic)", loop_timers),
        ]
        memory = self._memory_totals()
        gauges += [(subject, doc, memory(key)) for subject, key, doc in _MEMORY_GAUGES]
        gauges += [
            ("partial_frame_bytes", "bytes of incomplete request frames held, all connections "
                                    "(at most max_partial_frame_bytes)", lambda: server.frame_budget.total),
            ("outbound_buffer_bytes", "bytes written to client connections and not yet sent "
                                      "(a connection's deliveries pause past max_outbound_buffer)",
             self._outbound_bytes),
            ("delayed_messages", "delayed messages held in memory until due, all subscriptions (at most "
                                 "max_tracked_delayed_messages each, hub.delayed)", self._delayed),
        ]
        for subject, doc, read in gauges:
            try:
                yield GaugeMetricFamily(_name(subject), doc, value=read())
            except Exception as exc:   # a scrape racing a shutdown: skip that gauge
                log.debug("gauge %s unreadable: %s", subject, exc)
        cache = server.cache
        stats = cache.stats() if cache is not None else {}
        yield GaugeMetricFamily(_name("readahead_cache_bytes"), "bytes in the read-ahead cache",
                                value=stats.get("size_bytes", 0))
        yield GaugeMetricFamily(_name("readahead_cache_entries"), "messages in the read-ahead cache",
                                value=stats.get("entries", 0))
        yield GaugeMetricFamily(_name("readahead_cache_stubs"), "read-ahead stubs waiting for a scan",
                                value=stats.get("stubs", 0))
        yield CounterMetricFamily(_name("readahead_cache_hits"), "read-ahead cache hits",
                                  value=stats.get("hits", 0))
        yield CounterMetricFamily(_name("readahead_cache_misses"), "read-ahead cache misses",
                                  value=stats.get("misses", 0))

    def _memory_totals(self) -> Callable[[str], Callable[[], int]]:
        """Readers of the topics' summed ``log.memory()`` figures, one per key; the topics are walked once per
        scrape (at the first read), not once per gauge."""
        totals: collections.Counter[str] | None = None

        def reader(key: str) -> Callable[[], int]:
            def read() -> int:
                nonlocal totals
                if totals is None:
                    totals = collections.Counter()
                    for t in list(self.server.topics.values()):
                        totals.update(t.log.memory())
                return totals[key]
            return read
        return reader

    def _outbound_bytes(self) -> int:
        return sum(c.transport.get_write_buffer_size() for c in list(self.server.connections)
                   if c.transport is not None)

    def _delayed(self) -> int:
        return sum(len(s.dispatcher.delays) for t in list(self.server.topics.values())
                   for s in list(t.subs.subs.values()) if s.dispatcher is not None and s.dispatcher.delays is not None)

    def _backlog(self) -> int:
        total = 0
        for t in list(self.server.topics.values()):
            last = int(t.log.last_seq)
            total += sum(max(0, last - s.consumed) for s in list(t.subs.subs.values()))
        return total
