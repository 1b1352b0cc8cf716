"""The HBase Thrift1 gateway emulator (a test double) keeps HBase's semantics, seen through happybase."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import happybase
import pytest

from metastore.testing.hbase_thrift_emulator import Hbase_thrift, HBaseThriftEmulator
from tests.fixtures.hbase import start_emulator_process, stop_process

H: Any = Hbase_thrift


@pytest.fixture
def emu() -> Iterator[HBaseThriftEmulator]:
    with HBaseThriftEmulator(max_keyvalue_size=1 << 20) as e:
        yield e


@pytest.fixture
def conn(emu: HBaseThriftEmulator) -> Iterator[Any]:
    c = happybase.Connection("127.0.0.1", emu.port, timeout=5000)
    c.create_table("t", {"f": {"max_versions": 3}, "m": {"max_versions": 1}})
    yield c
    c.close()


ROWS = [b"b", b"a", b"ab", b"a\x00", b"\xff", b"z", b"\x00", b"c\xc3\xa9"]


def keys(rows: Any) -> list[bytes]:
    return [k for k, _ in rows]


def test_scans_are_in_byte_order_with_inclusive_start_and_exclusive_stop(conn: Any) -> None:
    t = conn.table("t")
    for r in ROWS:
        t.put(r, {b"f:x": r})
    assert keys(t.scan()) == sorted(ROWS)
    assert keys(t.scan(row_start=b"a", row_stop=b"b")) == [b"a", b"a\x00", b"ab"]
    assert keys(t.scan(row_start=b"a\x00", row_stop=b"z")) == [b"a\x00", b"ab", b"b", b"c\xc3\xa9"]
    assert keys(t.scan(row_prefix=b"a")) == [b"a", b"a\x00", b"ab"]
    # small batches: several scannerGetList calls continue where the last stopped
    assert keys(t.scan(batch_size=2)) == sorted(ROWS)
    assert keys(t.scan(limit=3)) == sorted(ROWS)[:3]


def test_reversed_scans_start_high_inclusive_and_stop_low_exclusive(conn: Any) -> None:
    t = conn.table("t")
    for r in ROWS:
        t.put(r, {b"f:x": r})
    assert keys(t.scan(reverse=True)) == sorted(ROWS, reverse=True)
    assert keys(t.scan(row_start=b"b", row_stop=b"a", reverse=True)) == [b"b", b"ab", b"a\x00"]
    assert keys(t.scan(row_start=b"zz", reverse=True, batch_size=2)) == sorted(
        [r for r in ROWS if r <= b"zz"], reverse=True)


def test_scan_with_columns_skips_rows_without_them_and_projects(conn: Any) -> None:
    t = conn.table("t")
    t.put(b"r1", {b"f:a": b"1", b"m:v": b"v1"})
    t.put(b"r2", {b"f:b": b"2"})
    assert list(t.scan(columns=[b"m"])) == [(b"r1", {b"m:v": b"v1"})]
    assert list(t.scan(columns=[b"f:b"])) == [(b"r2", {b"f:b": b"2"})]
    assert dict(t.scan()) == {b"r1": {b"f:a": b"1", b"m:v": b"v1"}, b"r2": {b"f:b": b"2"}}
    assert t.row(b"r1", columns=[b"f"]) == {b"f:a": b"1"}


def test_column_families_are_checked(conn: Any) -> None:
    t = conn.table("t")
    with pytest.raises(H.IOError, match="NoSuchColumnFamily"):
        t.put(b"r", {b"nope:x": b"1"})
    with pytest.raises(H.IOError, match="NoSuchColumnFamily"):
        t.row(b"r", columns=[b"nope:x"])
    assert t.row(b"r") == {}
    assert set(t.families()) == {b"f", b"m"}
    assert t.families()[b"f"]["max_versions"] == 3


def test_qualifiers_may_hold_any_bytes_including_colons(conn: Any) -> None:
    t = conn.table("t")
    cols = {b"f:": b"empty", b"f:a:b": b"colon", b"f:\x00\xff": b"binary"}
    t.put(b"r", cols)
    assert t.row(b"r") == cols
    assert t.row(b"r", columns=[b"f:a:b"]) == {b"f:a:b": b"colon"}


def test_check_and_put_with_missing_expectation_means_absent(conn: Any) -> None:
    c = conn.client
    put = H.Mutation(column=b"m:v", value=b"1")
    assert c.checkAndPut(b"t", b"r", b"m:v", None, put, {}) is True
    assert c.checkAndPut(b"t", b"r", b"m:v", None, H.Mutation(column=b"m:v", value=b"x"), {}) is False
    assert c.checkAndPut(b"t", b"r", b"m:v", b"", H.Mutation(column=b"m:v", value=b"x"), {}) is False
    assert c.checkAndPut(b"t", b"r", b"m:v", b"0", H.Mutation(column=b"m:v", value=b"x"), {}) is False
    assert c.checkAndPut(b"t", b"r", b"m:v", b"1", H.Mutation(column=b"m:v", value=b"2"), {}) is True
    assert conn.table("t").row(b"r") == {b"m:v": b"2"}
    # the checked and the written column may differ; an empty expectation also means "absent"
    assert c.checkAndPut(b"t", b"r", b"m:lock", b"", H.Mutation(column=b"f:x", value=b"y"), {}) is True
    assert conn.table("t").row(b"r") == {b"m:v": b"2", b"f:x": b"y"}
    with pytest.raises(H.IOError, match="NoSuchColumnFamily"):
        c.checkAndPut(b"t", b"r", b"zz:v", None, put, {})


def test_check_and_put_is_atomic_across_connections(emu: HBaseThriftEmulator, conn: Any) -> None:
    wins: list[int] = []

    def racer(i: int) -> None:
        c = happybase.Connection("127.0.0.1", emu.port)
        try:
            for n in range(50):
                if c.client.checkAndPut(b"t", b"lock", b"m:v", None,
                                        H.Mutation(column=b"m:v", value=b"%d-%d" % (i, n)), {}):
                    wins.append(i)
        finally:
            c.close()

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(wins) == 1


def test_timestamps_versions_and_time_ranges(conn: Any) -> None:
    t = conn.table("t")
    t.put(b"r", {b"f:a": b"v10"}, timestamp=10)
    t.put(b"r", {b"f:a": b"v30"}, timestamp=30)
    t.put(b"r", {b"f:a": b"v20"}, timestamp=20)  # an older write does not hide the newer one
    assert t.row(b"r", include_timestamp=True) == {b"f:a": (b"v30", 30)}
    assert t.cells(b"r", b"f:a", versions=5, include_timestamp=True) == [
        (b"v30", 30), (b"v20", 20), (b"v10", 10)]
    assert t.row(b"r", timestamp=30) == {b"f:a": b"v20"}  # the bound is exclusive
    t.put(b"r", {b"f:a": b"v40"}, timestamp=40)
    assert len(t.cells(b"r", b"f:a", versions=5)) == 3  # max_versions of family f
    t.put(b"r", {b"m:v": b"1"}, timestamp=1)
    t.put(b"r", {b"m:v": b"2"}, timestamp=2)
    assert t.cells(b"r", b"m:v", versions=5) == [b"2"]  # max_versions=1


def test_delete_markers_mask_older_puts_until_major_compaction(conn: Any) -> None:
    t = conn.table("t")
    t.put(b"r", {b"f:a": b"1", b"f:b": b"1"}, timestamp=100)
    conn.client.mutateRowTs(b"t", b"r", [H.Mutation(isDelete=True, column=b"f:a")], 200, {})
    assert t.row(b"r") == {b"f:b": b"1"}
    t.put(b"r", {b"f:a": b"late"}, timestamp=150)  # older than the marker: masked
    assert t.row(b"r") == {b"f:b": b"1"}
    t.put(b"r", {b"f:a": b"new"}, timestamp=201)
    assert t.row(b"r") == {b"f:a": b"new", b"f:b": b"1"}
    conn.client.mutateRowTs(b"t", b"r", [H.Mutation(isDelete=True, column=b"f")], 300, {})
    assert t.row(b"r") == {}
    t.put(b"r", {b"f:c": b"masked"}, timestamp=299)
    t.put(b"r", {b"f:d": b"kept"}, timestamp=301)
    assert t.row(b"r") == {b"f:d": b"kept"}
    conn.compact_table("t", major=True)
    t.put(b"r", {b"f:c": b"visible"}, timestamp=299)
    assert t.row(b"r") == {b"f:c": b"visible", b"f:d": b"kept"}


def test_mutate_row_applies_deletes_before_puts(conn: Any) -> None:
    c = conn.client
    t = conn.table("t")
    t.put(b"r", {b"f:a": b"1", b"f:b": b"1"}, timestamp=5)
    c.mutateRowTs(b"t", b"r", [H.Mutation(column=b"f:c", value=b"3"),
                               H.Mutation(isDelete=True, column=b"f:a")], 6, {})
    assert t.row(b"r", include_timestamp=True) == {b"f:b": (b"1", 5), b"f:c": (b"3", 6)}
    t.delete(b"r")
    assert t.row(b"r") == {}
    assert keys(t.scan()) == []


def test_counters_and_appends(conn: Any) -> None:
    t = conn.table("t")
    assert t.counter_inc(b"r", b"f:n") == 1
    assert t.counter_inc(b"r", b"f:n", value=41) == 42
    assert t.counter_get(b"r", b"f:n") == 42
    assert t.row(b"r")[b"f:n"] == struct.pack(">q", 42)
    conn.client.append(H.TAppend(table=b"t", row=b"r", columns=[b"f:s"], values=[b"ab"]))
    conn.client.append(H.TAppend(table=b"t", row=b"r", columns=[b"f:s"], values=[b"cd"]))
    assert t.row(b"r", columns=[b"f:s"]) == {b"f:s": b"abcd"}


def test_limits_row_length_and_keyvalue_size(conn: Any) -> None:
    t = conn.table("t")
    with pytest.raises(H.IllegalArgument, match="KeyValue size too large"):
        t.put(b"r", {b"f:big": b"x" * (1 << 20)})
    with pytest.raises(H.IllegalArgument, match="Row length"):
        t.put(b"r" * 32768, {b"f:a": b"1"})
    with pytest.raises(H.IllegalArgument, match="Row length is 0"):
        t.put(b"", {b"f:a": b"1"})
    t.put(b"r" * 32767, {b"f:a": b"1"})
    assert t.row(b"r" * 32767) == {b"f:a": b"1"}
    assert t.row(b"r") == {}


def test_table_administration(conn: Any) -> None:
    assert conn.tables() == [b"t"]
    with pytest.raises(H.AlreadyExists):
        conn.create_table("t", {"f": {}})
    with pytest.raises(H.IllegalArgument, match="Illegal table name"):
        conn.create_table("bad/name", {"f": {}})
    with pytest.raises(H.IllegalArgument, match="Illegal table name"):
        conn.create_table("-x", {"f": {}})
    conn.create_table("ns:t2", {"f": {}})
    with pytest.raises(H.IOError, match="TableNotDisabled"):
        conn.delete_table("t")
    conn.disable_table("t")
    assert conn.is_table_enabled("t") is False
    with pytest.raises(H.IOError, match="TableNotEnabled"):
        conn.table("t").row(b"r")
    conn.delete_table("t")
    assert conn.tables() == [b"ns:t2"]
    with pytest.raises(H.IOError, match="TableNotFound"):
        conn.table("t").row(b"r")


def test_scanner_ids_are_checked_and_closed(emu: HBaseThriftEmulator, conn: Any) -> None:
    t = conn.table("t")
    t.put(b"a", {b"f:x": b"1"})
    assert keys(t.scan()) == [b"a"]
    assert emu.store.open_scanners == 0
    with pytest.raises(H.IllegalArgument, match="invalid"):
        conn.client.scannerGetList(424242, 1)
    with pytest.raises(H.IOError, match="filters"):
        list(t.scan(filter=b"PrefixFilter('a')"))


def test_an_idle_connection_is_not_dropped(conn: Any) -> None:
    """thriftpy2 servers drop clients idle for 3 s unless client_timeout=None."""
    t = conn.table("t")
    t.put(b"r", {b"f:a": b"1"})
    time.sleep(3.3)
    assert t.row(b"r") == {b"f:a": b"1"}


def test_stop_closes_client_connections(emu: HBaseThriftEmulator, conn: Any) -> None:
    conn.table("t").put(b"r", {b"f:a": b"1"})
    emu.stop()
    with pytest.raises((EOFError, OSError, Exception)):  # the connection is gone
        conn.table("t").row(b"r")


def test_runs_as_a_separate_process() -> None:
    proc, address = start_emulator_process()
    try:
        host, _, port = address.rpartition(":")
        c = happybase.Connection(host, int(port), timeout=5000)
        c.create_table("p", {"f": {}})
        c.table("p").put(b"k", {b"f:a": b"1"})
        assert c.table("p").row(b"k") == {b"f:a": b"1"}
        c.close()
    finally:
        stop_process(proc)
    assert proc.returncode == 0
