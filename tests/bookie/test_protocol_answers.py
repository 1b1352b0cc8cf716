"""``protocol.ok_answer``: the ledger client's hand-parsed OK answers, byte for byte against protobuf (issue 32)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bookie import protocol

_OPS = [int(v) for v in protocol.OperationType.values() if v]   # not OP_UNSPECIFIED (left to protobuf)
_STATUSES = [int(v) for v in protocol.StatusCode.values()]
_INT64 = st.integers(-(2**63), 2**63 - 1)


def _read_by_protobuf(body: bytes) -> tuple[int, int, int] | None:
    """What the hand parser must return for ``body``: the ids when protobuf reads a plain OK answer, else None."""
    try:
        r = protocol.parse_response(body)
    except protocol.errors.MalformedFrameError:
        return None
    plain = protocol.Response(txn_id=r.txn_id, op=r.op, ledger_id=r.ledger_id, entry_id=r.entry_id)
    if r != plain or r.status != protocol.OK or not r.txn_id:
        return None
    return r.txn_id, r.op, r.entry_id


@given(txn_id=st.integers(1, 2**64 - 1), ledger_id=_INT64, entry_id=_INT64)
def test_an_add_entry_ok_answer_reads_as_protobuf_reads_it(txn_id: int, ledger_id: int, entry_id: int) -> None:
    body = protocol.Response(txn_id=txn_id, op=protocol.ADD_ENTRY, ledger_id=ledger_id,
                             entry_id=entry_id).SerializeToString()
    got = protocol.ok_answer(body)
    if txn_id < 2**63 and ledger_id >= 0 and entry_id >= 0:   # every answer a bookie sends to an add
        assert got == (txn_id, protocol.ADD_ENTRY, entry_id)
        if txn_id and ledger_id >= 0:
            assert protocol.add_ok_frame(txn_id, ledger_id, entry_id)[4:] == body
    else:
        assert got is None   # left to protobuf


@given(txn_id=st.integers(1, 2**63 - 1), op=st.sampled_from(_OPS))
def test_an_ok_frame_reads_as_its_txn_and_op(txn_id: int, op: int) -> None:
    body = protocol.ok_frame(txn_id, op)[4:]
    assert body == protocol.Response(txn_id=txn_id, op=op).SerializeToString()
    assert protocol.ok_answer(body) == (txn_id, op, 0) == _read_by_protobuf(body)


@given(txn_id=st.integers(0, 2**64 - 1), op=st.sampled_from(_OPS), status=st.sampled_from(_STATUSES),
       ledger_id=_INT64, entry_id=_INT64, lac=_INT64, message=st.sampled_from(["", "no"]),
       trace=st.lists(st.integers(0, 2**64 - 1), max_size=3), body=st.binary(max_size=3))
def test_a_response_with_anything_more_than_ids_is_left_to_protobuf(
        txn_id: int, op: int, status: int, ledger_id: int, entry_id: int, lac: int, message: str,
        trace: list[int], body: bytes) -> None:
    frame = protocol.Response(txn_id=txn_id, op=op, status=status, ledger_id=ledger_id, entry_id=entry_id,
                              lac=lac, message=message, trace_ns=trace, body=body).SerializeToString()
    got = protocol.ok_answer(frame)
    assert got is None or got == _read_by_protobuf(frame)
    if status != protocol.OK or message or trace or body or lac or not txn_id:
        assert got is None


_FIELDS = st.sampled_from([
    b"\x08\x05", b"\x08\x85\x01", b"\x08\x80\x00",           # txn id, also an overlong varint
    b"\x08" + b"\xff" * 9 + b"\x01",                            # a 10-byte txn id
    b"\x10\x01", b"\x10\x07", b"\x10\x00", b"\x10\x81\x01",   # op
    b"\x18\x00", b"\x18\x02",                                   # status, even an explicit OK
    b"\x20\x07", b"\x20" + b"\xff" * 9 + b"\x01",               # ledger id, -1
    b"\x28\x09", b"\x28\x80\x80\x01", b"\x28" + b"\xff" * 9 + b"\x01",   # entry id, -1
    b"\x38\x01", b"\x5a\x00", b"\x62\x00", b"\x68\x01", b"\x78\x01",     # lac, message, adds, trace, unknown
    b"\x08", b"\x28", b"\x28\x80", b"\xff",                     # truncated, broken
])


@given(st.lists(_FIELDS, max_size=6))
def test_whatever_the_bytes_an_answer_read_by_hand_is_the_one_protobuf_reads(parts: list[bytes]) -> None:
    frame = b"".join(parts)
    got = protocol.ok_answer(frame)
    assert got is None or got == _read_by_protobuf(frame)


def test_client_txns_hand_an_ok_answer_to_answered_ok_and_the_rest_a_response() -> None:
    class Acks:
        def __init__(self) -> None:
            self.oks: list[int] = []
            self.responses: list[protocol.Response] = []

        def answered_ok(self, entry_id: int) -> None:
            self.oks.append(entry_id)

        def __call__(self, response: protocol.Response) -> None:
            self.responses.append(response)

    txns: protocol.ClientTxns[Acks] = protocol.ClientTxns()
    acks, plain, failed, lacs = Acks(), Acks(), Acks(), Acks()
    add = txns.add_next(protocol.ADD_ENTRY, acks)
    multi = txns.add_next(protocol.ADD_ENTRIES_MULTI, acks)
    lac = txns.add_next(protocol.WRITE_LAC_MULTI, lacs)
    bad = txns.add_next(protocol.ADD_ENTRY, failed)
    wrong = txns.add_next(protocol.ADD_ENTRY, plain)
    traced: list[protocol.Response] = []
    misfits: list[str] = []
    frames = [protocol.add_ok_frame(add, 3, 41)[4:], protocol.ok_frame(multi, protocol.ADD_ENTRIES_MULTI)[4:],
              protocol.ok_frame(lac, protocol.WRITE_LAC_MULTI)[4:],
              protocol.Response(txn_id=bad, op=protocol.ADD_ENTRY, status=protocol.FENCED).SerializeToString(),
              protocol.ok_frame(wrong, protocol.ADD_ENTRIES)[4:],   # the wrong op: a misfit, still outstanding
              protocol.add_ok_frame(999, 3, 1)[4:]]                  # matches nothing
    adds = txns.answer(frames, lambda r, exc: misfits.append(str(exc)), traced.append)
    assert adds == 3   # the two OK adds and the failed one
    assert acks.oks == [41, 0] and acks.responses == []
    assert lacs.oks == [0]
    assert failed.oks == [] and [r.status for r in failed.responses] == [protocol.FENCED]
    assert plain.oks == [] and plain.responses == []
    assert "request was ADD_ENTRY" in misfits[0] and "matches no request" in misfits[1]
    assert list(txns) == [wrong] and traced == []


def test_a_callback_without_answered_ok_gets_the_response_of_an_ok_answer() -> None:
    txns: protocol.ClientTxns[object] = protocol.ClientTxns()
    got: list[tuple[int, int]] = []
    txn = txns.add_next(protocol.ADD_ENTRY, lambda r: got.append((r.ledger_id, r.entry_id)))
    assert txns.answer([protocol.add_ok_frame(txn, 8, 9)[4:]], lambda r, e: None) == 1   # type: ignore[arg-type]
    assert got == [(8, 9)] and len(txns) == 0
