"""The pure wire codec: framing, limits, messages, txn-id matching (byte strings only)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import errors
from bookie import protocol as proto

requests = st.builds(
    proto.Request,
    txn_id=st.integers(0, 2**64 - 1),
    op=st.sampled_from(sorted(proto.OPERATIONS)),
    ledger_id=st.integers(-(2**63), 2**63 - 1),
    entry_id=st.integers(-1, 2**63 - 1),
    master_key=st.binary(max_size=20),
    body=st.binary(max_size=300),
    fence=st.booleans(),
    recovery=st.booleans(),
)


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@given(st.lists(requests, max_size=20), st.lists(st.integers(1, 64), min_size=1, max_size=50))
def test_any_chunking_yields_the_same_requests(reqs: list[proto.Request], cuts: list[int]) -> None:
    stream = b"".join(proto.encode_frame(r) for r in reqs)
    decoder = proto.FrameDecoder()
    got: list[proto.Request] = []
    pos, i = 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        got += [proto.parse_request(f) for f in decoder.feed(stream[pos:pos + step])]
        pos += step
        i += 1
    assert got == reqs
    assert decoder.buffered == 0


@given(st.binary(max_size=2000), st.integers(16, 600))
@settings(max_examples=300)
def test_garbage_never_escapes_as_anything_but_protocol_error(data: bytes, limit: int) -> None:
    decoder = proto.FrameDecoder(max_frame_size=limit)
    try:
        frames = decoder.feed(data)
    except errors.FrameTooLargeError as exc:
        frames = exc.frames
        with pytest.raises(errors.FrameTooLargeError):
            decoder.feed(b"\x00")  # the stream stays broken
    for f in frames:
        assert len(f) <= limit
        try:
            proto.parse_request(f)
        except errors.MalformedFrameError:
            pass


def test_oversized_header_raises_before_the_body_arrives() -> None:
    decoder = proto.FrameDecoder(max_frame_size=1024)
    ok = proto.encode_frame(proto.bookie_info_request(1))
    with pytest.raises(errors.FrameTooLargeError, match="1025 bytes exceeds max_frame_size 1024") as info:
        decoder.feed(ok + struct.pack(">I", 1025))
    assert [proto.parse_request(f).txn_id for f in info.value.frames] == [1]
    assert isinstance(info.value, errors.ProtocolError)


def test_frame_at_the_limit_is_accepted() -> None:
    decoder = proto.FrameDecoder(max_frame_size=10)
    assert decoder.feed(frame(b"0123456789")) == [b"0123456789"]
    assert decoder.feed(frame(b"")) == [b""]


def test_default_limit_is_bookkeepers() -> None:
    assert proto.FrameDecoder().max_frame_size == 5242880 == proto.DEFAULT_MAX_FRAME_SIZE


def test_malformed_protobuf_is_a_clear_error() -> None:
    with pytest.raises(errors.MalformedFrameError, match="malformed request frame of 5 bytes"):
        proto.parse_request(b"\xff\xff\xff\xff\x0f")
    with pytest.raises(errors.MalformedFrameError, match="malformed response"):
        proto.parse_response(b"\x0a\x05ab")


def test_unknown_op_survives_the_round_trip() -> None:
    req = proto.parse_request(proto.encode_frame(proto.Request(txn_id=3, op=42))[4:])
    assert req.op == 42 and req.op not in proto.OPERATIONS
    assert proto.op_name(42) == "OP_42"
    assert proto.status_name(proto.FENCED) == "FENCED"


def test_response_to_echoes_the_request() -> None:
    req = proto.read_request(9, 5, proto.LAST_ENTRY, fence=True, master_key=b"k")
    resp = proto.response_to(req, proto.NO_ENTRY, "nothing")
    assert (resp.txn_id, resp.op, resp.ledger_id, resp.entry_id, resp.status, resp.message) == (
        9, proto.READ_ENTRY, 5, -1, proto.NO_ENTRY, "nothing")


@pytest.mark.parametrize(("status", "error"), [
    (proto.NO_ENTRY, errors.NoSuchEntryError),
    (proto.NO_LEDGER, errors.NoSuchLedgerError),
    (proto.FENCED, errors.LedgerFencedError),
    (proto.UNAUTHORIZED, errors.UnauthorizedError),
    (proto.READ_ONLY, errors.BookieReadOnlyError),
    (proto.TOO_LARGE, errors.TooLargeError),
    (proto.UNKNOWN_OP, errors.UnknownOpError),
    (proto.BAD_REQUEST, errors.BadRequestError),
    (proto.ERROR, errors.BookieServerError),
    (99, errors.BookieServerError),
])
def test_status_maps_to_error(status: int, error: type[errors.BKError]) -> None:
    resp = proto.Response(txn_id=1, op=proto.ADD_ENTRY, status=status, ledger_id=3, entry_id=4, message="m")
    with pytest.raises(error, match="on ADD_ENTRY 3:4: m"):
        proto.raise_for_status(resp)
    assert proto.raise_for_status(proto.Response(status=proto.OK)).status == proto.OK


def test_pending_requests_match_out_of_order() -> None:
    pending: proto.PendingRequests[str] = proto.PendingRequests()
    reqs = [proto.add_request(pending.next_txn_id(), 1, i, b"k", b"") for i in range(3)]
    for r in reqs:
        pending.add(r, f"add-{r.entry_id}")
    assert [r.txn_id for r in reqs] == [1, 2, 3]
    assert pending.complete(proto.response_to(reqs[2])) == "add-2"
    assert pending.complete(proto.response_to(reqs[0])) == "add-0"
    assert len(pending) == 1 and reqs[1].txn_id in pending
    with pytest.raises(errors.ProtocolError, match="txn id 1"):
        pending.complete(proto.response_to(reqs[0]))  # already completed
    with pytest.raises(errors.ProtocolError, match="already outstanding"):
        pending.add(reqs[1], "again")
    wrong_op = proto.Response(txn_id=reqs[1].txn_id, op=proto.READ_LAC)
    with pytest.raises(errors.ProtocolError, match="READ_LAC, request was ADD_ENTRY"):
        pending.complete(wrong_op)
    assert pending.drain() == ["add-1"]
    assert len(pending) == 0


def test_txn_zero_never_matches() -> None:
    pending: proto.PendingRequests[int] = proto.PendingRequests()
    pending.add(proto.bookie_info_request(pending.next_txn_id()), 1)
    with pytest.raises(errors.ProtocolError, match="BAD_REQUEST: bad"):
        pending.complete(proto.error_response(proto.BAD_REQUEST, "bad"))


@given(st.lists(st.integers(0, 30), unique=True, max_size=30))
def test_pending_completes_in_any_order(order: list[int]) -> None:
    pending: proto.PendingRequests[int] = proto.PendingRequests()
    reqs = {i: proto.read_lac_request(pending.next_txn_id(), i) for i in range(31)}
    for i, r in reqs.items():
        pending.add(r, i)
    for i in order:
        assert pending.complete(proto.response_to(reqs[i])) == i
    assert sorted(pending.drain()) == sorted(set(range(31)) - set(order))
