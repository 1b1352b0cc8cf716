"""Interleaved bench rounds (``tools.bench.rounds``): the rotated order and the median-of-rounds ratio rows."""

from __future__ import annotations

from typing import Any

from tools.bench.publish import FLOOR, cpu_ratio_lines, p99_lines, publish_ratios, ratio_lines, throughput_target
from tools.bench.queue import queue_target
from tools.bench.rounds import MEDIAN, by_round, rotated


def test_each_round_runs_every_system_once_starting_with_system_r_mod_k() -> None:
    systems = ["quire", "redis", "floor"]
    orders = [rotated(systems, r) for r in range(4)]
    assert orders == [["quire", "redis", "floor"], ["redis", "floor", "quire"], ["floor", "quire", "redis"],
                      ["quire", "redis", "floor"]]
    assert all(sorted(o) == sorted(systems) for o in orders)
    assert [rotated(systems, r)[0] for r in range(3)] == systems    # each system goes first once in k rounds
    assert rotated(["quire"], 5) == ["quire"] and rotated([], 2) == []


def thr(system: str, ops: float, r: int | None, errors: int = 0, **key: Any) -> dict[str, Any]:
    line = {"system": system, "case": "quire E3W2A2" if system == "quire" else system, "mode": "throughput",
            "ops_per_sec": ops, "errors": errors, **key}
    if system == "quire":
        line["config"] = "E3W2A2"
    return line if r is None else {**line, "round": r}


def rated(system: str, r: int, p99: float, cpu: float, errors: int = 0) -> dict[str, Any]:
    line = {"system": system, "case": "quire E3W2A2" if system == "quire" else system, "mode": "fixed_rate",
            "size": 100, "target_rate": 5000, "p99_ms": p99, "server_cpu_us_per_msg": cpu, "errors": errors,
            "round": r}
    if system == "quire":
        line["config"] = "E3W2A2"
    return line


def throughput_ratios(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list(by_round(lambda xs: ratio_lines("publish", xs, ("size",), target=throughput_target), lines, True))


def test_one_round_gives_the_ratio_lines_as_before() -> None:
    lines = [thr("quire", 300.0, 0, size=100), thr(FLOOR, 200.0, 0, size=100)]
    assert throughput_ratios(lines) == list(ratio_lines("publish", lines, ("size",), target=throughput_target))
    untagged = [thr("quire", 300.0, None, size=100), thr(FLOOR, 200.0, None, size=100)]
    (only,) = throughput_ratios(untagged)
    assert only["ratio"] == 1.5 and "stat" not in only and "round" not in only


def test_throughput_ratio_is_the_median_of_the_per_round_ratios_not_of_best_rounds() -> None:
    # round 1's load hit the floor (slow), round 2's hit Quire: best-of-rounds would say 400/100 = 4.0
    quire = [300.0, 310.0, 150.0]
    floor = [200.0, 100.0, 200.0]
    lines = [x for r in range(3) for x in (thr("quire", quire[r], r, size=100), thr(FLOOR, floor[r], r, size=100))]
    rows = throughput_ratios(lines)
    per_round, (med,) = rows[:3], rows[3:]
    assert [x["round"] for x in per_round] == [0, 1, 2]
    assert [x["ratio"] for x in per_round] == [1.5, 3.1, 0.75]
    assert all("stat" not in x for x in per_round)
    assert med == {"bench": "publish", "case": "ratio", "quire": "quire E3W2A2", "vs": FLOOR, "size": 100,
                   "target": 1.0, "ratio": 1.5, "stat": MEDIAN, "rounds": 3, "round_ratios": [1.5, 3.1, 0.75],
                   "meets_target": True}


def test_median_rows_are_per_peer_and_key_and_only_rounds_with_a_ratio_count() -> None:
    lines = []
    for r, (q, redis) in enumerate([(300.0, 200.0), (300.0, 100.0), (300.0, 400.0), (300.0, 300.0)]):
        for n in (1, 4):
            lines += [thr("quire", q, r, consumers=n), thr("redis", redis, r, consumers=n),
                      thr("nats", 150.0, r, consumers=n, errors=1 if r == 0 else 0)]
    rows = list(by_round(lambda xs: ratio_lines("queue", xs, ("consumers",), target=queue_target), lines, True))
    med = {(x["vs"], x["consumers"]): x for x in rows if x.get("stat") == MEDIAN}
    assert set(med) == {(p, n) for p in ("redis", "nats") for n in (1, 4)}
    assert med[("redis", 4)]["ratio"] == 1.25 and med[("redis", 4)]["round_ratios"] == [1.5, 3.0, 0.75, 1.0]
    assert med[("redis", 4)]["target"] == 1.5 and not med[("redis", 4)]["meets_target"]   # issue 29's target
    assert "target" not in med[("redis", 1)]
    assert med[("nats", 1)]["rounds"] == 3            # round 0's NATS run had errors: no ratio that round
    assert len([x for x in rows if "stat" not in x]) == 4 * 4 - 2


def test_p99_and_cpu_median_rows_hold_quire_at_most_the_target_and_a_round_with_errors_spoils_it() -> None:
    q = [(4.0, 240.0), (9.0, 500.0), (5.0, 250.0)]
    f = [(4.0, 200.0), (4.0, 200.0), (4.0, 200.0)]
    lines = [x for r in range(3) for x in (rated("quire", r, *q[r]), rated(FLOOR, r, *f[r]))]
    (*_, p99) = by_round(lambda xs: p99_lines("publish", xs), lines, False)
    assert p99["stat"] == MEDIAN and p99["round_ratios"] == [1.0, 2.25, 1.25] and p99["ratio"] == 1.25
    assert p99["target"] == 1.3 and p99["meets_target"]                 # round 1's outlier does not decide
    assert "quire_p99_ms" not in p99 and "round" not in p99
    (*_, cpu) = by_round(lambda xs: cpu_ratio_lines("publish", xs), lines, False)
    assert cpu["round_ratios"] == [1.2, 2.5, 1.25] and cpu["ratio"] == 1.25 and cpu["meets_target"]
    lines[0]["errors"] = 2                                               # round 0's Quire run had errors
    (*_, cpu) = by_round(lambda xs: cpu_ratio_lines("publish", xs), lines, False)
    assert cpu["ratio"] == 1.25 and not cpu["meets_target"]
    lines[0]["errors"] = 0
    lines[4] = rated("quire", 2, 6.0, 400.0)                             # round 2 over the target too
    (*_, cpu) = by_round(lambda xs: cpu_ratio_lines("publish", xs), lines, False)
    assert cpu["ratio"] == 2.0 and not cpu["meets_target"]


def test_one_closed_loop_round_with_three_fixed_rate_rounds_gives_plain_throughput_ratios() -> None:
    # publish's default with peers: the closed-loop cases once, the fixed-rate ones three times
    lines = [thr("quire", 300.0, 0, size=100), thr(FLOOR, 200.0, 0, size=100)]
    lines += [x for r in range(3) for x in (rated("quire", r, 4.0 + r, 240.0), rated(FLOOR, r, 4.0, 200.0))]
    rows = list(publish_ratios(lines))
    (throughput,) = [x for x in rows if x["case"] == "ratio"]
    assert throughput["ratio"] == 1.5 and "stat" not in throughput and "round" not in throughput
    p99 = [x for x in rows if x["case"] == "p99 ratio"]
    assert [x.get("round") for x in p99] == [0, 1, 2, None] and p99[-1]["stat"] == MEDIAN
    assert p99[-1]["ratio"] == 1.25 and p99[-1]["meets_target"]
    cpu = [x for x in rows if x["case"] == "cpu ratio"]
    assert len(cpu) == 4 and cpu[-1]["ratio"] == 1.2 and cpu[-1]["rounds"] == 3
