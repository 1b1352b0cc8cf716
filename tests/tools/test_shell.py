"""`quire shell` listing commands and bad input, against one LocalCluster of real bookie processes.

The cluster (3 writable bookies on three racks, one read-only bookie) and its
ledgers are made once for the module; every command runs as a real
``python -m tools.cli shell ...`` process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from bookie.client import BookKeeper
from bookie.ops import BookieOps
from bookie.registration import READ_ONLY, list_bookies
from metastore import open_metastore
from tests.bookie.clusterutil import wait_for
from tests.tools.shellutil import one_line_error, shell
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

RACKS = ["/dc/rack-a", "/dc/rack-b", "/dc/rack-c", "/dc/rack-d"]
PASSWORD = b"pw"


@dataclass
class Setup:
    cluster: LocalCluster
    uri: str
    writable: list[str]
    readonly: str
    closed: int       # E3 W2 A2, 10 text entries, password
    pair: int         # E2 W2 A2 on two bookies, binary entries
    open: int         # still open, 3 entries
    not_on_pair: str  # a writable bookie the pair ledger does not use
    metadata: dict[int, object]

    def ms(self) -> tuple[str, str]:
        return ("--metastore", self.uri)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    root = tmp_path_factory.mktemp("shell")
    usage = root / "usage"
    usage.write_text("0.99\n")
    cluster = LocalCluster(bookies=4, data_dir=root / "cluster",
                           conf_overrides={"session_timeout": "1000", "gc_wait_time": "600000",
                                           "disk_check_interval": "100"})
    for i, rack in enumerate(RACKS):
        cluster.set_bookie_conf(i, bookie_rack=rack)
    cluster.set_bookie_conf(3, disk_usage_override_file=str(usage))
    async with cluster:
        ms = await open_metastore(cluster.metastore_uri)
        readonly = cluster.bookie_addresses[3]

        async def registered_read_only() -> bool:
            rec = (await list_bookies(ms)).get(readonly)
            return rec is not None and rec.state == READ_ONLY

        await wait_for(registered_read_only, timeout=30)
        bk = await BookKeeper.connect(ms)
        closed = await bk.create_ledger(3, 2, 2, password=PASSWORD, properties={"owner": b"shell-test"})
        await closed.add_entries([f"entry-{i}".encode() for i in range(10)])
        await closed.close()
        pair = await bk.create_ledger(2, 2, 2)
        await pair.add_entries([bytes([0, i, 255]) for i in range(3)])
        await pair.close()
        still_open = await bk.create_ledger(3, 2, 2)
        for i in range(3):  # one at a time, so the bookies learn a last-add-confirmed of 1
            await still_open.add_entry(f"open-{i}".encode())
        writable = cluster.bookie_addresses[:3]
        not_on_pair = next(a for a in writable if a not in pair.metadata.bookies())
        meta = {lh.ledger_id: lh.metadata for lh in (closed, pair)}
        await bk.close()  # the open ledger stays OPEN in the metadata
        await ms.close()
        yield Setup(cluster, cluster.metastore_uri, writable, readonly, closed.ledger_id, pair.ledger_id,
                    still_open.ledger_id, not_on_pair, meta)


async def test_listbookies_shows_writable_then_readonly(setup: Setup) -> None:
    r = await shell("listbookies", *setup.ms())
    assert r.rc == 0, r.err
    rows = [line.split("\t") for line in r.lines]
    assert [row[0] for row in rows] == sorted(setup.writable)
    for row in rows:
        assert row[1] == RACKS[setup.cluster.bookie_addresses.index(row[0])]
        assert row[2] == "writable"
    r = await shell("listbookies", "--readonly", *setup.ms())
    assert r.rc == 0, r.err
    assert [line.split("\t")[:3] for line in r.lines] == [[setup.readonly, RACKS[3], "readonly"]]


async def test_listledgers_all_by_bookie_and_long(setup: Setup) -> None:
    r = await shell("listledgers", *setup.ms())
    assert r.rc == 0, r.err
    assert r.lines == [str(i) for i in sorted([setup.closed, setup.pair, setup.open])]
    r = await shell("listledgers", "--bookie", setup.not_on_pair, *setup.ms())
    assert r.lines == [str(i) for i in sorted([setup.closed, setup.open])]
    r = await shell("listledgers", "--bookie", setup.readonly, *setup.ms())
    assert r.rc == 0 and r.lines == []
    r = await shell("listledgers", "--long", *setup.ms())
    rows = {int(line.split("\t")[0]): line.split("\t") for line in r.lines}
    assert rows[setup.closed][1:4] == ["CLOSED", "E3 W2 A2", "last=9"]
    assert rows[setup.pair][1:4] == ["CLOSED", "E2 W2 A2", "last=2"]
    assert rows[setup.open][1] == "OPEN"
    assert set(rows[setup.pair][5].split(",")) == set(setup.metadata[setup.pair].bookies())  # type: ignore[attr-defined]


async def test_ledgermetadata_text_and_json(setup: Setup) -> None:
    md = setup.metadata[setup.closed]
    r = await shell("ledgermetadata", str(setup.closed), *setup.ms())
    assert r.rc == 0, r.err
    assert f"ledger_id: {setup.closed}" in r.lines
    assert "state: CLOSED" in r.lines and "last_entry_id: 9" in r.lines and "has_password: True" in r.lines
    assert f"  0: {', '.join(md.ensembles[0][1])}" in r.lines  # type: ignore[attr-defined]
    assert "  owner: shell-test" in r.lines
    r = await shell("ledgermetadata", str(setup.closed), "--json", *setup.ms())
    d = json.loads(r.out)
    assert d["ensembles"] == [{"first_entry": 0, "bookies": md.ensembles[0][1]}]  # type: ignore[attr-defined]
    assert (d["ensemble_size"], d["write_quorum"], d["ack_quorum"], d["length"]) == (3, 2, 2, md.length)  # type: ignore[attr-defined]
    one_line_error(await shell("ledgermetadata", "999999", *setup.ms()), "no ledger 999999")


async def test_readledger_ranges_hex_and_open_ledgers(setup: Setup) -> None:
    r = await shell("readledger", str(setup.closed), "--password", "pw", *setup.ms())
    assert r.rc == 0, r.err
    assert r.lines == [f"{i}\tentry-{i}" for i in range(10)]
    r = await shell("readledger", str(setup.closed), "2", "4", "--password", "pw", *setup.ms())
    assert r.lines == [f"{i}\tentry-{i}" for i in (2, 3, 4)]
    r = await shell("readledger", str(setup.closed), "8", "--password", "pw", *setup.ms())
    assert r.lines == ["8\tentry-8", "9\tentry-9"]
    r = await shell("readledger", str(setup.pair), *setup.ms())
    assert r.lines == [f"{i}\t00{i:02x}ff" for i in range(3)]
    # an open ledger reads up to the LAC the bookies know, and stays open (no fencing)
    r = await shell("readledger", str(setup.open), *setup.ms())
    assert r.rc == 0, r.err
    assert r.lines == ["0\topen-0", "1\topen-1"]
    r = await shell("ledgermetadata", str(setup.open), *setup.ms())
    assert "state: OPEN" in r.lines
    one_line_error(await shell("readledger", str(setup.closed), "5", "99", "--password", "pw", *setup.ms()),
                   "past the last readable entry 9")
    bad = await shell("readledger", str(setup.closed), "4", "2", "--password", "pw", *setup.ms())
    one_line_error(bad, "FROM 4 is after TO 2")
    assert bad.rc == 2
    one_line_error(await shell("readledger", str(setup.closed), *setup.ms()), "password")


async def test_ledger_password_from_a_file_or_the_environment(setup: Setup, tmp_path: Path) -> None:
    """Not only --password (which every user sees in ps)."""
    secret = tmp_path / "ledger.pw"
    secret.write_text("pw\n")
    want = [f"{i}\tentry-{i}" for i in (0, 1)]
    r = await shell("readledger", str(setup.closed), "0", "1", "--password-file", str(secret), *setup.ms())
    assert (r.rc, r.lines) == (0, want), r.err
    r = await shell("readledger", str(setup.closed), "0", "1", *setup.ms(), env={"QUIRE_LEDGER_PASSWORD": "pw"})
    assert (r.rc, r.lines) == (0, want), r.err
    wrong = tmp_path / "wrong.pw"
    wrong.write_text("nope\n")
    one_line_error(await shell("readledger", str(setup.closed), "--password-file", str(wrong), *setup.ms(),
                               env={"QUIRE_LEDGER_PASSWORD": "pw"}), "password")   # the file wins
    missing = await shell("readledger", str(setup.closed), "--password-file", str(tmp_path / "none"), *setup.ms())
    one_line_error(missing, "cannot read password file")
    assert missing.rc == 2
    # recover tries every line of its password files: the closed ledger no longer "would fail" on it
    passwords = tmp_path / "all.pw"
    passwords.write_text("other\npw\n")
    r = await shell("recover", setup.writable[0], "--dry-run", "--password-file", str(passwords), *setup.ms())
    assert not any("none of the passwords" in line for line in r.lines), r.out


async def test_simpletest_writes_reads_back_and_cleans_up(setup: Setup) -> None:
    r = await shell("simpletest", "--ensemble", "3", "--write-quorum", "2", "--ack-quorum", "2", "--entries", "20",
                    *setup.ms())
    assert r.rc == 0, r.err
    assert "wrote 20 entries" in r.out and "read back 20 entries: OK" in r.lines
    lid = int(r.lines[0].split()[2])
    listed = await shell("listledgers", *setup.ms())
    assert str(lid) not in listed.lines, "the test ledger is deleted unless --keep"
    r = await shell("simpletest", "-e", "2", "-w", "2", "-a", "1", "-n", "5", "--keep", *setup.ms())
    assert r.rc == 0, r.err
    lid = int(r.lines[0].split()[2])
    assert str(lid) in (await shell("listledgers", *setup.ms())).lines
    # four writable bookies are needed for E4, there are three
    one_line_error(await shell("simpletest", "--ensemble", "4", *setup.ms()), "bookies")
    usage = await shell("simpletest", "--ensemble", "2", "--write-quorum", "3", *setup.ms())
    one_line_error(usage, "ensemble")
    assert usage.rc == 2


async def test_bookieinfo_writable_readonly_and_unreachable(setup: Setup) -> None:
    addr = setup.writable[0]
    r = await shell("bookieinfo", addr, *setup.ms())
    assert r.rc == 0, r.err
    fields = dict(line.split(": ", 1) for line in r.lines)
    assert fields["bookie"] == addr and fields["state"] == "writable" and fields["registered"] == "yes"
    assert fields["network_location"] == RACKS[0]
    free, total = int(fields["free_disk"].split()[0]), int(fields["total_disk"].split()[0])
    assert 0 < free <= total
    r = await shell("bookieinfo", setup.readonly, *setup.ms())
    assert dict(line.split(": ", 1) for line in r.lines)["state"] == "readonly"
    one_line_error(await shell("bookieinfo", "127.0.0.1:1", "--timeout", "2", *setup.ms()),
                   "bookie 127.0.0.1:1 (not registered) did not answer")


async def test_json_of_listbookies_and_bookieinfo_carries_the_text_facts(setup: Setup) -> None:
    text, js, ro = await asyncio.gather(shell("listbookies", *setup.ms()), shell("listbookies", "--json", *setup.ms()),
                                        shell("listbookies", "--readonly", "--json", *setup.ms()))
    assert js.rc == 0, js.err
    rows = json.loads(js.out)
    cols = [line.split("\t") for line in text.lines]
    assert [r["address"] for r in rows] == [c[0] for c in cols] == sorted(setup.writable)
    for r, c in zip(rows, cols, strict=True):
        assert set(r) == {"address", "network_location", "state", "free_disk", "total_disk"}
        assert (r["network_location"], r["state"]) == (c[1], c[2]) == (RACKS[setup.writable.index(c[0])], "writable")
        assert isinstance(r["free_disk"], int) and 0 < r["free_disk"] <= r["total_disk"]
    assert [(r["address"], r["network_location"], r["state"]) for r in json.loads(ro.out)] == \
        [(setup.readonly, RACKS[3], "readonly")]

    for addr, state in ((setup.writable[0], "writable"), (setup.readonly, "readonly")):
        text, js = await asyncio.gather(shell("bookieinfo", addr, *setup.ms()),
                                        shell("bookieinfo", addr, "--json", *setup.ms()))
        assert js.rc == 0, js.err
        fields = dict(line.split(": ", 1) for line in text.lines)
        d = json.loads(js.out)
        assert (d["bookie"], d["state"], d["registered"], d["network_location"]) == \
            (fields["bookie"], fields["state"], fields["registered"] == "yes", fields["network_location"]) == \
            (addr, state, True, RACKS[setup.cluster.bookie_addresses.index(addr)])
        assert d["total_disk"] == int(fields["total_disk"].split()[0])
        assert 0 < d["free_disk"] <= d["total_disk"]   # free disk moves between the two runs
        assert abs(d["disk_usage"] - (1 - d["free_disk"] / d["total_disk"])) < 1e-3
    one_line_error(await shell("bookieinfo", "127.0.0.1:1", "--json", "--timeout", "2", *setup.ms()),
                   "bookie 127.0.0.1:1 (not registered) did not answer")


async def test_json_of_listledgers_with_and_without_long(setup: Setup) -> None:
    text, js, on, none = await asyncio.gather(
        shell("listledgers", *setup.ms()), shell("listledgers", "--json", *setup.ms()),
        shell("listledgers", "--bookie", setup.not_on_pair, "--json", *setup.ms()),
        shell("listledgers", "--bookie", setup.readonly, "--json", *setup.ms()))
    assert js.rc == 0, js.err
    assert json.loads(js.out) == [{"ledger_id": int(line)} for line in text.lines]
    assert {setup.closed, setup.pair, setup.open} <= {d["ledger_id"] for d in json.loads(js.out)}
    assert (none.rc, json.loads(none.out)) == (0, [])
    text, js = await asyncio.gather(shell("listledgers", "--long", *setup.ms()),
                                    shell("listledgers", "--long", "--json", *setup.ms()))
    docs = json.loads(js.out)
    # --bookie: exactly the ledgers with a segment on that bookie (other tests of the module add ledgers too)
    on_ids = [d["ledger_id"] for d in json.loads(on.out)]
    assert setup.pair not in on_ids
    assert on_ids == [d["ledger_id"] for d in docs if setup.not_on_pair in d["bookies"]]
    assert len(docs) == len(text.lines)
    for d, line in zip(docs, text.lines, strict=True):
        lid, state, quorums, last, length, bookies = line.split("\t")
        assert (str(d["ledger_id"]), d["state"], f"E{d['ensemble_size']} W{d['write_quorum']} A{d['ack_quorum']}",
                f"last={d['last_entry_id']}", f"length={d['length']}", ",".join(d["bookies"])) == \
            (lid, state, quorums, last, length, bookies)
    closed = next(d for d in docs if d["ledger_id"] == setup.closed)
    one = json.loads((await shell("ledgermetadata", str(setup.closed), "--json", *setup.ms())).out)
    assert {k: v for k, v in closed.items() if k != "bookies"} == one   # the ledgermetadata --json object
    assert closed["bookies"] == sorted(setup.metadata[setup.closed].bookies())  # type: ignore[attr-defined]


async def test_json_of_listunderreplicated_and_autorecovery_status(setup: Setup) -> None:
    from bookie.autorecovery import UnderReplicationManager

    # the cluster's bookies run AutoRecovery workers, which would take the mark and drop it (nothing to copy):
    # paused cluster-wide, a mark naming bookies that never were stays as made
    ms = await open_metastore(setup.uri)
    urm = await UnderReplicationManager.open(ms)
    await urm.set_enabled(False)
    try:
        await urm.mark(setup.pair, {"127.0.0.1:2", "127.0.0.1:1"})
        (marked_ms,) = [rec.marked_ms for rec in await urm.list()]
        text, js, status, status_js = await asyncio.gather(
            shell("listunderreplicated", *setup.ms()), shell("listunderreplicated", "--json", *setup.ms()),
            shell("autorecovery", "status", *setup.ms()), shell("autorecovery", "--json", *setup.ms()))
        assert js.rc == 0, js.err
        assert json.loads(js.out) == [{"ledger_id": setup.pair, "missing_bookies": ["127.0.0.1:1", "127.0.0.1:2"],
                                       "marked_ms": marked_ms}]
        lid, missing, _age = text.lines[0].split("\t")
        assert (int(lid), missing.split(",")) == (setup.pair, ["127.0.0.1:1", "127.0.0.1:2"])
        fields = dict(line.split(": ", 1) for line in status.lines)
        assert status_js.rc == 0, status_js.err
        assert json.loads(status_js.out) == {
            "enabled": fields["autorecovery"] == "enabled",
            "auditor": None if fields["auditor"] == "none" else fields["auditor"],
            "lost_bookie_recovery_delay_s": None, "under_replicated_ledgers": int(fields["under-replicated ledgers"])}
        assert (fields["autorecovery"], fields["under-replicated ledgers"]) == ("disabled", "1")
        bad = await shell("autorecovery", "disable", "--json", *setup.ms())
        one_line_error(bad, "--json goes with autorecovery status only")
        assert bad.rc == 2
    finally:
        await urm.unmark(setup.pair)
        await urm.set_enabled(True)
        await ms.close()
    assert json.loads((await shell("listunderreplicated", "--json", *setup.ms())).out) == []


async def test_recover_refuses_bad_destinations(setup: Setup) -> None:
    src = setup.writable[0]
    one_line_error(await shell("recover", src, src, *setup.ms()), "is the bookie being recovered")
    one_line_error(await shell("recover", src, "127.0.0.1:1", *setup.ms()), "not a registered bookie")
    one_line_error(await shell("recover", src, setup.readonly, *setup.ms()), "read-only")
    one_line_error(await shell("decommission", src, *setup.ms()), "still running")
    on_src = (await shell("listledgers", "--bookie", src, *setup.ms())).lines
    assert str(setup.closed) in on_src and str(setup.open) in on_src
    r = await shell("recover", src, "--dry-run", "--password", "pw", *setup.ms())
    assert [line.split()[1] for line in r.lines[:-1]] == on_src
    assert r.err.startswith(f"note: {src} is running (registered and answering)"), r.err   # says it is live
    # the E3 ledgers span all three writable bookies: no bookie can take src's fragments, so the real
    # run would fail them, and the dry run says so and exits 1 (it used to exit 0)
    failing = [line for line in r.lines[:-1] if ": would fail: " in line]
    assert any(line.startswith(f"ledger {setup.closed} (CLOSED): would fail: copy") and "-> nothing (" in line
               for line in failing), r.out
    assert r.rc == 1
    assert r.lines[-1] == (f"dry run: {len(on_src)} ledgers on {src}, {len(failing)} would fail or be skipped; "
                           f"nothing changed")
    # without the password too
    nopw = await shell("recover", src, "--dry-run", *setup.ms())
    assert nopw.rc == 1
    assert any(line.startswith(f"ledger {setup.closed} (CLOSED): would fail: none of the passwords")
               for line in nopw.lines), nopw.out
    assert " would fail or be skipped; nothing changed" in nopw.lines[-1]
    assert any(line.startswith(f"ledger {setup.open} (OPEN): would") and "recovery-close it" in line
               for line in r.lines)
    after = await shell("ledgermetadata", str(setup.open), *setup.ms())
    assert "state: OPEN" in after.lines, "a dry run changes nothing"


async def test_metastore_from_conf_file(setup: Setup, tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text(f"# a bookie conf names the metastore\nbookie_port=3181\nmetastore_uri={setup.uri}\n")
    r = await shell("listbookies", "--conf", str(conf))
    assert r.rc == 0, r.err
    assert len(r.lines) == 3
    nometa = tmp_path / "nometa.conf"
    nometa.write_text("bookie_port=3181\n")
    # a conf naming no metastore (as the shipped ones) means the roles' default, lmdb://data/metastore,
    # which is not created by a tool
    one_line_error(await shell("listbookies", "--conf", str(nometa), cwd=str(tmp_path)),
                   f"no lmdb metastore at {tmp_path / 'data' / 'metastore'}")
    assert not (tmp_path / "data").exists()
    one_line_error(await shell("listbookies", "--conf", str(tmp_path / "missing.conf")), "cannot read")
    badpolicy = tmp_path / "badpolicy.conf"
    badpolicy.write_text(f"metastore_uri={setup.uri}\nensemble_placement_policy=nosuch\n")
    one_line_error(await shell("listbookies", "--conf", str(badpolicy)), "ensemble_placement_policy")
    badclient = tmp_path / "badclient.conf"
    badclient.write_text(f"metastore_uri={setup.uri}\nread_entry_timeout=soon\n")
    r = await shell("readledger", str(setup.pair), "--conf", str(badclient))
    one_line_error(r, "read_entry_timeout")
    assert r.rc == 2


@pytest.mark.parametrize(("args", "needle", "rc"), [
    (["listbookies"], "no metastore given", 2),
    (["listbookies", "--metastore", "lmdb:///nonexistent/quire-meta"], "no lmdb metastore", 1),
    (["listbookies", "--metastore", "nosuch://x"], "unknown metastore scheme", 2),
    (["listbookies", "--metastore", "not-a-uri"], "malformed metastore URI", 2),
    (["listbookies", "--metastore", "zk://127.0.0.1:1/quire", "--timeout", "1"], "did not answer within 1 s", 1),
    (["ledgermetadata", "abc", "--metastore", "lmdb:///x"], "bad ledger id 'abc'", 2),
    (["ledgermetadata", "--metastore", "lmdb:///x"], "required: ID", 2),
    (["bookieinfo", "nohost", "--metastore", "lmdb:///x"], "bad bookie address 'nohost'", 2),
    (["recover", "127.0.0.1:99999", "--metastore", "lmdb:///x"], "bad bookie address", 2),
    (["simpletest", "--entries", "0", "--metastore", "lmdb:///x"], "bad count '0': expected a number >= 1", 2),
    (["recover", "127.0.0.1:1", "--parallel", "x", "--metastore", "lmdb:///x"], "bad count 'x'", 2),
])
async def test_bad_input_is_one_line_and_nonzero(args: list[str], needle: str, rc: int) -> None:
    r = await shell(*args)
    one_line_error(r, needle)
    assert r.rc == rc


async def test_cluster_serves_on_after_bad_input(setup: Setup) -> None:
    for args in (["ledgermetadata", "-1"], ["readledger", str(setup.closed), "x"], ["bookieinfo", ":"]):
        assert (await shell(*args, *setup.ms())).rc == 2
    r = await shell("readledger", str(setup.closed), "0", "0", "--password", "pw", *setup.ms())
    assert r.lines == ["0\tentry-0"]


async def test_every_command_help_shows_an_example() -> None:
    from tools.shell.cli import COMMANDS

    helps = await asyncio.gather(*(shell(name, "--help") for name in COMMANDS))
    for name, r in zip(COMMANDS, helps, strict=True):
        assert r.rc == 0, r.err
        assert "example:" in r.out and f"quire shell {name} --metastore" in r.out
        assert "--metastore URI" in r.out and "--conf FILE" in r.out
    top = await shell("--help")
    assert all(name in top.out for name in COMMANDS)


async def test_progress_bar_only_on_a_terminal(setup: Setup) -> None:
    import fcntl
    import os
    import pty
    import struct
    import termios

    async def stderr_of(*args: str, tty: bool) -> str:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tools.cli", "shell", *args, *setup.ms(),
                stdout=asyncio.subprocess.DEVNULL, stderr=slave if tty else asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0
        finally:
            os.close(slave)
        if not tty:
            os.close(master)
            return err.decode()
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(master)
        return b"".join(chunks).decode(errors="replace")

    # the read-only bookie holds no ledger: a recover of it is quick and changes nothing
    shown = await stderr_of("recover", setup.readonly, tty=True)
    assert "recover:" in shown and "entries=0" in shown
    assert "recover:" not in await stderr_of("recover", setup.readonly, "--no-progress", tty=True)
    assert await stderr_of("recover", setup.readonly, tty=False) == ""


async def test_recover_reports_ledgers_it_cannot_move_and_changes_nothing_for_them(setup: Setup) -> None:
    # three writable bookies and E3 ledgers: nothing can replace one of them; the open ledger is skipped
    src = setup.not_on_pair
    before = (await shell("ledgermetadata", str(setup.closed), "--json", *setup.ms())).out
    r = await shell("recover", src, "--skip-open", "--password", "pw", *setup.ms())
    assert r.rc == 1, r.out + r.err
    lines = {int(line.split()[1].rstrip(":")): line for line in r.lines[:-1]}
    assert f"FAILED: no bookie can replace {src}" in lines[setup.closed]
    assert "skipped: open (OPEN) and --skip-open given" in lines[setup.open]
    assert r.lines[-1].startswith(f"recover {src}: ") and "failed" in r.lines[-1]
    assert (await shell("ledgermetadata", str(setup.closed), "--json", *setup.ms())).out == before
    assert "state: OPEN" in (await shell("ledgermetadata", str(setup.open), *setup.ms())).lines


async def test_recover_to_a_given_destination_drains_a_live_bookie(setup: Setup) -> None:
    # runs last: it moves the pair ledger off one of its (live) bookies onto DEST
    src = next(a for a in sorted(setup.metadata[setup.pair].bookies()))  # type: ignore[attr-defined]
    dest = setup.not_on_pair
    r = await shell("recover", src, dest, "--skip-open", "--password", "pw", *setup.ms())
    lines = {int(line.split()[1].rstrip(":")): line for line in r.lines[:-1]}
    assert lines[setup.pair] == f"ledger {setup.pair}: entries 0-2 (3 copied) {src} -> {dest}", r.out
    assert f"FAILED: destination {dest} is already in the ensemble" in lines[setup.closed]
    assert r.rc == 1, "a ledger failed and one was skipped"
    moved = json.loads((await shell("ledgermetadata", str(setup.pair), "--json", *setup.ms())).out)
    ensemble = moved["ensembles"][0]["bookies"]
    assert src not in ensemble and dest in ensemble and len(ensemble) == 2
    # the copies are on DEST, as the bookie itself says
    ms = await open_metastore(setup.uri)
    ops = await BookieOps.open(ms)
    try:
        for i in range(3):
            payload = await ops.read_payload(dest, setup.pair, i)
            assert payload.endswith(bytes([0, i, 255]))
    finally:
        await ops.close()
        await ms.close()
    assert (await shell("readledger", str(setup.pair), *setup.ms())).lines == [f"{i}\t00{i:02x}ff" for i in range(3)]


async def test_triggeraudit_leaves_a_request_the_auditor_reads(setup: Setup) -> None:
    from bookie.autorecovery import UnderReplicationManager

    ms = await open_metastore(setup.uri)
    try:
        urm = await UnderReplicationManager.open(ms)

        async def elected() -> bool:   # the cluster's bookies run AutoRecovery: one of them is the auditor
            return await urm.auditor() is not None

        await wait_for(elected, timeout=15)
        before = await urm.audit_request()
        r = await shell("triggeraudit", *setup.ms())
        assert r.rc == 0, r.err
        after = await urm.audit_request()
        assert after is not None and after != before
        assert f"the auditor ({await urm.auditor()})" in r.out and "listunderreplicated" in r.out
    finally:
        await ms.close()


async def test_readledger_into_a_closed_pipe_ends_quietly(setup: Setup) -> None:
    """`quire shell readledger N | head -1`: before, 40 lines of 'unhandled exception during asyncio.run()
    shutdown' (the reads in flight failed once their bookie connections were gone)."""
    ms = await open_metastore(setup.uri)
    bk = await BookKeeper.connect(ms)
    try:
        lh = await bk.create_ledger(3, 2, 2)
        await lh.add_entries([b"line-%04d-" % i + b"x" * 60 for i in range(3000)])   # ~200 KB of output
        await lh.close()
    finally:
        await bk.close()
        await ms.close()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tools.cli", "shell", "readledger",
                                                str(lh.ledger_id), *setup.ms(), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    async with asyncio.timeout(60):
        assert (await proc.stdout.readline()).startswith(b"0\tline-0000-")
        proc._transport.get_pipe_transport(1).close()  # type: ignore[attr-defined]   # what `head -1` does
        err = (await proc.stderr.read()).decode()
        assert await proc.wait() == 141
    assert err == ""
