"""``bookie.testing.AddPipeline``, the benchmark's client without I/O: window, matching, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import errors
from bookie import protocol as proto
from bookie.testing import AddEntriesPipeline, AddPipeline


def adds(n: int, ledger_id: int = 3) -> tuple[list[bytes], list[bytes]]:
    frames = [proto.encode_frame(proto.add_request(i + 1, ledger_id, i, b"k", b"p%d" % i)) for i in range(n)]
    expected = [proto.encode_frame(proto.add_response(i + 1, ledger_id, i)) for i in range(n)]
    return frames, expected


def answer(i: int, status: int = proto.OK, ledger_id: int = 3) -> bytes:
    resp = proto.Response(txn_id=i + 1, op=proto.ADD_ENTRY, status=status, ledger_id=ledger_id, entry_id=i)
    return proto.encode_frame(resp)


@settings(max_examples=100)
@given(st.integers(1, 40), st.integers(1, 10), st.lists(st.integers(1, 50), min_size=1))
def test_in_order_answers_in_any_split_keep_the_window_full(n: int, window: int, cuts: list[int]) -> None:
    frames, expected = adds(n)
    run = AddPipeline(frames, expected, window)
    sent = run.start(0.0)
    assert sent == frames[:min(window, n)]
    stream = b"".join(expected)
    pos, k, now = 0, 0, 1.0
    while pos < len(stream):
        answerable = len(b"".join(expected[:len(sent)]))   # only adds sent can be answered
        assert pos < answerable
        chunk = stream[pos:min(pos + cuts[k % len(cuts)], answerable)]
        pos += len(chunk)
        sent += run.receive(chunk, now)
        assert run.sent - run.answered <= window
        k += 1
        now += 1.0
    assert run.finished and run.errors == 0 and sent == frames
    lat = run.latencies()
    assert len(lat) == n and all(x > 0 for x in lat)


def test_other_answers_are_parsed_counted_and_matched_by_txn_id() -> None:
    frames, expected = adds(6)
    run = AddPipeline(frames, expected, window=6)
    run.start(0.0)
    assert run.receive(expected[0] + expected[1][:3], 1.0) == []       # in order so far, one answered
    assert run.answered == 1
    # the second answer's rest, then the fourth (FENCED) before the third, then the others
    more = run.receive(expected[1][3:] + answer(3, proto.FENCED) + expected[2], 2.0)
    assert run.answered == 4 and run.errors == 1 and more == []        # all six were sent already
    run.receive(answer(5, ledger_id=4) + expected[4], 3.0)             # an OK answer naming another ledger
    assert run.finished and run.errors == 2
    assert run.answered_at == [1.0, 2.0, 2.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize("stray", [answer(9), answer(0, proto.BAD_REQUEST)])
def test_an_answer_to_no_outstanding_add_is_a_protocol_error(stray: bytes) -> None:
    frames, expected = adds(3)
    run = AddPipeline(frames, expected, window=3)
    run.start(0.0)
    run.receive(expected[0], 1.0)
    with pytest.raises(errors.ProtocolError):
        run.receive(stray, 2.0)


def test_an_add_answered_twice_is_a_protocol_error() -> None:
    frames, expected = adds(3)
    run = AddPipeline(frames, expected, window=3)
    run.start(0.0)
    run.receive(answer(1, proto.ERROR), 1.0)
    with pytest.raises(errors.ProtocolError):
        run.receive(answer(1), 2.0)


def _frames_of(parts: list[bytes]) -> list[proto.Request]:
    decoder = proto.FrameDecoder()
    return [proto.parse_request(f) for f in decoder.feed(b"".join(parts))]


def test_add_entries_pipeline_sends_answered_adds_again_as_one_frame() -> None:
    payloads = [b"%02d" % i * 25 for i in range(10)]
    txn_ids = iter(range(100, 200))
    run = AddEntriesPipeline(payloads, proto.AddBodies(3, b"k").ledger_fields, window=4,
                             next_txn_id=lambda: next(txn_ids), max_bytes=130)
    first = _frames_of(run.start(0.0))        # 4 adds of 50 bytes, at most 130 bytes a frame: 2 + 2
    assert [(r.txn_id, r.op, r.ledger_id, list(r.entries)) for r in first] == [
        (100, proto.ADD_ENTRIES, 3, payloads[0:2]), (101, proto.ADD_ENTRIES, 3, payloads[2:4])]
    ok = proto.encode_frame(proto.Response(txn_id=101, op=proto.ADD_ENTRIES))
    more = _frames_of(run.receive(ok[:5], 1.0) + run.receive(ok[5:], 2.0))   # any split
    assert [list(r.entries) for r in more] == [payloads[4:6]]                # as many as answered
    fenced = proto.add_response(0, 3, 1, errors.LedgerFencedError("f"))
    failed = proto.Response(txn_id=100, op=proto.ADD_ENTRIES, status=proto.FENCED,
                            adds=[proto.add_response(0, 3, 0), fenced])
    run.receive(proto.encode_frame(failed), 3.0)
    assert (run.answered, run.errors, run.sent) == (4, 1, 8)
    assert run.latencies() == [3.0, 3.0, 2.0, 2.0]
    with pytest.raises(errors.ProtocolError, match="matches no ADD_ENTRIES"):
        run.receive(ok, 4.0)                   # answered already
