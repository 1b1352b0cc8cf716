"""WRITE_LAC and long-poll READ_LAC frames, and ``protocol.LongPolls``, on byte strings alone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookie import errors
from bookie import protocol as proto
from bookie.digest import master_key

KEY = master_key(b"pw")


def _round_trip(req: proto.Request) -> proto.Request:
    frames = proto.FrameDecoder().feed(proto.encode_frame(req))
    assert len(frames) == 1
    return proto.parse_request(frames[0])


def test_write_lac_frame_carries_ledger_key_and_lac() -> None:
    got = _round_trip(proto.write_lac_request(7, 42, KEY, 99))
    assert (got.txn_id, got.op, got.ledger_id, got.master_key, got.lac) == (7, proto.WRITE_LAC, 42, KEY, 99)
    assert proto.WRITE_LAC in proto.OPERATIONS
    assert proto.op_name(got.op) == "WRITE_LAC"


def test_plain_read_lac_is_unchanged_on_the_wire_and_not_a_long_poll() -> None:
    plain = proto.read_lac_request(3, 42)
    assert plain.SerializeToString() == proto.Request(txn_id=3, op=proto.READ_LAC, ledger_id=42).SerializeToString()
    assert not proto.is_long_poll(_round_trip(plain))


@given(st.integers(-1, 2**63 - 1), st.integers(1, proto.MAX_LONG_POLL_TIMEOUT_MS))
def test_long_poll_read_lac_round_trips(previous: int, timeout_ms: int) -> None:
    got = _round_trip(proto.read_lac_request(5, 42, previous_lac=previous, timeout_ms=timeout_ms))
    assert proto.is_long_poll(got)
    assert (got.op, got.ledger_id, got.previous_lac, got.timeout_ms) == (proto.READ_LAC, 42, previous, timeout_ms)


def test_long_poll_timeout_must_fit_the_field() -> None:
    with pytest.raises(ValueError, match="timeout_ms"):
        proto.read_lac_request(1, 42, previous_lac=0, timeout_ms=-1)
    with pytest.raises(ValueError, match="timeout_ms"):
        proto.read_lac_request(1, 42, previous_lac=0, timeout_ms=proto.MAX_LONG_POLL_TIMEOUT_MS + 1)


def test_lac_response_and_too_many_requests_status() -> None:
    req = proto.read_lac_request(9, 42, previous_lac=3, timeout_ms=1000)
    resp = proto.lac_response(req, 4, 5)
    assert (resp.txn_id, resp.op, resp.status, resp.lac, resp.entry_id) == (9, proto.READ_LAC, proto.OK, 4, 5)
    refused = proto.response_to(req, proto.TOO_MANY_REQUESTS, "limit")
    with pytest.raises(errors.TooManyRequestsError, match="TOO_MANY_REQUESTS on READ_LAC 42"):
        proto.raise_for_status(refused)
    assert proto.status_of(errors.TooManyRequestsError("x")) == proto.TOO_MANY_REQUESTS


# --- LongPolls ------------------------------------------------------------------------------------

def _poll(ledger_id: int, previous: int, timeout_ms: int = 1000, txn: int = 1) -> proto.Request:
    return proto.read_lac_request(txn, ledger_id, previous_lac=previous, timeout_ms=timeout_ms)


def test_a_rise_answers_only_the_reads_waiting_below_it() -> None:
    polls: proto.LongPolls[str] = proto.LongPolls()
    low = polls.park("a", _poll(1, 3), now=10.0)
    high = polls.park("b", _poll(1, 5), now=10.0)
    other = polls.park("a", _poll(2, 3), now=10.0)
    assert low is not None and high is not None and other is not None
    assert low.deadline == pytest.approx(11.0)
    assert polls.watched(1) and polls.watched(2) and not polls.watched(3)
    assert polls.lac_rose(1, 4) == [low]     # LAC 4 passes 3, not 5
    assert polls.lac_rose(1, 5) == []        # 5 is not above 5
    assert polls.lac_rose(1, 6) == [high]
    assert not polls.watched(1) and len(polls) == 1
    assert polls.expire(other) is True
    assert polls.expire(other) is False      # answered once only
    assert len(polls) == 0 and polls.parked_by("a") == 0


def test_expiry_after_an_answer_is_a_no_op() -> None:
    polls: proto.LongPolls[str] = proto.LongPolls()
    p = polls.park("a", _poll(1, 0), now=0.0)
    assert p is not None
    assert polls.lac_rose(1, 1) == [p]
    assert polls.expire(p) is False


def test_limits_per_connection_and_per_ledger() -> None:
    polls: proto.LongPolls[str] = proto.LongPolls(max_per_connection=3, max_per_ledger=2)
    assert polls.park("a", _poll(1, 0), 0.0) is not None
    assert polls.park("a", _poll(1, 0), 0.0) is not None
    assert polls.park("a", _poll(1, 0), 0.0) is None          # a third on ledger 1
    assert polls.park("b", _poll(1, 0), 0.0) is not None      # another connection has its own
    assert polls.park("a", _poll(2, 0), 0.0) is not None
    assert polls.park("a", _poll(3, 0), 0.0) is None          # a fourth on connection a
    assert polls.parked_by("a") == 3
    assert len(polls.lac_rose(1, 1)) == 3                     # a's two and b's one
    assert polls.park("a", _poll(1, 0), 0.0) is not None      # room again
    with pytest.raises(ValueError):
        proto.LongPolls(max_per_connection=0)


def test_drop_forgets_a_connection_and_take_all_empties() -> None:
    polls: proto.LongPolls[str] = proto.LongPolls()
    mine = [polls.park("a", _poll(lid, 0), 0.0) for lid in (1, 1, 2)]
    theirs = polls.park("b", _poll(1, 0), 0.0)
    assert sorted(map(id, polls.drop("a"))) == sorted(map(id, mine))
    assert polls.parked_by("a") == 0 and not polls.watched(2)
    assert polls.lac_rose(1, 1) == [theirs]
    polls.park("c", _poll(4, 0), 0.0)
    assert len(polls.take_all()) == 1 and len(polls) == 0 and not polls.watched(4)


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 3), st.integers(-1, 5)), max_size=40),
       st.lists(st.tuples(st.integers(1, 3), st.integers(-1, 6)), max_size=10))
def test_every_parked_read_comes_out_exactly_once(parks: list[tuple[str, int, int]],
                                                  rises: list[tuple[int, int]]) -> None:
    polls: proto.LongPolls[str] = proto.LongPolls(max_per_connection=10, max_per_ledger=4)
    parked = []
    for conn, lid, prev in parks:
        p = polls.park(conn, _poll(lid, prev), 0.0)
        if p is not None:
            parked.append(p)
    out = []
    for lid, lac in rises:
        for p in polls.lac_rose(lid, lac):
            assert p.ledger_id == lid and p.request.previous_lac < lac
            out.append(p)
    out += polls.drop("a")
    out += polls.take_all()
    assert sorted(map(id, out)) == sorted(map(id, parked))
    assert len(polls) == 0
