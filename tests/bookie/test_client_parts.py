"""The ledger client's parts on their own: conf, failure history, add framing, metadata CAS."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookie import protocol
from bookie.client_conf import PLACEMENT_KEYS, ClientConf, load_client_conf, render_client_conf
from bookie.errors import BKError, BookieUnavailableError, ConfError, LedgerFencedError, NoSuchLedgerError
from bookie.failures import FailureHistory
from bookie.metadata import LedgerMetadata, LedgerMetadataManager, LedgerState, MetadataVersionError, close_ledger
from metastore import open_metastore
from metastore.conf import check_conf_file
from placement import PlacementConf

SHIPPED = Path(__file__).resolve().parents[2] / "conf" / "bk_client.conf"


def test_shipped_client_conf_is_the_rendered_one() -> None:
    assert SHIPPED.read_text() == render_client_conf()
    client_keys = set(ClientConf.__dataclass_fields__)
    problems = [p for p in check_conf_file(ClientConf, SHIPPED)
                if not any(f": {key} is not a key of" in p for key in PLACEMENT_KEYS)]
    problems += [p for p in check_conf_file(PlacementConf, SHIPPED)
                 if not any(f": {key} is not a key of" in p for key in client_keys)]
    assert problems == []
    assert ClientConf.from_mapping(load_client_conf(SHIPPED)) == ClientConf()


def test_client_conf_errors_are_one_line_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfError, match=r"^client conf: bad value for read_window: '0' \(expected >= 1\)$"):
        ClientConf.from_mapping({"read_window": "0"})
    with pytest.raises(ConfError, match="unknown key 'add_timeout'"):
        ClientConf.from_mapping({"add_timeout": "1"})
    bad = tmp_path / "bk_client.conf"
    bad.write_text("max_entry_size=big\n")
    with pytest.raises(ConfError, match=r"bk_client.conf: bad value for max_entry_size") as info:
        load_client_conf(bad)
    assert "\n" not in str(info.value)
    conf = ClientConf.from_mapping({"add_entry_timeout": 2, "ensemble_placement_policy": "regionaware"})
    assert conf.add_entry_timeout == 2.0
    with pytest.raises(ConfError, match="network_topology_stabilize_period_seconds"):
        ClientConf.from_mapping({"network_topology_stabilize_period_seconds": "soon"})
    with pytest.raises(ConfError, match="local_region"):
        ClientConf.from_mapping({"local_region": "/a/b"})


def test_failure_history_halves_every_half_life() -> None:
    now = [100.0]
    history = FailureHistory(half_life=10.0, clock=lambda: now[0])
    for _ in range(8):
        history.note("a:1")
    history.note("b:1")
    assert history["a:1"] == 8 and history["b:1"] == 1 and history["c:1"] == 0
    now[0] += 10.0
    assert history["a:1"] == 4 and "b:1" not in history
    now[0] += 25.0
    assert history["a:1"] == 1 and len(history) == 1
    now[0] += 10.0
    assert dict(history) == {}
    with pytest.raises(ValueError):
        FailureHistory(half_life=0)


def test_failure_history_names_the_bookies_in_quarantine() -> None:
    now = [100.0]
    history = FailureHistory(half_life=10.0, clock=lambda: now[0])
    history.note("a:1")
    now[0] += 2.0
    history.note("b:1")
    assert history.recent(3.0) == {"a:1", "b:1"}
    now[0] += 1.5                                  # a failed 3.5 s ago, b 1.5 s ago
    assert history.recent(3.0) == {"b:1"}
    now[0] += 2.0
    assert history.recent(3.0) == set()


@given(txn_id=st.integers(1, 2**64 - 1), ledger_id=st.integers(0, 2**63 - 1), entry_id=st.integers(-1, 2**63 - 1),
       payload=st.binary(max_size=300), recovery=st.booleans())
def test_add_frame_is_the_add_request_frame(txn_id: int, ledger_id: int, entry_id: int, payload: bytes,
                                            recovery: bool) -> None:
    body = protocol.add_request_body(ledger_id, entry_id, b"k" * 20, payload, recovery=recovery)
    frame = protocol.add_frame_head(txn_id, body) + body
    expected = protocol.add_request(txn_id, ledger_id, entry_id, b"k" * 20, payload, recovery=recovery)
    decoder = protocol.FrameDecoder()
    [got] = decoder.feed(frame)
    assert protocol.parse_request(got) == expected


@pytest.mark.parametrize("txn_id", [1, 0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 0xFFFFFFF, 0x10000000,
                                    2**35, 2**64 - 1])
def test_add_frame_txn_id_varint_lengths(txn_id: int) -> None:
    body = protocol.add_request_body(3, 4, b"k" * 20, b"p")
    frame = protocol.add_frame_head(txn_id, body) + body
    [got] = protocol.FrameDecoder().feed(frame)
    assert protocol.parse_request(got).txn_id == txn_id


@given(txn_id=st.integers(1, 2**64 - 1), recovery=st.booleans(),
       sizes=st.lists(st.sampled_from([0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000]), min_size=1, max_size=6))
def test_add_entries_frame_is_the_add_entries_request(txn_id: int, recovery: bool, sizes: list[int]) -> None:
    # payload lengths on each side of each varint boundary of the entries' field leads
    payloads = [b"p" * n for n in sizes]
    ledger = protocol.AddBodies(3, b"k" * 20, recovery=recovery)
    parts, size = protocol.add_entries_frame(txn_id, ledger.ledger_fields, payloads)
    frame = b"".join(parts)
    assert len(frame) == size
    assert frame == protocol.encode_frame(protocol.Request(
        txn_id=txn_id, op=protocol.ADD_ENTRIES, ledger_id=3, master_key=b"k" * 20, recovery=recovery,
        entries=payloads))
    assert all(any(p is x for p in parts) for x in payloads if x)   # the payloads themselves, not copies


def test_client_txns_match_pre_encoded_adds() -> None:
    txns: protocol.ClientTxns[str] = protocol.ClientTxns()
    t = txns.next_txn_id()
    txns.add_txn(t, protocol.ADD_ENTRY, "cb")
    with pytest.raises(protocol.errors.ProtocolError):
        txns.add_txn(t, protocol.ADD_ENTRY, "again")
    resp = protocol.Response(txn_id=t, op=protocol.ADD_ENTRY, status=protocol.OK)
    assert txns.complete(resp) == "cb" and len(txns) == 0


@pytest.mark.parametrize("recovery", [False, True])
@pytest.mark.parametrize("entry_id", [0, 1, 0x7F, 0x80, 99_999, 2**40])
def test_add_bodies_are_the_bytes_of_add_request_body(entry_id: int, recovery: bool) -> None:
    bodies = protocol.AddBodies(77, b"k" * 20, recovery=recovery)
    bodies.body(12, b"an earlier, longer payload")  # the reused request keeps nothing of it
    payload = b"p" * (entry_id % 300)
    assert bodies.body(entry_id, payload) == protocol.add_request_body(77, entry_id, b"k" * 20, payload,
                                                                        recovery=recovery)


def test_client_txns_answer_runs_callbacks_in_order_and_reports_misfits() -> None:
    txns: protocol.ClientTxns[Callable[[protocol.Response], None]] = protocol.ClientTxns()
    got: list[tuple[str, int]] = []
    add = txns.add_next(protocol.ADD_ENTRY, lambda r: got.append(("add", r.entry_id)))
    read = txns.add_next(protocol.READ_ENTRY, lambda r: got.append(("read", r.entry_id)))
    other = txns.add_next(protocol.ADD_ENTRY, lambda r: got.append(("other", r.entry_id)))
    misfits: list[tuple[protocol.Response | None, str]] = []

    def frame(txn_id: int, op: int, entry_id: int) -> bytes:
        return protocol.Response(txn_id=txn_id, op=op, entry_id=entry_id).SerializeToString()

    adds = txns.answer([frame(read, protocol.READ_ENTRY, 2), b"\xff\xff not a response",
                        frame(other, protocol.READ_ENTRY, 9),  # the wrong op: stays outstanding
                        frame(999, protocol.ADD_ENTRY, 5),      # matches nothing
                        frame(add, protocol.ADD_ENTRY, 1)],
                       lambda response, exc: misfits.append((response, str(exc))))
    assert adds == 1
    assert got == [("read", 2), ("add", 1)]
    assert [r is None for r, _ in misfits] == [True, False, False]
    assert "malformed response frame" in misfits[0][1]
    assert "request was ADD_ENTRY" in misfits[1][1] and "matches no request" in misfits[2][1]
    assert len(txns) == 1  # ``other`` is still outstanding
    assert txns.answer([frame(other, protocol.ADD_ENTRY, 3)], lambda r, e: misfits.append((r, str(e)))) == 1
    assert got[-1] == ("other", 3) and len(txns) == 0


def _md() -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles=[(0, ["a:1", "b:1", "c:1"])])


async def test_metadata_cas_update_close_and_ids(tmp_path: Path) -> None:
    store = await open_metastore(f"lmdb://{tmp_path / 'meta'}")
    try:
        mgr = await LedgerMetadataManager.open(store)
        ids = await asyncio.gather(*(mgr.new_ledger_id() for _ in range(20)))
        assert sorted(ids) == list(range(1, 21))
        version = await mgr.create(5, _md())
        await mgr.create(7, _md())
        assert await mgr.ledger_ids() == {5, 7}

        # a stale version is retried from a fresh read: both concurrent changes land
        def bump(key: str) -> Callable[[LedgerMetadata], LedgerMetadata]:
            def change(md: LedgerMetadata) -> LedgerMetadata:
                md.properties[key] = b"1"
                return md
            return change

        await asyncio.gather(*(mgr.update(5, bump(f"k{i}"), current=(_md(), version)) for i in range(5)))
        md, _ = await mgr.read(5)
        assert set(md.properties) == {f"k{i}" for i in range(5)}

        closed, _ = await close_ledger(mgr, 5, 41, 4200)
        assert closed.state is LedgerState.CLOSED and (closed.last_entry_id, closed.length) == (41, 4200)
        again, _ = await close_ledger(mgr, 5, 40, 4000, recovering=True)  # already closed: left alone
        assert again.last_entry_id == 41

        def recover(md: LedgerMetadata) -> LedgerMetadata:
            md.state = LedgerState.IN_RECOVERY
            return md

        await mgr.update(7, recover)
        with pytest.raises(LedgerFencedError):
            await close_ledger(mgr, 7, 3, 30)
        assert (await close_ledger(mgr, 7, 3, 30, recovering=True))[0].is_closed
        with pytest.raises(NoSuchLedgerError):
            await close_ledger(mgr, 99, 0, 0)

        def always_conflict(md: LedgerMetadata) -> LedgerMetadata:
            raise MetadataVersionError("lost the race")

        with pytest.raises(MetadataVersionError):
            await mgr.update(7, always_conflict)
    finally:
        await store.close()


async def test_connect_to_a_missing_lmdb_store_fails_naming_the_path(tmp_path: Path) -> None:
    """``BookKeeper.connect("lmdb:///typo")`` used to create an empty store, then fail with 'need 3 bookies'."""
    from bookie.client import BookKeeper
    from metastore.errors import ServiceDownError

    typo = tmp_path / "typo"
    with pytest.raises(ServiceDownError, match=f"no lmdb metastore at {typo}"):
        await BookKeeper.connect(f"lmdb://{typo}")
    assert not typo.exists()


async def test_a_connection_writes_adds_early_once_flush_bytes_wait_and_the_rest_at_the_end_of_the_turn() -> None:
    from bookie.connection import FLUSH_BYTES, BookieConnection

    writes: list[bytes] = []

    class Transport:
        def writelines(self, data: list[bytes]) -> None:
            writes.append(b"".join(data))

        def is_closing(self) -> bool:
            return False

        def get_extra_info(self, name: str) -> None:
            return None

        def abort(self) -> None:
            pass

    conn = BookieConnection("b:1")
    conn.connection_made(Transport())  # type: ignore[arg-type]
    body = protocol.AddBodies(9, b"k" * 20).body(0, b"p" * 1000)
    count = 2 * FLUSH_BYTES // len(body) + 10
    for _ in range(count):
        conn.submit_add(body, lambda result: None)
    early = list(writes)
    assert len(early) == 2, "two early writes, each as soon as FLUSH_BYTES waited"
    assert all(FLUSH_BYTES <= len(w) < FLUSH_BYTES + len(body) + 16 for w in early)
    await asyncio.sleep(0)  # the end of the turn writes the rest
    assert len(writes) == 3
    frames = protocol.FrameDecoder().feed(b"".join(writes))
    assert [protocol.parse_request(f).txn_id for f in frames] == list(range(1, count + 1))
    conn.close()


def test_an_all_ok_multi_answer_acks_add_acks_by_entry_id_and_others_with_a_response() -> None:
    """A frame's all-OK answer: an ``AddAcks`` callback gets ``ok(entry_id)`` (no ``Response``), any other
    callback a ``Response`` naming the ledger and entry; an error answer reaches both through ``__call__``."""
    from bookie.frame_answers import AddAcks, _LedgersRun

    class Acks(AddAcks):
        def __init__(self) -> None:
            self.oks: list[int] = []
            self.calls: list[object] = []

        def ok(self, entry_id: int) -> None:
            self.oks.append(entry_id)

        def __call__(self, result: protocol.Response | BKError) -> None:
            self.calls.append(result)

    seen: list[object] = []

    def plain(result: protocol.Response | BKError) -> None:
        seen.append(result if isinstance(result, BKError) else (result.ledger_id, result.entry_id))

    acks = Acks()
    l1, l2 = protocol.AddBodies(1, b"k" * 20), protocol.AddBodies(2, b"k" * 20)
    run = _LedgersRun(None, [b"a", b"b", b"c"], [l1, l2, l1], [5, 7, 6],  # type: ignore[arg-type]
                      [acks, plain, acks])
    run(protocol.Response(op=protocol.ADD_ENTRIES_MULTI, status=protocol.OK))
    assert acks.oks == [5, 6] and acks.calls == []
    assert seen == [(2, 7)]
    lost = BookieUnavailableError("gone")
    run(lost)
    assert acks.calls == [lost, lost] and acks.oks == [5, 6] and seen == [(2, 7), lost]
