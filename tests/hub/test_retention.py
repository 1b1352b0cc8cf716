"""messageBound in retention: an idle bounded subscriber does not keep consumed ledgers (real processes)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bookie.client import BookKeeper
from bookie.errors import BKError
from hub.client import HedwigClient, Message
from hub.proto import pubsub_pb2 as pb
from metastore import open_metastore
from tests.fixtures.polling import eventually
from tools.cluster import LocalCluster

from .conftest import HUB_CONF

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

BOUND = 10


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: Any) -> AsyncIterator[tuple[LocalCluster, Any, Any]]:
    root: Path = tmp_path_factory.mktemp("retention")
    conf = dict(HUB_CONF, max_entries_per_ledger="2", messages_consumed_thread_run_interval="200")
    async with LocalCluster(bookies=3, hubs=1, data_dir=root, conf_overrides=conf) as cluster:
        ms = await open_metastore(cluster.metastore_uri)
        bk = await BookKeeper.connect(ms)
        try:
            yield cluster, await ms.create_table("topic_persistence"), bk
        finally:
            await bk.close()
            await ms.close()


def name() -> bytes:
    return uuid.uuid4().hex[:10].encode()


async def ranges_of(table: Any, topic: bytes) -> list[pb.LedgerRange]:
    return list(pb.LedgerRanges.FromString((await table.get(topic.decode())).value["data"] or b"").ranges)


async def gone(bk: Any, ledger_ids: list[int]) -> bool:
    for lid in ledger_ids:
        try:
            rh = await bk.open_ledger_no_recovery(lid)
        except BKError:
            continue
        await rh.close()
        return False
    return True


class Seqs:
    """A delivery handler recording seq ids; ``wait_for(n)`` until the n-th one arrived."""

    def __init__(self) -> None:
        self.got: list[int] = []
        self.cond = asyncio.Condition()

    async def __call__(self, topic: bytes, sub: bytes, msg: Message) -> None:
        async with self.cond:
            self.got.append(msg.seq_id)
            self.cond.notify_all()

    async def wait_for(self, last: int, timeout: float = 20.0) -> None:
        async with asyncio.timeout(timeout), self.cond:
            await self.cond.wait_for(lambda: bool(self.got) and self.got[-1] >= last)


async def publish_consumed(c: HedwigClient, topic: bytes, n: int, active: Seqs | None = None) -> Seqs:
    """An active unbounded subscriber ``a`` on ``c``; ``n`` more publishes (one entry each) it has all handled."""
    if active is None:
        await c.subscribe(topic, b"a")
        active = Seqs()
        await c.start_delivery(topic, b"a", active)
    first = len(active.got) + 1
    for i in range(n):
        assert await c.publish(topic, b"%d" % i) == first + i
    await active.wait_for(first + n - 1)
    assert active.got == list(range(1, first + n))
    return active


async def test_idle_unbounded_subscriber_still_blocks_and_idle_bounded_one_does_not(
        env: tuple[LocalCluster, Any, Any]) -> None:
    cluster, persistence, bk = env
    blocked, trimmed = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0],
                                          conf={"consumed_messages_buffer_size": "1"}) as c:
        await c.subscribe(blocked, b"idle")                       # unbounded, never attached again
        await c.close_subscription(blocked, b"idle")
        await publish_consumed(c, blocked, 20)
        for bounded in (b"bounded", b"raised"):
            await c.subscribe(trimmed, bounded, message_bound=BOUND)
            await c.close_subscription(trimmed, bounded)
        active = await publish_consumed(c, trimmed, BOUND)        # nothing past the bound yet: all kept
        before = await ranges_of(persistence, trimmed)
        assert before[0].startSeqIdIncluded == 1 and len(before) >= BOUND // 2
        await publish_consumed(c, trimmed, 40 - BOUND, active)    # 20 ledgers of 2 entries in all

        async def trimmed_to_bound() -> bool:   # ledgers wholly at or below 40 - BOUND go; 31.. stays
            return (await ranges_of(persistence, trimmed))[0].startSeqIdIncluded == 40 - BOUND + 1

        await eventually(trimmed_to_bound)
        kept = {r.ledgerId for r in await ranges_of(persistence, trimmed)}
        dropped = [r.ledgerId for r in before if r.ledgerId not in kept]
        assert len(dropped) == BOUND // 2                         # every ledger of 1..BOUND
        await eventually(lambda: gone(bk, dropped))               # deleted from the bookies too
        # the same timer runs saw the unbounded idle subscriber's topic: nothing deleted there
        assert (await ranges_of(persistence, blocked))[0].startSeqIdIncluded == 1

        await c.subscribe(trimmed, b"bounded", create_or_attach="ATTACH", message_bound=BOUND)
        late = Seqs()
        await c.start_delivery(trimmed, b"bounded", late)
        await late.wait_for(40)
        assert late.got == list(range(40 - BOUND + 1, 41))        # the newest BOUND, in order
        await c.publish(trimmed, b"next")
        await late.wait_for(41)
        assert late.got[-1] == 41 and len(late.got) == BOUND + 1

        # its bound raised past what was kept: delivery starts at the oldest message still stored
        await c.subscribe(trimmed, b"raised", create_or_attach="ATTACH", message_bound=3 * BOUND)
        raised = Seqs()
        await c.start_delivery(trimmed, b"raised", raised)
        await raised.wait_for(41)
        assert raised.got == list(range(40 - BOUND + 1, 42))

        await c.subscribe(blocked, b"idle", create_or_attach="ATTACH")
        everything = Seqs()
        await c.start_delivery(blocked, b"idle", everything)
        await everything.wait_for(20)
        assert everything.got == list(range(1, 21))


async def test_lagging_bounded_subscriber_skips_what_was_trimmed(env: tuple[LocalCluster, Any, Any]) -> None:
    cluster, persistence, _ = env
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0],
                                          conf={"auto_send_consume_message_enabled": "false"}) as slow, \
            await HedwigClient.connect(cluster.hub_addresses[0], conf={"consumed_messages_buffer_size": "1"}) as c:
        await slow.subscribe(topic, b"bounded", message_bound=BOUND, message_window_size=1)
        lagging = Seqs()
        await slow.start_delivery(topic, b"bounded", lagging)    # gets 1, then waits for its consume
        await publish_consumed(c, topic, 40)
        assert lagging.got == [1]

        async def trimmed_to_bound() -> bool:
            return (await ranges_of(persistence, topic))[0].startSeqIdIncluded == 40 - BOUND + 1

        await eventually(trimmed_to_bound)
        await slow.consume(topic, b"bounded", 1)                  # 2..30 are gone: skipped, not stalled
        for last in range(40 - BOUND + 1, 41):
            await lagging.wait_for(last)
            await slow.consume(topic, b"bounded", last)
        assert lagging.got == [1, *range(40 - BOUND + 1, 41)]
