"""The server-side rules of ``bookie.protocol`` (``ServerConnection``, ``FrameBudget``) on byte strings."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import errors
from bookie import protocol as proto
from bookie.digest import encode_entry

requests = st.builds(
    proto.Request,
    txn_id=st.integers(1, 2**64 - 1),
    op=st.integers(0, 10),
    ledger_id=st.integers(0, 2**63 - 1),
    entry_id=st.integers(-1, 2**63 - 1),
    body=st.binary(max_size=100),
)


def drain(conn: proto.ServerConnection) -> list[proto.Event]:
    out: list[proto.Event] = []
    while (ev := conn.next_event()) not in (proto.NEED_DATA, proto.PAUSED):
        out.append(ev)
    return out


@given(st.binary(max_size=3000), st.lists(st.integers(1, 512), min_size=1, max_size=20), st.integers(16, 700))
@settings(max_examples=300)
def test_any_bytes_give_requests_or_error_responses_never_an_exception(data: bytes, cuts: list[int],
                                                                        limit: int) -> None:
    conn = proto.ServerConnection(max_frame_size=limit)
    events: list[proto.Event] = []
    pos, i = 0, 0
    while pos < len(data):
        conn.receive_data(data[pos:pos + cuts[i % len(cuts)]])
        pos += cuts[i % len(cuts)]
        i += 1
        events += drain(conn)
    for ev in events:
        assert isinstance(ev, proto.Request | proto.Response)
        if isinstance(ev, proto.Response):
            assert ev.txn_id == 0 and ev.status in (proto.BAD_REQUEST, proto.TOO_LARGE)
    too_large = [ev for ev in events if isinstance(ev, proto.Response) and ev.status == proto.TOO_LARGE]
    assert len(too_large) <= 1
    if too_large:
        assert events[-1] is too_large[0]  # nothing is served after the stream broke
        assert conn.broken and not conn.reading and conn.close_now
    else:  # the same split as the plain decoder's
        assert len(events) == len(proto.FrameDecoder(limit).feed(data))


@given(st.lists(requests, max_size=30), st.integers(1, 64))
def test_requests_come_out_in_order_whatever_the_chunking(reqs: list[proto.Request], step: int) -> None:
    stream = b"".join(proto.encode_frame(r) for r in reqs)
    conn = proto.ServerConnection()
    got: list[proto.Event] = []
    for pos in range(0, len(stream), step):
        conn.receive_data(stream[pos:pos + step])
        got += drain(conn)
    assert got == reqs
    assert conn.buffered == 0


def test_in_flight_cap_pauses_until_half_finished() -> None:
    conn = proto.ServerConnection(max_pending_requests=4)
    conn.receive_data(b"".join(proto.encode_frame(proto.read_lac_request(i + 1, 1)) for i in range(10)))
    served = 0
    while isinstance(conn.next_event(), proto.Request):
        conn.request_started()
        served += 1
    assert served == 4 and conn.paused and not conn.reading and not conn.held_by_output
    conn.request_finished()
    assert conn.paused  # 3 in flight > 4 // 2
    conn.request_finished()
    assert not conn.paused and conn.reading
    assert len(drain(conn)) == 6


def test_queued_responses_ask_for_a_flush_then_pause() -> None:
    conn = proto.ServerConnection(max_response_bytes=1000)
    assert conn.response_queued(600) is False
    assert conn.response_queued(600) is True
    assert conn.paused and conn.held_by_output
    conn.flushed()
    assert not conn.paused


def test_write_buffer_pauses_and_draining_stops_for_good() -> None:
    conn = proto.ServerConnection()
    conn.receive_data(proto.encode_frame(proto.bookie_info_request(1)))
    conn.writing_paused()
    assert conn.next_event() is proto.PAUSED and not conn.held_by_output
    conn.writing_resumed()
    assert isinstance(conn.next_event(), proto.Request)
    conn.drain()
    conn.receive_data(proto.encode_frame(proto.bookie_info_request(2)))
    assert conn.next_event() is proto.PAUSED and conn.buffered > 0


def test_oversized_frame_answers_too_large_and_closes_once_idle() -> None:
    conn = proto.ServerConnection(max_frame_size=1024)
    conn.receive_data(proto.encode_frame(proto.bookie_info_request(1)) + struct.pack(">I", 5000))
    assert isinstance(conn.next_event(), proto.Request)
    conn.request_started()
    resp = conn.next_event()
    assert isinstance(resp, proto.Response) and resp.status == proto.TOO_LARGE and "1024" in resp.message
    assert conn.next_event() is proto.PAUSED and not conn.close_now
    conn.receive_data(b"ignored")
    conn.request_finished()
    assert conn.close_now and conn.buffered == 0


def test_malformed_frame_is_bad_request_and_the_stream_goes_on() -> None:
    conn = proto.ServerConnection()
    garbage = b"\xff\xff\xff\xff\x0f"
    conn.receive_data(struct.pack(">I", len(garbage)) + garbage + proto.encode_frame(proto.bookie_info_request(3)))
    bad, ok = drain(conn)
    assert isinstance(bad, proto.Response) and (bad.txn_id, bad.status) == (0, proto.BAD_REQUEST)
    assert isinstance(ok, proto.Request) and ok.txn_id == 3


def test_add_header_validation_and_status_mapping() -> None:
    good = proto.add_request(1, 5, 2, b"k", encode_entry(5, 2, 1, 3, b"abc"))
    assert proto.add_header(good) == (5, 2, 1)
    with pytest.raises(errors.BadRequestError, match="shorter than its header"):
        proto.add_header(proto.add_request(1, 5, 2, b"k", b"tiny"))
    with pytest.raises(errors.BadRequestError, match="payload is of entry 5:2"):
        proto.add_header(proto.add_request(1, 5, 3, b"k", good.body))
    assert proto.status_of(errors.LedgerFencedError()) == proto.FENCED
    assert proto.status_of(errors.BookieReadOnlyError()) == proto.READ_ONLY
    assert proto.status_of(RuntimeError()) == proto.ERROR
    failed = proto.add_response(7, 5, 2, errors.UnauthorizedError("no"))
    assert (failed.status, failed.message, failed.txn_id) == (proto.UNAUTHORIZED, "no", 7)
    assert proto.add_response(7, 5, 2).status == proto.OK


@settings(max_examples=300)
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_add_ok_frame_is_the_encoded_ok_response(txn_id: int, ledger_id: int, entry_id: int) -> None:
    frame = proto.add_ok_frame(txn_id, ledger_id, entry_id)
    assert frame == proto.encode_frame(proto.add_response(txn_id, ledger_id, entry_id))
    (resp,) = proto.FrameDecoder().feed(frame)
    assert proto.parse_response(resp) == proto.add_response(txn_id, ledger_id, entry_id)


@settings(max_examples=300)
@given(st.integers(0, 2**64 - 1), st.sampled_from([proto.ADD_ENTRIES, proto.ADD_ENTRIES_MULTI, proto.ADD_ENTRY]))
def test_ok_frame_is_the_encoded_ok_response(txn_id: int, op: int) -> None:
    frame = proto.ok_frame(txn_id, op)
    assert frame == proto.encode_frame(proto.Response(txn_id=txn_id, op=op))
    (resp,) = proto.FrameDecoder().feed(frame)
    assert proto.parse_response(resp) == proto.Response(txn_id=txn_id, op=op, status=proto.OK)


def test_add_header_takes_the_payload_read_already() -> None:
    good = proto.add_request(1, 5, 2, b"k", encode_entry(5, 2, 1, 3, b"abc"))
    assert proto.add_header(good, good.body) == (5, 2, 1)
    with pytest.raises(errors.BadRequestError, match="shorter than its header"):
        proto.add_header(good, b"tiny")


def test_frame_budget_closes_the_newest_offenders() -> None:
    budget = proto.FrameBudget(100)
    assert budget.update(1, 60) == []
    assert budget.update(2, 30) == []
    assert budget.update(3, 30) == [3]  # newest first, just enough to get back within the limit
    budget.release(3)
    assert budget.total == 90
    assert budget.update(1, 0) == [] and budget.total == 30
    assert budget.update(4, 0) == []  # nothing held: not tracked
    assert budget.update(5, 200) == [5]


ids = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))


@settings(max_examples=200)
@given(st.lists(ids, min_size=1, max_size=20) | st.lists(ids, min_size=1, max_size=3).map(lambda x: x * 3))
def test_add_acks_frame_the_encoded_ok_response_whatever_came_before(seq: list[tuple[int, int, int]]) -> None:
    acks = proto.AddAcks()  # one per connection: the Response it reuses must not leak a field across adds
    for txn_id, ledger_id, entry_id in seq:
        frame = acks.frame(txn_id, ledger_id, entry_id)
        assert frame == proto.encode_frame(proto.add_response(txn_id, ledger_id, entry_id))
        assert frame == proto.add_ok_frame(txn_id, ledger_id, entry_id)


def test_requests_finished_together_lift_the_in_flight_hold() -> None:
    conn = proto.ServerConnection(max_pending_requests=4)
    for _ in range(4):
        conn.request_started()
    assert conn.paused
    assert not conn.requests_finished(1)   # 3 in flight > 4 // 2
    assert conn.paused
    assert conn.requests_finished(3)       # the hold lifts: the shell serves again
    assert not conn.paused and conn.in_flight == 0


def test_watched_ledgers_is_a_live_view() -> None:
    polls: proto.LongPolls[str] = proto.LongPolls()
    view = polls.watched_ledgers
    assert 5 not in view
    parked = polls.park("c", proto.read_lac_request(1, 5, previous_lac=0, timeout_ms=1000), 0.0)
    assert parked is not None and 5 in view and polls.watched(5)
    assert polls.lac_rose(5, 1) == [parked]
    assert 5 not in view and not polls.watched(5)
