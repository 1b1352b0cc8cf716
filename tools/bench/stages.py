"""The per-stage breakdown of ``quire bench publish``'s fixed-rate run, and the CPU of each process.

    sampler = StageSampler(every=100)
    submit = sampler.wrap(client, topic, body, plain_submit)   # 1 publish in 100 goes as publish_traced
    ...                                                         # the run
    rows = stage_rows(sampler.samples, **fields)               # one JSON row per stage
    before = process_cpu(named_pids); ...; cpu_rows(before, process_cpu(named_pids), count, **fields)

How the times are collected (``hub.tracing``, ``bookie.tracing``): a sampled
publish carries ``PublishRequest.trace``; the hub marks the ADD_ENTRIES
frames of its entry, each bookie answers those with its own stage times,
and the hub returns every time in the publish's answer. All are
``time.monotonic_ns()`` (CLOCK_MONOTONIC), comparable across the processes
because the bench runs them on one machine. The stages, in the order a
message passes them (``STAGES``; ``bookie_*`` stages count each of the
message's copies, W per message):

* ``client_to_hub``: client queued the request -> hub parsed it
* ``hub_to_add_sent``: hub parsed it -> its entry framed for the first bookie
* ``bookie_wire_in``: entry framed for a bookie -> that bookie parsed it
* ``bookie_journal``: bookie parsed it -> its journal group written (O_DSYNC)
* ``bookie_answer``: journal written -> the answer queued for the socket
* ``bookie_wire_out``: answer queued -> the hub read it
* ``quorum_to_answer``: the add completed (last ack of the quorum read) -> the publish's answer queued
* ``hub_to_client``: answer queued -> client read it
* ``total``: client queued -> client read

A row per stage has the samples' count, p50/p90/p99/max in µs and a
histogram (``hist_us``: samples per power-of-two bucket, keyed by its upper
bound in µs).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["STAGES", "StageSampler", "cpu_rows", "process_cpu", "stage_rows", "stages_of"]

STAGES = ("client_to_hub", "hub_to_add_sent", "bookie_wire_in", "bookie_journal", "bookie_answer",
          "bookie_wire_out", "quorum_to_answer", "hub_to_client", "total")


class StageSampler:
    """Sends every ``every``-th publish of each wrapped submitter as a traced one and keeps what came back."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.samples: list[Any] = []   # hub.client_publish.TracedPublish
        self.errors = 0

    def wrap(self, client: Any, topic: bytes, body: bytes,
             plain: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
        if self.every <= 0:
            return plain
        count = 0

        def submit() -> Awaitable[Any]:
            nonlocal count
            count += 1
            if count % self.every:
                return plain()
            return self._traced(client, topic, body)

        return submit

    async def _traced(self, client: Any, topic: bytes, body: bytes) -> Any:
        got = await client.publish_traced(topic, body)
        self.samples.append(got)
        return got.seq_id


def stages_of(sample: Any) -> dict[str, list[float]]:
    """One traced publish's stage durations in µs (``bookie_*``: one per copy)."""
    t = sample.trace
    us = 1e-3
    out: dict[str, list[float]] = {s: [] for s in STAGES}
    out["client_to_hub"].append((t.hub_read_ns - sample.sent_ns) * us)
    out["total"].append((sample.read_ns - sample.sent_ns) * us)
    out["hub_to_client"].append((sample.read_ns - t.answer_sent_ns) * us)
    out["quorum_to_answer"].append((t.answer_sent_ns - t.hub_ack_read_ns) * us)
    if t.add_sent_ns:
        out["hub_to_add_sent"].append((t.add_sent_ns - t.hub_read_ns) * us)
    for b in t.bookies:
        if not b.ack_read_ns:   # this copy's answer came after the quorum's (not read yet)
            continue
        out["bookie_wire_in"].append((b.read_ns - b.add_sent_ns) * us)
        out["bookie_journal"].append((b.journal_written_ns - b.read_ns) * us)
        out["bookie_answer"].append((b.ack_sent_ns - b.journal_written_ns) * us)
        out["bookie_wire_out"].append((b.ack_read_ns - b.ack_sent_ns) * us)
    return out


def _hist(values: list[float]) -> dict[str, int]:
    hist: dict[str, int] = {}
    for v in values:
        bound = 1 << max(0, int(max(v, 1.0)).bit_length())   # the smallest power of two above v
        hist[str(bound)] = hist.get(str(bound), 0) + 1
    return dict(sorted(hist.items(), key=lambda kv: int(kv[0])))


def _pct(ordered: list[float], q: float) -> float:
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def stage_rows(samples: list[Any], **fields: Any) -> Iterator[dict[str, Any]]:
    """One row per stage (``"case": "stage"``) over ``samples``; ``fields`` go in every row."""
    merged: dict[str, list[float]] = {s: [] for s in STAGES}
    for sample in samples:
        for stage, values in stages_of(sample).items():
            merged[stage].extend(values)
    for stage in STAGES:
        values = sorted(merged[stage])
        row: dict[str, Any] = {"bench": "publish", "case": "stage", "stage": stage, **fields,
                               "samples": len(values)}
        if values:
            row.update(p50_us=_pct(values, 0.5), p90_us=_pct(values, 0.9), p99_us=_pct(values, 0.99),
                       max_us=round(values[-1], 1), hist_us=_hist(values))
        yield row


# -- the CPU of each process ------------------------------------------------------------------------


def _proc_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` (``/proc/PID/stat``); ``OSError`` if it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def process_cpu(pids: dict[str, int]) -> dict[str, tuple[float, float]]:
    """``{name: (user s, system s)}`` for each named process, and ``client`` (this process) itself."""
    out: dict[str, tuple[float, float]] = {}
    for name, pid in pids.items():
        try:
            out[name] = _proc_times(pid)
        except OSError:
            continue
    t = os.times()
    out["client"] = (t.user, t.system)
    return out


def cpu_rows(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], count: int,
             **fields: Any) -> Iterator[dict[str, Any]]:
    """One row per process (``"case": "cpu"``): user and system seconds apart, and per message in µs."""
    for name, (user1, sys1) in after.items():
        if name not in before:
            continue
        user0, sys0 = before[name]
        user, system = user1 - user0, sys1 - sys0
        row: dict[str, Any] = {"bench": "publish", "case": "cpu", "process": name, **fields,
                               "user_s": round(user, 3), "system_s": round(system, 3)}
        if count:
            row.update(user_us_per_msg=round(user * 1e6 / count, 1), system_us_per_msg=round(system * 1e6 / count, 1),
                       cpu_us_per_msg=round((user + system) * 1e6 / count, 1))
        yield row
