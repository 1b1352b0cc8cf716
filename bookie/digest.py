"""Entry payloads as stored by bookies and shipped on the wire, with their digest.

The writer encodes, every reader verifies::

    payload = encode_entry(ledger_id, entry_id, lac, length, b"body",
                           digest_type="crc32c", password=b"")
    entry = decode_entry(payload, digest_type="crc32c", password=b"",
                         ledger_id=ledger_id, entry_id=entry_id)
    entry.body, entry.lac, entry.length

Layout (all integers signed 64-bit big-endian, as BookKeeper's)::

    ledger_id | entry_id | lac | length | digest | body
       8          8        8      8      4 or 32   rest

* ``lac`` is the writer's last-add-confirmed when it sent the entry
  (piggybacked; bookies keep the highest one per ledger).
* ``length`` is the ledger's total length in bytes after this entry (the
  BookKeeper meaning: recovery closes a ledger with the length of its last
  entry); the codec does not check it against the body.
* ``digest`` covers the 32 header bytes and the body:
  ``crc32c`` (default) is the 4-byte CRC32C (Castagnoli); ``mac`` is the
  32-byte HMAC-SHA256 keyed by the ledger password itself.

``master_key(password)`` is what a client sends to bookies to prove it may
write a ledger: ``sha1(b"ledger" + password)``, BookKeeper's
``MacDigestManager.genDigest("ledger", password)``. A bookie stores the
master key of the first add it sees and refuses other keys.

Bookies do not verify digests (they may not know the password); they only
read the header with ``read_header``.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Callable
from typing import NamedTuple

import crc32c

from bookie.errors import DigestMismatchError

_HEADER = struct.Struct(">qqqq")
HEADER_SIZE = _HEADER.size
"""Bytes before the digest: ledger id, entry id, LAC, length."""


class DigestType(enum.StrEnum):
    """How entry payloads are protected; the values are the names used in metadata and conf."""

    CRC32C = "crc32c"
    MAC = "mac"


DIGEST_SIZES = {DigestType.CRC32C: 4, DigestType.MAC: 32}


class EntryHeader(NamedTuple):
    """The fixed part of a payload (what a bookie needs, read without verification)."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int


class Entry(NamedTuple):
    """A verified entry: its ids, the piggybacked LAC, the ledger length after it, and the body."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    body: bytes

    @property
    def data(self) -> bytes:
        """The body (the name the ledger client's readers use)."""
        return self.body


def master_key(password: bytes) -> bytes:
    """The 20-byte master key bookies hold for a ledger: ``sha1(b"ledger" + password)``."""
    return hashlib.sha1(b"ledger" + bytes(password)).digest()


def digest_type_of(digest_type: DigestType | str) -> DigestType:
    """Normalise a digest type name; ``ValueError`` for an unknown one."""
    if type(digest_type) is DigestType:
        return digest_type
    try:
        return DigestType(digest_type)
    except ValueError:
        known = ", ".join(t.value for t in DigestType)
        raise ValueError(f"unknown digest type {digest_type!r} (known: {known})") from None


def _digest(kind: DigestType, password: bytes, header: bytes, body: bytes) -> bytes:
    if kind is DigestType.CRC32C:
        return (crc32c.crc32c(body, crc32c.crc32c(header)) & 0xFFFFFFFF).to_bytes(4, "big")
    mac = hmac.new(password, header, hashlib.sha256)
    mac.update(body)
    return mac.digest()


def encode_entry(ledger_id: int, entry_id: int, lac: int, length: int, body: bytes,
                 digest_type: DigestType | str = DigestType.CRC32C, password: bytes = b"") -> bytes:
    """Return the payload for one entry (header, digest, body).

    Raises ``ValueError`` for an unknown digest type and ``struct.error`` when
    an id does not fit a signed 64-bit integer.
    """
    kind = digest_type_of(digest_type)
    header = _HEADER.pack(ledger_id, entry_id, lac, length)
    if type(body) is not bytes:
        body = bytes(body)
    return header + _digest(kind, password, header, body) + body


EntryEncoder = Callable[[int, int, int, int, bytes], bytes]
"""``encoder(ledger_id, entry_id, lac, length, body)``: ``encode_entry`` with the digest type and password bound."""


def entry_encoder(digest_type: DigestType | str = DigestType.CRC32C, password: bytes = b"") -> EntryEncoder:
    """``encode_entry`` with ``digest_type`` and ``password`` bound (the writer's hot path: one call per entry).

    ``ValueError`` for an unknown digest type now; the encoder returns exactly
    what ``encode_entry`` returns for the same arguments.
    """
    kind = digest_type_of(digest_type)
    password = bytes(password)
    pack = _HEADER.pack
    if kind is not DigestType.CRC32C:
        def encode_mac(ledger_id: int, entry_id: int, lac: int, length: int, body: bytes) -> bytes:
            return encode_entry(ledger_id, entry_id, lac, length, body, kind, password)
        return encode_mac
    crc = crc32c.crc32c

    def encode_crc32c(ledger_id: int, entry_id: int, lac: int, length: int, body: bytes) -> bytes:
        header = pack(ledger_id, entry_id, lac, length)
        if type(body) is not bytes:
            body = bytes(body)
        return header + (crc(body, crc(header)) & 0xFFFFFFFF).to_bytes(4, "big") + body
    return encode_crc32c


def read_header(payload: bytes) -> EntryHeader:
    """The header of ``payload`` without verifying the digest.

    Raises ``DigestMismatchError`` when the payload is shorter than a header.
    """
    if len(payload) < HEADER_SIZE:
        raise DigestMismatchError(f"entry payload of {len(payload)} bytes is shorter than its header")
    return EntryHeader._make(_HEADER.unpack_from(payload))


def decode_entry(payload: bytes, digest_type: DigestType | str = DigestType.CRC32C,
                 password: bytes = b"", *, ledger_id: int | None = None,
                 entry_id: int | None = None) -> Entry:
    """Verify ``payload`` and return the entry it holds.

    Raises ``DigestMismatchError`` when the payload is truncated, its digest
    does not match (corruption, or the wrong password for ``mac``), or it
    names another ledger or entry than the ``ledger_id``/``entry_id`` given.
    """
    kind = digest_type_of(digest_type)
    size = DIGEST_SIZES[kind]
    payload = bytes(payload)
    if len(payload) < HEADER_SIZE + size:
        raise DigestMismatchError(f"entry payload of {len(payload)} bytes is shorter than "
                                  f"header and {kind.value} digest")
    header = payload[:HEADER_SIZE]
    body = payload[HEADER_SIZE + size:]
    expected = _digest(kind, password, header, body)
    if not hmac.compare_digest(expected, payload[HEADER_SIZE:HEADER_SIZE + size]):
        lid, eid, _, _ = _HEADER.unpack(header)
        raise DigestMismatchError(f"{kind.value} digest mismatch on entry {lid}:{eid}")
    lid, eid, lac, length = _HEADER.unpack(header)
    got = Entry(lid, eid, lac, length, body)
    if ledger_id is not None and got.ledger_id != ledger_id:
        raise DigestMismatchError(f"payload is of ledger {got.ledger_id}, expected {ledger_id}")
    if entry_id is not None and got.entry_id != entry_id:
        raise DigestMismatchError(f"payload is of entry {got.entry_id}, expected {entry_id}")
    return got
