"""White-box: when TopicLog sends queued publishes as another entry while adds are in flight.

A fake ledger handle holds every add until the test settles it, so which
entries exist at each step is exact (no timing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from hub.conf import load_hub_conf
from hub.persistence import TopicLog, decode_batch
from hub.proto import pubsub_pb2 as pb

pytestmark = pytest.mark.asyncio


class HeldLedger:
    """``async_add_entry`` records each entry; ``settle(i)`` acknowledges the i-th."""

    ledger_id = 7

    def __init__(self) -> None:
        self.adds: list[tuple[list[int], Callable[[int, BaseException | None], None]]] = []

    def async_add_entry(self, data: bytes, cb: Callable[[int, BaseException | None], None]) -> None:
        self.adds.append(([m.msgId.localComponent for m in decode_batch(data)], cb))

    def entries(self) -> list[list[int]]:
        return [seqs for seqs, _ in self.adds]

    def settle(self, i: int) -> None:
        self.adds[i][1](i, None)


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def held_log(**conf: Any) -> tuple[TopicLog, HeldLedger]:
    log = TopicLog(b"t", None, None, load_hub_conf(None, conf))
    lh = HeldLedger()
    log.lh, log._index[lh.ledger_id] = lh, []
    return log, lh


def body(n: int) -> pb.Message:
    return pb.Message(body=b"x" * n)


async def test_queued_publishes_wait_for_the_add_in_flight_until_they_fill_batch_flush_bytes() -> None:
    log, lh = held_log(batch_flush_bytes=30, max_outstanding_adds=4)
    first = log.enqueue(body(10))
    await turns()
    assert lh.entries() == [[1]]                       # a lone publish goes out at once
    small = [log.enqueue(body(10)), log.enqueue(body(10))]
    await turns()
    assert lh.entries() == [[1]]                       # 20 bytes < 30: they wait
    small.append(log.enqueue(body(10)))
    await turns()
    assert lh.entries() == [[1], [2, 3, 4]]            # 30 bytes: a second entry joins the first in flight
    lh.settle(1)
    await turns()
    assert not any(f.done() for f in [first, *small])   # completed in order only
    lh.settle(0)
    await turns()
    assert [f.result() for f in [first, *small]] == [1, 2, 3, 4]


async def test_a_small_remainder_goes_once_no_add_is_in_flight() -> None:
    log, lh = held_log(batch_flush_bytes=1000, max_outstanding_adds=4)
    first = log.enqueue(body(10))
    await turns()
    rest = [log.enqueue(body(10)) for _ in range(3)]
    await turns()
    assert lh.entries() == [[1]]
    lh.settle(0)
    await turns()
    assert first.result() == 1
    assert lh.entries() == [[1], [2, 3, 4]]            # the add settled: what queued goes as one entry
    lh.settle(1)
    await turns()
    assert [f.result() for f in rest] == [2, 3, 4]


async def test_no_more_than_max_outstanding_adds_in_flight() -> None:
    log, lh = held_log(batch_flush_bytes=0, max_outstanding_adds=2)
    futs = [log.enqueue(body(1))]
    await turns()
    futs += [log.enqueue(body(1))]
    await turns()
    futs += [log.enqueue(body(1))]
    await turns()
    assert lh.entries() == [[1], [2]]                  # 0: each goes at once, but two in flight at most
    lh.settle(0)
    await turns()
    assert lh.entries() == [[1], [2], [3]]
    lh.settle(1)
    lh.settle(2)
    await turns()
    assert [f.result() for f in futs] == [1, 2, 3]
