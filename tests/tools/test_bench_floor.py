"""The python floor (tools.bench.floor) as real processes, and its place in the publish bench's lines."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.tools.test_bench_peers import _gone
from tools.bench.floor import FloorPeer, floor_publishers, frame, split_frames
from tools.bench.peers import PeerStartError
from tools.bench.publish import FLOOR, PEERS, Runner, closed_loop, ratio_lines


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


def test_the_floor_is_a_default_peer_and_its_ratio_line_has_no_target() -> None:
    assert "floor" in PEERS
    lines = [
        {"system": "quire", "case": "quire E3W2A2", "mode": "throughput", "size": 100, "ops_per_sec": 300.0},
        {"system": FLOOR, "case": FLOOR, "mode": "throughput", "size": 100, "ops_per_sec": 600.0},
        {"system": "redis", "case": "redis", "mode": "throughput", "size": 100, "ops_per_sec": 200.0},
    ]
    floor, redis = sorted(ratio_lines("publish", lines, ("size",)), key=lambda x: x["vs"])
    assert floor["vs"] == FLOOR and floor["ratio"] == 0.5
    assert "target" not in floor and "meets_target" not in floor
    assert redis["vs"] == "redis" and redis["meets_target"]
