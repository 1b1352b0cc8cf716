"""A small group of one writing connection is committed at the end of its read; several writers share groups.

The bookie commits the group a read opened before that read's callback
returns when its connection is the only one that writes (the answers leave
with the read's flush); once two connections write, groups are committed
in a later loop turn, so that writes read in one turn share one group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from bookie import group_commit
from bookie import protocol as proto
from bookie.errors import BKError
from bookie.server import BookieServer
from bookie.server_connection import BookieServerProtocol
from bookie.testing import RawBookieClient
from tests.bookie.conftest import WAIT, add_req

pytestmark = pytest.mark.timeout(60)


def watch_reads(conn: BookieServerProtocol, commits: Callable[[], int]) -> list[tuple[int, int]]:
    """Record, for each read of ``conn``, the journal's commits before and after its ``data_received``."""
    seen: list[tuple[int, int]] = []
    served = conn.data_received

    def data_received(data: bytes) -> None:
        before = commits()
        served(data)
        seen.append((before, commits()))

    conn.data_received = data_received  # type: ignore[method-assign]
    return seen


async def test_a_lone_writer_s_add_is_committed_and_answered_within_its_read(server: BookieServer,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_commit, "_INLINE_SYNC", 60.0)   # small groups written on the loop, however slow the disk
    client = await RawBookieClient.connect(server.address)
    try:
        assert (await client.call(add_req(1, 0))).status == proto.OK
        (conn,) = server.connections
        journal = server.storage.journal
        reads = watch_reads(conn, lambda: journal.commits)
        sent: list[int] = []
        writelines = conn.outbox.transport.writelines  # type: ignore[union-attr]

        def write(frames: list[bytes]) -> None:
            sent.append(len(reads))   # the reads served before this answer left
            writelines(frames)

        conn.outbox.transport.writelines = write  # type: ignore[union-attr,method-assign]
        for entry_id in range(1, 4):
            assert (await client.call(add_req(1, entry_id))).status == proto.OK
        assert reads == [(1, 2), (2, 3), (3, 4)]   # each add's group committed before its read returned
        assert sent == [0, 1, 2]                  # each answer written by its read's flush, not a later turn
        assert server.adders == 1
        assert server.storage.read_entry(1, 3)[0] == 3
        lost = asyncio.Event()
        connection_lost = conn.connection_lost

        def lose(exc: Exception | None) -> None:
            connection_lost(exc)
            lost.set()

        conn.connection_lost = lose  # type: ignore[method-assign]
    finally:
        await client.close()
    await asyncio.wait_for(lost.wait(), WAIT)
    assert server.adders == 0   # a writer gone: the next lone writer commits at its reads' end again


async def test_two_writers_adds_read_in_one_loop_turn_share_a_group(server: BookieServer) -> None:
    first = await RawBookieClient.connect(server.address)
    second = await RawBookieClient.connect(server.address)
    try:
        assert (await first.call(add_req(1, 0))).status == proto.OK
        assert (await second.call(add_req(2, 0))).status == proto.OK
        assert server.adders == 2
        journal = server.storage.journal
        before = journal.commits
        loop = asyncio.get_running_loop()
        answers: list[asyncio.Future[proto.Response | BKError]] = [loop.create_future(), loop.create_future()]
        first.submit(add_req(1, 1), answers[0].set_result)    # both written in this loop turn: the bookie
        second.submit(add_req(2, 1), answers[1].set_result)   # reads them in one turn
        done = await asyncio.wait_for(asyncio.gather(*answers), WAIT)
        assert [a.status for a in done if isinstance(a, proto.Response)] == [proto.OK, proto.OK]
        assert journal.commits == before + 1   # one group for both connections' adds
    finally:
        await first.close()
        await second.close()


async def test_an_answer_ready_in_a_read_leaves_before_the_journal_write_of_its_adds(
        server: BookieServer, monkeypatch: pytest.MonkeyPatch) -> None:
    client = await RawBookieClient.connect(server.address)
    try:
        assert (await client.call(add_req(1, 0))).status == proto.OK
        (conn,) = server.connections
        events: list[str] = []
        transport = conn.outbox.transport
        assert transport is not None
        writelines, append = transport.writelines, server.storage.journal.writer.append

        def write(frames: list[bytes]) -> None:
            events.append(f"write {len(frames)}")
            writelines(frames)

        def journal_write(data: bytes) -> object:
            events.append("journal")
            return append(data)

        monkeypatch.setattr(transport, "writelines", write)
        monkeypatch.setattr(server.storage.journal.writer, "append", journal_write)
        loop = asyncio.get_running_loop()
        answers: list[asyncio.Future[proto.Response | BKError]] = [loop.create_future(), loop.create_future()]
        client.submit(proto.read_request(0, 1, 0), answers[0].set_result)   # one read: answered at once
        client.submit(add_req(1, 1), answers[1].set_result)                 # and an add: after the journal
        done = await asyncio.wait_for(asyncio.gather(*answers), WAIT)
        assert [a.status for a in done if isinstance(a, proto.Response)] == [proto.OK, proto.OK]
        assert events == ["write 1", "journal", "write 1"]
    finally:
        await client.close()
