"""bookie.wire: the framing and the Outbox both the bookie and the hub use, on a fake transport."""

from collections.abc import Callable

import bookie.protocol
from bookie.proto import bookie_pb2 as pb
from bookie.wire import FrameDecoder, Outbox, encode_frame


class Transport:
    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []
        self.closing = False

    def writelines(self, data: list[bytes]) -> None:
        self.writes.append(list(data))

    def is_closing(self) -> bool:
        return self.closing


def test_bookie_protocol_still_exports_the_framing() -> None:
    assert bookie.protocol.FrameDecoder is FrameDecoder and bookie.protocol.encode_frame is encode_frame
    frame = encode_frame(pb.Request(txn_id=3))
    assert [pb.Request.FromString(f).txn_id for f in FrameDecoder().feed(frame * 2)] == [3, 3]


def test_a_scheduled_outbox_flushes_once_per_schedule_and_at_once_past_flush_bytes() -> None:
    scheduled: list[Callable[[], None]] = []
    out = Outbox(schedule=scheduled.append, flush_bytes=10)
    t = Transport()
    out.attach(t)
    out.send(b"abc")
    out.send(b"def")
    assert len(scheduled) == 1 and t.writes == [] and out.queued_bytes == 6
    out.send(b"ghijk")                     # 11 bytes wait: written now
    assert t.writes == [[b"abc", b"def", b"ghijk"]] and out.queued_bytes == 0
    scheduled[0]()                         # the end-of-turn flush finds nothing
    assert len(t.writes) == 1
    out.send(b"x")
    assert len(scheduled) == 2
    scheduled[1]()
    assert t.writes[-1] == [b"x"]


def test_sends_without_flush_bytes_wait_for_the_one_scheduled_flush() -> None:
    scheduled: list[Callable[[], None]] = []
    out = Outbox(schedule=scheduled.append)   # flush_bytes 0: no write before the end of the turn
    t = Transport()
    out.attach(t)
    for i in range(100):
        out.send(bytes(1000 + i % 2))
    assert len(scheduled) == 1 and t.writes == [] and out.queued_bytes == 100_050 and len(out) == 100
    scheduled[0]()
    assert len(t.writes) == 1 and len(t.writes[0]) == 100 and out.queued_bytes == 0
    out.send(b"next turn")                     # a send after the flush schedules the next one
    assert len(scheduled) == 2


def test_an_outbox_joins_the_parts_of_a_small_write_and_keeps_those_of_a_large_one() -> None:
    out = Outbox(join_bytes=8)
    t = Transport()
    out.attach(t)
    out.put(b"abc")
    out.put_all([b"de", b"fgh"], 5)          # 8 bytes: one joined part
    out.flush()
    out.put(b"single")                       # one part: as it is
    out.flush()
    out.put_all([b"abcd", b"efghi"], 9)      # past join_bytes: the parts themselves (no copy)
    out.flush()
    assert t.writes == [[b"abcdefgh"], [b"single"], [b"abcd", b"efghi"]] and out.queued_bytes == 0
    plain = Outbox()                         # join_bytes 0 (the default): never joined
    plain.attach(t)
    plain.put_all([b"a", b"b"], 2)
    plain.flush()
    assert t.writes[-1] == [b"a", b"b"]


def test_a_detached_outbox_drops_what_it_held() -> None:
    scheduled: list[Callable[[], None]] = []
    out = Outbox(schedule=scheduled.append)
    t = Transport()
    out.attach(t)
    out.send(b"late")
    out.detach()
    for flush in scheduled:
        flush()
    assert t.writes == [] and len(out) == 0


def test_txn_table_numbers_requests_from_1_wraps_past_2_64_and_skips_outstanding_ids() -> None:
    from bookie.wire import TxnTable
    from bookie.wire.txns import TXN_ID_MASK

    table: TxnTable[str] = TxnTable()
    assert table.take("a") == 1 and table.take("b") == 2 and len(table) == 2
    assert table.forget(1) == "a" and table.forget(1) is None and 1 not in table and 2 in table
    table._next = TXN_ID_MASK - 1                # almost 2**64 requests later: 2 is still outstanding
    assert table.take("c") == TXN_ID_MASK        # the last id, then 0 is skipped (reserved) and 2 too
    assert table.take("d") == 1 and table.take("e") == 3
    assert sorted(table) == [1, 2, 3, TXN_ID_MASK]
    assert sorted(table.drain_values()) == ["b", "c", "d", "e"] and len(table) == 0


def test_outbox_send_all_queues_several_frames_like_send() -> None:
    scheduled: list[Callable[[], None]] = []
    out = Outbox(schedule=scheduled.append, flush_bytes=10)
    t = Transport()
    out.attach(t)
    out.send_all([b"ab", b"cd"], 4)
    assert len(scheduled) == 1 and t.writes == [] and out.queued_bytes == 4 and len(out) == 2
    out.send_all([b"efg", b"hij"], 6)     # 10 bytes wait: written now
    assert t.writes == [[b"ab", b"cd", b"efg", b"hij"]] and out.queued_bytes == 0
    out.send_all([b"k"], 1)
    scheduled[-1]()
    assert t.writes[-1] == [b"k"]
