"""Memory kept per message (issue 35): the pieces that used to grow, and a soak of real processes.

The soak (``test_rss_stays_flat_under_steady_publishing``) runs a LocalCluster
(one hub, three bookies, E3 W2 A2) with ``tools.bench.soak`` and checks every
process's anonymous RSS after warm-up against a bound a 50 bytes per message
leak would exceed; its docstring says how the bound is computed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from bookie import protocol
from hub.entry_index import BLOCK, EntryIndex
from hub.log_reader import KNOWN_PER_LEDGER
from hub.persistence import TopicLog
from tools.bench.publish import Runner
from tools.bench.soak import read_rss, slope, slope_line, soak


def anon_rss() -> int:
    return read_rss(os.getpid())[1]


def test_add_bodies_keeps_nothing_per_add_and_encodes_as_protobuf_does() -> None:
    bodies = protocol.AddBodies(77, b"k" * 20, recovery=True)
    for entry_id in (0, 1, 127, 128, 2**40, 2**63 - 1):
        for payload in (b"", b"x", os.urandom(300)):
            assert bodies.body(entry_id, payload) == protocol.add_request_body(
                77, entry_id, b"k" * 20, payload, recovery=True)
    with pytest.raises(ValueError):
        bodies.body(-1, b"x")
    payload = os.urandom(4096)
    bodies.body(0, payload)
    before = anon_rss()
    for entry_id in range(5000):
        bodies.body(entry_id, payload)
    # a protobuf Request reused with body set per add kept every payload: 5000 x 4 KiB = 20 MiB
    assert anon_rss() - before < 4 << 20


def test_entry_index_finds_the_entry_holding_every_seq_id() -> None:
    idx = EntryIndex()
    assert idx.entry_of(1) == -1 and len(idx) == 0
    firsts: list[int] = []
    seq = 10
    for entry in range(5 * BLOCK + 3):
        count = 300 if entry % 17 == 5 else 1 + entry % 7      # some counts past one byte's worth
        firsts.append(seq)
        idx.append(seq, count)
        seq += count
    assert len(idx) == len(firsts)
    assert idx.entry_of(9) == -1
    for entry, first in enumerate(firsts):
        end = firsts[entry + 1] if entry + 1 < len(firsts) else seq
        assert {idx.entry_of(s) for s in (first, (first + end - 1) // 2, end - 1)} == {entry}
    assert idx.entry_of(seq + 1000) == len(firsts) - 1     # past the end: the last entry, as bisect gave
    small = EntryIndex()
    for entry in range(10_000):
        small.append(1 + 3 * entry, 3)
    assert small.nbytes < 1.2 * len(small) and small.entry_of(3 * 9_999 + 2) == 9_999
    with pytest.raises(ValueError, match="expected"):
        idx.append(seq + 1, 1)
    with pytest.raises(ValueError):
        idx.append(seq, 0)


def test_known_entry_starts_of_a_ledger_stay_bounded() -> None:
    from hub.conf import load_hub_conf

    log = TopicLog(b"t", None, None, load_hub_conf(None, {}))  # type: ignore[arg-type]
    for entry in range(3 * KNOWN_PER_LEDGER):
        log._learn(5, entry, 1 + 2 * entry)
    known = log._known[5]
    assert len(known) <= KNOWN_PER_LEDGER
    assert known == sorted(known) and known[0] == (1, 0)


def test_slope_and_slope_line() -> None:
    from tools.bench.soak import Sample

    assert slope([1.0], [5.0]) == 0.0
    assert slope([0.0, 1.0, 2.0], [1.0, 3.0, 5.0]) == pytest.approx(2.0)
    samples = [Sample(float(t), "hub", 1, 100_000_000 + 50 * 1000 * t, 50_000_000 + 50 * 1000 * t, 1000 * t)
               for t in range(0, 60, 5)]
    line = slope_line("hub", samples, 20.0)
    assert line["anon_bytes_per_msg"] == pytest.approx(50.0) and not line["meets_target"]
    assert line["messages"] == 35_000 and line["samples"] == 8


LEAK_BYTES_PER_MSG = 50
"""The smallest leak the soak test must catch (issue 35)."""


@pytest.mark.slow
@pytest.mark.parametrize("subscribers", [0, 1])
def test_rss_stays_flat_under_steady_publishing(tmp_path: Path, subscribers: int) -> None:
    """About 2 500 msg/s of 200-byte messages to 4 topics for 50 s, E3 W2 A2 (and then with one subscriber).

    After a 20 s warm-up, each process (the hub, each bookie, this client)
    may change its anonymous RSS by at most half of what a leak of
    ``LEAK_BYTES_PER_MSG`` bytes per message would add over the messages
    actually published after the warm-up (the machine may be too busy for
    the rate; the bound follows the count), plus 2 MiB of allocator slack.
    At 2 500 msg/s that is 30 s x 2 500 x 25 B + 2 MiB, about 4 MiB, where a
    50-byte leak adds 3.6 MiB on top of any noise, and the old 460-byte one
    35 MiB. The growth is also measured as a least-squares slope over the
    samples, which must stay under half the leak rate. Anonymous memory,
    not VmRSS: a bookie's file-backed pages are its LMDB store mapped in,
    growing with the data as the disk does (page cache, reclaimable).
    """
    args = argparse.Namespace(minutes=50 / 60, rate=2500, topics=4, size=200, interval=2.0, exactly_once=False)
    from tools.bench.publish import quire_cluster

    with Runner() as loop:
        cluster = quire_cluster(str(tmp_path), 3, 2, 2)
        loop.run(cluster.start())
        try:
            load, samples, _ = loop.run(soak(cluster, args, subscribers))
        finally:
            loop.run(cluster.stop())
    assert load.errors == 0, load.first_error
    if subscribers:
        assert load.delivered >= load.published
    warmup = 20.0
    processes = {s.process for s in samples}
    assert processes == {"hub", "bookie-0", "bookie-1", "bookie-2", "client"}
    for name in sorted(processes):
        line = slope_line(name, [s for s in samples if s.process == name], warmup)
        messages = line["messages"]
        assert messages >= 20_000, f"only {messages} messages after warm-up: too few to judge"
        bound = messages * LEAK_BYTES_PER_MSG // 2 + (2 << 20)
        assert line["anon_change_bytes"] < bound, (name, line)
        assert line["anon_bytes_per_msg"] < LEAK_BYTES_PER_MSG / 2, (name, line)


def test_dedup_keeps_at_most_max_producers_and_never_one_in_flight() -> None:
    from hub.dedup import ProducerDedup

    answers: list[tuple[int, BaseException | None]] = []
    d = ProducerDedup(window=3, max_producers=2)
    assert d.admit(b"busy", 1, lambda s, e: answers.append((s, e)))      # in flight: never forgotten
    for i in range(10):
        d.stored(f"p{i}".encode(), 1, 100 + i)
        d.stored(f"p{i}".encode(), 2, 200 + i)
    assert d.producers <= 2 and d.evicted == 9 and len(d) == 1 + 2    # busy's pending + p9's window
    d.settle(b"busy", 1, 7, None)
    assert answers == [] and len(d) == 3
    assert not d.admit(b"busy", 1, lambda s, e: answers.append((s, e))) and answers == [(7, None)]
    for sequence_id in range(100):
        d.stored(b"p9", sequence_id, sequence_id)
    assert len(d) == 1 + 3         # every window holds at most ``window`` sequence ids
