"""Stage times of sampled adds on the ledger client's side (the bench's per-stage breakdown).

    trace = AddTrace()
    watch(ledger_id, entry_id, trace)       # before the add of a traced publish's entry is submitted
    ...                                     # the connections frame it as a traced ADD_ENTRIES and
    trace.bookies                           # fill in each bookie's stages as its answer is read
    unwatch(ledger_id, entry_id)            # once the add completed (or failed)

A traced add leaves as an ADD_ENTRIES frame with ``Request.trace`` set
(a lone or a large traced add too, which would otherwise go as an
ADD_ENTRY: the sampled add takes the batch path); the bookie answers it with
``Response.trace_ns`` (read, journal written, answer queued), and the
connection adds its own two times (framed, answer read) per bookie.

All times are ``time.monotonic_ns()`` (CLOCK_MONOTONIC): the bench runs every
process on one machine, so they compare across processes. With nothing
watched the add path pays one test of an empty dict per frame and per read.
"""

from __future__ import annotations

__all__ = ["FRAMES", "WATCHED", "AddTrace", "BookieTimes", "unwatch", "watch"]


class BookieTimes:
    """One bookie's copy of a traced add: ``[add sent, read, journal written, ack sent, ack read]`` (ns)."""

    __slots__ = ("address", "times")

    def __init__(self, address: str, sent_ns: int) -> None:
        self.address = address
        self.times = [sent_ns, 0, 0, 0, 0]


class AddTrace:
    """The bookies' stages of one traced add, in the order its frames were sent."""

    __slots__ = ("bookies",)

    def __init__(self) -> None:
        self.bookies: list[BookieTimes] = []


WATCHED: dict[tuple[int, int], AddTrace] = {}
"""``(ledger id, entry id)`` -> the trace of a sampled add not yet completed."""
FRAMES: dict[tuple[str, int], list[BookieTimes]] = {}
"""``(bookie address, txn id)`` -> the traced copies a frame carries, until its answer is read."""


def watch(ledger_id: int, entry_id: int, trace: AddTrace) -> None:
    WATCHED[(ledger_id, entry_id)] = trace


def unwatch(ledger_id: int, entry_id: int) -> AddTrace | None:
    return WATCHED.pop((ledger_id, entry_id), None)
