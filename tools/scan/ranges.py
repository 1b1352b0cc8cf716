"""Split a scannable table into contiguous key ranges, one Spark partition each.

    from tools.scan.ranges import plan_ranges
    ranges = plan_ranges(table, 8)     # [("", "k1"), ("k1", "k2"), ..., ("kN", "")]

A range is ``(low, high)``: ``low`` inclusive, ``high`` exclusive, ``""``
open on that side, so the ranges always cover the whole table exactly once
whatever split points are chosen. The split points are sampled with cursors
on the driver, never by a full scan: the first and last keys are read
(one-row cursors ASC and DESC), ``n - 1`` candidate keys are interpolated
between them (digit keys such as the 20-digit ledger ids in base 10, other
keys over printable ASCII), and each candidate is snapped to the first real
key at or after it (a one-row cursor). Snapped duplicates collapse, so a
table with fewer keys than ``n`` gets fewer ranges. Skewed keys only make
partitions uneven; they never lose or repeat a row.
"""

from __future__ import annotations

import itertools
from typing import Protocol

from metastore import Order
from metastore.api import Fields
from metastore.sync import SyncCursor

Range = tuple[str, str]
WIDTH = 12  # characters after the common prefix that the interpolation looks at


class _RangeTable(Protocol):
    def open_cursor_range(self, first_key: str, first_inclusive: bool, last_key: str, last_inclusive: bool,
                          order: Order = ..., fields: Fields = ...) -> SyncCursor: ...


def _one_key(table: _RangeTable, start: str, order: Order) -> str | None:
    cur = table.open_cursor_range(start, True, "", True, order, fields=set())
    try:
        got = cur.read_entries(1) if cur.has_more() else []
    finally:
        cur.close()
    return got[0][0] if got else None


def interpolate(first: str, last: str, n: int) -> list[str]:
    """``n - 1`` keys spread evenly between ``first`` and ``last`` (sorted, may repeat)."""
    if n <= 1 or first >= last:
        return []
    p = next((i for i, (x, y) in enumerate(zip(first, last, strict=False)) if x != y), min(len(first), len(last)))
    a, b = first[p:p + WIDTH], last[p:p + WIDTH]
    chars = a + b
    if chars.isdigit() and chars.isascii():
        lo, base = ord("0"), 10
    else:
        lo = min(32, *(ord(c) for c in chars))
        base = max(127, *(ord(c) + 1 for c in chars)) - lo
    width = max(len(a), len(b))

    def number(s: str) -> int:
        v = 0
        for c in s.ljust(width, chr(lo)):
            v = v * base + min(max(ord(c) - lo, 0), base - 1)
        return v

    def text(v: int) -> str:
        digits = []
        for _ in range(width):
            v, d = divmod(v, base)
            digits.append(chr(lo + d))
        return first[:p] + "".join(reversed(digits))

    x, y = number(a), number(b)
    return [text(x + (y - x) * i // n) for i in range(1, n)]


def plan_ranges(table: _RangeTable, n: int) -> list[Range]:
    """Up to ``n`` ranges covering ``table`` (a blocking scannable table); ``[("", "")]`` for an empty one.

    Raises the store's ``MetastoreError`` when a probe cursor fails.
    """
    first = _one_key(table, "", Order.ASC)
    last = _one_key(table, "", Order.DESC)
    if first is None or last is None or n <= 1:
        return [("", "")]
    splits: set[str] = set()
    for candidate in interpolate(first, last, n):
        if candidate <= first:
            continue
        snapped = _one_key(table, candidate, Order.ASC)
        if snapped is not None and snapped > first:
            splits.add(snapped)
    bounds = ["", *sorted(splits), ""]
    return list(itertools.pairwise(bounds))
