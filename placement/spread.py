"""Pure spreading arithmetic shared by the placement policies.

No topology, no I/O: groups are lists of bookie names (one group per rack
or per region) and randomness comes from the caller's ``random.Random``::

    chosen = choose_spread(racks, 6, rng)   # 6 bookies, as few per rack as possible
    ensemble = arrange(chosen, rng)        # order them so equal racks sit far apart
    windows_span_two(locations, write_quorum)   # every write quorum on >= 2 racks?

The rule behind it: a cyclic ensemble of ``E`` members has every window of
``W`` consecutive members on at least two racks exactly when no rack has a
cyclic run of ``W`` members. If the most used rack holds ``n`` members, the
best arrangement splits them into ``E - n`` runs, so the goal is reachable
exactly when ``n <= (E - n) * (W - 1)`` -- and choosing bookies to keep ``n``
as small as possible (water-filling) is optimal for that.
"""

from __future__ import annotations

import random
from collections.abc import Sequence, Set


def fill_level(capacities: Sequence[int], count: int) -> int:
    """Smallest ``m`` with ``sum(min(c, m)) >= count``.

    Raises ``ValueError`` when the capacities add up to less than ``count``.
    """
    if count <= 0:
        return 0
    if sum(capacities) < count:
        raise ValueError(f"capacities {list(capacities)} cannot hold {count}")
    level = max(1, -(-count // len(capacities)))
    while sum(min(c, level) for c in capacities) < count:
        level += 1
    return level


def even_shares(capacities: Sequence[int], count: int) -> list[int]:
    """Split ``count`` as evenly as capacities allow, deterministically.

    Shares differ by at most one except where a group is capped by its
    capacity; the extra ones go to the earliest groups. Raises
    ``ValueError`` when the capacities add up to less than ``count``.
    """
    if count <= 0:
        return [0] * len(capacities)
    level = fill_level(capacities, count)
    shares = [min(c, level) for c in capacities]
    surplus = sum(shares) - count
    for i in range(len(shares) - 1, -1, -1):
        if surplus == 0:
            break
        if capacities[i] >= level:
            shares[i] -= 1
            surplus -= 1
    return shares


def choose_spread(
    groups: Sequence[Sequence[str]],
    count: int,
    rng: random.Random,
    prefer: Set[str] | None = None,
) -> list[list[str]]:
    """Pick ``count`` members spread over ``groups`` as evenly as possible.

    Returns the picks per group (only non-empty lists). The most loaded
    group gets ``fill_level`` members; which groups get one fewer, and which
    members are picked, is random. Inside a group, members in ``prefer`` are
    picked before the others. Raises ``ValueError`` when the groups hold
    fewer than ``count`` members.
    """
    n = len(groups)
    if count <= 0:
        return []
    if prefer is None and n >= count:
        # fast path: one member from each of ``count`` distinct groups
        choice = rng.choice
        return [[choice(groups[i])] for i in rng.sample(range(n), count)]
    caps = [len(g) for g in groups]
    level = fill_level(caps, count)
    take = [min(c, level) for c in caps]
    surplus = sum(take) - count
    if surplus:
        at_level = [i for i, c in enumerate(caps) if c >= level]
        for i in rng.sample(at_level, surplus):
            take[i] -= 1
    chosen: list[list[str]] = []
    for group, k in zip(groups, take, strict=True):
        if k <= 0:
            continue
        if prefer is None:
            chosen.append(rng.sample(group, k))
            continue
        first = [b for b in group if b in prefer]
        if len(first) >= k:
            chosen.append(rng.sample(first, k))
        else:
            rest = [b for b in group if b not in prefer]
            chosen.append(rng.sample(first, len(first)) + rng.sample(rest, k - len(first)))
    return chosen


def arrange(groups: Sequence[Sequence[str]], rng: random.Random) -> list[str]:
    """Order all members so members of one group sit as far apart as possible.

    Groups of equal size are dealt round-robin (members of a group sit
    ``len(groups)`` apart). Otherwise, cyclically, no two members of a group
    are adjacent when no group holds more than half; and when one does, it
    is cut into the fewest, evenly sized runs, each followed by one other
    member. The order inside each group is kept. Ties and the starting point
    are random.
    """
    parts = [list(g) for g in groups if g]
    if not parts:
        return []
    if len(parts) == 1:
        return parts[0]
    rng.shuffle(parts)
    parts.sort(key=len, reverse=True)
    biggest = len(parts[0])
    if biggest == 1:
        return [g[0] for g in parts]
    total = sum(len(g) for g in parts)
    if len(parts[-1]) == biggest:
        # equal groups: deal round-robin, members of a group len(parts) apart
        out = [g[k] for k in range(biggest) for g in parts]
    elif biggest <= total // 2:
        positions = [*range(0, total, 2), *range(1, total, 2)]
        out = [""] * total
        k = 0
        for g in parts:
            for member in g:
                out[positions[k]] = member
                k += 1
    else:
        major = parts[0]
        others = [m for g in parts[1:] for m in g]
        runs, longer = divmod(biggest, len(others))
        out = []
        start = 0
        for j, other in enumerate(others):
            size = runs + (1 if j < longer else 0)
            out.extend(major[start : start + size])
            out.append(other)
            start += size
    shift = rng.randrange(total)
    return out[shift:] + out[:shift]


def two_racks_reachable(most_used: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether a rack holding ``most_used`` members still lets every window span two racks."""
    if write_quorum < 2:
        return True
    return most_used <= (ensemble_size - most_used) * (write_quorum - 1)


def longest_cyclic_run(labels: Sequence[str]) -> int:
    """Length of the longest cyclic run of equal labels (``len`` if all are equal)."""
    n = len(labels)
    start = next((i for i in range(n) if labels[i] != labels[i - 1]), None)
    if start is None:
        return n
    best = run = 0
    prev: str | None = None
    for k in range(n):
        label = labels[(start + k) % n]
        run = run + 1 if label == prev else 1
        prev = label
        best = max(best, run)
    return best


def windows_span_two(labels: Sequence[str], write_quorum: int) -> bool:
    """Whether every cyclic window of ``write_quorum`` labels holds two distinct ones."""
    if write_quorum < 2 or not labels:
        return True
    return longest_cyclic_run(labels) < write_quorum


def labels_to_avoid(labels: Sequence[str], position: int, write_quorum: int) -> set[str]:
    """Labels a new member at ``position`` must not have for every window through it to span two.

    A label is to be avoided when some window of ``write_quorum`` consecutive
    members (cyclic) containing ``position`` has all its other members on it.
    """
    n = len(labels)
    w = min(write_quorum, n)
    if w < 2:
        return set()
    avoid: set[str] = set()
    for start in range(position - w + 1, position + 1):
        others = {labels[j % n] for j in range(start, start + w) if j % n != position}
        if len(others) == 1:
            avoid |= others
    return avoid
