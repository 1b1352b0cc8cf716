"""Check a recorded publish/deliver history against Quire's delivery guarantee.

The guarantee checked (Jepsen style, over the whole history of one topic):

* **no lost acknowledged publish** — every publish the hub acknowledged is
  delivered to every subscriber after the network healed;
* **exactly once at the handler** — no body reaches a subscriber's handler
  twice, and one (producer, sequence id) is never stored under two seq ids
  (producer deduplication holds across retries);
* **no split-brain** — no seq id is acknowledged for two different bodies
  (two hubs never both acknowledge writes to one topic position);
* **dense seq ids** — a subscriber sees consecutive seq ids (no hole in the log);
* **per-producer order** — a producer's publishes, made one after another, get
  increasing seq ids and are delivered in that order.

Publishes whose outcome the client never learned (a timeout, a reset) may be
delivered or not; a delivered body nobody ever attempted is a phantom and fails.

History format (the workload writes one JSON object per line):
``{"op": "ack", "producer": P, "n": N, "body": B, "seq": S, "t": T}`` for an
acknowledged publish, ``{"op": "attempt", "producer": P, "n": N, "body": B}``
before every attempt, and ``{"op": "deliver", "sub": SUB, "seq": S, "body": B}``
for every message a subscriber's handler received.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GUARANTEE = ("every acknowledged publish delivered exactly once to every subscriber after healing; "
             "no seq id acknowledged for two bodies; seq ids dense; per-producer order")


@dataclass
class Verdict:
    """What the checker found: ``problems`` is empty when the history satisfies the guarantee."""

    acked: int = 0
    delivered: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    duplicated: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict[str, Any]:
        return {"acked": self.acked, "delivered": self.delivered, "lost": self.lost, "duplicated": self.duplicated,
                "problems": len(self.problems)}


def read_history(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every JSON line of ``paths`` (a missing file is an empty history; a torn last line is ignored)."""
    ops: list[dict[str, Any]] = []
    for path in paths:
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            try:
                ops.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a process killed mid-write
    return ops


def check(ops: list[dict[str, Any]], subscribers: Iterable[str]) -> Verdict:
    """Check ``ops`` (see the module docstring) for the named ``subscribers``."""
    v = Verdict()
    acks = [o for o in ops if o["op"] == "ack"]
    attempted = {o["body"] for o in ops if o["op"] in ("attempt", "ack")}
    v.acked = len(acks)

    # no split-brain: one body per acknowledged seq id
    body_of_seq: dict[int, str] = {}
    for a in acks:
        prev = body_of_seq.setdefault(a["seq"], a["body"])
        if prev != a["body"]:
            v.problems.append(f"split-brain: seq id {a['seq']} acknowledged for {prev!r} and {a['body']!r}")
    # dedup: one (producer, n) -> one seq id
    seq_of_pub: dict[tuple[str, int], int] = {}
    for a in acks:
        key = (a["producer"], a["n"])
        prev_seq = seq_of_pub.setdefault(key, a["seq"])
        if prev_seq != a["seq"]:
            v.duplicated += 1
            v.problems.append(f"stored twice: producer {key[0]} message {key[1]} acknowledged as seq ids "
                              f"{prev_seq} and {a['seq']}")
    # per-producer order of acknowledgements
    by_producer: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (producer, n), seq in seq_of_pub.items():
        by_producer[producer].append((n, seq))
    for producer, pairs in by_producer.items():
        pairs.sort()
        for (n1, s1), (n2, s2) in itertools.pairwise(pairs):
            if s2 <= s1:
                v.problems.append(f"order: producer {producer} message {n2} got seq id {s2} <= {s1} of message {n1}")

    acked_bodies = {a["body"] for a in acks}
    for sub in subscribers:
        got = [(o["seq"], o["body"]) for o in ops if o["op"] == "deliver" and o["sub"] == sub]
        v.delivered[sub] = len(got)
        counts: dict[str, int] = defaultdict(int)
        for _, body in got:
            counts[body] += 1
        for body, c in counts.items():
            if c > 1:
                v.duplicated += 1
                v.problems.append(f"duplicate: {sub} received {body!r} {c} times")
            if body not in attempted:
                v.problems.append(f"phantom: {sub} received {body!r}, which no producer published")
        missing = sorted(acked_bodies - counts.keys())
        v.lost += len(missing)
        if missing:
            v.problems.append(f"lost: {len(missing)} acknowledged publishes never reached {sub}: "
                              f"{missing[:10]}{' ...' if len(missing) > 10 else ''}")
        seqs = [s for s, _ in got]
        for s1, s2 in itertools.pairwise(seqs):
            if s2 != s1 + 1:
                v.problems.append(f"not dense: {sub} received seq id {s2} after {s1}")
                break
        for s, body in got:
            if s in body_of_seq and body_of_seq[s] != body:
                v.problems.append(f"split-brain: {sub} received seq id {s} as {body!r}, "
                                  f"acknowledged as {body_of_seq[s]!r}")
        position = {body: i for i, (_, body) in enumerate(got)}
        for producer, pairs in by_producer.items():
            delivered_ns = [n for n, _ in pairs if f"{producer}-{n}" in position]
            order = [position[f"{producer}-{n}"] for n in delivered_ns]
            if order != sorted(order):
                v.problems.append(f"order: {sub} received producer {producer}'s messages out of order")
    return v


def assert_history(ops: list[dict[str, Any]], subscribers: Iterable[str], scenario: str, seed: int) -> Verdict:
    """``check`` and fail with every problem, the guarantee and the seed when the history breaks it."""
    v = check(ops, subscribers)
    if not v.ok:
        lines = "\n  ".join(v.problems[:30])
        raise AssertionError(f"scenario {scenario} seed {seed} broke the guarantee ({GUARANTEE}):\n  {lines}\n"
                             f"summary: {json.dumps(v.summary())}\nrerun with QUIRE_PARTITION_SEED={seed}")
    return v


# --- work queues (SHARED subscriptions, DESIGN 6b) --------------------------------------------------

QUEUE_GUARANTEE = ("every acknowledged publish handed out at least once and acknowledged; a message handed out "
                   "again only if it was unacknowledged when a consumer, connection or owner failed (or its ack "
                   "was within the ack persistence interval before an owner failed); nothing dead-lettered twice")


@dataclass
class QueueVerdict:
    """What ``check_queue`` found: ``problems`` is empty when the history keeps ``QUEUE_GUARANTEE``."""

    published: int = 0
    received: int = 0
    redelivered: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict[str, Any]:
        return {"published": self.published, "received": self.received, "redelivered": self.redelivered,
                "problems": len(self.problems)}


def check_queue(ops: list[dict[str, Any]], *, ack_slack: float = 0.0) -> QueueVerdict:
    """Check a work-queue history.

    Ops: ``{"op": "ack", "seq": S, ...}`` an acknowledged publish; ``{"op": "recv", "consumer": C, "seq": S,
    "t": T}`` a message handed to a consumer's application; ``{"op": "acked", "consumer": C, "seq": S, "t": T}``
    the application acknowledged it; ``{"op": "fault", "kind": "consumer"|"owner", "consumer": C, "t": T,
    "until": U}`` a consumer (its connection) or the topic's owner failed at T (``until``: a fault that lasts, a
    hub stopping, ends at U; default T); ``{"op": "dlq", "seq": S}`` a message found on the
    dead-letter topic. ``ack_slack``: seconds before an owner fault within which acks may be lost (the ack
    persistence interval).
    """
    v = QueueVerdict()
    published = {o["seq"] for o in ops if o["op"] == "ack"}
    v.published = len(published)
    recvs = [o for o in ops if o["op"] == "recv"]
    v.received = len(recvs)
    acked_at: dict[int, float] = {}
    for o in ops:
        if o["op"] == "acked":
            acked_at.setdefault(o["seq"], o["t"])
    faults = [o for o in ops if o["op"] == "fault"]
    got = {o["seq"] for o in recvs}
    dead = [o["seq"] for o in ops if o["op"] == "dlq"]
    missing = sorted(published - got - set(dead))
    if missing:
        v.problems.append(f"lost: {len(missing)} acknowledged publishes never handed out: {missing[:10]}")
    unacked = sorted(published - acked_at.keys() - set(dead))
    if unacked:
        v.problems.append(f"never acknowledged: {len(unacked)} messages: {unacked[:10]}")
    first: dict[int, dict[str, Any]] = {}
    for o in sorted(recvs, key=lambda o: o["t"]):
        prev = first.get(o["seq"])
        if prev is None:
            first[o["seq"]] = o
            continue
        v.redelivered += 1
        # why may it come again? a fault after it was handed out, while it was not (durably) acknowledged
        acked = acked_at.get(o["seq"])
        excuse = False
        for f in faults:
            if not (prev["t"] <= f.get("until", f["t"]) and f["t"] <= o["t"]):
                continue
            if f["kind"] == "owner" and (acked is None or acked >= f["t"] - ack_slack):
                excuse = True
            elif f["kind"] == "consumer" and f.get("consumer") == prev["consumer"] and \
                    (acked is None or acked >= f["t"]):
                excuse = True
            elif f["kind"] == "consumer" and f.get("consumer") == o["consumer"] and o["t"] <= f.get("until", f["t"]):
                # the failed consumer's application took it from its own queue during the fault: the hub had
                # handed it to that consumer before, and then (the consumer failed) to the other
                excuse = True
        if not excuse:
            v.problems.append(f"redelivered without cause: seq {o['seq']} to {o['consumer']} at {o['t']:.3f} "
                              f"(first to {prev['consumer']} at {prev['t']:.3f}, acked at {acked})")
    twice = sorted({s for s in dead if dead.count(s) > 1})
    if twice:
        v.problems.append(f"dead-lettered twice: {twice[:10]}")
    return v
