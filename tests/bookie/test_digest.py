"""Entry payload encoding and digest verification."""

from __future__ import annotations

import hashlib
import hmac

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookie.digest import (
    HEADER_SIZE,
    DigestType,
    Entry,
    decode_entry,
    encode_entry,
    entry_encoder,
    master_key,
    read_header,
)
from bookie.errors import BKError, DigestMismatchError

ids = st.integers(0, 2**63 - 1)


@given(ids, ids, st.integers(-1, 2**63 - 1), st.integers(0, 2**63 - 1), st.binary(max_size=500),
       st.sampled_from(["crc32c", "mac"]), st.binary(max_size=16))
def test_round_trip(ledger_id: int, entry_id: int, lac: int, length: int, body: bytes, kind: str,
                    password: bytes) -> None:
    payload = encode_entry(ledger_id, entry_id, lac, length, body, kind, password)
    got = decode_entry(payload, kind, password, ledger_id=ledger_id, entry_id=entry_id)
    assert got == Entry(ledger_id, entry_id, lac, length, body)
    assert got.data == body
    assert read_header(payload) == (ledger_id, entry_id, lac, length)


@given(ids, ids, st.integers(-1, 2**63 - 1), st.integers(0, 2**63 - 1), st.binary(max_size=500),
       st.sampled_from(["crc32c", "mac"]), st.binary(max_size=16))
def test_a_bound_encoder_gives_the_bytes_of_encode_entry(ledger_id: int, entry_id: int, lac: int, length: int,
                                                         body: bytes, kind: str, password: bytes) -> None:
    encode = entry_encoder(kind, password)
    assert encode(ledger_id, entry_id, lac, length, body) == encode_entry(ledger_id, entry_id, lac, length, body,
                                                                          kind, password)
    assert encode(ledger_id, entry_id, lac, length, bytearray(body)) == encode_entry(
        ledger_id, entry_id, lac, length, body, kind, password)


def test_a_bound_encoder_refuses_an_unknown_digest_type_when_made() -> None:
    with pytest.raises(ValueError, match="unknown digest type 'md5'"):
        entry_encoder("md5")


@given(st.binary(min_size=1, max_size=200), st.sampled_from(["crc32c", "mac"]), st.data())
def test_any_single_bit_flip_is_detected(body: bytes, kind: str, data: st.DataObject) -> None:
    payload = bytearray(encode_entry(7, 3, 2, 99, body, kind, b"pw"))
    pos = data.draw(st.integers(0, len(payload) - 1))
    bit = data.draw(st.integers(0, 7))
    payload[pos] ^= 1 << bit
    with pytest.raises(DigestMismatchError):
        decode_entry(bytes(payload), kind, b"pw", ledger_id=7, entry_id=3)


def test_layout_and_crc32c_value() -> None:
    payload = encode_entry(1, 2, 1, 5, b"hello")
    header = payload[:HEADER_SIZE]
    assert header == (1).to_bytes(8, "big") + (2).to_bytes(8, "big") + (1).to_bytes(8, "big") + (5).to_bytes(8, "big")
    assert payload[HEADER_SIZE:HEADER_SIZE + 4] == crc32c.crc32c(header + b"hello").to_bytes(4, "big")
    assert payload[HEADER_SIZE + 4:] == b"hello"


def test_mac_is_hmac_sha256_keyed_by_the_password() -> None:
    payload = encode_entry(1, 0, -1, 3, b"abc", DigestType.MAC, b"secret")
    header = payload[:HEADER_SIZE]
    assert payload[HEADER_SIZE:HEADER_SIZE + 32] == hmac.new(b"secret", header + b"abc", hashlib.sha256).digest()


def test_wrong_password_or_type_fails() -> None:
    payload = encode_entry(1, 0, -1, 3, b"abc", "mac", b"secret")
    with pytest.raises(DigestMismatchError):
        decode_entry(payload, "mac", b"guess")
    with pytest.raises(DigestMismatchError):
        decode_entry(payload, "crc32c")


def test_entry_of_another_ledger_or_id_fails() -> None:
    payload = encode_entry(1, 0, -1, 3, b"abc")
    with pytest.raises(DigestMismatchError, match="ledger 1, expected 2"):
        decode_entry(payload, ledger_id=2)
    with pytest.raises(DigestMismatchError, match="entry 0, expected 1"):
        decode_entry(payload, entry_id=1)


def test_truncated_payload_fails() -> None:
    payload = encode_entry(1, 0, -1, 3, b"abc")
    for n in (0, 10, HEADER_SIZE, HEADER_SIZE + 3):
        with pytest.raises(DigestMismatchError):
            decode_entry(payload[:n])
    with pytest.raises(DigestMismatchError):
        read_header(payload[:HEADER_SIZE - 1])


def test_unknown_digest_type() -> None:
    with pytest.raises(ValueError, match="unknown digest type 'md5'"):
        encode_entry(1, 0, -1, 0, b"", "md5")


def test_master_key_is_bookkeepers() -> None:
    assert master_key(b"pw") == hashlib.sha1(b"ledgerpw").digest()
    assert len(master_key(b"")) == 20
    assert master_key(b"a") != master_key(b"b")


def test_digest_error_is_a_bk_error() -> None:
    assert issubclass(DigestMismatchError, BKError)
    assert DigestMismatchError().code == "DigestMatchException"
