"""``protocol.ok_answer``: a frame's all-OK answer read by hand, byte for byte against protobuf (issue 32)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bookie import protocol

_OPS = [int(v) for v in protocol.OperationType.values() if v]   # not OP_UNSPECIFIED (left to protobuf)
_STATUSES = [int(v) for v in protocol.StatusCode.values()]
_INT64 = st.integers(-(2**63), 2**63 - 1)


def _read_by_protobuf(body: bytes) -> tuple[int, int] | None:
    """What the hand parser must return for ``body``: txn id and op when protobuf reads an OK answer of
    nothing else, else None."""
    try:
        r = protocol.parse_response(body)
    except protocol.errors.MalformedFrameError:
        return None
    if r != protocol.Response(txn_id=r.txn_id, op=r.op) or not r.txn_id:
        return None
    return r.txn_id, r.op


@given(txn_id=st.integers(1, 2**64 - 1), op=st.sampled_from(_OPS))
def test_an_ok_frame_reads_as_its_txn_and_op(txn_id: int, op: int) -> None:
    body = protocol.Response(txn_id=txn_id, op=op).SerializeToString()
    if txn_id < 2**63:   # every txn id a client uses for years
        assert protocol.ok_frame(txn_id, op)[4:] == body
        assert protocol.ok_answer(body) == (txn_id, op) == _read_by_protobuf(body)
    else:
        assert protocol.ok_answer(body) is None


@given(txn_id=st.integers(0, 2**64 - 1), op=st.sampled_from(_OPS), status=st.sampled_from(_STATUSES),
       ledger_id=_INT64, entry_id=_INT64, lac=_INT64, message=st.sampled_from(["", "no"]),
       trace=st.lists(st.integers(0, 2**64 - 1), max_size=3), body=st.binary(max_size=3))
def test_a_response_with_anything_more_than_txn_and_op_is_left_to_protobuf(
        txn_id: int, op: int, status: int, ledger_id: int, entry_id: int, lac: int, message: str,
        trace: list[int], body: bytes) -> None:
    frame = protocol.Response(txn_id=txn_id, op=op, status=status, ledger_id=ledger_id, entry_id=entry_id,
                              lac=lac, message=message, trace_ns=trace, body=body).SerializeToString()
    got = protocol.ok_answer(frame)
    assert got is None or got == _read_by_protobuf(frame)
    if status != protocol.OK or ledger_id or entry_id or message or trace or body or lac or not txn_id:
        assert got is None


_FIELDS = st.sampled_from([
    b"\x08\x05", b"\x08\x85\x01", b"\x08\x80\x00",           # txn id, also an overlong varint
    b"\x08" + b"\xff" * 8 + b"\x7f", b"\x08" + b"\xff" * 9 + b"\x01",   # 9 and 10 bytes
    b"\x10\x01", b"\x10\x07", b"\x10\x00", b"\x10\x81\x01",   # op
    b"\x18\x00", b"\x18\x02",                                   # status, even an explicit OK
    b"\x20\x07", b"\x28\x09", b"\x38\x01",                      # ledger id, entry id, lac
    b"\x5a\x00", b"\x62\x00", b"\x68\x01", b"\x78\x01",         # message, adds, trace, unknown
    b"\x08", b"\x10", b"\x80", b"\xff", b"\x00",                # truncated, broken
])


@given(st.lists(_FIELDS, max_size=6))
def test_whatever_the_bytes_an_answer_read_by_hand_is_the_one_protobuf_reads(parts: list[bytes]) -> None:
    frame = b"".join(parts)
    got = protocol.ok_answer(frame)
    assert got is None or got == _read_by_protobuf(frame)


def test_client_txns_hand_an_all_ok_answer_to_answered_ok_and_the_rest_a_response() -> None:
    class Run:
        def __init__(self) -> None:
            self.oks = 0
            self.responses: list[protocol.Response] = []

        def answered_ok(self) -> None:
            self.oks += 1

        def __call__(self, response: protocol.Response) -> None:
            self.responses.append(response)

    txns: protocol.ClientTxns[Run] = protocol.ClientTxns()
    multi, lacs, failed, wrong = Run(), Run(), Run(), Run()
    m = txns.add_next(protocol.ADD_ENTRIES_MULTI, multi)
    lac = txns.add_next(protocol.WRITE_LAC_MULTI, lacs)
    bad = txns.add_next(protocol.ADD_ENTRIES, failed)
    w = txns.add_next(protocol.ADD_ENTRY, wrong)
    traced: list[protocol.Response] = []
    misfits: list[str] = []
    frames = [protocol.ok_frame(m, protocol.ADD_ENTRIES_MULTI)[4:],
              protocol.ok_frame(lac, protocol.WRITE_LAC_MULTI)[4:],
              protocol.Response(txn_id=bad, op=protocol.ADD_ENTRIES, status=protocol.FENCED).SerializeToString(),
              protocol.ok_frame(w, protocol.ADD_ENTRIES)[4:],   # the wrong op: a misfit, still outstanding
              protocol.ok_frame(999, protocol.ADD_ENTRIES)[4:]]  # matches nothing
    adds = txns.answer(frames, lambda r, exc: misfits.append(str(exc)), traced.append)
    assert adds == 2   # the OK frame and the failed one
    assert (multi.oks, multi.responses) == (1, []) and (lacs.oks, lacs.responses) == (1, [])
    assert failed.oks == 0 and [r.status for r in failed.responses] == [protocol.FENCED]
    assert wrong.oks == 0 and wrong.responses == []
    assert "request was ADD_ENTRY" in misfits[0] and "matches no request" in misfits[1]
    assert list(txns) == [w] and traced == []


def test_a_callback_without_answered_ok_gets_the_response_of_an_ok_answer() -> None:
    txns: protocol.ClientTxns[object] = protocol.ClientTxns()
    got: list[tuple[int, int]] = []
    txn = txns.add_next(protocol.ADD_ENTRIES, lambda r: got.append((r.txn_id, r.status)))
    assert txns.answer([protocol.ok_frame(txn, protocol.ADD_ENTRIES)[4:]], lambda r, e: None) == 1  # type: ignore[arg-type]
    assert got == [(txn, protocol.OK)] and len(txns) == 0
