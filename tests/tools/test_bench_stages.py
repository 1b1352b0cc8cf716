"""The per-stage breakdown rows of ``quire bench publish`` (tools.bench.stages) from known stage times."""

from __future__ import annotations

import asyncio
import os

from hub.client_publish import TracedPublish
from hub.proto import pubsub_pb2 as pb
from tools.bench.stages import STAGES, StageSampler, cpu_rows, process_cpu, stage_rows, stages_of

US = 1000   # ns


def sample(base: int) -> TracedPublish:
    t = pb.PublishTrace(hub_read_ns=base + 100 * US, add_sent_ns=base + 150 * US, hub_ack_read_ns=base + 900 * US,
                        answer_sent_ns=base + 920 * US)
    t.bookies.add(bookie="b0", add_sent_ns=base + 150 * US, read_ns=base + 200 * US,
                  journal_written_ns=base + 700 * US, ack_sent_ns=base + 710 * US, ack_read_ns=base + 800 * US)
    t.bookies.add(bookie="b1", add_sent_ns=base + 160 * US, read_ns=base + 300 * US,
                  journal_written_ns=base + 850 * US, ack_sent_ns=base + 860 * US, ack_read_ns=base + 900 * US)
    t.bookies.add(bookie="b2", add_sent_ns=base + 170 * US)   # answered after the quorum: not counted
    return TracedPublish(seq_id=1, trace=t, sent_ns=base, read_ns=base + 1000 * US)


def test_each_stage_is_the_time_between_two_stamps_and_each_read_copy_counts() -> None:
    got = stages_of(sample(10**12))
    assert got == {"client_to_hub": [100.0], "hub_to_add_sent": [50.0], "bookie_wire_in": [50.0, 140.0],
                   "bookie_journal": [500.0, 550.0], "bookie_answer": [10.0, 10.0], "bookie_wire_out": [90.0, 40.0],
                   "quorum_to_answer": [20.0], "hub_to_client": [80.0], "total": [1000.0]}


def test_a_row_per_stage_with_percentiles_and_a_power_of_two_histogram() -> None:
    rows = list(stage_rows([sample(i * 10**9) for i in range(10)], system="quire", rate=5000))
    assert [r["stage"] for r in rows] == list(STAGES)
    journal = rows[STAGES.index("bookie_journal")]
    assert journal["samples"] == 20 and journal["system"] == "quire" and journal["case"] == "stage"
    assert journal["p50_us"] == 550.0 and journal["max_us"] == 550.0
    assert journal["hist_us"] == {"512": 10, "1024": 10}
    assert next(iter(stage_rows([]))) == {"bench": "publish", "case": "stage", "stage": "client_to_hub", "samples": 0}


def test_the_sampler_traces_one_publish_in_n() -> None:
    calls: list[str] = []

    class Client:
        async def publish_traced(self, topic: bytes, body: bytes) -> TracedPublish:
            calls.append("traced")
            return sample(0)

    async def plain() -> int:
        calls.append("plain")
        return 0

    sampler = StageSampler(every=3)
    submit = sampler.wrap(Client(), b"t", b"x", plain)

    async def run() -> None:
        for _ in range(6):
            await submit()

    asyncio.run(run())
    assert calls == ["plain", "plain", "traced"] * 2 and len(sampler.samples) == 2
    assert StageSampler(every=0).wrap(Client(), b"t", b"x", plain) is plain


def test_cpu_rows_keep_user_and_system_apart_per_process() -> None:
    before = process_cpu({"me": os.getpid()})
    sum(i * i for i in range(200_000))
    rows = list(cpu_rows(before, process_cpu({"me": os.getpid()}), 1000, system="quire"))
    assert [r["process"] for r in rows] == ["me", "client"]
    assert all(r["user_s"] >= 0 and r["system_s"] >= 0 and "cpu_us_per_msg" in r for r in rows)
    assert process_cpu({"gone": 2**22 + 12345}).keys() == {"client"}
