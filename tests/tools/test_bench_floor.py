"""The python floor (tools.bench.floor) as real processes, and its place in the publish bench's lines."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.tools.test_bench_peers import _gone
from tools.bench.floor import KEY, TRACE_BIT, FloorPeer, floor_publishers, frame, split_acks, split_frames, traced_ack
from tools.bench.peers import PeerStartError
from tools.bench.publish import FLOOR, PEERS, Runner, closed_loop, ratio_lines, throughput_target
from tools.bench.stages import StageSampler, stage_rows


def test_split_frames_keeps_a_partial_frame_for_the_next_read() -> None:
    data = frame(7, b"abc") + frame(2**64 - 1, b"") + frame(9, b"xyz")
    buf = bytearray(data[:-2])
    assert split_frames(buf) == [(7, b"abc"), (2**64 - 1, b"")]
    buf += data[-2:]
    assert split_frames(buf) == [(9, b"xyz")] and not buf


def test_every_publish_is_synced_on_two_of_three_sinks_and_stop_ends_all_four(tmp_path: Path) -> None:
    body = os.urandom(100)

    async def load(url: str) -> tuple[int, int]:
        async with floor_publishers(url, 2, body, "t") as submits:
            out = await closed_loop(submits, 100, 16)
        return len(out.latencies), out.errors

    peer = FloorPeer(tmp_path).start()
    pids = peer.pids
    try:
        assert len(pids) == 4 and peer.pid == pids[-1] and peer.url.endswith(f":{peer.port}")
        with Runner() as loop:
            done, errors = loop.run(asyncio.wait_for(load(peer.url), 30))
    finally:
        peer.stop()
    assert (done, errors) == (200, 0)
    contents = [peer.sink_file(i).read_bytes() for i in range(3)]
    messages = 200 + 2  # and one warm-up publish per publisher
    assert sum(map(len, contents)) == 2 * messages * len(body)
    # Each file is whole payloads back to back; message k went to sinks k % 3 and (k + 1) % 3.
    assert [c.count(body) for c in contents] == [135, 135, 134]
    assert all(c == body * (len(c) // len(body)) for c in contents)
    assert peer.pids == [] and peer.pid is None and all(_gone(p) for p in pids)
    peer.stop()  # twice is harmless


def test_a_sink_that_cannot_open_its_file_is_reported_with_its_log(tmp_path: Path) -> None:
    class Unwritable(FloorPeer):
        def sink_file(self, i: int) -> Path:
            return self.data_dir / "no-such-dir" / f"sink-{i}.journal"

    peer = Unwritable(tmp_path)
    with pytest.raises(PeerStartError, match="floor sink-0 exited with status") as err:
        peer.start()
    assert "No such file or directory" in str(err.value)  # the log tail says why
    assert peer.pids == []


def test_the_floor_is_a_default_peer_and_the_yardstick_of_the_throughput_target() -> None:
    assert "floor" in PEERS
    lines = [
        {"system": "quire", "case": "quire E3W2A2", "config": "E3W2A2", "mode": "throughput", "size": 100,
         "ops_per_sec": 300.0},
        {"system": FLOOR, "case": FLOOR, "mode": "throughput", "size": 100, "ops_per_sec": 600.0},
        {"system": "redis", "case": "redis", "mode": "throughput", "size": 100, "ops_per_sec": 200.0},
    ]
    floor, redis = sorted(ratio_lines("publish", lines, ("size",), target=throughput_target), key=lambda x: x["vs"])
    assert floor["vs"] == FLOOR and floor["ratio"] == 0.5
    assert floor["target"] == 1.0 and not floor["meets_target"]        # issue 32: at least the floor's
    assert redis["vs"] == "redis" and redis["ratio"] == 1.5 and "target" not in redis   # issue 32 sets none


def test_split_acks_reads_bare_and_traced_acks_and_keeps_a_partial_one() -> None:
    data = KEY.pack(3) + traced_ack(4, (10, 20, 30)) + KEY.pack(5) + traced_ack(2**62, ())
    buf = bytearray(data[:-3])
    assert split_acks(buf) == [(3, None), (4, (10, 20, 30)), (5, None)]
    buf += data[-3:]
    assert split_acks(buf) == [(2**62, ())] and not buf
    assert KEY.unpack_from(traced_ack(4, ()))[0] == 4 | TRACE_BIT


def test_a_traced_floor_answers_sampled_publishes_with_each_process_stage_times(tmp_path: Path) -> None:
    """``FloorPeer(trace=True)``: 1 publish in 5 comes back with the relay's and both sinks' times, in the
    order a message passes them; the others are answered as before."""
    body = os.urandom(100)
    sampler = StageSampler(every=5)

    async def load(url: str) -> tuple[int, int]:
        async with floor_publishers(url, 2, body, "t", sampler) as submits:
            out = await closed_loop(submits, 50, 8)
        return len(out.latencies), out.errors

    peer = FloorPeer(tmp_path, trace=True).start()
    try:
        with Runner() as loop:
            assert loop.run(asyncio.wait_for(load(peer.url), 30)) == (100, 0)
    finally:
        peer.stop()
    assert len(sampler.samples) == 20
    for got in sampler.samples:
        t = got.trace
        assert got.sent_ns <= t.hub_read_ns <= t.add_sent_ns <= t.hub_ack_read_ns <= t.answer_sent_ns <= got.read_ns
        assert len(t.bookies) == 2
        for b in t.bookies:
            assert t.add_sent_ns <= b.read_ns <= b.journal_written_ns <= b.ack_sent_ns <= b.ack_read_ns
    rows = {r["stage"]: r for r in stage_rows(sampler.samples, system=FLOOR)}
    assert rows["bookie_journal"]["samples"] == 40 and rows["total"]["samples"] == 20
    assert sum(len(peer.sink_file(i).read_bytes()) for i in range(3)) == 2 * (100 + 2) * len(body)
