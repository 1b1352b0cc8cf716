"""hub.persistence when its owner loses the metastore: no ledger after a failed close, every open range recovered.

The partition scenario ``tests/partition/test_partitions.py::test_hub_cut_from_zookeeper_past_session_timeout``
without a network: the roll's close fails (as a ``ConnectionLoss`` would), the session goes, and the
next owner must find every acknowledged message (and rebuild producer deduplication from them).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bookie.client import BookKeeper
from hub import errors
from hub.conf import load_hub_conf
from hub.metadata import TopicDedupManager, TopicPersistenceManager
from hub.persistence import TopicLog
from hub.proto import pubsub_pb2 as pb
from metastore import errors as ms_errors
from metastore import open_metastore
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = 10.0
CONF = {"bk_ensemble_size": 2, "max_entries_per_ledger": 3, "max_outstanding_adds": 1,
        "ledger_create_backoff_ms": 10, "ledger_create_backoff_max_ms": 20}
HUB_CONF = load_hub_conf(None, CONF)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: Any) -> AsyncIterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("fencing")
    async with LocalCluster(bookies=3, hubs=0, data_dir=root) as c:
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(cluster: LocalCluster) -> AsyncIterator[tuple[Any, Any, Any]]:
    ms = await open_metastore(cluster.metastore_uri)
    bk = await BookKeeper.connect(ms)
    pm = TopicPersistenceManager(ms)
    dm = TopicDedupManager(ms)
    await pm.start()
    await dm.start()
    yield bk, pm, dm
    await bk.close()
    await ms.close()


def msg(i: int) -> pb.Message:
    """The ``i``-th message of producer ``p0`` (its sequence id is ``i``)."""
    return pb.Message(body=b"m%d" % i, srcRegion=b"standalone", producer=b"p0", sequenceId=i)


async def publish(log: TopicLog, i: int) -> int:
    return await asyncio.wait_for(log.publish(msg(i)), TIMEOUT)


async def acquire(env: tuple[Any, Any, Any], topic: bytes, **kw: Any) -> TopicLog:
    """``topic``'s log as a new owner acquires it (this file's conf; ``kw``: ``dedup_store``, ``owned``)."""
    bk, pm, _dm = env
    return await TopicLog.acquire(topic, bk, pm, HUB_CONF, **kw)


async def ranges_of(pm: Any, topic: bytes) -> list[tuple[int, int, int | None]]:
    got = await pm.read_topic_persistence_info(topic)
    if got is None:
        return []
    return [(r.ledgerId, r.startSeqIdIncluded,
             r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded") else None)
            for r in got[0].ranges]


async def is_closed(bk: Any, ledger_id: int) -> bool:
    rh = await bk.open_ledger_no_recovery(ledger_id)
    try:
        return bool(rh.metadata.is_closed)
    finally:
        await rh.close()


async def test_a_failed_close_at_the_roll_is_followed_by_no_ledger_and_the_next_owner_recovers_it(
        env: tuple[Any, Any, Any]) -> None:
    bk, pm, dm = env
    topic = b"close-fails-at-roll"
    session = {"alive": True}
    old = await acquire(env, topic, dedup_store=dm, owned=lambda: session["alive"])
    for i in (1, 2, 3):                                   # one entry each: the ledger is full
        assert await publish(old, i) == i
    full = old.lh

    async def close_cut_from_metastore() -> None:
        raise ms_errors.ServiceDownError("ConnectionLoss")

    full.close = close_cut_from_metastore
    with pytest.raises(errors.ServiceDownError):          # the roll: the close fails
        await publish(old, 4)
    assert old.closed                                     # the server releases the topic on this
    await asyncio.sleep(0.05)                             # past the ledger-start backoff
    with pytest.raises(errors.ServiceDownError):          # the old code started ledger 2 here, range 1 open
        await publish(old, 4)
    session["alive"] = False                              # then the session expired
    with pytest.raises(errors.ServiceDownError):
        await publish(old, 4)
    assert await ranges_of(pm, topic) == [(full.ledger_id, 1, None)]
    assert not await is_closed(bk, full.ledger_id)
    await old.release()                                   # the close fails again: logged, left open

    new = await acquire(env, topic, dedup_store=dm)
    assert new.last_seq == 3
    assert await ranges_of(pm, topic) == [(full.ledger_id, 1, 3)]
    assert await is_closed(bk, full.ledger_id)
    assert await publish(new, 3) == 3                     # deduplication rebuilt from the recovered ledger
    assert await publish(new, 4) == 4
    assert [m.seq_id for m in await new.scan(1, 10, 1 << 20)] == [1, 2, 3, 4]
    await new.release()


async def test_acquire_recovers_a_range_left_open_before_the_last(env: tuple[Any, Any, Any]) -> None:
    """The metadata the old code left (ledger 1 open without an end, ledger 2 after it) is repaired."""
    bk, pm, dm = env
    topic = b"open-range-before-the-last"
    old = await acquire(env, topic, dedup_store=dm)
    for i in (1, 2, 3):
        assert await publish(old, i) == i
    first = old.lh.ledger_id
    # what the old owner did next: a new ledger (its close having failed) holding seq id 4, acknowledged
    lh = await bk.create_ledger(ensemble=2, write_quorum=2, ack_quorum=2)
    entry = pb.MessageBatch(first_local_seq_id=4)
    entry.messages.append(msg(4))
    await lh.add_entry(entry.SerializeToString())
    await lh.close()
    ranges, version = await pm.read_topic_persistence_info(topic)
    r = ranges.ranges.add(ledgerId=lh.ledger_id, startSeqIdIncluded=4)
    r.endSeqIdIncluded.localComponent = 4
    await pm.write_topic_persistence_info(topic, ranges, version)

    new = await acquire(env, topic, dedup_store=dm)   # the old code: SERVICE_DOWN here
    assert new.last_seq == 4
    assert await ranges_of(pm, topic) == [(first, 1, 3), (lh.ledger_id, 4, 4)]
    assert await is_closed(bk, first)
    with pytest.raises(errors.PubSubError):               # the old owner acknowledges nothing more
        await publish(old, 5)
    assert old.closed
    assert await publish(new, 4) == 4                     # a retry of the acknowledged publish: deduplicated
    assert await publish(new, 5) == 5
    assert [m.body for m in await new.scan(1, 10, 1 << 20)] == [b"m%d" % i for i in range(1, 6)]
    await new.release()
    await old.release()


async def test_a_log_whose_hub_lost_its_session_opens_no_ledger(env: tuple[Any, Any, Any]) -> None:
    _, pm, _ = env
    topic = b"session-lost"
    session = {"alive": True}
    log = await acquire(env, topic, owned=lambda: session["alive"])
    for i in (1, 2, 3):
        assert await publish(log, i) == i
    full = log.lh.ledger_id
    session["alive"] = False
    with pytest.raises(errors.ServiceDownError):          # the roll closes the full ledger, starts none
        await publish(log, 4)
    assert log.closed
    assert await ranges_of(pm, topic) == [(full, 1, 3)]
    await log.release()

    session["alive"] = True
    log = await acquire(env, b"session-lost-midway", owned=lambda: session["alive"])
    assert await publish(log, 1) == 1
    current = log.lh
    session["alive"] = False
    with pytest.raises(errors.ServiceDownError):          # not sent: nothing more is acknowledged here
        await publish(log, 2)
    assert log.closed and current.last_add_confirmed == 0 and log.last_seq == 1
    await log.release()
    assert await ranges_of(pm, b"session-lost-midway") == [(current.ledger_id, 1, 1)]

    fresh = await acquire(env, b"session-lost-fresh", owned=lambda: False)
    with pytest.raises(errors.ServiceDownError):
        await publish(fresh, 1)
    assert await ranges_of(pm, b"session-lost-fresh") == []
    await fresh.release()


async def test_two_owners_of_a_new_topic_the_second_gives_up_and_the_next_recovers(
        env: tuple[Any, Any, Any]) -> None:
    """Both read no ranges; the first ledger recorded wins, the other owner gives the topic up."""
    _, pm, _ = env
    topic = b"two-new-owners"
    a = await acquire(env, topic)
    b = await acquire(env, topic)
    assert await publish(a, 1) == 1
    with pytest.raises(errors.TopicPersistenceInfoExistsError):
        await publish(b, 1)
    assert b.closed
    await b.release()
    c = await acquire(env, topic)       # fences a
    assert c.last_seq == 1
    with pytest.raises(errors.PubSubError):
        await publish(a, 2)
    assert await publish(c, 2) == 2
    assert [m.seq_id for m in await c.scan(1, 10, 1 << 20)] == [1, 2]
    assert len(await ranges_of(pm, topic)) == 2
    await a.release()
    await c.release()


async def test_a_hub_whose_close_fails_at_the_roll_and_session_expires_resumes_publishing(
        env: tuple[Any, Any, Any], cluster: LocalCluster) -> None:
    """The server's side, in process: the topic is given up and re-acquired; no acknowledged publish is lost."""
    from hub.client import HedwigClient
    from hub.server import HubServer
    from tests.fixtures.polling import eventually

    bk, pm, _dm = env
    conf = load_hub_conf(None, {**{k: str(v) for k, v in CONF.items()}, "bk_write_quorum_size": "2",
                                "bk_ack_quorum_size": "2", "zk_timeout": "1000", "server_port": "0",
                                "rebalance_interval_sec": "0", "metastore_uri": cluster.metastore_uri})
    server = HubServer(conf)
    await server.start()
    topic = b"hub-close-fails-at-roll"
    try:
        async with await HedwigClient.connect(server.address) as c:
            for i in (1, 2, 3):                           # one entry each: the ledger is full
                assert await c.publish(topic, b"m%d" % i, producer=b"p0", sequence_id=i) == i
            t = server.topics[topic]
            full = t.log.lh

            async def close_cut_from_metastore() -> None:
                raise ms_errors.ServiceDownError("ConnectionLoss")

            full.close = close_cut_from_metastore
            old_session = server.session
            await old_session.close()                     # the session expires (its owner record goes)
            # the roll's close fails, no ledger follows it; the hub gives the topic up, registers
            # again, re-acquires (recovering ledger 1) and the client's retries get through
            assert await asyncio.wait_for(c.publish(topic, b"m4", producer=b"p0", sequence_id=4), 30) == 4
            assert server.session is not old_session
            assert server.topics[topic] is not t
            assert await c.publish(topic, b"m3", producer=b"p0", sequence_id=3) == 3   # deduplicated
            rs = await ranges_of(pm, topic)
            assert rs[0] == (full.ledger_id, 1, 3) and rs[1][1:] == (4, None)

            async def closed() -> bool:
                return await is_closed(bk, full.ledger_id)

            await eventually(closed)
    finally:
        await server.stop()


async def test_a_new_ledger_whose_range_write_may_have_landed_is_left_to_the_next_owner(
        env: tuple[Any, Any, Any]) -> None:
    """The answer of the range write is lost (it landed): the ledger is kept for recovery, not deleted."""
    bk, pm, _dm = env
    topic = b"range-write-answer-lost"
    log = await acquire(env, topic)

    class AnswerLost:
        def __getattr__(self, name: str) -> Any:
            return getattr(pm, name)

        async def write_topic_persistence_info(self, *args: Any) -> Any:
            await pm.write_topic_persistence_info(*args)
            raise errors.ServiceDownError("ConnectionLoss")

    log.pm = AnswerLost()
    with pytest.raises(errors.ServiceDownError):
        await publish(log, 1)
    assert log.closed
    [(lid, start, end)] = await ranges_of(pm, topic)
    assert (start, end) == (1, None) and await is_closed(bk, lid)
    await log.release()
    new = await acquire(env, topic)     # the old code deleted it: NoSuchLedger here
    assert new.last_seq == 0 and await ranges_of(pm, topic) == []   # empty: forgotten (and deleted)
    assert await publish(new, 1) == 1
    await new.release()
