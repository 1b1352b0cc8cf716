"""Value, Version and argument checks of metastore.api, and the registry's errors."""

from __future__ import annotations

import pytest

from metastore import ALL_FIELDS, Order, Value, Version, open_metastore
from metastore.api import check_range, check_value, in_range
from metastore.errors import IllegalOpError, MetastoreError, NoKeyError, ServiceDownError
from metastore.registry import scheme_of


def test_version_sentinels_and_order() -> None:
    assert Version.NEW == Version.NEW and Version.ANY == Version.ANY
    assert Version.NEW != Version.ANY
    assert Version(3) == Version(3) and Version(3) < Version(4)
    assert Version(-1) != Version.NEW
    assert len({Version(1), Version(1), Version.NEW}) == 2
    with pytest.raises(TypeError):
        _ = Version.NEW < Version(1)


def test_value_merge_and_project() -> None:
    v = Value({"a": b"1", "b": b"2"})
    assert v.merged(Value({"b": None, "c": b"3"})) == {"a": b"1", "c": b"3"}
    assert v == {"a": b"1", "b": b"2"}  # merged returns a copy
    assert v.project({"a", "zz"}) == {"a": b"1"}
    assert v.project(ALL_FIELDS) == v


def test_errors_share_a_base_with_codes() -> None:
    for cls, code in [(NoKeyError, "NoKey"), (ServiceDownError, "ServiceDown"), (IllegalOpError, "IllegalOp")]:
        err = cls("x")
        assert isinstance(err, MetastoreError) and err.code == code


def test_range_helpers() -> None:
    with pytest.raises(IllegalOpError):
        check_range("z", "a", Order.ASC)
    with pytest.raises(IllegalOpError):
        check_range("a", "z", Order.DESC)
    check_range("", "a", Order.DESC)
    assert in_range("m", "f", True, "b", True, Order.DESC) is False
    assert in_range("c", "f", True, "b", False, Order.DESC) is True


@pytest.mark.parametrize("uri", ["lmdb", "no-scheme-here", "", "://x"])
def test_malformed_uri(uri: str) -> None:
    with pytest.raises(IllegalOpError):
        scheme_of(uri)


async def test_unknown_scheme_names_the_known_ones() -> None:
    with pytest.raises(IllegalOpError, match=r"unknown metastore scheme 'foo'.*lmdb"):
        await open_metastore("foo://bar")


async def test_lmdb_uri_without_path() -> None:
    with pytest.raises(IllegalOpError):
        await open_metastore("lmdb://")


def test_check_value_copies_and_converts_and_refuses() -> None:
    plain = Value({"a": b"1", "b": None})
    got = check_value(plain)
    assert got == plain and got is not plain and type(got) is Value   # a copy: the caller's dict may change
    plain["a"] = b"2"
    assert got["a"] == b"1"
    converted = check_value({"a": bytearray(b"x"), "m": memoryview(b"y")})
    assert converted == {"a": b"x", "m": b"y"} and all(type(v) is bytes for v in converted.values())
    for bad in ({1: b"x"}, {"a": "text"}, {"a": 1}, None, [("a", b"x")]):
        with pytest.raises(IllegalOpError):
            check_value(bad)
