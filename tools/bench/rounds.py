"""Interleaved rounds for the benches that compare Quire with peers (``--rounds N``).

On a shared machine the background load changes during a run, so running
Quire first and each peer after it biases their ratio by whatever the load
did in between. With several rounds each round runs every system once, in
an order rotated per round (round r starts with system ``r mod k``:
``rotated``), and every measured row carries its ``round``. The ratios are
then taken within each round (``by_round``: rows tagged ``round``) and
summarised by the median over rounds of those per-round ratios
(``"stat": "median_of_rounds"``), so a load change that hits one system in
one round moves one per-round ratio, not the summary.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
Rows = list[dict[str, Any]]
MEDIAN = "median_of_rounds"
"""The ``stat`` of a summary ratio row: the median over rounds of the per-round ratios."""


def rotated(systems: Sequence[T], r: int) -> list[T]:
    """The systems in round ``r``'s order: the same cycle, starting with system ``r mod k``."""
    if not systems:
        return []
    k = r % len(systems)
    return [*systems[k:], *systems[:k]]


def _measured(field: str) -> bool:
    """A field of a ratio row that differs between rounds (the ratio and each side's figure)."""
    return field in ("ratio", "round", "meets_target") or field.startswith(("quire_", "peer_"))


def by_round(ratios: Callable[[Rows], Iterable[dict[str, Any]]], lines: Rows,
             higher_is_better: bool) -> Iterator[dict[str, Any]]:
    """``ratios(lines)`` when the lines hold at most one round; else ``ratios`` of each round's lines (each row
    tagged with its ``round``), then per ratio one summary row whose ``ratio`` is the median of the rounds'
    (``"stat": "median_of_rounds"``, ``"rounds"``, ``"round_ratios"``).

    A summary with a ``target`` meets it when the median does (at least the target when
    ``higher_is_better``, else at most) and no round missed it for another reason than its ratio
    (a side with errors).
    """
    rounds = sorted({x["round"] for x in lines if x.get("round") is not None})
    if len(rounds) <= 1:
        yield from ratios(lines)
        return
    groups: dict[tuple[Any, ...], Rows] = {}
    for r in rounds:
        for row in ratios([x for x in lines if x.get("round") == r]):
            row = {**row, "round": r}
            yield row
            groups.setdefault(tuple((k, v) for k, v in row.items() if not _measured(k)), []).append(row)
    for rows in groups.values():
        yield summary(rows, higher_is_better)


def summary(rows: Rows, higher_is_better: bool) -> dict[str, Any]:
    """The median-of-rounds row of one ratio's per-round rows (see ``by_round``)."""
    got = [float(x["ratio"]) for x in rows]
    median = round(statistics.median(got), 3)
    line = {k: v for k, v in rows[0].items() if not _measured(k)}
    line.update(ratio=median, stat=MEDIAN, rounds=len(rows), round_ratios=got)
    want = line.get("target")
    if isinstance(want, int | float):
        def passes(x: float) -> bool:
            return x >= want if higher_is_better else x <= want

        spoiled = any(x.get("meets_target") is False and passes(float(x["ratio"])) for x in rows)
        line["meets_target"] = passes(median) and not spoiled
    return line
