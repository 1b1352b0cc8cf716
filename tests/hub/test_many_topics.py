"""Many new topics at once on real processes: first publishes and a failover with hundreds in flight.

Every first publish to a new topic claims it, creates its first ledger (a new
ledger id) and writes its ranges; after a kill -9 of their hub another hub
recovers each topic's ledger and starts a new one. None of it may fail
because hundreds happen at once (issue 34: the ledger id record was a
compare-and-set storm).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import uuid
from pathlib import Path

import pytest

from hub.client import HedwigClient
from hub.conf import load_hub_conf
from hub.metadata import TopicPersistenceManager
from hub.server import HubServer
from metastore import open_metastore
from tests.fixtures.cycles import cyclic_garbage
from tests.hub.test_stats import scrape
from tools.bench.topics import wait_owner_gone
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="function")
# zk_timeout: a hub whose lease heartbeat is starved for longer loses its topics; on a 2-core machine shared
# by many test runs (load average 20) a burst of 1000 topics starved a 1 s lease now and then
CONF = {"bk_ensemble_size": "3", "bk_write_quorum_size": "2", "bk_ack_quorum_size": "2", "zk_timeout": "3000",
        "session_timeout": "3000", "rebalance_interval_sec": "0"}
IN_FLIGHT = 512


async def _in_process_hub(cluster: LocalCluster, keys: dict[str, str], **extra: str) -> HubServer:
    """A hub started in this process on ``cluster``, its conf ``keys`` (less a bookie's) and ``extra``."""
    hub_keys = {k: v for k, v in keys.items() if k != "session_timeout"}     # a bookie key
    server = HubServer(load_hub_conf(None, {**hub_keys, "server_port": "0", **extra,
                                            "metastore_uri": cluster.metastore_uri}))
    await server.start()
    return server


async def _publish_all(address: str, topics: list[bytes], body: bytes) -> list[int | BaseException]:
    conf = {"max_outstanding_messages": str(IN_FLIGHT), "server_ack_response_timeout": "60000"}
    async with await HedwigClient.connect(address, conf=conf) as c:
        return await asyncio.wait_for(
            asyncio.gather(*(c.publish_async(t, body) for t in topics), return_exceptions=True), 120)


async def _ledger_ids(uri: str, topics: list[bytes]) -> list[int]:
    """The ledger id of every range of every topic."""
    store = await open_metastore(uri)
    try:
        pm = TopicPersistenceManager(store)
        ledgers: list[int] = []
        for t in topics:
            got = await pm.read_topic_persistence_info(t)
            assert got is not None
            ledgers += [r.ledgerId for r in got[0].ranges]
    finally:
        await store.close()
    return ledgers


async def _burst_and_failover(tmp_path: Path, metastore: str) -> None:
    async with LocalCluster(bookies=3, hubs=2, metastore=metastore, data_dir=tmp_path / "c",
                            conf_overrides=CONF) as cluster:
        await cluster.stop_hub(1)                 # hub 0 alone acquires every topic
        topics = [f"many-{uuid.uuid4().hex[:6]}-{i}".encode() for i in range(IN_FLIGHT)]
        first = await _publish_all(cluster.hub_addresses[0], topics, b"first")
        failed = [r for r in first if isinstance(r, BaseException)]
        assert not failed, f"{len(failed)} first publishes failed, e.g. {failed[0]!r}"
        assert first == [1] * IN_FLIGHT           # each a new topic: seq id 1

        await cluster.restart_hub(1)
        await cluster.kill_hub(0)
        await wait_owner_gone(cluster.metastore_uri, topics[-1], timeout=60)
        second = await _publish_all(cluster.hub_addresses[1], topics, b"second")
        failed = [r for r in second if isinstance(r, BaseException)]
        assert not failed, f"{len(failed)} publishes after the failover failed, e.g. {failed[0]!r}"
        assert second == [2] * IN_FLIGHT          # dense: the recovered first message kept its seq id

        ledgers = await _ledger_ids(cluster.metastore_uri, topics)
        assert len(ledgers) == 2 * IN_FLIGHT and len(set(ledgers)) == len(ledgers)   # no ledger id twice


@pytest.mark.slow
async def test_512_first_publishes_in_flight_and_a_failover_on_lmdb(tmp_path: Path) -> None:
    await _burst_and_failover(tmp_path, "lmdb")


@pytest.mark.slow
@pytest.mark.zookeeper
async def test_512_first_publishes_in_flight_and_a_failover_on_zookeeper(tmp_path: Path) -> None:
    await _burst_and_failover(tmp_path, "zookeeper")


async def test_topic_loads_beyond_the_bound_wait_their_turn(tmp_path: Path) -> None:
    """In process: 60 new topics at once with ``max_concurrent_topic_loads=3``: all publishes succeed,
    acquisitions and new ledgers run 3 at a time (concurrently, but never more)."""
    async with LocalCluster(bookies=3, hubs=0, data_dir=tmp_path / "c", conf_overrides=CONF) as cluster:
        server = await _in_process_hub(cluster, CONF, max_concurrent_topic_loads="3")
        try:
            peaks = {"acquire": [0, 0], "ledger": [0, 0]}     # [now, most at once]
            waiting: list[int] = []

            def counted(kind: str, fn):  # type: ignore[no-untyped-def]
                async def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
                    peak = peaks[kind]
                    peak[0] += 1
                    peak[1] = max(peak[1], peak[0])
                    waiting.append(server.loads_waiting)
                    try:
                        await asyncio.sleep(0.02)            # hold the slot a while: the others must queue
                        return await fn(*args, **kwargs)
                    finally:
                        peak[0] -= 1
                return wrapper

            server._acquire = counted("acquire", server._acquire)  # type: ignore[method-assign]
            server.bk.create_ledger = counted("ledger", server.bk.create_ledger)  # type: ignore[method-assign]
            topics = [f"bounded-{i}".encode() for i in range(60)]
            got = await _publish_all(server.address, topics, b"m")
            assert got == [1] * 60, [r for r in got if isinstance(r, BaseException)][:3]
            assert peaks["acquire"][1] == 3 and peaks["ledger"][1] == 3
            assert max(waiting) > 0 and server.loads_waiting == 0
        finally:
            await server.stop()


def _cyclic_garbage_of_the_server() -> collections.Counter[str]:
    """The objects of the server's own packages that only a full collection would free, by type."""
    gc.unfreeze()                                     # the hub froze what it acquired (hub.gcwatch)
    return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in cyclic_garbage()
                               if type(o).__module__.startswith(("hub.", "bookie.", "metastore.")))


async def test_acquired_and_released_topics_leave_no_cyclic_garbage(tmp_path: Path) -> None:
    """In process: 40 topics acquired, then released. Neither leaves a reference cycle among the hub's objects,
    so freezing what acquisitions built (``hub.gcwatch``) keeps nothing from the collector that the hub has
    given up: a released topic's log, quota, subscriptions and compaction are freed by reference counting."""

    conf_keys = {**CONF, "bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1"}
    async with LocalCluster(bookies=1, hubs=0, data_dir=tmp_path / "c", conf_overrides=conf_keys) as cluster:
        server = await _in_process_hub(cluster, conf_keys)
        try:
            # one client throughout: a closed client's own connection objects are cycles of the test's
            async with await HedwigClient.connect(server.address, conf={"max_outstanding_messages": "64"}) as c:
                assert await c.publish(b"warm-up", b"m") == 1
                _cyclic_garbage_of_the_server()
                topics = [f"cycles-{i}".encode() for i in range(40)]
                assert await asyncio.gather(*(c.publish_async(t, b"m") for t in topics)) == [1] * 40
                assert not _cyclic_garbage_of_the_server()
                for t in topics:
                    await server.release_topic(t)
                assert not any(t in server.topics for t in topics)
                assert not _cyclic_garbage_of_the_server()
        finally:
            await server.stop()


async def test_idle_topics_share_their_empty_tables_and_the_hubs_callbacks(tmp_path: Path) -> None:
    """In process: topics published to once hold no table of their own while it is empty (readers, known entry
    starts, ledger sizes and times, subscriptions: ``metastore.idle.IDLE_DICT``) and share the hub's callbacks;
    the first subscription, or a roll to a new ledger, gives that one topic tables of its own, with the closed
    ledger's size and time and the writer's time known (issue 34)."""
    from metastore.idle import IDLE_DICT

    conf_keys = {**CONF, "bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1"}
    async with LocalCluster(bookies=1, hubs=0, data_dir=tmp_path / "c", conf_overrides=conf_keys) as cluster:
        server = await _in_process_hub(cluster, conf_keys, max_entries_per_ledger="2")
        try:
            topics = [f"tables-{i}".encode() for i in range(10)]
            assert await _publish_all(server.address, topics, b"m") == [1] * 10
            owned = [server.topics[t] for t in topics]
            for t in owned:
                log = t.log
                assert log._readers is IDLE_DICT and log._known is IDLE_DICT and t.subs.subs is IDLE_DICT
                assert log._sizes is IDLE_DICT and log._ctimes is IDLE_DICT and t.subs._subscribing is IDLE_DICT
                assert log.lh is not None and log._ctime(log.lh.ledger_id) == log.lh.metadata.ctime_ms
                # the one ledger's entry index in a slot, no table; the ranges kept serialized, not parsed
                assert log._index is IDLE_DICT and log._last_index is not None
                assert log._last_index.ledger_id == log.lh.ledger_id and type(log._ranges_wire) is bytes
                assert [r.ledgerId for r in log.ranges.ranges] == [log.lh.ledger_id]
                # no compaction state, no ledger-change lock, the quota itself as the gate (no bound methods),
                # the subscriptions reading the log itself, the writer's metadata serialized, versions as ints
                assert t._compaction is None and log.hold is None and log._lock_ is None and log.gate is t.quota
                assert t.subs._log is log and t.subs._last_seq is None and t.subs.last_seq() == log.last_seq
                writer = log.lh._writer
                assert writer is not None and type(writer.metadata_wire) is bytes and log.lh._metadata is None
                assert type(log._version) is int and type(writer._version) is int
            assert len({id(t.log.on_persisted) for t in owned}) == 1       # bound once by the hub
            assert len({id(t.subs.track) for t in owned}) == 1
            async with await HedwigClient.connect(server.address) as c:
                await c.subscribe(topics[0], b"sub")
                first = owned[1].log.lh
                assert first is not None
                assert [await c.publish(topics[1], b"m") for _ in range(2)] == [2, 3]   # entry 2 rolls
            assert owned[0].subs.subs is not IDLE_DICT and list(owned[0].subs.subs) == [b"sub"]
            rolled = owned[1].log
            assert rolled.lh is not None and rolled.lh.ledger_id != first.ledger_id
            assert rolled._sizes == {first.ledger_id: first.length} and first.length > 0
            assert rolled._ctimes == {first.ledger_id: first.metadata.ctime_ms}
            assert list(rolled._index) == [first.ledger_id] and rolled._last_index is not None
            assert rolled._last_index.ledger_id == rolled.lh.ledger_id and rolled._first_time_ms > 0
            assert rolled._index_of(first.ledger_id) is rolled._index[first.ledger_id]
            assert [m.seq_id for m in await rolled.scan(1, 10, 1 << 20)] == [1, 2, 3]   # both ledgers read
            assert [u.ledger_id for u in rolled.consumed_ledgers(3)] == [first.ledger_id]
            assert all(t.subs.subs is IDLE_DICT and t.log._sizes is IDLE_DICT for t in owned[2:])
        finally:
            await server.stop()


@pytest.mark.slow
async def test_two_hubs_racing_for_the_same_1000_new_topics(tmp_path: Path) -> None:
    """Clients of both hubs publish to the same new topics at once: one owner each, dense seq ids,
    no ledger id twice."""
    async with LocalCluster(bookies=3, hubs=2, data_dir=tmp_path / "c", conf_overrides=CONF) as cluster:
        topics = [f"race-{uuid.uuid4().hex[:6]}-{i}".encode() for i in range(1000)]
        a, b = await asyncio.gather(_publish_all(cluster.hub_addresses[0], topics, b"a"),
                                    _publish_all(cluster.hub_addresses[1], topics[::-1], b"b"))
        failed = [r for r in a + b if isinstance(r, BaseException)]
        assert not failed, f"{len(failed)} publishes failed, e.g. {failed[0]!r}"
        for seq_a, seq_b in zip(a, b[::-1], strict=True):
            assert {seq_a, seq_b} == {1, 2}                  # dense: one owner numbered both
        ledgers = await _ledger_ids(cluster.metastore_uri, topics)
        assert len(ledgers) == len(set(ledgers)) == 1000     # one ledger per topic, none shared


async def _loop_gauges(url: str) -> tuple[float, float]:
    got = await scrape(url)
    return got["hub_loop_tasks"], got["hub_loop_timers"]


async def test_idle_topics_hold_no_task_or_timer(tmp_path: Path) -> None:
    """500 new topics, each published to once and then idle: the hub's loop holds no more asyncio tasks or
    timers than before them (``hub_loop_tasks``, ``hub_loop_timers``): idle topics are served by the hub's one
    housekeeping scan, not by timers or tasks of their own (issue 34)."""
    conf = {**CONF, "bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1"}
    async with LocalCluster(bookies=1, hubs=1, data_dir=tmp_path / "c", conf_overrides=conf) as cluster:
        url = cluster.stats_urls[0]                    # hubs first
        address = cluster.hub_addresses[0]
        assert await _publish_all(address, [b"warm-up"], b"m") == [1]   # bookie connection, first ledger
        before = await _loop_gauges(url)
        topics = [f"idle-{i}".encode() for i in range(500)]
        assert await _publish_all(address, topics, b"m") == [1] * 500
        # what the publishes left (a ledger's explicit-LAC timer, a second after its last add) winds down
        async with asyncio.timeout(30):
            while (now := await _loop_gauges(url))[0] > before[0] + 5 or now[1] > before[1] + 5:  # noqa: ASYNC110
                await asyncio.sleep(0.2)    # another process's loop, seen through its gauges
        assert (await scrape(url))["hub_topics_owned"] == 501


async def test_an_acquisition_that_fails_after_starting_its_ledger_closes_and_drops_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process (issue 34): an acquisition for a publish starts the topic's ledger itself; when a later
    step of it fails (here the subscriptions' read), that ledger is closed and, empty, dropped with its
    range, before the claim is given up: the retried acquisition has no ledger to recover, and the
    publish lands in one ledger, the only one left."""
    from hub.subscriptions import TopicSubscriptions

    failed: list[bytes] = []
    load = TopicSubscriptions.load

    async def failing_once(self: TopicSubscriptions) -> None:
        if not failed:
            failed.append(self.topic)
            raise RuntimeError("subscriptions unreadable (test)")
        await load(self)

    monkeypatch.setattr(TopicSubscriptions, "load", failing_once)
    async with LocalCluster(bookies=3, hubs=0, data_dir=tmp_path / "c", conf_overrides=CONF) as cluster:
        server = await _in_process_hub(cluster, CONF)
        try:
            before = await server.bk.ledgers.ledger_ids()
            recoveries: list[int] = []
            open_ledger = server.bk.open_ledger

            async def counted(ledger_id: int, password: bytes = b"") -> object:
                recoveries.append(ledger_id)
                return await open_ledger(ledger_id, password)

            server.bk.open_ledger = counted  # type: ignore[assignment,method-assign]
            assert await _publish_all(server.address, [b"fails-once"], b"m") == [1]
            assert failed == [b"fails-once"]
            assert recoveries == []         # nothing was left open for the retry to recover
            kept = await _ledger_ids(cluster.metastore_uri, [b"fails-once"])
            assert len(kept) == 1
            assert await server.bk.ledgers.ledger_ids() - before == set(kept)
        finally:
            await server.stop()
