"""Prometheus metrics of one bookie, in a registry of its own.

    stats = BookieStats(read_only=lambda: server.read_only, connections=lambda: len(server.connections),
                        disk_usage=lambda: server.last_disk_usage)
    stats.count(op, status)              # per response, a plain integer on the hot path
    stats.on_commit(entries, seconds, sync_seconds)    # per journal group (the storage's ``on_commit`` hook)
    stats.on_checkpoint(entries, seconds)              # per checkpoint
    start_http_server(port, registry=stats.registry)

Request counts are exported at scrape time as ``bookie_requests_total{op,status}``;
commit sizes and latencies are histograms (counted in plain integers per
journal group, exported at scrape time too); read-only state, connections
and disk usage are gauges read from the callables given, and so are the
``gauges`` given as ``(name, help, read)``: the bookie server's memory
bounds (``bookie_long_poll_reads``, ``bookie_requests_in_flight``,
``bookie_response_buffer_bytes``, ``bookie_partial_frame_bytes``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from bookie import protocol as proto
from bookie.disk import DiskUsage

__all__ = ["BookieStats"]


_bisect = bisect.bisect_left


class _Histogram:
    """A Prometheus histogram observed with one ``bisect`` and two additions (no lock, no Python loop
    over the buckets, as ``prometheus_client.Histogram`` has); ``metric()`` builds it at scrape time."""

    __slots__ = ("bounds", "counts", "documentation", "name", "source", "total")

    def __init__(self, name: str, documentation: str, buckets: Sequence[float],
                 source: _Histogram | None = None) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0
        self.source = source
        """Another histogram (same buckets) whose samples this one exports under its own name: never observed."""

    def observe(self, value: float) -> None:
        self.counts[_bisect(self.bounds, value)] += 1  # le: the first bound >= value
        self.total += value

    def metric(self) -> HistogramMetricFamily:
        samples = self.source or self
        buckets, seen = [], 0
        for bound, n in zip((*samples.bounds, math.inf), list(samples.counts), strict=True):
            seen += n
            buckets.append(("+Inf" if bound == math.inf else repr(bound), float(seen)))  # prometheus' le
        return HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=samples.total)


class BookieStats(Collector):
    """See the module docstring."""

    def __init__(self, *, read_only: Callable[[], bool], connections: Callable[[], int],
                 disk_usage: Callable[[], DiskUsage | None], write_cache_bytes: Callable[[], int] = lambda: 0,
                 gauges: Sequence[tuple[str, str, Callable[[], float]]] = ()) -> None:
        self._write_cache_bytes = write_cache_bytes
        self._gauges = tuple(gauges)
        self._read_only = read_only
        self._connections = connections
        self._disk_usage = disk_usage
        self.requests: dict[tuple[int, int], int] = {}
        self.registry = CollectorRegistry()
        self.commit_entries = _Histogram(
            "bookie_group_commit_entries", "entries written per group commit",
            (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384))
        self.commit_seconds = _Histogram(
            "bookie_group_commit_seconds", "time from a group's first write to its durable commit",
            (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0))
        self.journal_sync_seconds = _Histogram(
            "bookie_journal_sync_seconds", "time of one journal group's write and fdatasync",
            (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0))
        self.journal_group_entries = _Histogram(   # the same samples (each group is one commit)
            "bookie_journal_group_entries", "adds synced per journal group",
            (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384), source=self.commit_entries)
        self.checkpoint_seconds = _Histogram(
            "bookie_checkpoint_seconds", "time of one checkpoint (write cache into LMDB)",
            (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
        self.registry.register(self)

    def on_checkpoint(self, entries: int, seconds: float) -> None:
        self.checkpoint_seconds.observe(seconds)

    def count(self, op: int, status: int) -> None:
        key = (op, status)
        self.requests[key] = self.requests.get(key, 0) + 1

    def on_commit(self, entries: int, seconds: float, sync_seconds: float = 0.0) -> None:
        """One journal group: its adds, its seconds from first write to durable, its sync's seconds (per group on
        the loop: ``observe`` inline, the entries once for both histograms of them)."""
        h = self.commit_entries
        h.counts[_bisect(h.bounds, entries)] += 1
        h.total += entries
        h = self.commit_seconds
        h.counts[_bisect(h.bounds, seconds)] += 1
        h.total += seconds
        h = self.journal_sync_seconds
        h.counts[_bisect(h.bounds, sync_seconds)] += 1
        h.total += sync_seconds

    def collect(self) -> Iterable[Metric]:
        c = CounterMetricFamily("bookie_requests", "requests served, by op and status",
                                labels=["op", "status"])
        for (op, status), n in sorted(self.requests.items()):
            c.add_metric([proto.op_name(op), proto.status_name(status)], n)
        yield c
        for histogram in (self.commit_entries, self.commit_seconds, self.journal_sync_seconds,
                          self.journal_group_entries, self.checkpoint_seconds):
            yield histogram.metric()
        yield GaugeMetricFamily("bookie_read_only", "1 when the bookie refuses adds",
                                value=1.0 if self._read_only() else 0.0)
        yield GaugeMetricFamily("bookie_connections", "open client connections", value=self._connections())
        yield GaugeMetricFamily("bookie_write_cache_bytes", "bytes of synced entries not yet in LMDB",
                                value=self._write_cache_bytes())
        for name, doc, read in self._gauges:
            yield GaugeMetricFamily(name, doc, value=read())
        usage = self._disk_usage()
        if usage is not None:
            yield GaugeMetricFamily("bookie_disk_free_bytes", "free bytes on the ledger directory",
                                    value=usage.free)
            yield GaugeMetricFamily("bookie_disk_used_fraction", "used fraction of the ledger directory",
                                    value=usage.used_fraction)
