"""tools.scan without Spark: key-range planning, decoders, the executor read path, CLI errors."""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metastore import Value, Version, Versioned, sync
from tests.tools.scan_data import BAD_LEDGER_KEY, cursor_rows, populate
from tools.scan.cli import parse_duration
from tools.scan.datasource import KeyRangePartition, check_visible, read_range
from tools.scan.errors import MetastoreNotVisibleError
from tools.scan.ranges import interpolate, plan_ranges
from tools.scan.schema import spec_for


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = f"lmdb://{tmp_path_factory.mktemp('scan-units')}/meta"
    populate(uri)
    return uri


def _read_all(uri: str, table: str, ranges: list[tuple[str, str]], columns: tuple[str, ...] = ()) -> list[dict]:
    spec = spec_for(table, columns)
    rows: list[dict] = []
    for low, high in ranges:
        part = KeyRangePartition(uri, table, low, high, True, "driver-host")
        for batch in read_range(part, spec, 7):
            rows += batch.to_pylist()
    return rows


def test_interpolate_ledger_ids_in_base_10() -> None:
    first, last = f"{1:020d}", f"{1_000_000:020d}"
    mids = interpolate(first, last, 4)
    assert [int(m) for m in mids] == [250_000, 500_000, 750_000]


def test_ranges_cover_the_table_once_and_match_a_cursor_scan(store: str) -> None:
    ms = sync.open_metastore(store)
    try:
        ranges = plan_ranges(ms.create_scannable_table("ledgers"), 6)
    finally:
        ms.close()
    assert 4 <= len(ranges) <= 6  # 121 keys: every candidate snaps to a distinct key
    assert ranges[0][0] == "" and ranges[-1][1] == ""
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    rows = _read_all(store, "ledgers", ranges)
    expected = cursor_rows(store, "ledgers")
    assert [r["key"] for r in rows] == sorted(expected)
    assert {r["key"]: r["version"] for r in rows} == {k: v for k, (v, _) in expected.items()}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(st.characters(min_codepoint=1, max_codepoint=0x2FF), min_size=1, max_size=6),
                min_size=0, max_size=25, unique=True),
       st.integers(min_value=1, max_value=9))
def test_any_keys_split_into_ranges_that_lose_and_repeat_nothing(tmp_path_factory: pytest.TempPathFactory,
                                                               keys: list[str], n: int) -> None:
    uri = f"lmdb://{tmp_path_factory.mktemp('keys')}/meta"
    ms = sync.open_metastore(uri)
    try:
        t = ms.create_scannable_table("misc")
        for k in keys:
            t.put(k, Value({"x": b"1"}), Version.NEW)
        ranges = plan_ranges(t, n)
    finally:
        ms.close()
    assert len(ranges) <= max(n, 1)
    assert [r["key"] for r in _read_all(uri, "misc", ranges)] == sorted(keys)


def test_decoded_ledger_row_and_a_malformed_record(store: str) -> None:
    rows = {r["key"]: r for r in _read_all(store, "ledgers", [("", "")])}
    bad = rows[BAD_LEDGER_KEY]
    assert bad["ledger_id"] is None and bad["error"].startswith("DecodeError")
    r = rows[f"{6:020d}"]
    assert (r["ledger_id"], r["state"], r["last_entry_id"], r["length"], r["digest_type"]) == (6, "CLOSED", 59,
                                                                                            6000, "crc32c")
    assert r["ensembles"] == [
        {"first_entry": 0, "bookies": ["127.0.0.1:3182", "127.0.0.1:3183", "127.0.0.1:3184"]},
        {"first_entry": 100, "bookies": ["127.0.0.1:3189", "127.0.0.1:3181", "127.0.0.1:3182"]}]
    assert r["properties"] == [("owner", b"t6")]
    assert r["error"] is None


def test_subscriptions_topics_hubs_and_generic_tables(store: str) -> None:
    subs = {(r["topic"], r["subscriber"]): r for r in _read_all(store, "subscriptions", [("", "")])}
    assert len(subs) == 12
    assert subs[("topic-2", "sub-2")]["consumed_seq_id"] == 40
    assert subs[("topic-2", "sub-2")]["message_bound"] == 20
    assert subs[("topic-2", "sub-2")]["message_filter"] == "f"
    tp = {r["topic"]: r["ranges"] for r in _read_all(store, "topic_persistence", [("", "")])}
    assert tp["topic-2"] == [{"ledger_id": 4, "start_seq_id": 1, "end_seq_id": 10},
                             {"ledger_id": 5, "start_seq_id": 11, "end_seq_id": 20},
                             {"ledger_id": 6, "start_seq_id": 21, "end_seq_id": None}]
    hubs = _read_all(store, "hubs", [("", "")])
    assert [(h["hostname"], h["port"], h["ssl_port"], h["num_topics"]) for h in hubs] == [
        ("127.0.0.1", 4080, 9876, 2), ("127.0.0.1", 4081, 9877, 3)]
    generic = _read_all(store, "misc", [("", "")])
    assert dict(generic[0]["fields"]) == {"a": b"A0", "b": b"B0"}
    named = _read_all(store, "misc", [("", "")], ("b", "a"))
    assert [(r["a"], r["b"]) for r in named[:2]] == [(b"A0", b"B0"), (b"A1", None)]


def test_executor_that_cannot_see_the_lmdb_path_says_so(tmp_path: Path) -> None:
    part = KeyRangePartition(f"lmdb://{tmp_path}/not-here", "ledgers", "", "", True, "driver-7")
    with pytest.raises(MetastoreNotVisibleError, match=r"not visible on executor host .*driver-7"):
        next(read_range(part, spec_for("ledgers"), 10))
    assert not (tmp_path / "not-here").exists()  # the executor never creates an empty store
    with pytest.raises(MetastoreNotVisibleError, match="no lmdb metastore at"):
        check_visible(f"lmdb://{tmp_path}/not-here", "driver")


def test_parse_duration() -> None:
    assert [parse_duration(x) for x in ("0", "90", "90s", "15m", "2h", "1.5d")] == [0, 90, 90, 900, 7200, 129600]
    with pytest.raises(argparse.ArgumentTypeError, match="bad duration"):
        parse_duration("soon")


def _quire(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli", "scan", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_help_shows_an_example() -> None:
    for cmd in ((), ("orphan-ledgers",)):
        out = _quire(*cmd, "--help")
        assert out.returncode == 0
        assert "example:" in out.stdout and "quire scan " in out.stdout


@pytest.mark.parametrize(("args", "reason"), [
    (["--metastore", "lmdb:///no/such/quire/store"], "no lmdb metastore at /no/such/quire/store"),
    (["--metastore", "nosuch://x"], "unknown metastore scheme 'nosuch'"),
    (["--metastore", "not-a-uri"], "malformed metastore URI"),
    (["--metastore", "lmdb:///x", "--out", "result.json"], "must end in .csv or .parquet"),
])
def test_cli_bad_argument_or_missing_metastore_is_one_line(args: list[str], reason: str) -> None:
    out = _quire("ledgers-per-bookie", *args)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("quire scan: error: ")
    assert reason in out.stderr


def test_cli_unreachable_zookeeper_is_one_line() -> None:
    out = _quire("under-replicated", "--metastore", "zk://127.0.0.1:1/quire?connect_timeout=2")
    assert out.returncode == 1
    ours = [line for line in out.stderr.splitlines() if line.startswith("quire scan:")]  # kazoo logs its tries
    assert len(ours) == 1 and ours[0] == out.stderr.splitlines()[-1]
    assert ours[0].startswith("quire scan: error: cannot open metastore zk://127.0.0.1:1/quire")
    assert "cannot connect to ZooKeeper" in ours[0]


def test_cli_argparse_errors_exit_2() -> None:
    out = _quire("orphan-ledgers", "--metastore", "lmdb:///x", "--min-age", "soon")
    assert out.returncode == 2 and "bad duration 'soon'" in out.stderr
    out = _quire("no-such-report", "--metastore", "lmdb:///x")
    assert out.returncode == 2


def test_columnar_ledger_batch_matches_the_row_decoder(store: str) -> None:
    """The ledgers table's column-wise builder gives exactly what decoding row by row gives, errors included."""
    from dataclasses import replace

    from bookie.proto.ledger_metadata_pb2 import LedgerMetadataFormat

    spec = spec_for("ledgers")
    assert spec.columnar is not None
    ms = sync.open_metastore(store)
    try:
        cur = ms.create_scannable_table("ledgers").open_cursor(fields=spec.fields)
        entries = cur.read_entries(10_000)
        cur.close()
    finally:
        ms.close()
    good = LedgerMetadataFormat(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1).SerializeToString()
    entries += [("not-a-number", Versioned(Value({"data": good}), Version(1))),
                (f"{999_999:020d}", Versioned(Value({}), Version(2)))]
    columnar = spec.batch(entries).to_pylist()
    by_rows = replace(spec, columnar=None).batch(entries).to_pylist()
    assert len(columnar) == len(entries) > 100
    assert columnar == by_rows
    assert [r["error"] for r in columnar[-2:]] == [
        "ValueError: invalid literal for int() with base 10: 'not-a-number'", "ValueError: record has no 'data' field"]
    assert spec.batch([]).num_rows == 0


def test_selected_columns_match_the_full_decode(store: str) -> None:
    """``spec_for(select=...)`` keeps key, version, error and the named columns, values as the full decode."""
    full = {r["key"]: r for r in _read_all(store, "ledgers", [("", "")])}
    spec = spec_for("ledgers", select=("length", "state"))
    assert spec.schema.names == ["key", "version", "state", "length", "error"]   # schema order
    part = KeyRangePartition(store, "ledgers", "", "", True, "driver-host")
    rows = [r for batch in read_range(part, spec, 7) for r in batch.to_pylist()]
    assert len(rows) == len(full) > 100
    for r in rows:
        assert r == {k: full[r["key"]][k] for k in ("key", "version", "state", "length", "error")}
    assert spec.batch([]).num_rows == 0
    subs_full = {r["key"]: r for r in _read_all(store, "subscriptions", [("", "")])}
    part = KeyRangePartition(store, "subscriptions", "", "", True, "driver-host")
    subs = [r for batch in read_range(part, spec_for("subscriptions", select=("consumed_seq_id",)), 5)
            for r in batch.to_pylist()]
    assert [r["consumed_seq_id"] for r in subs] == [subs_full[r["key"]]["consumed_seq_id"] for r in subs]
    assert len(subs) == 12 and set(subs[0]) == {"key", "version", "consumed_seq_id", "error"}
    with pytest.raises(ValueError, match="has no column 'nope'"):
        spec_for("ledgers", select=("nope",))
    with pytest.raises(ValueError, match="known table"):
        spec_for("misc", select=("a",))
