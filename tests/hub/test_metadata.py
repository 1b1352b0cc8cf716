"""hub.metadata against real backends: lmdb and a real ZooKeeper server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hub import errors
from hub.metadata import (
    HubRegistry,
    SubscriptionDataManager,
    TopicOwnershipManager,
    TopicPersistenceManager,
    hub_address,
)
from hub.proto import pubsub_pb2 as pb
from metastore import MetaStore, Version, open_metastore
from tools.zookeeper import ZooKeeperServer


@pytest.fixture(params=["lmdb", "zk"])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "lmdb":
        return f"lmdb://{tmp_path}/meta"
    return str(request.getfixturevalue("zk_uri"))


@pytest.fixture
async def ms(uri: str) -> AsyncIterator[MetaStore]:
    store = await open_metastore(uri)
    try:
        yield store
    finally:
        await store.close()


HUB_A = pb.HubInfo(hostname="127.0.0.1", port=4080, sslPort=9876, czxid=1)
HUB_B = pb.HubInfo(hostname="127.0.0.1", port=4081, sslPort=0, czxid=2)


def state(seq: int) -> pb.SubscriptionState:
    return pb.SubscriptionState(msgId=pb.MessageSeqId(localComponent=seq))


def prefs(bound: int, option: bytes = b"x") -> pb.SubscriptionPreferences:
    out = pb.SubscriptionPreferences(messageBound=bound, messageFilter="pkg.F")
    out.options.entries.add(key="opt", value=option)
    return out


def test_hub_address() -> None:
    assert hub_address(HUB_A) == "127.0.0.1:4080:9876"


async def test_owner_create_cas_delete(ms: MetaStore) -> None:
    owners = TopicOwnershipManager(ms)
    await owners.start()
    assert await owners.read_owner_info(b"t") is None
    v1 = await owners.write_owner_info(b"t", HUB_A, Version.NEW)
    with pytest.raises(errors.TopicOwnerInfoExistsError):
        await owners.write_owner_info(b"t", HUB_B, Version.NEW)
    got = await owners.read_owner_info(b"t")
    assert got == (HUB_A, v1)
    v2 = await owners.write_owner_info(b"t", HUB_B, v1)
    assert v2 != v1
    with pytest.raises(errors.BadVersionError):
        await owners.write_owner_info(b"t", HUB_A, v1)      # stale version
    with pytest.raises(errors.BadVersionError):
        await owners.delete_owner_info(b"t", v1)
    assert await owners.read_owner_info(b"t") == (HUB_B, v2)
    await owners.delete_owner_info(b"t", v2)
    assert await owners.read_owner_info(b"t") is None
    with pytest.raises(errors.NoTopicOwnerInfoError):
        await owners.write_owner_info(b"t", HUB_A, v2)
    with pytest.raises(errors.NoTopicOwnerInfoError):
        await owners.delete_owner_info(b"t", v2)


async def test_ephemeral_owner_vanishes_with_session(ms: MetaStore) -> None:
    owners = TopicOwnershipManager(ms)
    session = await ms.session(timeout=2.0)
    v = await owners.write_owner_info("tøpic".encode(), HUB_A, Version.NEW, session)
    with pytest.raises(errors.TopicOwnerInfoExistsError):
        await owners.write_owner_info("tøpic".encode(), HUB_B, Version.NEW)
    # a CAS update keeps the claim ephemeral
    v2 = await owners.write_owner_info("tøpic".encode(), HUB_A, v)
    assert await owners.read_owner_info("tøpic".encode()) == (HUB_A, v2)
    await session.close()
    assert await owners.read_owner_info("tøpic".encode()) is None
    await owners.write_owner_info("tøpic".encode(), HUB_B, Version.NEW)   # claimable again


async def test_bad_topic_names_are_malformed(ms: MetaStore) -> None:
    owners = TopicOwnershipManager(ms)
    subs = SubscriptionDataManager(ms)
    for bad in (b"", b"\xff\xfe"):
        with pytest.raises(errors.MalformedRequestError):
            await owners.read_owner_info(bad)
        with pytest.raises(errors.MalformedRequestError):
            await subs.read_subscriptions(bad)
    with pytest.raises(errors.MalformedRequestError):
        await subs.create_subscription_data(b"a\x00b", b"s", pb.SubscriptionData())
    with pytest.raises(errors.MalformedRequestError):
        await subs.read_subscription_data(b"t", b"")
    # and the managers keep working
    await owners.write_owner_info(b"ok", HUB_A, Version.NEW)
    assert await owners.read_owner_info(b"ok") is not None


async def test_persistence_create_cas_delete(ms: MetaStore) -> None:
    mgr = TopicPersistenceManager(ms)
    await mgr.start()
    assert await mgr.read_topic_persistence_info(b"t") is None
    ranges = pb.LedgerRanges()
    ranges.ranges.add(ledgerId=7, startSeqIdIncluded=1)
    v1 = await mgr.write_topic_persistence_info(b"t", ranges, Version.NEW)
    with pytest.raises(errors.TopicPersistenceInfoExistsError):
        await mgr.write_topic_persistence_info(b"t", ranges, Version.NEW)
    ranges.ranges[0].endSeqIdIncluded.localComponent = 10
    ranges.ranges.add(ledgerId=9, startSeqIdIncluded=11)
    v2 = await mgr.write_topic_persistence_info(b"t", ranges, v1)
    with pytest.raises(errors.BadVersionError):
        await mgr.write_topic_persistence_info(b"t", pb.LedgerRanges(), v1)
    got = await mgr.read_topic_persistence_info(b"t")
    assert got is not None and got[0] == ranges and got[1] == v2
    with pytest.raises(errors.BadVersionError):
        await mgr.delete_topic_persistence_info(b"t", v1)
    await mgr.delete_topic_persistence_info(b"t", v2)
    assert await mgr.read_topic_persistence_info(b"t") is None
    with pytest.raises(errors.NoTopicPersistenceInfoError):
        await mgr.delete_topic_persistence_info(b"t", v2)
    with pytest.raises(errors.NoTopicPersistenceInfoError):
        await mgr.write_topic_persistence_info(b"t", ranges, v2)


async def test_subscription_partial_update(ms: MetaStore) -> None:
    subs = SubscriptionDataManager(ms)
    await subs.start()
    assert subs.is_partial_update_supported()
    assert await subs.read_subscription_data(b"t", b"s") is None
    v1 = await subs.create_subscription_data(b"t", b"s", pb.SubscriptionData(state=state(5),
                                                                              preferences=prefs(3)))
    with pytest.raises(errors.SubscriptionStateExistsError):
        await subs.create_subscription_data(b"t", b"s", pb.SubscriptionData(state=state(0)))
    # a state-only update leaves the preferences as they were
    v2 = await subs.update_subscription_data(b"t", b"s", pb.SubscriptionData(state=state(9)), v1)
    got = await subs.read_subscription_data(b"t", b"s")
    assert got == (pb.SubscriptionData(state=state(9), preferences=prefs(3)), v2)
    # a preferences-only update leaves the state
    v3 = await subs.update_subscription_data(b"t", b"s", pb.SubscriptionData(preferences=prefs(4, b"y")), v2)
    got = await subs.read_subscription_data(b"t", b"s")
    assert got == (pb.SubscriptionData(state=state(9), preferences=prefs(4, b"y")), v3)
    with pytest.raises(errors.BadVersionError):
        await subs.update_subscription_data(b"t", b"s", pb.SubscriptionData(state=state(1)), v2)
    # replace drops the part that is not given
    v4 = await subs.replace_subscription_data(b"t", b"s", pb.SubscriptionData(state=state(10)), v3)
    assert await subs.read_subscription_data(b"t", b"s") == (pb.SubscriptionData(state=state(10)), v4)
    with pytest.raises(errors.BadVersionError):
        await subs.delete_subscription_data(b"t", b"s", v3)
    await subs.delete_subscription_data(b"t", b"s", v4)
    assert await subs.read_subscription_data(b"t", b"s") is None
    with pytest.raises(errors.NoSubscriptionStateError):
        await subs.update_subscription_data(b"t", b"s", pb.SubscriptionData(state=state(1)), v4)
    with pytest.raises(errors.NoSubscriptionStateError):
        await subs.delete_subscription_data(b"t", b"s", v4)


async def test_create_without_state_stores_empty_state(ms: MetaStore) -> None:
    subs = SubscriptionDataManager(ms)
    v = await subs.create_subscription_data(b"t", b"s", pb.SubscriptionData(preferences=prefs(1)))
    got = await subs.read_subscription_data(b"t", b"s")
    assert got is not None and got[1] == v
    assert got[0].HasField("state") and got[0].state.msgId.localComponent == 0
    assert got[0].preferences == prefs(1)


async def test_read_subscriptions_only_that_topic(ms: MetaStore) -> None:
    subs = SubscriptionDataManager(ms)
    await subs.start()
    made = {}
    # "ab" and "a b" sort right after "a"; "a" must not see their subscribers (nor they its)
    for topic, sub, seq in [(b"a", b"s1", 1), (b"a", "süb".encode(), 2), (b"ab", b"s1", 3),
                            (b"a b", b"s3", 4), (b"b", b"s1", 5)]:
        made[(topic, sub)] = await subs.create_subscription_data(topic, sub,
                                                                 pb.SubscriptionData(state=state(seq)))
    got = await subs.read_subscriptions(b"a")
    assert set(got) == {b"s1", "süb".encode()}
    assert got[b"s1"] == (pb.SubscriptionData(state=state(1)), made[(b"a", b"s1")])
    assert got["süb".encode()][0].state.msgId.localComponent == 2
    assert set(await subs.read_subscriptions(b"ab")) == {b"s1"}
    assert (await subs.read_subscriptions(b"ab"))[b"s1"][0].state.msgId.localComponent == 3
    assert set(await subs.read_subscriptions(b"a b")) == {b"s3"}
    assert await subs.read_subscriptions(b"nothing") == {}


async def test_hub_registry(ms: MetaStore) -> None:
    hubs = HubRegistry(ms)
    await hubs.start()
    assert await hubs.live_hubs() == []
    sa = await ms.session(timeout=2.0)
    sb = await ms.session(timeout=2.0)
    await hubs.register(HUB_A, sa)
    await hubs.register(HUB_B, sb)
    live = await hubs.live_hubs()
    assert [(hub_address(i), load.numTopics) for i, load in live] == [
        ("127.0.0.1:4080:9876", 0), ("127.0.0.1:4081:0", 0)]
    assert live[0][0] == HUB_A
    await hubs.update_load(HUB_A, 5)
    await hubs.update_load(HUB_B, 2)
    assert [load.numTopics for _, load in await hubs.live_hubs()] == [5, 2]
    # a restarted hub on the same address replaces the stale registration
    sa2 = await ms.session(timeout=2.0)
    restarted = pb.HubInfo(hostname=HUB_A.hostname, port=HUB_A.port, sslPort=HUB_A.sslPort, czxid=99)
    await hubs.register(restarted, sa2)
    live = await hubs.live_hubs()
    assert [(i.czxid, load.numTopics) for i, load in live] == [(99, 0), (2, 2)]
    await sa.close()
    # B's session ends: it drops out of the registry; updating its load reports it
    await sb.close()
    assert [i.czxid for i, _ in await hubs.live_hubs()] == [99]
    with pytest.raises(errors.ServiceDownError):
        await hubs.update_load(HUB_B, 3)
    await hubs.unregister(restarted)
    await hubs.unregister(restarted)       # already gone: no error
    assert await hubs.live_hubs() == []
    await sa2.close()


async def test_closed_store_gives_hub_errors(uri: str) -> None:
    store = await open_metastore(uri)
    owners = TopicOwnershipManager(store)
    await owners.start()
    await store.close()
    with pytest.raises(errors.PubSubError) as info:
        await owners.read_owner_info(b"t")
    assert "metastore" in str(info.value)   # a hub error naming the cause, not a metastore error


async def test_zookeeper_down_is_service_down_and_recovers(zk_server_private: ZooKeeperServer) -> None:
    zk = zk_server_private
    store = await open_metastore(f"zk://{zk.connect_string}/hubs", operation_timeout=1.0)
    try:
        owners = TopicOwnershipManager(store)
        subs = SubscriptionDataManager(store)
        v = await owners.write_owner_info(b"t", HUB_A, Version.NEW)
        await subs.start()
        await asyncio.to_thread(zk.stop)
        with pytest.raises(errors.ServiceDownError):
            await owners.read_owner_info(b"t")
        with pytest.raises(errors.ServiceDownError):
            await owners.write_owner_info(b"t", HUB_B, v)
        with pytest.raises(errors.ServiceDownError):
            await subs.read_subscriptions(b"t")
        await asyncio.to_thread(zk.start)
        async with asyncio.timeout(30):
            while True:   # kazoo reconnects with backoff: each read waits 1 s, then says SERVICE_DOWN again
                try:
                    got = await owners.read_owner_info(b"t")
                    break
                except errors.ServiceDownError:
                    continue
        assert got == (HUB_A, v)                       # the failed CAS wrote nothing
    finally:
        await store.close()
