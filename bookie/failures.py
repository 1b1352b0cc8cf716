"""Per-bookie failure counts that fade: the read-ordering hint the placement policy gets.

    history = FailureHistory(half_life=60.0)
    history.note("10.0.0.1:3181")        # a read or add failed on that bookie
    history["10.0.0.1:3181"]             # 1 now, 0 after a few half-lives
    policy.reorder_read_sequence(ensemble, write_set, history)

Every ``half_life`` seconds each count is halved (integer division, so a
bookie that stopped failing drops back to 0 and is tried first again).
Decay is applied lazily when the history is read or written; no timer runs.
``recent(seconds)`` names the bookies that failed within the last
``seconds`` (the quarantine ``BookKeeper.create_ledger`` leaves out of new
ensembles, as BookKeeper's ``bookieQuarantineTime``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

__all__ = ["FailureHistory"]


class FailureHistory(Mapping[str, int]):
    """A ``Mapping[str, int]`` of recent failures per bookie address; see the module docstring."""

    def __init__(self, half_life: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        if half_life <= 0:
            raise ValueError(f"half_life must be positive, not {half_life}")
        self.half_life = half_life
        self._clock = clock
        self._counts: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._epoch = clock()

    def _decay(self) -> None:
        halvings = int((self._clock() - self._epoch) / self.half_life)
        if halvings <= 0:
            return
        self._epoch += halvings * self.half_life
        shift = min(halvings, 63)
        self._counts = {a: n >> shift for a, n in self._counts.items() if n >> shift}

    def note(self, address: str) -> None:
        """Count one failure of ``address``."""
        self._decay()
        self._counts[address] = self._counts.get(address, 0) + 1
        self._last[address] = self._clock()

    def recent(self, seconds: float) -> set[str]:
        """The bookies whose last failure was less than ``seconds`` ago."""
        since = self._clock() - seconds
        self._last = {a: t for a, t in self._last.items() if t > since}
        return set(self._last)

    def __getitem__(self, address: str) -> int:
        self._decay()
        return self._counts.get(address, 0)

    def __contains__(self, address: object) -> bool:
        self._decay()
        return address in self._counts

    def __iter__(self) -> Iterator[str]:
        self._decay()
        return iter(list(self._counts))

    def __len__(self) -> int:
        self._decay()
        return len(self._counts)
