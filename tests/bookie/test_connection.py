"""The client connection pool against a real bookie process: reuse, loss, reconnect, pre-encoded adds."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from bookie import errors as proto_errors
from bookie import protocol, tracing
from bookie.connection import FLUSH_BYTES, BookieConnection, BookieConnectionPool
from bookie.digest import encode_entry, master_key
from bookie.errors import BKError, BookieUnavailableError
from bookie.testing import BookieProcess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_pool_reuses_reconnects_and_names_unreachable_bookies(shared_bookie: BookieProcess) -> None:
    pool = BookieConnectionPool(connect_timeout=2.0)
    addr = shared_bookie.address
    try:
        assert pool.connected(addr) is None
        conn = await pool.get(addr)
        assert pool.connected(addr) is conn and await pool.get(addr) is conn
        pending = conn.send(protocol.read_lac_request(0, 424242))
        conn.close()
        with pytest.raises(BookieUnavailableError):
            await asyncio.wait_for(pending, 5)
        assert conn.is_closed and pool.connected(addr) is None
        again = await pool.get(addr)
        assert again is not conn
        resp = await again.request(protocol.read_lac_request(again.next_txn_id(), 424242), timeout=5)
        assert resp.status in (protocol.NO_LEDGER, protocol.OK)
        dead = f"127.0.0.1:{_free_port()}"
        with pytest.raises(BookieUnavailableError, match=dead):
            await pool.get(dead)
    finally:
        pool.close()


async def test_pre_encoded_adds_are_answered_in_any_order(shared_bookie: BookieProcess) -> None:
    pool = BookieConnectionPool()
    try:
        conn = await pool.get(shared_bookie.address)
        key = master_key(b"conn-test")
        answers: dict[int, protocol.Response | BKError] = {}
        all_in = asyncio.get_running_loop().create_future()

        def answered(result: protocol.Response | BKError) -> None:
            assert isinstance(result, protocol.Response)
            answers[result.entry_id] = result
            if len(answers) == 50 and not all_in.done():
                all_in.set_result(None)

        for e in range(50):
            body = protocol.add_request_body(77001, e, key, encode_entry(77001, e, e - 1, e + 1, b"x"))
            conn.submit_add(body, answered)
        await asyncio.wait_for(all_in, 10)
        assert sorted(answers) == list(range(50))
        assert all(isinstance(r, protocol.Response) and r.status == protocol.OK for r in answers.values())
        resp = await conn.request(protocol.read_request(conn.next_txn_id(), 77001, 49), timeout=5)
        assert protocol.raise_for_status(resp).body == encode_entry(77001, 49, 48, 50, b"x")
    finally:
        pool.close()


async def test_pool_flush_writes_queued_requests_without_waiting_for_the_loop_turn(
        shared_bookie: BookieProcess) -> None:
    pool = BookieConnectionPool()
    try:
        conn = await pool.get(shared_bookie.address)
        pending = conn.send(protocol.read_lac_request(conn.next_txn_id(), 424243))
        assert conn._outbox.queued_bytes > 0      # queued for the end of this loop turn
        pool.flush()
        assert conn._outbox.queued_bytes == 0     # written now
        resp = await asyncio.wait_for(pending, 5)
        assert resp.status in (protocol.NO_LEDGER, protocol.OK)
    finally:
        pool.close()


class ScriptedBookie:
    """An in-process bookie that records each request frame and answers adds OK (or as ``old``, without
    ADD_ENTRIES: UNKNOWN_OP, as a bookie of an earlier version; or ``fail_entry``: that add UNAUTHORIZED)."""

    def __init__(self, *, old: bool = False, fail_entry: int = -1, multi: bool = False,
                 lac_multi: bool = False) -> None:
        self.old = old
        self.multi = multi   # serves ADD_ENTRIES_MULTI (else UNKNOWN_OP, as a bookie of an earlier version)
        self.lac_multi = lac_multi   # serves WRITE_LAC_MULTI (else UNKNOWN_OP); WRITE_LAC always
        self.fail_entry = fail_entry
        self.seen: list[protocol.Request] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    def _add(self, txn_id: int, ledger_id: int, entry_id: int) -> protocol.Response:
        exc = proto_errors.UnauthorizedError("no") if entry_id == self.fail_entry else None
        return protocol.add_response(txn_id, ledger_id, entry_id, exc)

    def _answer(self, req: protocol.Request) -> protocol.Response:
        if req.op == protocol.ADD_ENTRY:
            return self._add(req.txn_id, req.ledger_id, req.entry_id)
        if req.op == protocol.ADD_ENTRIES and not self.old:
            answers = [self._add(0, req.ledger_id, protocol.ENTRY_HEADER.unpack_from(p)[1]) for p in req.entries]
            bad = [a for a in answers if a.status != protocol.OK]
            if not bad:
                return protocol.Response(txn_id=req.txn_id, op=protocol.ADD_ENTRIES)
            return protocol.Response(txn_id=req.txn_id, op=protocol.ADD_ENTRIES, status=bad[0].status,
                                     message=bad[0].message, adds=answers)
        if req.op == protocol.ADD_ENTRIES_MULTI and self.multi:
            answers = [self._add(0, *protocol.ENTRY_HEADER.unpack_from(p)[:2]) for p in req.entries]
            bad = [a for a in answers if a.status != protocol.OK]
            if not bad:
                return protocol.Response(txn_id=req.txn_id, op=req.op)
            return protocol.Response(txn_id=req.txn_id, op=req.op, status=bad[0].status, message=bad[0].message,
                                     adds=answers)
        if req.op == protocol.WRITE_LAC:
            resp = protocol.response_to(req)
            resp.lac = req.lac
            return resp
        if req.op == protocol.WRITE_LAC_MULTI and self.lac_multi:
            return protocol.Response(txn_id=req.txn_id, op=req.op)
        return protocol.response_to(req, protocol.UNKNOWN_OP, f"unknown op {req.op}")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = protocol.FrameDecoder(protocol.DEFAULT_MAX_FRAME_SIZE)
        while data := await reader.read(1 << 16):
            for frame in decoder.feed(data):
                req = protocol.parse_request(frame)
                self.seen.append(req)
                writer.write(protocol.encode_frame(self._answer(req)))
        writer.close()


LEDGER = protocol.AddBodies(5, b"k" * 20)


def _payloads(n: int, size: int = 10, ledger_id: int = 5) -> list[bytes]:
    return [encode_entry(ledger_id, e, e - 1, (e + 1) * size, bytes([e % 256]) * size) for e in range(n)]


Outcome = tuple[int, int, str] | BKError


async def _submit_all(conn: BookieConnection, payloads: list[bytes],
                      ledger: protocol.AddBodies = LEDGER) -> list[Outcome]:
    """``submit_entry`` of every payload (entry ids 0, 1, ...) in one loop turn; each add's outcome, in order."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[Outcome]] = []
    for e, payload in enumerate(payloads):
        fut: asyncio.Future[Outcome] = loop.create_future()
        # the OK answer object is shared by a frame's adds: read it in the callback
        conn.submit_entry(ledger, e, payload, lambda r, f=fut: f.set_result(r if isinstance(r, BKError) else
                                                                             (r.entry_id, r.status, r.message)))
        futures.append(fut)
    return list(await asyncio.wait_for(asyncio.gather(*futures), 10))


async def test_the_adds_of_one_turn_leave_as_one_add_entries_frame_per_ledger() -> None:
    bookie = ScriptedBookie()
    async with bookie as address:
        conn = await BookieConnection.connect(address)
        try:
            payloads = _payloads(5)
            got = await _submit_all(conn, payloads)
            assert got == [(e, protocol.OK, "") for e in range(5)]
            (frame,) = bookie.seen
            assert (frame.op, frame.ledger_id, frame.master_key, list(frame.entries)) == (
                protocol.ADD_ENTRIES, 5, b"k" * 20, payloads)
            other = protocol.AddBodies(6, b"j" * 20, recovery=True)
            loop = asyncio.get_running_loop()
            done: list[asyncio.Future[Outcome]] = [loop.create_future() for _ in range(3)]
            for i, (ledger, payload) in enumerate([(LEDGER, _payloads(1)[0]), (other, _payloads(1, ledger_id=6)[0]),
                                                   (other, _payloads(2, ledger_id=6)[1])]):
                conn.submit_entry(ledger, i and i - 1, payload,
                                  lambda r, f=done[i]: f.set_result(r if isinstance(r, BKError) else
                                                                    (r.entry_id, r.status, r.message)))
            assert await asyncio.wait_for(asyncio.gather(*done), 10) == [(0, protocol.OK, ""), (0, protocol.OK, ""),
                                                                         (1, protocol.OK, "")]
            assert [(r.op, r.ledger_id, r.recovery, len(r.entries)) for r in bookie.seen[1:]] == [
                (protocol.ADD_ENTRY, 5, False, 0), (protocol.ADD_ENTRIES, 6, True, 2)]   # one add alone: ADD_ENTRY
            assert bookie.seen[1].body == _payloads(1)[0] and bookie.seen[1].master_key == b"k" * 20
            assert conn.add_silence(loop.time()) == 0.0   # nothing outstanding
        finally:
            conn.close()


async def test_a_bookie_without_add_entries_gets_the_adds_one_by_one() -> None:
    bookie = ScriptedBookie(old=True)
    async with bookie as address:
        conn = await BookieConnection.connect(address)
        try:
            payloads = _payloads(3)
            assert await _submit_all(conn, payloads) == [(e, protocol.OK, "") for e in range(3)]
            assert [r.op for r in bookie.seen] == [protocol.ADD_ENTRIES] + [protocol.ADD_ENTRY] * 3
            assert [(r.ledger_id, r.entry_id, r.master_key, r.body) for r in bookie.seen[1:]] == [
                (5, e, b"k" * 20, payloads[e]) for e in range(3)]
            assert not conn.batch_adds
            assert await _submit_all(conn, _payloads(2)) == [(e, protocol.OK, "") for e in range(2)]
            assert [r.op for r in bookie.seen[4:]] == [protocol.ADD_ENTRY] * 2   # and from then on
        finally:
            conn.close()


async def test_each_add_of_a_frame_gets_its_own_answer_when_one_fails() -> None:
    async with ScriptedBookie(fail_entry=1) as address:
        conn = await BookieConnection.connect(address)
        try:
            got = await _submit_all(conn, _payloads(3))
            assert got == [(0, protocol.OK, ""), (1, protocol.UNAUTHORIZED, "no"), (2, protocol.OK, "")]
        finally:
            conn.close()


async def test_adds_not_framed_yet_fail_with_the_connection_and_large_ones_leave_early() -> None:
    bookie = ScriptedBookie()
    async with bookie as address:
        conn = await BookieConnection.connect(address)
        outcomes: list[object] = []
        for e, payload in enumerate(_payloads(3)):
            conn.submit_entry(LEDGER, e, payload, outcomes.append)
        conn.close()                                 # before the end of the turn: nothing was framed
        assert len(outcomes) == 3 and all(isinstance(o, BookieUnavailableError) for o in outcomes)
        conn = await BookieConnection.connect(address)
        try:
            big = _payloads(3, size=40 * 1024)
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            answered: list[int] = []

            def on_answer(r: protocol.Response | BKError) -> None:
                assert isinstance(r, protocol.Response) and r.status == protocol.OK
                answered.append(r.entry_id)
                if len(answered) == 3:
                    done.set_result(None)

            conn.submit_entry(LEDGER, 0, big[0], on_answer)
            assert conn._outbox.queued_bytes == 0    # waits for the end of the turn
            conn.submit_entry(LEDGER, 1, big[1], on_answer)   # past FLUSH_BYTES: framed and written now
            assert conn._entries == [] and conn._outbox.queued_bytes == 0
            conn.submit_entry(LEDGER, 2, big[2], on_answer)
            await asyncio.wait_for(done, 10)
            assert sorted(answered) == [0, 1, 2]
            assert [(r.op, len(r.entries)) for r in bookie.seen] == [(protocol.ADD_ENTRIES, 2), (protocol.ADD_ENTRY, 0)]
            huge = encode_entry(5, 2, 1, 1, b"h" * FLUSH_BYTES)
            got = await _submit_all(conn, [*_payloads(2), huge])    # a large add: never in a frame of others
            assert [g[:2] for g in got if not isinstance(g, BKError)] == [(0, 0), (1, 0), (2, 0)]
            assert [(r.op, len(r.entries)) for r in bookie.seen[2:]] == [(protocol.ADD_ENTRIES, 2),
                                                                        (protocol.ADD_ENTRY, 0)]
        finally:
            conn.close()


KEY = b"k" * 20
MIXED = [protocol.AddBodies(lid, KEY) for lid in (5, 6, 7)]


async def _submit_mixed(conn: BookieConnection, adds: list[tuple[protocol.AddBodies, int, bytes]]) -> list[Outcome]:
    """``submit_entry`` of each ``(ledger, entry id, payload)`` in one loop turn; ``(ledger, entry, status)`` each."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[Outcome]] = []
    for ledger, entry_id, payload in adds:
        fut: asyncio.Future[Outcome] = loop.create_future()
        conn.submit_entry(ledger, entry_id, payload, lambda r, f=fut: f.set_result(
            r if isinstance(r, BKError) else (r.ledger_id, r.entry_id, r.status)))
        futures.append(fut)
    return list(await asyncio.wait_for(asyncio.gather(*futures), 10))


def _interleaved(ledgers: list[protocol.AddBodies], per_ledger: int) -> list[tuple[protocol.AddBodies, int, bytes]]:
    return [(lg, e, _payloads(per_ledger, ledger_id=lg.ledger_id)[e]) for e in range(per_ledger) for lg in ledgers]


async def test_the_adds_of_several_ledgers_of_one_turn_leave_as_one_frame() -> None:
    bookie = ScriptedBookie(multi=True, fail_entry=2)
    async with bookie as address:
        conn = await BookieConnection.connect(address)
        try:
            adds = _interleaved(MIXED, 2)
            got = await _submit_mixed(conn, adds)
            assert got == [(lg.ledger_id, e, protocol.OK) for lg, e, _ in adds]
            (frame,) = bookie.seen
            assert (frame.op, frame.ledger_id, frame.master_key) == (protocol.ADD_ENTRIES_MULTI, 0, KEY)
            assert list(frame.entries) == [p for _, _, p in adds]        # in submission order
            # one failed add: each add gets its own answer, naming its ledger
            adds = [(lg, 2, _payloads(3, ledger_id=lg.ledger_id)[2]) for lg in MIXED[:2]]
            assert await _submit_mixed(conn, adds) == [(5, 2, protocol.UNAUTHORIZED), (6, 2, protocol.UNAUTHORIZED)]
            assert conn.batch_ledgers and conn.add_silence(asyncio.get_running_loop().time()) == 0.0
        finally:
            conn.close()


async def test_a_bookie_without_add_entries_multi_gets_one_add_entries_per_ledger() -> None:
    bookie = ScriptedBookie()
    async with bookie as address:
        conn = await BookieConnection.connect(address)
        try:
            adds = _interleaved(MIXED, 2)
            assert await _submit_mixed(conn, adds) == [(lg.ledger_id, e, protocol.OK) for lg, e, _ in adds]
            assert [(r.op, r.ledger_id, len(r.entries)) for r in bookie.seen] == [
                (protocol.ADD_ENTRIES_MULTI, 0, 6), (protocol.ADD_ENTRIES, 5, 2), (protocol.ADD_ENTRIES, 6, 2),
                (protocol.ADD_ENTRIES, 7, 2)]
            assert not conn.batch_ledgers and conn.batch_adds
            assert await _submit_mixed(conn, _interleaved(MIXED[:2], 2)) == [
                (lg, e, protocol.OK) for e in range(2) for lg in (5, 6)]
            assert [r.op for r in bookie.seen[4:]] == [protocol.ADD_ENTRIES] * 2    # and from then on
        finally:
            conn.close()


async def test_a_real_bookie_serves_adds_of_several_ledgers_in_one_frame(shared_bookie: BookieProcess) -> None:
    conn = await BookieConnection.connect(shared_bookie.address)
    try:
        base = 7_000_000 + _free_port()     # ledgers of this test only
        ledgers = [protocol.AddBodies(base + i, KEY) for i in range(3)]
        adds = _interleaved(ledgers, 3)
        got = await _submit_mixed(conn, adds)
        assert got == [(lg.ledger_id, e, protocol.OK) for lg, e, _ in adds]
        for lg, e, payload in adds:
            resp = await conn.request(protocol.read_request(conn.next_txn_id(), lg.ledger_id, e), timeout=5)
            assert (resp.status, resp.body) == (protocol.OK, payload)
        # a ledger of another master key in the frame: its add alone fails, naming its ledger
        intruder = protocol.AddBodies(base + 1, b"x" * 20)
        mixed = [(ledgers[0], 3, _payloads(4, ledger_id=base)[3]),
                 (intruder, 3, _payloads(4, ledger_id=base + 1)[3]),
                 (ledgers[2], 3, _payloads(4, ledger_id=base + 2)[3])]
        got = await _submit_mixed(conn, mixed)
        assert got == [(base, 3, protocol.OK), (base + 1, 3, protocol.UNAUTHORIZED), (base + 2, 3, protocol.OK)]
        assert conn.batch_ledgers
    finally:
        conn.close()


async def test_watched_adds_leave_in_traced_frames_and_get_the_bookies_stage_times(
        shared_bookie: BookieProcess) -> None:
    """bookie.tracing: a watched add's frame (one ledger, several ledgers, or a lone add, which goes as
    ADD_ENTRIES then) carries Request.trace; the real bookie answers with its stage times, in order."""
    conn = await BookieConnection.connect(shared_bookie.address)
    try:
        base = 8_000_000 + _free_port()
        ledgers = [protocol.AddBodies(base + i, KEY) for i in range(2)]
        cases = [_interleaved(ledgers, 2),                               # ADD_ENTRIES_MULTI
                 [(ledgers[0], 2, _payloads(4, ledger_id=base)[2]),      # ADD_ENTRIES of one ledger
                  (ledgers[0], 3, _payloads(4, ledger_id=base)[3])],
                 [(ledgers[1], 2, _payloads(3, ledger_id=base + 1)[2])]]  # a lone add
        for adds in cases:
            lg, entry_id, _ = adds[-1]
            trace = tracing.AddTrace()
            tracing.watch(lg.ledger_id, entry_id, trace)
            try:
                before = time.monotonic_ns()
                got = await _submit_mixed(conn, adds)
                assert got == [(a.ledger_id, e, protocol.OK) for a, e, _ in adds]
            finally:
                assert tracing.unwatch(lg.ledger_id, entry_id) is trace
            (copy,) = trace.bookies
            assert copy.address == shared_bookie.address
            sent, read, written, acked, ack_read = copy.times
            assert before <= sent <= read <= written <= acked <= ack_read <= time.monotonic_ns()
        assert not tracing.FRAMES and not tracing.WATCHED
        # nothing watched: no traced frame, no times
        got = await _submit_mixed(conn, [(ledgers[0], 4, _payloads(5, ledger_id=base)[4])])
        assert got == [(base, 4, protocol.OK)] and not tracing.FRAMES
    finally:
        conn.close()


async def _submit_lacs(conn: BookieConnection, lacs: list[tuple[int, bytes, int]]) -> list[tuple[int, int, int] | str]:
    """``submit_lac`` each (ledger, master key, LAC) in one loop turn; each one's (ledger, LAC, status) answer."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[tuple[int, int, int] | str]] = []
    for ledger_id, key, lac in lacs:
        fut: asyncio.Future[tuple[int, int, int] | str] = loop.create_future()
        conn.submit_lac(ledger_id, key, lac, lambda r, f=fut: f.set_result(
            type(r).__name__ if isinstance(r, BKError) else (r.ledger_id, r.lac, r.status)))
        futures.append(fut)
    return list(await asyncio.wait_for(asyncio.gather(*futures), 10))


async def test_the_explicit_lacs_of_one_turn_leave_as_one_frame_per_master_key() -> None:
    bookie = ScriptedBookie(lac_multi=True)
    async with bookie as address:
        conn = await BookieConnection.connect(address)
        try:
            lacs = [(5, KEY, 3), (6, KEY, 0), (9, b"o" * 20, 7), (7, KEY, 12)]
            got = await _submit_lacs(conn, lacs)
            assert got == [(5, 3, protocol.OK), (6, 0, protocol.OK), (9, 7, protocol.OK), (7, 12, protocol.OK)]
            multi, single = bookie.seen
            assert (multi.op, multi.master_key, list(multi.lac_ledger_ids), list(multi.lacs)) == (
                protocol.WRITE_LAC_MULTI, KEY, [5, 6, 7], [3, 0, 12])
            assert (single.op, single.ledger_id, single.master_key, single.lac) == (
                protocol.WRITE_LAC, 9, b"o" * 20, 7)   # alone under its key: a plain WRITE_LAC
            assert conn.batch_lacs
        finally:
            conn.close()


async def test_a_bookie_without_write_lac_multi_gets_one_write_lac_per_ledger() -> None:
    bookie = ScriptedBookie()
    async with bookie as address:
        conn = await BookieConnection.connect(address)
        try:
            got = await _submit_lacs(conn, [(5, KEY, 1), (6, KEY, 2)])
            assert got == [(5, 1, protocol.OK), (6, 2, protocol.OK)]
            assert [(r.op, r.ledger_id) for r in bookie.seen] == [
                (protocol.WRITE_LAC_MULTI, 0), (protocol.WRITE_LAC, 5), (protocol.WRITE_LAC, 6)]
            assert not conn.batch_lacs
            assert await _submit_lacs(conn, [(5, KEY, 4), (6, KEY, 5)]) == [(5, 4, protocol.OK), (6, 5, protocol.OK)]
            assert [r.op for r in bookie.seen[3:]] == [protocol.WRITE_LAC] * 2    # and from then on
        finally:
            conn.close()


async def test_queued_lacs_fail_with_their_connection() -> None:
    bookie = ScriptedBookie(lac_multi=True)
    async with bookie as address:
        conn = await BookieConnection.connect(address)
        answers: list[protocol.Response | BKError] = []
        conn.submit_lac(5, KEY, 1, answers.append)
        conn.close()
        assert len(answers) == 1 and isinstance(answers[0], BookieUnavailableError)
        conn.submit_lac(6, KEY, 1, answers.append)     # on a closed connection: at once
        assert len(answers) == 2 and isinstance(answers[1], BookieUnavailableError)


async def test_a_real_bookie_records_the_lacs_of_several_ledgers_in_one_frame(shared_bookie: BookieProcess) -> None:
    conn = await BookieConnection.connect(shared_bookie.address)
    try:
        base = 9_000_000 + _free_port()     # ledgers of this test only
        got = await _submit_lacs(conn, [(base, KEY, 4), (base + 1, KEY, 0), (base + 2, KEY, 9)])
        assert got == [(base, 4, protocol.OK), (base + 1, 0, protocol.OK), (base + 2, 9, protocol.OK)]
        for ledger_id, lac in ((base, 4), (base + 1, 0), (base + 2, 9)):
            resp = await conn.request(protocol.read_lac_request(conn.next_txn_id(), ledger_id), timeout=5)
            assert (resp.status, resp.lac) == (protocol.OK, lac)
        # another master key for a known ledger: the frame fails UNAUTHORIZED, the other LAC is still recorded
        req = protocol.write_lac_multi_request(conn.next_txn_id(), b"x" * 20, [base, base + 3], [6, 2])
        resp = await conn.request(req, timeout=5)
        assert resp.status == protocol.UNAUTHORIZED
        assert (await conn.request(protocol.read_lac_request(conn.next_txn_id(), base), timeout=5)).lac == 4
        assert (await conn.request(protocol.read_lac_request(conn.next_txn_id(), base + 3), timeout=5)).lac == 2
        # a malformed one (ledgers and LACs not pairwise) is refused, and the connection keeps serving
        bad = protocol.Request(txn_id=conn.next_txn_id(), op=protocol.WRITE_LAC_MULTI, master_key=KEY,
                               lac_ledger_ids=[base, base + 1], lacs=[5])
        assert (await conn.request(bad, timeout=5)).status == protocol.BAD_REQUEST
        again = await _submit_lacs(conn, [(base, KEY, 5), (base + 1, KEY, 1)])
        assert again == [(base, 5, protocol.OK), (base + 1, 1, protocol.OK)] and conn.batch_lacs
    finally:
        conn.close()
