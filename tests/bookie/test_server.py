"""The bookie server, tested as a real ``python -m tools.cli bookie`` OS process."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bookie import protocol as proto
from bookie.conf import BookieConf
from bookie.digest import decode_entry, encode_entry, master_key
from bookie.errors import BookieUnavailableError, ConfError, DigestMismatchError
from bookie.registration import BOOKIES_TABLE, READ_ONLY, WRITABLE, decode_registration, list_bookies
from bookie.storage import corrupt_stored_entry
from bookie.testing import BookieProcess, RawBookieClient
from metastore import Value, Version, open_metastore
from metastore.errors import NoKeyError
from tests.bookie.conftest import KEY, StartBookie, add_req
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.timeout(60)



# --- the protocol against the shared process ------------------------------------------------------


async def test_add_then_read_back(client: RawBookieClient) -> None:
    resp = await client.call(add_req(101, 0, b"hello", lac=-1))
    assert (resp.status, resp.op, resp.ledger_id, resp.entry_id) == (proto.OK, proto.ADD_ENTRY, 101, 0)
    got = await client.call(proto.read_request(0, 101, 0))
    assert got.status == proto.OK
    assert decode_entry(got.body, ledger_id=101, entry_id=0).body == b"hello"


async def test_pipelined_adds_all_acknowledged_and_lac_tracked(client: RawBookieClient) -> None:
    n = 500
    results = await asyncio.gather(*(client.call(add_req(102, i, b"x" * 10, lac=i - 1)) for i in range(n)))
    assert [r.status for r in results] == [proto.OK] * n
    assert sorted(r.entry_id for r in results) == list(range(n))
    lac = await client.call(proto.read_lac_request(0, 102))
    assert (lac.status, lac.lac, lac.entry_id) == (proto.OK, n - 2, n - 1)
    last = await client.call(proto.read_request(0, 102, proto.LAST_ENTRY))
    assert (last.status, last.entry_id) == (proto.OK, n - 1)
    assert decode_entry(last.body).entry_id == n - 1


async def test_missing_entry_and_unknown_ledger(client: RawBookieClient) -> None:
    assert (await client.call(add_req(103, 0))).status == proto.OK
    assert (await client.call(proto.read_request(0, 103, 7))).status == proto.NO_ENTRY
    assert (await client.call(proto.read_request(0, 999_999, 0))).status == proto.NO_LEDGER
    assert (await client.call(proto.read_lac_request(0, 999_999))).status == proto.NO_LEDGER


async def test_wrong_master_key_is_unauthorized(client: RawBookieClient) -> None:
    assert (await client.call(add_req(104, 0))).status == proto.OK
    bad = await client.call(add_req(104, 1, key=master_key(b"wrong")))
    assert bad.status == proto.UNAUTHORIZED
    fence = await client.call(proto.read_request(0, 104, 0, fence=True, master_key=master_key(b"wrong")))
    assert fence.status == proto.UNAUTHORIZED
    assert (await client.call(add_req(104, 1))).status == proto.OK  # not fenced by the failed attempt


async def test_fencing_read_refuses_later_adds_but_not_recovery_adds(client: RawBookieClient) -> None:
    for i in range(3):
        assert (await client.call(add_req(105, i, lac=i - 1))).status == proto.OK
    fenced = await client.call(proto.read_request(0, 105, proto.LAST_ENTRY, fence=True, master_key=KEY))
    assert (fenced.status, fenced.entry_id) == (proto.OK, 2)
    assert (await client.call(add_req(105, 3))).status == proto.FENCED
    assert (await client.call(add_req(105, 3, recovery=True))).status == proto.OK


async def test_fencing_an_unknown_ledger_creates_it_fenced(client: RawBookieClient) -> None:
    resp = await client.call(proto.read_request(0, 106, 0, fence=True, master_key=KEY))
    assert resp.status == proto.NO_ENTRY
    assert (await client.call(add_req(106, 0))).status == proto.FENCED


async def test_bookie_info(client: RawBookieClient) -> None:
    info = await client.call(proto.bookie_info_request(0))
    assert info.status == proto.OK
    assert 0 < info.free_disk <= info.total_disk
    assert info.read_only is False


async def test_payload_that_names_another_entry_is_bad_request(client: RawBookieClient) -> None:
    req = add_req(107, 0)
    req.entry_id = 5
    assert (await client.call(req)).status == proto.BAD_REQUEST
    short = proto.add_request(0, 107, 0, KEY, b"tiny")
    assert (await client.call(short)).status == proto.BAD_REQUEST
    assert (await client.call(proto.read_request(0, 107, 0))).status == proto.NO_LEDGER


async def test_malformed_frame_gets_bad_request_and_connection_lives(client: RawBookieClient,
                                                                    shared_bookie: BookieProcess) -> None:
    garbage = b"\xff\xff\xff\xff\x0f"  # an unterminated varint: not a protobuf message
    client.send_raw(struct.pack(">I", len(garbage)) + garbage)
    orphan = await asyncio.wait_for(client.orphans.get(), 10)
    assert (orphan.txn_id, orphan.status) == (0, proto.BAD_REQUEST)
    assert (await client.call(add_req(108, 0))).status == proto.OK
    assert shared_bookie.alive()


async def test_unknown_op_is_answered(client: RawBookieClient) -> None:
    req = proto.Request(op=77, ledger_id=1)
    resp = await client.call(req)
    assert (resp.status, resp.op) == (proto.UNKNOWN_OP, 77)
    assert (await client.call(proto.bookie_info_request(0))).status == proto.OK


async def test_oversized_frame_closes_connection_and_bookie_serves_on(shared_bookie: BookieProcess) -> None:
    victim = await RawBookieClient.connect(shared_bookie.address)
    ok: asyncio.Future[proto.Response] = asyncio.get_running_loop().create_future()
    victim.submit(add_req(109, 0), ok.set_result)  # read before the oversized frame: still answered
    victim.send_raw(struct.pack(">I", 65537) + b"x" * 100)
    assert (await asyncio.wait_for(ok, 10)).status == proto.OK
    too_large = await asyncio.wait_for(victim.orphans.get(), 10)
    assert too_large.status == proto.TOO_LARGE
    await asyncio.wait_for(victim.closed, 10)
    with pytest.raises(BookieUnavailableError):
        await victim.call(proto.bookie_info_request(0))

    fresh = await RawBookieClient.connect(shared_bookie.address)
    try:
        assert (await fresh.call(proto.read_request(0, 109, 0))).status == proto.OK
    finally:
        await fresh.close()
    assert shared_bookie.alive()


async def test_random_bytes_never_kill_the_bookie(shared_bookie: BookieProcess) -> None:
    for seed in range(5):
        c = await RawBookieClient.connect(shared_bookie.address)
        c.send_raw(os.urandom(2048 + seed))
        c.flush()
        await c.close()
    fresh = await RawBookieClient.connect(shared_bookie.address)
    try:
        assert (await fresh.call(proto.bookie_info_request(0))).status == proto.OK
    finally:
        await fresh.close()
    assert shared_bookie.alive()


# --- registration, read-only, GC --------------------------------------------------------------------


async def test_registration_and_read_only_transitions(start_bookie: StartBookie, metastore_uri: str,
                                                      tmp_path: Path) -> None:
    usage = tmp_path / "usage"
    bookie = start_bookie(bookie_rack="/region-a/rack-7", disk_check_interval=50,
                          disk_usage_override_file=usage)
    ms = await open_metastore(metastore_uri)
    c = await RawBookieClient.connect(bookie.address)
    try:
        table = await ms.create_scannable_table(BOOKIES_TABLE)
        rec = decode_registration((await table.get(bookie.address)).value)
        assert (rec.address, rec.network_location, rec.state) == (bookie.address, "/region-a/rack-7", WRITABLE)
        assert rec.free_disk > 0
        assert (await c.call(add_req(1, 0))).status == proto.OK

        usage.write_text("0.97")

        async def state_is(state: int) -> bool:
            return decode_registration((await table.get(bookie.address)).value).state == state

        await eventually(lambda: state_is(READ_ONLY))
        assert (await c.call(add_req(1, 1))).status == proto.READ_ONLY
        assert (await c.call(proto.read_request(0, 1, 0))).status == proto.OK
        assert (await c.call(proto.bookie_info_request(0))).read_only is True

        usage.write_text("0.92")  # between the marks: stays read-only (the new free space is published)

        async def free_published() -> bool:
            rec = decode_registration((await table.get(bookie.address)).value)
            return abs(rec.free_disk - rec.total_disk * 0.08) < rec.total_disk * 0.005 and rec.state == READ_ONLY

        await eventually(free_published)
        assert (await c.call(add_req(1, 1))).status == proto.READ_ONLY

        usage.write_text("0.5")
        await eventually(lambda: state_is(WRITABLE))
        assert (await c.call(add_req(1, 1))).status == proto.OK
        assert bookie.address in await list_bookies(ms)
    finally:
        await c.close()
        await ms.close()


async def test_garbage_collection_deletes_ledgers_gone_from_metastore(start_bookie: StartBookie,
                                                                      metastore_uri: str) -> None:
    ms = await open_metastore(metastore_uri)
    ledgers = await ms.create_scannable_table("ledgers")
    await ledgers.put(f"{1:020d}", Value({"data": b"metadata"}), Version.NEW)
    bookie = start_bookie(gc_wait_time=100)
    c = await RawBookieClient.connect(bookie.address)
    try:
        for lid in (1, 2):
            assert (await c.call(add_req(lid, 0))).status == proto.OK

        async def gone() -> bool:
            return (await c.call(proto.read_request(0, 2, 0))).status == proto.NO_LEDGER

        await eventually(gone)
        assert (await c.call(proto.read_request(0, 1, 0))).status == proto.OK
    finally:
        await c.close()
        await ms.close()


# --- shutdown and crash -----------------------------------------------------------------------------


async def test_sigterm_finishes_in_flight_adds_and_unregisters(start_bookie: StartBookie,
                                                              metastore_uri: str) -> None:
    bookie = start_bookie("b1")
    c = await RawBookieClient.connect(bookie.address)
    acked: list[int] = []
    failed: list[int] = []

    def done(resp: object, eid: int) -> None:
        (acked if isinstance(resp, proto.Response) and resp.status == proto.OK else failed).append(eid)

    for i in range(2000):
        c.submit(add_req(7, i, b"y" * 100), lambda r, i=i: done(r, i))
    c.flush()
    await eventually(lambda: len(acked) > 0)
    bookie.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(bookie.proc.wait, 20) == 0
    await asyncio.wait_for(c.closed, 10)
    assert len(acked) + len(failed) == 2000  # every add was answered or failed by the close

    ms = await open_metastore(metastore_uri)
    try:
        table = await ms.create_scannable_table(BOOKIES_TABLE)
        with pytest.raises(NoKeyError):
            await table.get(bookie.address)  # removed at once, not after the lease
    finally:
        await ms.close()

    again = start_bookie("b1")
    c2 = await RawBookieClient.connect(again.address)
    try:
        for eid in acked:
            assert (await c2.call(proto.read_request(0, 7, eid))).status == proto.OK
    finally:
        await c2.close()


async def test_kill_9_loses_no_acknowledged_add(start_bookie: StartBookie, metastore_uri: str) -> None:
    bookie = start_bookie("b2")
    port = bookie.address.rsplit(":", 1)[1]
    c = await RawBookieClient.connect(bookie.address)
    acked: list[int] = []
    for i in range(3000):
        c.submit(add_req(9, i, b"z" * 200),
                 lambda r, i=i: acked.append(i) if isinstance(r, proto.Response) and r.status == proto.OK
                 else None)
    c.flush()
    await eventually(lambda: len(acked) >= 500)
    bookie.kill()
    await asyncio.wait_for(c.closed, 10)
    assert acked

    # same address: the dead process's registration (lease still live) is replaced at once
    again = start_bookie("b2", bookie_port=port)
    assert again.address == bookie.address
    c2 = await RawBookieClient.connect(again.address)
    ms = await open_metastore(metastore_uri)
    try:
        for eid in acked:
            resp = await c2.call(proto.read_request(0, 9, eid))
            assert resp.status == proto.OK, eid
            assert decode_entry(resp.body, ledger_id=9, entry_id=eid).body == b"z" * 200
        assert again.address in await list_bookies(ms)
    finally:
        await c2.close()
        await ms.close()


async def test_corrupted_entry_fails_its_digest(start_bookie: StartBookie) -> None:
    bookie = start_bookie("b3")
    c = await RawBookieClient.connect(bookie.address)
    try:
        assert (await c.call(add_req(11, 0, b"precious"))).status == proto.OK
        corrupt_stored_entry(bookie.conf_path.parent / "data", 11, 0)
        resp = await c.call(proto.read_request(0, 11, 0))
        assert resp.status == proto.OK
        with pytest.raises(DigestMismatchError):
            decode_entry(resp.body, ledger_id=11, entry_id=0)
    finally:
        await c.close()


async def test_stats_endpoint_serves_prometheus_text(start_bookie: StartBookie) -> None:
    bookie = start_bookie("b4", stats_http_port=-1)
    url = bookie.ready_line.split("stats=", 1)[1]
    c = await RawBookieClient.connect(bookie.address)
    try:
        assert (await c.call(add_req(12, 0))).status == proto.OK
    finally:
        await c.close()
    import urllib.request

    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    assert 'bookie_requests_total{op="ADD_ENTRY",status="OK"} 1.0' in text
    assert "bookie_group_commit_entries_count" in text


# --- configuration --------------------------------------------------------------------------------


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli", "bookie", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("line", "needle"), [
    ("no_such_key=1", "unknown key 'no_such_key'"),
    ("bookie_port=eighty", "bad value for bookie_port"),
    ("disk_usage_threshold=1.5", "bad value for disk_usage_threshold"),
    ("bookie_rack=rack-without-slash", "bad value for bookie_rack"),
])
def test_bad_configuration_exits_nonzero_with_one_line(tmp_path: Path, line: str, needle: str) -> None:
    conf = tmp_path / "bk.conf"
    conf.write_text(f"metastore_uri=lmdb://{tmp_path}/meta\n{line}\n")
    res = run_cli("--conf", str(conf))
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


def test_bad_metastore_uri_is_a_configuration_error(tmp_path: Path) -> None:
    # (no metastore at all is no longer an error: the bookie joins the embedded lmdb://data/metastore)
    res = run_cli("--data", str(tmp_path / "d"), "--metastore", "data/metastore")
    assert res.returncode == 2
    assert "metastore_uri" in res.stderr


def test_shipped_conf_lists_every_key_with_its_default() -> None:
    shipped = Path(__file__).resolve().parents[2] / "conf" / "bk_server.conf"
    from bookie.conf import read_properties

    props = read_properties(shipped)
    assert set(props) == set(BookieConf.__dataclass_fields__)
    assert BookieConf.from_properties(props) == BookieConf()


def test_conf_parsing_and_overrides(tmp_path: Path) -> None:
    conf = tmp_path / "bk.conf"
    conf.write_text("# comment\nbookie_port = 4000\nzk_host: zk1:2181,zk2:2181\n\ngc_wait_time=0\n")
    c = BookieConf.from_file(conf, {"bookie_port": "0"})
    assert (c.bookie_port, c.gc_wait_time) == (0, 0)
    assert c.metastore == "zk://zk1:2181,zk2:2181/quire"
    with pytest.raises(ConfError, match="disk_usage_lwm_threshold"):
        BookieConf(disk_usage_lwm_threshold=0.99)
    with pytest.raises(ConfError, match="cannot read"):
        BookieConf.from_file(tmp_path / "missing.conf")


def test_port_in_use_is_a_start_failure(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run_cli("--port", str(port), "--data", str(tmp_path / "d"), "--metastore",
                      f"lmdb://{tmp_path}/meta")
    assert res.returncode == 1
    assert "cannot start" in res.stderr


def test_encode_entry_matches_what_the_bookie_echoes() -> None:
    # guards the helper the other tests rely on
    req = add_req(5, 3, b"abc", lac=2)
    assert req.body == encode_entry(5, 3, 2, 12, b"abc")


def test_unreachable_metastore_exits_with_the_reason(tmp_path: Path) -> None:
    """A bookie whose metastore cannot be reached fails fast, says why, and leaves no process behind."""
    conf = tmp_path / "bk.conf"
    conf.write_text(f"bookie_port=0\nledger_directories={tmp_path / 'data'}\n"
                    "metastore_uri=zk://127.0.0.1:1/quire?connect_timeout=2\n")
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "bookie", "--conf", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "cannot connect to ZooKeeper at 127.0.0.1:1" in proc.stderr.strip().splitlines()[-1]
    assert "bookie ready" not in proc.stdout


# --- start-up failures: one line, the reason ------------------------------------------------------


def test_unreachable_zookeeper_is_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "bk.conf"
    conf.write_text(f"bookie_port=0\nledger_directories={tmp_path / 'data'}\n"
                    "metastore_uri=zk://127.0.0.1:1/quire?connect_timeout=1.5\n")
    res = run_cli("--conf", str(conf))
    assert res.returncode == 1
    assert res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "quire bookie: cannot start: cannot connect to ZooKeeper at 127.0.0.1:1 within 1.5 s"], res.stderr


def test_port_in_use_is_one_line_without_a_stopped_message(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run_cli("--port", str(port), "--data", str(tmp_path / "d"), "--metastore", f"lmdb://{tmp_path}/meta")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quire bookie: cannot start:"), res.stderr
    assert "address already in use" in lines[0] and "stopped" not in res.stderr
