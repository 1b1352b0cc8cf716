"""The server's ADD_ENTRY hot path, in process: every check answered with its status, acks in runs.

The adds of one connection are pipelined (submitted in one loop turn, so
they reach the bookie together and are served one after the other by the
fast path), mixed with adds each check must refuse.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bookie import journal
from bookie import protocol as proto
from bookie.digest import encode_entry, master_key
from bookie.server import BookieServer
from bookie.testing import AddEntriesPipeline, AddPipeline, RawBookieClient
from tests.bookie.conftest import KEY, WAIT, add_req, start_server

pytestmark = pytest.mark.timeout(60)

@pytest.fixture
async def client(server: BookieServer) -> AsyncIterator[RawBookieClient]:
    c = await RawBookieClient.connect(server.address)
    yield c
    await c.close()


async def pipelined(client: RawBookieClient, requests: list[proto.Request]) -> list[proto.Response]:
    """Submit every request in one loop turn; their answers in request order."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[Any]] = []
    for req in requests:
        fut = loop.create_future()
        client.submit(req, fut.set_result)
        futures.append(fut)
    return list(await asyncio.wait_for(asyncio.gather(*futures), WAIT))


def break_the_journal(server: BookieServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every journal write of ``server`` fails from now on ("the journal disk is on fire")."""
    def broken(data: bytes) -> None:
        raise OSError("the journal disk is on fire")

    monkeypatch.setattr(server.storage.journal.writer, "append", broken)


def other_entry_payload(ledger_id: int, entry_id: int) -> proto.Request:
    """An add whose payload header names another entry than the request."""
    return proto.add_request(0, ledger_id, entry_id, KEY, encode_entry(ledger_id, entry_id + 7, -1, 4, b"data"))


async def store_one_and_fence_another(client: RawBookieClient) -> None:
    """Ledger 1 holds entry 0; ledger 2 is fenced."""
    assert (await client.call(add_req(1, 0))).status == proto.OK
    fence = proto.read_request(0, 2, proto.LAST_ENTRY, fence=True, master_key=KEY)
    assert (await client.call(fence)).status in (proto.OK, proto.NO_ENTRY)


async def test_every_check_answers_with_its_status(server: BookieServer, client: RawBookieClient) -> None:
    await store_one_and_fence_another(client)
    cases = [
        (add_req(1, 1), proto.OK),
        (add_req(1, 2, key=master_key(b"wrong")), proto.UNAUTHORIZED),
        (add_req(-1, 0), proto.BAD_REQUEST),           # ledger id out of range
        (add_req(1, -5), proto.BAD_REQUEST),           # entry id out of range
        (other_entry_payload(1, 3), proto.BAD_REQUEST),
        (add_req(2, 0), proto.FENCED),
        (add_req(2, 0, recovery=True), proto.OK),      # a recovery add passes the fence
        (add_req(1, 4, lac=3), proto.OK),
    ]
    answers = await pipelined(client, [req for req, _ in cases])
    assert [a.status for a in answers] == [status for _, status in cases]
    for (req, _), answer in zip(cases, answers, strict=True):
        assert (answer.txn_id, answer.op, answer.ledger_id, answer.entry_id) == (
            req.txn_id, proto.ADD_ENTRY, req.ledger_id, req.entry_id)
    requests = server.stats.requests
    assert requests[(proto.ADD_ENTRY, proto.OK)] == 4   # the first add, and three here
    assert requests[(proto.ADD_ENTRY, proto.UNAUTHORIZED)] == 1
    assert requests[(proto.ADD_ENTRY, proto.BAD_REQUEST)] == 3
    assert requests[(proto.ADD_ENTRY, proto.FENCED)] == 1
    assert server.storage.read_lac(1) == 3
    (conn,) = server.connections
    assert conn.state.in_flight == 0


async def test_a_read_only_bookie_refuses_adds_on_the_fast_path(server: BookieServer,
                                                               client: RawBookieClient) -> None:
    server.operator_read_only = True
    answers = await pipelined(client, [add_req(1, 0), add_req(1, 1)])
    assert [a.status for a in answers] == [proto.READ_ONLY, proto.READ_ONLY]
    server.operator_read_only = False
    assert (await client.call(add_req(1, 0))).status == proto.OK
    with pytest.raises(proto.errors.NoSuchEntryError):
        server.storage.read_entry(1, 1)


async def test_a_failed_journal_write_answers_each_add_with_the_error(server: BookieServer,
                                                                     client: RawBookieClient,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert (await client.call(add_req(1, 0))).status == proto.OK
    break_the_journal(server, monkeypatch)
    reqs = [add_req(1, i) for i in range(1, 6)]
    answers = await pipelined(client, reqs)
    assert [a.status for a in answers] == [proto.ERROR] * 5
    assert [(a.txn_id, a.ledger_id, a.entry_id) for a in answers] == [
        (r.txn_id, r.ledger_id, r.entry_id) for r in reqs]
    assert all("on fire" in a.message for a in answers)
    assert server.stats.requests[(proto.ADD_ENTRY, proto.ERROR)] == 5
    (conn,) = server.connections
    assert conn.state.in_flight == 0


async def test_answers_are_the_bytes_protobuf_encodes(server: BookieServer, client: RawBookieClient) -> None:
    payloads = [encode_entry(7, i, i - 1, (i + 1) * 10, b"x" * 10) for i in range(300)]
    run = AddPipeline(*client.encode_adds(7, KEY, payloads), window=50)
    await client.pipeline(run, timeout=WAIT)
    assert run.finished and run.errors == 0   # every answer equal to encode_frame(add_response(...))
    assert len(run.latencies()) == 300
    assert server.storage.read_entry(7, 299) == (299, payloads[299])
    assert server.stats.requests[(proto.ADD_ENTRY, proto.OK)] == 300


async def test_runs_resume_a_connection_held_at_max_pending_requests(tmp_path: Path) -> None:
    srv = await start_server(tmp_path, max_pending_requests=8)
    try:
        c = await RawBookieClient.connect(srv.address)
        payloads = [encode_entry(3, i, i - 1, i + 1, b"y") for i in range(200)]
        run = AddPipeline(*c.encode_adds(3, KEY, payloads), window=200)   # far over the cap
        await c.pipeline(run, timeout=WAIT)
        assert run.finished and run.errors == 0
        (conn,) = srv.connections
        assert conn.state.in_flight == 0 and not conn.state.paused
        await c.close()
    finally:
        await srv.stop()


def add_entries(ledger_id: int, payloads: list[bytes], *, key: bytes = KEY) -> proto.Request:
    """An ADD_ENTRIES of ``payloads`` (encoded entries) to ``ledger_id``."""
    return proto.Request(op=proto.ADD_ENTRIES, ledger_id=ledger_id, master_key=key, entries=payloads)


def payload(ledger_id: int, entry_id: int, lac: int = -1) -> bytes:
    """``add_req``'s payload."""
    return add_req(ledger_id, entry_id, lac=lac).body


async def test_add_entries_stores_every_add_and_answers_once(server: BookieServer, client: RawBookieClient) -> None:
    payloads = [payload(1, i, lac=i - 1) for i in range(5)]
    answer = await client.call(add_entries(1, payloads))
    assert (answer.op, answer.status, list(answer.adds)) == (proto.ADD_ENTRIES, proto.OK, [])
    assert [server.storage.read_entry(1, i)[1] for i in range(5)] == payloads
    assert server.storage.read_lac(1) == 3
    requests = server.stats.requests
    assert requests[(proto.ADD_ENTRY, proto.OK)] == 5            # per add, as if sent singly
    assert requests[(proto.ADD_ENTRIES, proto.OK)] == 1
    (conn,) = server.connections
    assert conn.state.in_flight == 0


async def test_an_add_entries_multi_frame_of_known_ledgers_is_journaled_with_each_ledger_s_highest_lac(
        server: BookieServer, client: RawBookieClient, monkeypatch: pytest.MonkeyPatch) -> None:
    for ledger_id in (1, 2):   # known ledgers: the frame's adds are admitted by one call (GroupCommit.admit_frame)
        assert (await client.call(add_req(ledger_id, 0))).status == proto.OK
    storage = server.storage
    admitted: list[int] = []
    admit_frame = storage.journal.admit_frame

    def spy(*args: Any) -> int:
        admitted.append(admit_frame(*args))
        return admitted[-1]

    monkeypatch.setattr(storage.journal, "admit_frame", spy)
    start = storage.journal.synced
    frame = [payload(1, 1, lac=0), payload(2, 1, lac=0), payload(1, 2, lac=1), payload(2, 2, lac=1),
             payload(1, 3, lac=0)]   # ledger 1's last add carries a lower LAC than the one before it
    answer = await client.call(proto.Request(op=proto.ADD_ENTRIES_MULTI, master_key=KEY, entries=frame))
    assert (answer.op, answer.status, list(answer.adds)) == (proto.ADD_ENTRIES_MULTI, proto.OK, [])
    assert admitted == [len(frame)]   # all five at once
    assert (storage.read_lac(1), storage.read_lac(2)) == (1, 1)
    assert (storage.last_entry_id(1), storage.last_entry_id(2)) == (3, 2)
    assert [storage.read_entry(1, i)[1] for i in (1, 2, 3)] == frame[0::2]
    assert server.stats.requests[(proto.ADD_ENTRY, proto.OK)] == 2 + 5
    records = list(journal.read_journal(storage.journal_dir, start))   # what a restart replays
    assert [(r.ledger_id, r.entry_id, r.value) for r in records if r.kind == journal.ADD] == [
        (1, 1, frame[0]), (2, 1, frame[1]), (1, 2, frame[2]), (2, 2, frame[3]), (1, 3, frame[4])]
    # each ledger's highest LAC is in the entry header of one of these adds: no LAC record repeats it (issue 34),
    # the replay reads it from the headers
    assert [r for r in records if r.kind == journal.LAC] == []
    header_lacs: dict[int, int] = {}
    for r in records:
        if r.kind == journal.ADD:
            header_lacs[r.ledger_id] = max(header_lacs.get(r.ledger_id, -1), proto.ENTRY_HEADER.unpack_from(r.value)[2])
    assert header_lacs == {1: 1, 2: 1}


async def test_add_entries_answers_each_failed_add_and_keeps_the_others(server: BookieServer,
                                                                        client: RawBookieClient) -> None:
    await store_one_and_fence_another(client)
    cases = [
        (payload(1, 1), 1, proto.OK),
        (payload(2, 2), 2, proto.BAD_REQUEST),      # an entry of another ledger
        (b"short", -1, proto.BAD_REQUEST),          # shorter than an entry header
        (payload(1, 4), 4, proto.OK),
    ]
    answer = await client.call(add_entries(1, [p for p, _, _ in cases]))
    assert answer.op == proto.ADD_ENTRIES and answer.status == proto.BAD_REQUEST   # the first failure's
    assert "payload is of entry 2:2" in answer.message
    assert [(a.op, a.ledger_id, a.entry_id, a.status) for a in answer.adds] == [
        (proto.ADD_ENTRY, 1, entry_id, status) for _, entry_id, status in cases]
    assert server.storage.read_entry(1, 4)[1] == cases[3][0]       # the good adds were stored
    wrong_key = await client.call(add_entries(1, [payload(1, 5)], key=master_key(b"wrong")))
    assert wrong_key.status == proto.UNAUTHORIZED and "wrong master key" in wrong_key.message
    fenced = await client.call(add_entries(2, [payload(2, 0), payload(2, 1)]))
    assert [a.status for a in fenced.adds] == [proto.FENCED] * 2
    recovery = proto.Request(op=proto.ADD_ENTRIES, ledger_id=2, master_key=KEY, recovery=True,
                             entries=[payload(2, 0)])
    assert (await client.call(recovery)).status == proto.OK          # a recovery add passes the fence
    requests = server.stats.requests
    assert requests[(proto.ADD_ENTRY, proto.OK)] == 4                 # the first add, two here and the recovery
    assert requests[(proto.ADD_ENTRY, proto.BAD_REQUEST)] == 2 and requests[(proto.ADD_ENTRY, proto.FENCED)] == 2
    assert (await client.call(add_req(1, 5))).status == proto.OK       # the connection keeps serving
    (conn,) = server.connections
    assert conn.state.in_flight == 0


async def test_add_entries_on_a_read_only_bookie_or_without_entries_is_refused(server: BookieServer,
                                                                               client: RawBookieClient) -> None:
    empty = await client.call(add_entries(1, []))
    assert empty.status == proto.BAD_REQUEST and "without entries" in empty.message
    server.operator_read_only = True
    answer = await client.call(add_entries(1, [payload(1, 0), payload(1, 1)]))
    assert answer.status == proto.READ_ONLY and [a.status for a in answer.adds] == [proto.READ_ONLY] * 2
    server.operator_read_only = False
    assert (await client.call(add_entries(1, [payload(1, 0), payload(1, 1)]))).status == proto.OK


async def test_a_failed_journal_write_fails_every_add_of_an_add_entries(server: BookieServer,
                                                                        client: RawBookieClient,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert (await client.call(add_req(1, 0))).status == proto.OK
    break_the_journal(server, monkeypatch)
    answer = await client.call(add_entries(1, [payload(1, i) for i in range(1, 4)]))
    assert answer.status == proto.ERROR and "on fire" in answer.message
    assert [(a.entry_id, a.status) for a in answer.adds] == [(i, proto.ERROR) for i in range(1, 4)]
    (conn,) = server.connections
    assert conn.state.in_flight == 0


async def test_a_pipeline_of_add_entries_frames_is_stored_in_full(server: BookieServer,
                                                                  client: RawBookieClient) -> None:
    payloads = [encode_entry(9, i, i - 1, (i + 1) * 10, b"z" * 10) for i in range(500)]
    run = AddEntriesPipeline(payloads, proto.AddBodies(9, KEY).ledger_fields, 64, client.conn.next_txn_id)
    await client.pipeline(run, timeout=WAIT)
    assert run.finished and run.errors == 0 and len(run.latencies()) == 500
    assert server.storage.read_entry(9, 499) == (499, payloads[499])
    assert server.stats.requests[(proto.ADD_ENTRY, proto.OK)] == 500


async def test_single_adds_and_add_entries_frames_of_one_read_are_answered_by_one_run(
        server: BookieServer, client: RawBookieClient) -> None:
    assert (await client.call(add_req(1, 0))).status == proto.OK
    journal_ = server.storage.journal
    waiters: list[int] = []
    complete = journal_._complete

    def count_waiters(batch: Any) -> None:
        waiters.append(len(batch.waiters))
        complete(batch)

    journal_._complete = count_waiters  # type: ignore[method-assign]
    before = dict(server.stats.requests)
    answers = await pipelined(client, [add_req(1, 1), add_entries(1, [payload(1, 2), payload(1, 3)]),
                                       add_req(1, 4)])
    assert [(a.op, a.status) for a in answers] == [(proto.ADD_ENTRY, proto.OK), (proto.ADD_ENTRIES, proto.OK),
                                                   (proto.ADD_ENTRY, proto.OK)]
    assert waiters and all(n == 1 for n in waiters)   # each group: one waiter for the connection's run
    requests = server.stats.requests
    assert requests[(proto.ADD_ENTRY, proto.OK)] - before[(proto.ADD_ENTRY, proto.OK)] == 4
    assert requests[(proto.ADD_ENTRIES, proto.OK)] - before.get((proto.ADD_ENTRIES, proto.OK), 0) == 1
    assert [server.storage.read_entry(1, i)[0] for i in range(5)] == [0, 1, 2, 3, 4]
    (conn,) = server.connections
    assert conn.state.in_flight == 0


async def test_a_failed_journal_write_answers_each_add_of_a_mixed_run_with_the_error(
        server: BookieServer, client: RawBookieClient, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (await client.call(add_req(1, 0))).status == proto.OK
    before = dict(server.stats.requests)
    break_the_journal(server, monkeypatch)
    single, frame, last = await pipelined(client, [add_req(1, 1), add_entries(1, [payload(1, 2), payload(1, 3)]),
                                                   add_req(1, 4)])
    assert (single.op, single.status, single.entry_id) == (proto.ADD_ENTRY, proto.ERROR, 1)
    assert (frame.op, frame.status) == (proto.ADD_ENTRIES, proto.ERROR) and "on fire" in frame.message
    assert [(a.entry_id, a.status) for a in frame.adds] == [(2, proto.ERROR), (3, proto.ERROR)]
    assert (last.op, last.status, last.entry_id) == (proto.ADD_ENTRY, proto.ERROR, 4)
    assert server.stats.requests[(proto.ADD_ENTRY, proto.OK)] == before[(proto.ADD_ENTRY, proto.OK)]
    assert (proto.ADD_ENTRIES, proto.OK) not in server.stats.requests
    (conn,) = server.connections
    assert conn.state.in_flight == 0
