"""``quire bench topics``: many topics — acquisition rate, takeover after kill -9, idle cost, spread publishing.

    quire bench topics                               # LMDB metastore
    quire bench topics --metastore zookeeper         # a ZooKeeper server started by the cluster
    quire bench topics --takeover-topics 10000

Runs ``LocalCluster(bookies=3, hubs=2)`` (E3 W2 A2, 100-byte messages) and
prints one JSON line per case:

* ``acquire`` at ``--windows`` (64 and 512) first publishes in flight: each
  publish goes to a new topic, so the hub claims it, reads its (missing)
  ranges and subscriptions and creates its first ledger. Only hub 0 runs
  meanwhile (hub 1 is stopped), so hub 0 owns every topic. Topics per second,
  publish latency percentiles, failures (none expected: a failed first
  publish is a defect, the figure the bench exists to watch).
* ``idle_topic_rss``: hub 0's resident memory (``VmRSS``) before and after
  those acquisitions, per topic it owns (each idle, its ledger open); also
  its anonymous part alone (``RssAnon``: without the pages of the LMDB
  metastore's file the hub has read, which the page cache holds).
* ``takeover``: hub 1 is started, hub 0 is killed with SIGKILL, and once its
  ownership records have expired (``lease_wait_s`` after the kill: the
  hub's ``zk_timeout``) one message is published to each of the
  ``--takeover-topics`` topics hub 0 had acquired last through hub 1, 512
  in flight: hub 1 claims each, recovery-opens its ledger (fencing), reads its
  last entry and starts a new ledger. ``seconds`` counts from the lease
  expiry to the last publish answered; ``hub_sessions_lost`` (0 expected: a
  hub that loses its lease loses every topic), ``hub_gc_slow_pauses`` and
  ``hub_gc_freezes`` are hub 1's counts; ``hub_cpu_ms_per_topic`` and
  ``hub_main_thread_cpu_ms_per_topic`` its CPU time (``/proc``) over the case. With ``--takeover-topics`` above what
  the acquisitions made, more topics are acquired first (untimed); with 0 the
  case is skipped (no kill).
* ``spread_publish``: ``--spread-topics`` (2000) topics owned by hub 1, one
  client with ``--depth`` publishes in flight, ``--messages`` messages
  round-robin over them; then the same client, depth and count on one topic
  (``one_topic``); then a ``ratio`` line (spread / one topic), same run.
  Between them ``spread_publish_no_multi``: the spread case with the
  client's ``batching_multi_topic`` off (a request per topic and loop turn,
  as before PUBLISH_MULTI), and a ``multi_ratio`` line (spread / that).
  Each of these lines carries ``entries_per_message`` (ledger entries the
  bookies journaled, over the write quorum, per message: about 1 when 2 000
  topics cannot batch, far below 1 for one topic, whose entries pack many
  messages) and the CPU milliseconds per message of the hub, of the
  bookies together and of the bench's client (this process's event loop
  thread: the client library and the bench's window), ``cores_busy`` (each
  one's CPU over the case's seconds: 1.0 is one of the 2 cores saturated),
  ``journal_group`` (the bookies' journal groups: adds each, mean ms of the
  write and sync, and of first write to durable) and the bookies'
  checkpoints (count and total ms) over the case. Then ``one_topic_unbatched``: hub 1 restarted with one
  message per entry (``max_batch_messages=1``, ``--depth`` adds in flight per
  topic), the same client, depth and count on a new topic; and a
  ``fair_ratio`` line (spread / that case): the spread case against one topic
  with the same entries per message, which is what the spread case can
  reach without batching across topics. Then ``one_topic_unbatched_requests``:
  the same, with the client's producer batching off (one request per
  message, as each spread message is one), and ``topics_ratio`` (spread /
  that): what 2 000 topics and ledgers cost by themselves, with entries and
  requests alike. ``--spread-topics 0`` skips these lines.

Why the spread ``ratio`` stays far below its 0.7 target (issue 34; 2 000
topics, depth 64, load average 5-9 on the 2 shared cores; medians of 9 runs,
per message, CPU of the hub / of the three bookies together, and msg/s):

    case                                hub ms   bookies ms   msg/s
    one_topic (0.016 entries/msg)        0.011        0.018   21 300
    one_topic_unbatched (1 entry/msg)    0.024        0.022   13 900
    one_topic_unbatched_requests         0.044        0.046    9 000
    spread_publish (2 000 topics)        0.062        0.068    6 700

(ratio 0.29, fair_ratio 0.39, topics_ratio 0.75; each varies by a factor
of 2 from run to run on this machine.) Over one topic's cost, a spread
message's extra in the hub is about a quarter its entry of its own, 40 % its
request of its own (parse, answer, and smaller add frames to the bookies,
as a read's one-message requests leave in chunks of
``hub.connection.PIPELINE_PUBLISHES``) and a third the 2 000 topics and
ledgers; in the bookies nearly all of it is the smaller frames and the
ledgers. 0.7 of one topic is about what one topic reaches itself at one
message an entry (0.5-0.75 of its batched rate): reaching it would take
2 000 topics costing nothing per topic and nothing per request over one
ledger's unbatched entries. Like-for-like aims are ``topics_ratio`` >= 0.7
(about met) and ``fair_ratio`` rising towards it, which takes batching
across topics on the wire (one publish request, and one answer, for the
messages of many topics, as Kafka's produce request carries many
partitions). PUBLISH_MULTI does that (issue 34, ``hub.connection_multi``).
This bench, 9 runs of the code before it alternated with 9 after (load
average 5-9 on the 2 shared cores; medians): spread 4 660 -> 6 510 msg/s,
hub 0.061 -> 0.040 ms and bookies 0.063 -> 0.034 ms of CPU per message
(fewer, larger add frames), ``ratio`` 0.20 -> 0.34, ``fair_ratio`` 0.36 ->
0.45, ``topics_ratio`` 0.75 -> 0.95, ``multi_ratio`` 1.3 (0.8-1.7). What is
left per message is its entry of its own: the topic's pump, its ledger add
and its share of the bookies' answers.

Where a spread message's time goes now (issue 34, the rows' CPU and journal
fields; 2 000 topics at depth 64, against ``one_topic_unbatched``, both one
message per entry): the window moves as one convoy. The client writes one
PUBLISH_MULTI of about 64 parts, the hub one ADD_ENTRIES_MULTI per bookie,
each bookie one journal group (about 33 adds, a 0.4 ms sync) and one answer,
the hub one answer (``strace``: 8 system calls a cycle in both cases). A
message's latency is then about 64 times the CPU per message of the client,
the hub and one bookie in turn, plus a sync, while the 2 cores are half idle
(``cores_busy`` about 0.5 hub, 0.5 bookies, 0.25 client). Per message
(``/proc`` thread times): hub 27 against 18 us, one bookie 8.3 against 6.9
(its checkpoint thread 1.4 against 0.55: a segment and a ledger record per
ledger), client 10 against 6. Splitting the convoy (a PUBLISH_MULTI's parts
sent to the bookies in chunks, smaller client requests) did not pay in
alternated runs; cutting per-message work does: a part of a body alone is
now stamped, serialized and answered once per request (``hub.connection_multi``),
and the bookies journal no LAC record an add's header already carries. 10
pairs of this bench, the code before those alternated with after (load
average 3-7; medians): spread 12 400 -> 14 300 msg/s (per pair -12 % to
+33 %, median +16 %), p50 3.9 -> 3.2 ms, hub 29 -> 26 us per message,
``ratio`` 0.35 -> 0.38, ``fair_ratio`` 0.55 -> 0.62.

Figures measured on a shared machine are contended: the lines carry the
configuration, not the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tools.bench import percentiles, rate
from tools.bench.load import cpu_seconds
from tools.bench.publish import Outcome, Runner, Window, bench_data_dir
from tools.bench.soak import read_rss

BODY = b"x" * 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metastore", default="lmdb", choices=("lmdb", "zookeeper"),
                        help="metastore backend of the cluster (zookeeper: a server started by the cluster)")
    parser.add_argument("--windows", default="64,512",
                        help="first publishes in flight in the acquisition cases, comma-separated")
    parser.add_argument("--acquire-topics", type=int, default=1000, help="new topics per acquisition case")
    parser.add_argument("--takeover-topics", type=int, default=1000,
                        help="topics hub 1 takes over after hub 0's kill -9 (e.g. 10000; 0: no takeover case)")
    parser.add_argument("--spread-topics", type=int, default=2000,
                        help="topics of the spread publish case (0: no spread cases)")
    parser.add_argument("--messages", type=int, default=20000, help="messages of each publish-rate case")
    parser.add_argument("--depth", type=int, default=64, help="publishes in flight in the publish-rate cases")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a hub or bookie conf key for the cluster (repeatable)")
    parser.add_argument("--data", default=None, help="data directory (default: a new dir under ./data/bench)")


def _conf(args: argparse.Namespace) -> dict[str, str]:
    # no load shedding: hub 0 keeps what it acquired until the kill
    out = {"bk_ensemble_size": "3", "bk_write_quorum_size": "2", "bk_ack_quorum_size": "2",
           "rebalance_interval_sec": "0"}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--conf wants KEY=VALUE, not {item!r}")
        out[key.strip()] = value.strip()
    return out


async def publish_each(address: str, topics: list[bytes], window: int) -> Outcome:
    """One message to each of ``topics`` over one connection, ``window`` in flight."""
    return await publish_spread(address, topics, len(topics), window)


async def publish_spread(address: str, topics: list[bytes], messages: int, depth: int,
                         batching: bool = True, multi: bool = True) -> Outcome:
    """``messages`` messages round-robin over ``topics`` over one connection, ``depth`` in flight
    (``batching``: the client's producer batching, else one request per message; ``multi``: a loop turn's
    batches to many topics as one PUBLISH_MULTI, else one request per topic)."""
    from hub.client import HedwigClient

    out = Outcome()
    conf = {"max_outstanding_messages": str(max(depth, 10)), "server_ack_response_timeout": "60000"}
    if not batching:
        conf["batching_enabled"] = "false"
    if not multi:
        conf["batching_multi_topic"] = "false"
    client = await HedwigClient.connect(address, conf=conf)
    try:
        w = Window(depth, out)
        cycle = itertools.cycle(topics)
        t0 = time.perf_counter()
        for _ in range(messages):
            topic = next(cycle)
            await w.submit(lambda t=topic: client.publish_async(t, BODY))  # type: ignore[misc]
        await w.drain()
        out.seconds = time.perf_counter() - t0
    finally:
        await client.close()
    return out


def _cpu_seconds(pid: int | None) -> float:
    """User and system CPU seconds used so far by process ``pid`` (0 when gone)."""
    if pid is None:
        return 0.0
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


BOOKIE_SUMS = ("bookie_group_commit_entries_sum", "bookie_group_commit_entries_count",
               "bookie_journal_sync_seconds_sum", "bookie_group_commit_seconds_sum",
               "bookie_checkpoint_seconds_sum", "bookie_checkpoint_seconds_count")
"""What ``bookie_sums`` reads of each bookie's ``/metrics``: journaled entries and groups, the groups' sync and
first-write-to-durable seconds, the checkpoints' seconds and count."""


async def bookie_sums(stats_urls: list[str]) -> dict[str, float]:
    """``BOOKIE_SUMS`` of the bookies behind ``stats_urls`` so far, summed over them."""
    import urllib.request

    def fetch(url: str) -> dict[str, float]:
        out = dict.fromkeys(BOOKIE_SUMS, 0.0)
        with urllib.request.urlopen(url, timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                name, _, value = line.partition(" ")
                if name in out:
                    out[name] = float(value)
        return out

    total = dict.fromkeys(BOOKIE_SUMS, 0.0)
    for one in await asyncio.gather(*(asyncio.to_thread(fetch, u) for u in stats_urls)):
        for name, value in one.items():
            total[name] += value
    return total


async def wait_owner_gone(uri: str, topic: bytes, timeout: float = 120.0) -> float:
    """Seconds until ``topic``'s owner record is gone (its owner's lease expired)."""
    from hub.metadata import TopicOwnershipManager
    from metastore import open_metastore

    store = await open_metastore(uri)
    t0 = time.perf_counter()
    try:
        owners = TopicOwnershipManager(store)
        async with asyncio.timeout(timeout):
            while await owners.read_owner_info(topic) is not None:  # noqa: ASYNC110 - another process's lease
                await asyncio.sleep(0.05)
    finally:
        await store.close()
    return time.perf_counter() - t0


HUB_EVENTS = ("sessions_lost", "gc_slow_pauses", "gc_freezes")
"""What the takeover line reports of the hub taking over: a lost session (its lease) loses every topic it
took over; long collection pauses are what used to lose it (hub.gcwatch)."""


async def hub_events(stats_url: str) -> dict[str, int]:
    """``HUB_EVENTS`` counted by a hub so far, from its ``/metrics`` (``hub_events_total{event}``)."""
    import urllib.request

    def fetch() -> str:
        with urllib.request.urlopen(stats_url, timeout=10) as resp:
            return str(resp.read().decode())

    text = await asyncio.to_thread(fetch)
    counts = dict.fromkeys(HUB_EVENTS, 0)
    for line in text.splitlines():
        for event in HUB_EVENTS:
            if line.startswith(f'hub_events_total{{event="{event}"}}'):
                counts[event] = int(float(line.rsplit(" ", 1)[1]))
    return {f"hub_{k}": v for k, v in counts.items()}


def read_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of process ``pid`` (its live threads) and of its main thread, to the nanosecond
    (``/proc/PID/task/*/schedstat``; the clock ticks of ``/proc/PID/stat`` are scaled for a thread and for
    its process apart, and a thread's could read a tick above its process's). A thread that exits during an
    interval takes its time out of the process's figure; a hub's threads live as long as it does."""
    total = main = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except OSError:      # the thread ended meanwhile
            continue
        total += ns
        if int(tid) == pid:
            main = ns
    return total / 1e9, main / 1e9


def _line(case: str, args: argparse.Namespace, out: Outcome, **extra: Any) -> dict[str, Any]:
    ok = len(out.latencies) - out.errors
    line: dict[str, Any] = {"bench": "topics", "case": case, "metastore": args.metastore, **extra,
                            "ok": ok, "errors": out.errors, "seconds": round(out.seconds, 3),
                            "ops_per_sec": rate(ok, out.seconds), **percentiles(out.latencies)}
    if out.first_error:
        line["first_error"] = out.first_error
    return line


def _takeover(loop: asyncio.Runner, cluster: Any, args: argparse.Namespace, last: list[bytes],
              names: Callable[[str, int], list[bytes]]) -> Iterator[dict[str, Any]]:
    """Hub 1 started, hub 0 killed, then ``--takeover-topics`` topics (the last acquired first) published to."""
    takeover = last[-args.takeover_topics:]
    if len(takeover) < args.takeover_topics:
        extra = names("take", args.takeover_topics - len(takeover))
        loop.run(publish_each(cluster.hub_addresses[0], extra, 512))
        takeover = extra + takeover
    loop.run(cluster.restart_hub(1))
    hub1 = cluster.hub_addresses[1]
    loop.run(cluster.kill_hub(0))
    lease = loop.run(wait_owner_gone(cluster.metastore_uri, takeover[-1]))
    pid = cluster.hub_pid(1)
    assert pid is not None
    cpu_before = read_cpu(pid)
    out = loop.run(publish_each(hub1, takeover, 512))
    cpu = [round((after - before) * 1000 / len(takeover), 3)
           for before, after in zip(cpu_before, read_cpu(pid), strict=True)]
    yield _line("takeover", args, out, in_flight=512, topics=len(takeover), lease_wait_s=round(lease, 2),
                hub_cpu_ms_per_topic=cpu[0], hub_main_thread_cpu_ms_per_topic=cpu[1],
                **loop.run(hub_events(cluster.stats_urls[1])))


class _Costs:
    """What a publish-rate case cost the cluster: ledger entries and hub / bookie CPU, per message."""

    def __init__(self, loop: asyncio.Runner, cluster: Any, quorum: int) -> None:
        self.loop, self.cluster, self.quorum = loop, cluster, quorum
        n = len(cluster.bookie_addresses)
        self.urls = [u for u in cluster.stats_urls if u][-n:]       # hubs first, then the bookies
        self.pids = [cluster.bookie_pid(i) for i in range(n)]

    def _now(self) -> tuple[dict[str, float], float, float]:
        sums = self.loop.run(bookie_sums(self.urls))
        return sums, _cpu_seconds(self.cluster.hub_pid(1)), sum(map(_cpu_seconds, self.pids))

    def run(self, case: Callable[[], Outcome]) -> tuple[Outcome, dict[str, Any]]:
        s0, h0, b0 = self._now()
        c0 = time.thread_time()      # the bench client: this process's event loop, on this thread
        out = case()
        c1 = time.thread_time()
        s1, h1, b1 = self._now()
        ok = max(len(out.latencies) - out.errors, 1)
        d = {k: s1[k] - s0[k] for k in BOOKIE_SUMS}
        groups = max(d["bookie_group_commit_entries_count"], 1)
        return out, {"entries_per_message": round(d["bookie_group_commit_entries_sum"] / self.quorum / ok, 3),
                     "hub_cpu_ms_per_msg": round((h1 - h0) * 1000 / ok, 4),
                     "bookies_cpu_ms_per_msg": round((b1 - b0) * 1000 / ok, 4),
                     "client_cpu_ms_per_msg": round((c1 - c0) * 1000 / ok, 4),
                     # cores busy over the case: 1.0 is one core saturated (the machine has 2)
                     "cores_busy": {k: round(v / out.seconds, 2) if out.seconds else None
                                    for k, v in (("hub", h1 - h0), ("bookies", b1 - b0), ("client", c1 - c0))},
                     # the bookies' journal groups: adds each, mean ms of the sync and of first write to durable
                     "journal_group": {
                         "entries": round(d["bookie_group_commit_entries_sum"] / groups, 1),
                         "sync_ms": round(d["bookie_journal_sync_seconds_sum"] * 1000 / groups, 3),
                         "commit_ms": round(d["bookie_group_commit_seconds_sum"] * 1000 / groups, 3)},
                     "checkpoints": int(d["bookie_checkpoint_seconds_count"]),
                     "checkpoint_ms": round(d["bookie_checkpoint_seconds_sum"] * 1000, 1)}


def _spread(loop: asyncio.Runner, cluster: Any, args: argparse.Namespace, names: Callable[[str, int], list[bytes]],
            run_id: str) -> Iterator[dict[str, Any]]:
    """``--spread-topics`` topics vs one topic through hub 1, same client and depth, and their ratio; then
    one topic at one message per entry and the fair ratio (the module docstring)."""
    hub1 = cluster.hub_addresses[1]
    spread = names("spread", args.spread_topics)
    loop.run(publish_each(hub1, spread, 512))     # acquired, first ledgers open: not timed
    one = [f"one-{run_id}".encode()]
    loop.run(publish_each(hub1, one, 1))
    costs = _Costs(loop, cluster, int(_conf(args)["bk_write_quorum_size"]))
    many, many_cost = costs.run(lambda: loop.run(publish_spread(hub1, spread, args.messages, args.depth)))
    yield _line("spread_publish", args, many, topics=len(spread), depth=args.depth, **many_cost)
    # the same without PUBLISH_MULTI (one request per topic and loop turn, as before issue 34's): what it gains
    apart, apart_cost = costs.run(lambda: loop.run(publish_spread(hub1, spread, args.messages, args.depth,
                                                                  multi=False)))
    yield _line("spread_publish_no_multi", args, apart, topics=len(spread), depth=args.depth, **apart_cost)
    apart_rate = rate(len(apart.latencies) - apart.errors, apart.seconds)
    single, single_cost = costs.run(lambda: loop.run(publish_spread(hub1, one, args.messages, args.depth)))
    yield _line("one_topic", args, single, topics=1, depth=args.depth, **single_cost)
    one_rate = rate(len(single.latencies) - single.errors, single.seconds)
    many_rate = rate(len(many.latencies) - many.errors, many.seconds)
    yield {"bench": "topics", "case": "ratio", "metastore": args.metastore,
           "what": f"{len(spread)} topics / 1 topic, msg/s", "depth": args.depth,
           "ratio": round(many_rate / one_rate, 3) if one_rate else None, "target": 0.7}
    yield {"bench": "topics", "case": "multi_ratio", "metastore": args.metastore,
           "what": f"{len(spread)} topics with / without PUBLISH_MULTI, msg/s", "depth": args.depth,
           "ratio": round(many_rate / apart_rate, 3) if apart_rate else None}

    # one topic, one message per entry: what the spread case compares with once batching is taken out
    loop.run(cluster.stop_hub(1))
    cluster.set_hub_conf(1, max_batch_messages="1", max_outstanding_adds=str(args.depth),
                         batch_hold_after_adds=str(args.depth))
    loop.run(cluster.restart_hub(1))
    unbatched = [f"unbatched-{run_id}".encode()]
    loop.run(publish_each(hub1, unbatched, 1))
    flat, flat_cost = costs.run(lambda: loop.run(publish_spread(hub1, unbatched, args.messages, args.depth)))
    yield _line("one_topic_unbatched", args, flat, topics=1, depth=args.depth, max_batch_messages=1, **flat_cost)
    flat_rate = rate(len(flat.latencies) - flat.errors, flat.seconds)
    yield {"bench": "topics", "case": "fair_ratio", "metastore": args.metastore,
           "what": f"{len(spread)} topics / 1 topic at one message per entry, msg/s", "depth": args.depth,
           "entries_per_message": [many_cost["entries_per_message"], flat_cost["entries_per_message"]],
           "ratio": round(many_rate / flat_rate, 3) if flat_rate else None}

    # the same topic, one request per message too (the client's producer batching off), as each spread
    # message is: what is left between the two is what many topics and ledgers cost
    lone, lone_cost = costs.run(lambda: loop.run(publish_spread(hub1, unbatched, args.messages, args.depth,
                                                                batching=False)))
    yield _line("one_topic_unbatched_requests", args, lone, topics=1, depth=args.depth, max_batch_messages=1,
                client_batching=False, **lone_cost)
    lone_rate = rate(len(lone.latencies) - lone.errors, lone.seconds)
    yield {"bench": "topics", "case": "topics_ratio", "metastore": args.metastore,
           "what": f"{len(spread)} topics / 1 topic at one message per entry and per request, msg/s",
           "depth": args.depth, "ratio": round(many_rate / lone_rate, 3) if lone_rate else None}


def run(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    from tools.cluster import LocalCluster

    windows = [int(w) for w in str(args.windows).split(",") if w.strip()]
    run_id = uuid.uuid4().hex[:6]
    names: Callable[[str, int], list[bytes]] = lambda kind, n: [  # noqa: E731
        f"{kind}-{run_id}-{i}".encode() for i in range(n)]
    with bench_data_dir(args, "topics-") as data_dir, Runner() as loop:
        cluster = LocalCluster(bookies=3, hubs=2, metastore=args.metastore, data_dir=data_dir,
                               conf_overrides=_conf(args))
        loop.run(cluster.start())
        try:
            loop.run(cluster.stop_hub(1))      # hub 0 alone: it owns every topic acquired next
            hub0 = cluster.hub_addresses[0]
            loop.run(publish_each(hub0, [f"warm-{run_id}".encode()], 1))
            pid = cluster.hub_pid(0)
            assert pid is not None
            before, anon_before = read_rss(pid)
            owned = 1
            last: list[bytes] = []
            for window in windows:
                topics = names(f"acq{window}", args.acquire_topics)
                out = loop.run(publish_each(hub0, topics, window))
                owned += len(topics)
                last = topics
                yield _line("acquire", args, out, in_flight=window, topics=len(topics))
            after, anon_after = read_rss(pid)
            acquired = owned - 1
            yield {"bench": "topics", "case": "idle_topic_rss", "metastore": args.metastore, "topics": acquired,
                   "hub_rss_before_mb": round(before / 2**20, 1), "hub_rss_after_mb": round(after / 2**20, 1),
                   "hub_bytes_per_topic": round((after - before) / acquired) if acquired else None,
                   "hub_anon_bytes_per_topic": round((anon_after - anon_before) / acquired) if acquired else None}

            if args.takeover_topics > 0:
                yield from _takeover(loop, cluster, args, last, names)
            elif args.spread_topics > 0:     # the spread case runs on hub 1 alone: hub 0 stopped cleanly
                loop.run(cluster.restart_hub(1))
                loop.run(cluster.stop_hub(0))
            if args.spread_topics > 0:
                yield from _spread(loop, cluster, args, names, run_id)
        finally:
            loop.run(cluster.stop())
