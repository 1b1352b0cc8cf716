"""hub.ownership on a real lmdb metastore: least-loaded placement, redirects, claims of dead owners."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hub import errors
from hub.conf import load_hub_conf
from hub.metadata import HubRegistry, TopicOwnershipManager, hub_address
from hub.ownership import Ownership
from hub.proto import pubsub_pb2 as pb
from metastore import MetaStore, open_metastore


@pytest.fixture
async def ms(tmp_path: Path) -> AsyncIterator[MetaStore]:
    store = await open_metastore(f"lmdb://{tmp_path}/meta")
    yield store
    await store.close()


async def hub(ms: MetaStore, port: int, load: int, cas: bool = False) -> Ownership:
    conf = load_hub_conf(None, {"metadata_manager_based_topic_manager_enabled": cas})
    info = pb.HubInfo(hostname="127.0.0.1", port=port, czxid=port * 7)
    owners, registry = TopicOwnershipManager(ms), HubRegistry(ms)
    await owners.start()
    await registry.start()
    session = await ms.session(timeout=5.0)
    await registry.register(info, session)
    await registry.update_load(info, load)
    own = Ownership(conf, info, owners, registry, session)
    own.num_topics = load
    return own


async def test_new_topic_goes_to_the_least_loaded_hub(ms: MetaStore) -> None:
    busy, idle = await hub(ms, 1, load=5), await hub(ms, 2, load=0)
    assert await busy.claim(b"t", should_claim=False) == hub_address(idle.me)   # redirect there
    assert await idle.claim(b"t", should_claim=False) is None                   # the idle one claims
    assert await busy.claim(b"t", should_claim=True) == hub_address(idle.me)    # owned: redirect to owner
    assert await busy.claim(b"u", should_claim=True) is None                    # shouldClaim: claim it
    await idle.release(b"t")
    assert await busy.claim(b"t", should_claim=True) is None


async def test_a_topic_given_up_goes_to_a_hub_that_joined_within_the_live_cache(ms: MetaStore) -> None:
    """The live hubs are cached for half a second; a release reads them again, so a topic released right
    after another hub joined goes there (the console's release test lost that race once restarts got fast)."""
    first = await hub(ms, 1, load=3)
    assert await first.claim(b"t", should_claim=False) is None     # alone: it claims (and caches the live list)
    joined = await hub(ms, 2, load=0)                              # within the cache's half second
    assert await first.claim(b"u", should_claim=False) is None     # the cached list: the newcomer unseen yet
    await first.release(b"t")
    assert await first.claim(b"t", should_claim=False) == hub_address(joined.me)


async def test_cas_mode_takes_over_a_dead_owner(ms: MetaStore) -> None:
    a = await hub(ms, 1, load=0, cas=True)
    assert await a.claim(b"t", should_claim=True) is None
    await a.session.close()                       # a dies: its registration goes, its owner record stays
    b = await hub(ms, 2, load=0, cas=True)
    assert await b.claim(b"t", should_claim=False) is None
    got = await b.owners.read_owner_info(b"t")
    assert got is not None and got[0].port == 2


async def test_ephemeral_mode_waits_for_a_dead_owners_lease(ms: MetaStore) -> None:
    a = await hub(ms, 1, load=0)
    assert await a.claim(b"t", should_claim=True) is None
    await a.registry.unregister(a.me)             # gone from the hubs table, owner record not yet expired
    b = await hub(ms, 2, load=0)
    with pytest.raises(errors.ServiceDownError):
        await b.claim(b"t", should_claim=False)
    await a.session.close()                       # the lease ends: the record vanishes
    assert await b.claim(b"t", should_claim=False) is None
