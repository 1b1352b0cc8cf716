"""AutoRecovery's pieces without bookie processes: the tables, the auditor's delay logic, the copy pacer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from bookie.autorecovery import Auditor, AutoRecoveryStats, UnderReplicationManager
from bookie.conf import BookieConf
from bookie.metadata import LedgerMetadata, LedgerMetadataManager, LedgerState
from bookie.ops import BookieOps
from bookie.registration import BookieRegistration
from bookie.rereplication import EntryPacer
from metastore import MetaStore, open_metastore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MetaStore]:
    ms = await open_metastore(f"lmdb://{tmp_path / 'meta'}")
    yield ms
    await ms.close()


async def test_marks_merge_missing_bookies_and_keep_their_first_time(store: MetaStore) -> None:
    urm = await UnderReplicationManager.open(store)
    assert await urm.mark(7, {"b:1"})
    first = await urm.get(7)
    assert first is not None and first.missing == {"b:1"} and first.marked_ms > 0
    assert not await urm.mark(7, {"b:1"}), "a mark naming nothing new is not rewritten"
    assert await urm.mark(7, {"b:2"})
    merged = await urm.get(7)
    assert merged is not None and merged.missing == {"b:1", "b:2"} and merged.marked_ms == first.marked_ms
    assert await urm.mark(12, {"b:3"})
    assert [r.ledger_id for r in await urm.list()] == [7, 12]


async def test_unmark_keeps_a_mark_extended_since_it_was_read(store: MetaStore) -> None:
    urm = await UnderReplicationManager.open(store)
    await urm.mark(3, {"b:1"})
    claimed = await urm.get(3)
    assert claimed is not None
    await urm.mark(3, {"b:2"})  # the auditor finds another lost bookie meanwhile
    assert not await urm.unmark(3, claimed.version)
    now = await urm.get(3)
    assert now is not None and now.missing == {"b:1", "b:2"}
    assert await urm.unmark(3, now.version)
    assert await urm.get(3) is None


async def test_switch_and_delay_are_cluster_wide_keys(store: MetaStore) -> None:
    urm = await UnderReplicationManager.open(store)
    assert await urm.enabled()
    assert await urm.lost_bookie_recovery_delay(30.0) == 30.0
    assert await urm.lost_bookie_recovery_delay_override() is None
    await urm.set_enabled(False)
    await urm.set_lost_bookie_recovery_delay(5)
    other = await UnderReplicationManager.open(store)
    assert not await other.enabled()
    assert await other.lost_bookie_recovery_delay(30.0) == 5.0
    with pytest.raises(ValueError):
        await urm.set_lost_bookie_recovery_delay(-1)


async def test_pacer_holds_its_rate_and_saves_up_no_burst_after_a_pause() -> None:
    loop = asyncio.get_running_loop()
    pacer = EntryPacer(50)
    t0 = loop.time()
    for _ in range(11):
        await pacer.wait()
    assert loop.time() - t0 >= 0.19  # 10 intervals of 20 ms after the first copy
    await asyncio.sleep(0.3)  # idle: must not allow 15 copies at once afterwards
    t1 = loop.time()
    for _ in range(6):
        await pacer.wait()
    assert loop.time() - t1 >= 0.09


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_auditor_marks_only_after_the_delay_and_forgets_a_bookie_that_returns(store: MetaStore) -> None:
    """The auditor's delay logic with a fake clock, registrations made by hand and one ledger on X, Y, Z."""
    mgr = await LedgerMetadataManager.open(store)
    await mgr.create(1, LedgerMetadata(3, 2, 2, [(0, ["x:1", "y:1", "z:1"])], state=LedgerState.CLOSED,
                                       last_entry_id=9))
    await mgr.create(2, LedgerMetadata(3, 2, 2, [(0, ["y:1", "z:1", "w:1"])], state=LedgerState.CLOSED,
                                       last_entry_id=9))
    regs = {}
    for b in ("x:1", "y:1", "z:1", "w:1"):
        regs[b] = BookieRegistration(store, b, "/r/a", session_timeout=5.0)
        await regs[b].register(read_only=False, free_disk=1, total_disk=1)
    urm = await UnderReplicationManager.open(store)
    ops = await BookieOps.open(store)
    conf = BookieConf.from_properties({"lost_bookie_recovery_delay": "10", "auditor_periodic_check_interval": "0"})
    clock = FakeClock()
    auditor = Auditor(store, urm, ops, conf, AutoRecoveryStats(CollectorRegistry()), clock=clock)
    try:
        await auditor.tick()
        await regs["x:1"].unregister()
        await auditor.tick()
        assert auditor.gone_since == {"x:1": clock.now}
        clock.now += 9.9
        await auditor.tick()
        assert await urm.list() == []
        await regs["x:1"].register(read_only=False, free_disk=1, total_disk=1)  # back within the delay
        await auditor.tick()
        assert auditor.gone_since == {}
        clock.now += 60
        await auditor.tick()
        assert await urm.list() == []
        await regs["x:1"].unregister()
        await auditor.tick()
        await urm.set_lost_bookie_recovery_delay(2)  # the operator's cluster-wide value wins over the conf
        clock.now += 2
        await auditor.tick()
        marks = await urm.list()
        assert [(m.ledger_id, m.missing) for m in marks] == [(1, frozenset({"x:1"}))]
    finally:
        await ops.close()
        for r in regs.values():
            await r.unregister()


async def test_a_new_auditor_counts_bookies_named_by_ledgers_but_unregistered_as_gone(store: MetaStore) -> None:
    mgr = await LedgerMetadataManager.open(store)
    await mgr.create(5, LedgerMetadata(3, 2, 2, [(0, ["x:1", "y:1", "z:1"])]))
    urm = await UnderReplicationManager.open(store)
    ops = await BookieOps.open(store)
    conf = BookieConf.from_properties({"lost_bookie_recovery_delay": "0"})
    try:
        auditor = Auditor(store, urm, ops, conf, AutoRecoveryStats(CollectorRegistry()), clock=FakeClock())
        await auditor.tick()
        marks = await urm.list()
        assert [(m.ledger_id, m.missing) for m in marks] == [(5, frozenset({"x:1", "y:1", "z:1"}))]
    finally:
        await ops.close()


@dataclass
class Audit:
    store: MetaStore
    auditor: Auditor
    urm: UnderReplicationManager
    clock: FakeClock
    regs: dict[str, BookieRegistration]

    async def flash(self, bookie: str, ledger_id: int, ensemble: list[str]) -> None:
        """``bookie`` registers, is named by a new ledger and unregisters, all between two ticks."""
        await self.regs[bookie].register(read_only=False, free_disk=1, total_disk=1)
        await (await LedgerMetadataManager.open(self.store)).create(
            ledger_id, LedgerMetadata(len(ensemble), 2, 2, [(0, ensemble)]))
        await self.regs[bookie].unregister()

    async def marks(self) -> list[tuple[int, frozenset[str]]]:
        return [(m.ledger_id, m.missing) for m in await self.urm.list()]


@asynccontextmanager
async def auditing(store: MetaStore, conf: dict[str, str], registered: list[str],
                   others: list[str]) -> AsyncIterator[Audit]:
    """An auditor (fake clock) over ``registered`` bookies; ``others`` have registrations made but not yet used."""
    regs = {b: BookieRegistration(store, b, "/r/a", session_timeout=5.0) for b in registered + others}
    for b in registered:
        await regs[b].register(read_only=False, free_disk=1, total_disk=1)
    urm = await UnderReplicationManager.open(store)
    ops = await BookieOps.open(store)
    clock = FakeClock()
    auditor = Auditor(store, urm, ops, BookieConf.from_properties(conf), AutoRecoveryStats(CollectorRegistry()),
                      clock=clock)
    try:
        yield Audit(store, auditor, urm, clock, regs)
    finally:
        await ops.close()
        for r in regs.values():
            await r.unregister()


async def test_a_bookie_that_registers_and_dies_between_two_ticks_is_found_by_the_periodic_check(
        store: MetaStore) -> None:
    """Its registration never shows in a tick; the ledger it wrote to names it, and the periodic check reads that."""
    conf = {"lost_bookie_recovery_delay": "10", "auditor_periodic_check_interval": "60"}
    async with auditing(store, conf, ["x:1", "y:1"], ["v:1"]) as a:
        await a.auditor.tick()                    # elected: every named bookie is registered (none named yet)
        await a.flash("v:1", 8, ["x:1", "y:1", "v:1"])
        a.clock.now += 1
        await a.auditor.tick()
        assert a.auditor.gone_since == {}, "comparing registrations cannot see it"
        a.clock.now += 60                         # the periodic check is due
        await a.auditor.tick()
        assert a.auditor.gone_since == {"v:1": a.clock.now}
        assert await a.marks() == [], "marked only once gone for lost_bookie_recovery_delay"
        a.clock.now += 10
        await a.auditor.tick()
        assert await a.marks() == [(8, frozenset({"v:1"}))]


async def test_triggeraudit_runs_the_full_audit_at_the_next_tick(store: MetaStore) -> None:
    """With the periodic check off, only a request (``quire shell triggeraudit``) finds the bookie no tick saw."""
    conf = {"lost_bookie_recovery_delay": "0", "auditor_periodic_check_interval": "0"}
    async with auditing(store, conf, ["x:1"], ["v:1"]) as a:
        await a.urm.request_audit()               # made before this auditor was elected: its election scan serves it
        await a.auditor.tick()
        await a.flash("v:1", 4, ["x:1", "v:1"])
        for _ in range(3):
            a.clock.now += 3600
            await a.auditor.tick()
        assert await a.marks() == [], "no periodic check, no tick saw it"
        await a.urm.request_audit()
        await a.auditor.tick()
        assert await a.marks() == [(4, frozenset({"v:1"}))]
        await a.urm.unmark(4)
        await a.auditor.tick()                    # a request is served once
        assert await a.marks() == []
