"""Re-replicate every ledger fragment a bookie held onto other bookies (``quire shell recover``, AutoRecovery).

    ops = await BookieOps.open(store)
    recovery = BookieRecovery(ops, "127.0.0.1:3181", dest=None, passwords=[b"secret"])
    for line in await recovery.plan():       # --dry-run
        print(line)
    summary = await recovery.run(progress)   # RecoverySummary: recovered, failed, entries_copied...

A *fragment* is the part of one ensemble segment that the source bookie
stored: the entries of that segment whose write set includes the source's
position. For each ledger that names the source in any segment:

Each ledger is handled with the first of ``passwords`` (plus the empty
password) that its metadata accepts; it is needed to write the copies
(bookies check the master key derived from it) and to check ``mac`` digests.

1. An open ledger is recovery-closed first (``BookKeeper.open_ledger``:
   fence, recover the tail, close), so its entries stop changing; with
   ``skip_open`` it is left alone and reported. With ``keep_writers``
   (AutoRecovery) an OPEN ledger whose last segment does not name the
   source stays open: only its sealed segments are copied, so a live
   writer is not fenced.
   A ledger left IN_RECOVERY (an interrupted recovery-close) is finished
   the same way even when it no longer names the source.
2. For each fragment a target is chosen: ``dest`` when given, else the
   placement policy's ``replace_bookie`` for that segment's ensemble (so
   rack/region rules hold as they do for an ensemble change).
3. Every entry of the fragment is read from another member of its write set
   (its digest checked) and written to the target as a recovery add.
4. The segment's ensemble is updated by compare-and-set, source -> target.

Steps 3 and 4 are ordered so that an interruption at any point leaves the
metadata naming the source until a full copy exists; running again finds
the same fragments and copies them again (a bookie replaces an entry it
already has with the same bytes). A ledger already free of the source is
skipped, so re-running after a complete recovery does nothing.

Failure: one ledger's failure (no readable replica, wrong password, no
replacement bookie, a target that refuses) is reported in its
``LedgerOutcome`` and the others go on; the summary counts them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bookie.errors import BKError, DigestMismatchError, NoSuchLedgerError, NotEnoughBookiesError
from bookie.ops import (
    READ_ONLY,
    BookieOps,
    LedgerMetadata,
    LedgerState,
    master_key,
    password_matches,
    verify_payload,
)
from metastore.errors import MetastoreError
from placement import NotEnoughBookiesError as PlacementNotEnoughBookiesError

log = logging.getLogger(__name__)

__all__ = ["BookieRecovery", "EntryPacer", "Fragment", "LedgerOutcome", "RecoveryError", "RecoveryProgress",
           "RecoverySummary", "RecoveryUsageError", "fragments_of"]


class RecoveryError(BKError):
    """Re-replication of one ledger failed (no readable replica, no replacement bookie...)."""

    code = "RereplicationException"


class RecoveryUsageError(BKError):
    """A recovery asked for something that cannot be (a bad destination, a bad setting)."""

    code = "IllegalArgumentException"


class RecoveryProgress(Protocol):
    """What a run reports as it goes (``quire shell``'s progress bar implements it)."""

    def entries_copied(self, n: int) -> None: ...

    def ledger_done(self, line: str | None = None) -> None: ...

DEFAULT_WINDOW = 64
"""Entries of one fragment copied concurrently."""

TARGET_ATTEMPTS = 3
"""Placement-chosen targets tried for one fragment before the ledger is reported failed."""


@dataclass(frozen=True)
class Fragment:
    """The entries of one segment that ``bookie`` (at ``index`` of ``ensemble``) stored."""

    ledger_id: int
    first_entry: int
    last_entry: int
    """Last entry of the segment (inclusive); below ``first_entry`` when the segment is empty."""
    index: int
    ensemble: tuple[str, ...]
    bookie: str

    def entries(self, md: LedgerMetadata) -> list[int]:
        """Entry ids of the segment whose write set includes ``index``."""
        return [e for e in range(self.first_entry, self.last_entry + 1) if self.index in md.write_set(e)]

    def span(self) -> str:
        if self.last_entry < self.first_entry:
            return f"empty segment from entry {self.first_entry}"
        return f"entries {self.first_entry}-{self.last_entry}"


def fragments_of(ledger_id: int, md: LedgerMetadata, bookie: str) -> list[Fragment]:
    """The fragments of a ledger held by ``bookie``, in entry order.

    The last segment ends at the ledger's last entry; for an open ledger that
    is not known yet (-1), so its last fragment looks empty.
    """
    out: list[Fragment] = []
    for i, (first, ensemble) in enumerate(md.ensembles):
        if bookie not in ensemble:
            continue
        last = md.ensembles[i + 1][0] - 1 if i + 1 < len(md.ensembles) else md.last_entry_id
        out.append(Fragment(ledger_id, first, last, ensemble.index(bookie), tuple(ensemble), bookie))
    return out


@dataclass(frozen=True)
class PlannedLedger:
    """One ``--dry-run`` line: what would happen to a ledger, and whether it would be done (not failed or
    skipped: a real run exits 1 when any ledger is not)."""

    ledger_id: int
    text: str
    completes: bool


@dataclass
class LedgerOutcome:
    """What happened to one ledger."""

    ledger_id: int
    status: str
    """``recovered``, ``clean`` (no longer on the source), ``gone`` (deleted), ``skipped`` or ``failed``."""
    moves: list[tuple[Fragment, str, int]] = field(default_factory=list)
    """(fragment, target, entries copied) per fragment."""
    closed_at: int | None = None
    """Last entry id when this run recovery-closed the ledger."""
    error: str = ""

    @property
    def entries_copied(self) -> int:
        return sum(n for _, _, n in self.moves)

    def line(self) -> str:
        head = f"ledger {self.ledger_id}: "
        if self.status == "failed":
            return head + f"FAILED: {self.error}"
        if self.status == "skipped":
            return head + f"skipped: {self.error}"
        if self.status == "gone":
            return head + "deleted meanwhile"
        parts = [] if self.closed_at is None else [f"recovery-closed at entry {self.closed_at}"]
        parts += [f"{f.span()} ({n} copied) {f.bookie} -> {target}" for f, target, n in self.moves]
        return head + ("; ".join(parts) if parts else "already off the bookie")


@dataclass
class RecoverySummary:
    """The whole run: one outcome per ledger that named the source when the run started."""

    source: str
    outcomes: list[LedgerOutcome]

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def failed(self) -> int:
        return self.count("failed")

    @property
    def entries_copied(self) -> int:
        return sum(o.entries_copied for o in self.outcomes)

    def line(self) -> str:
        if not self.outcomes:
            return f"recover {self.source}: no ledger names it; nothing to do"
        done = self.count("recovered") + self.count("clean") + self.count("gone")
        return (f"recover {self.source}: {len(self.outcomes)} ledgers, {done} done, {self.failed} failed, "
                f"{self.count('skipped')} skipped, {self.entries_copied} entries copied")


class EntryPacer:
    """Spreads entry copies to at most ``rate`` per second (0: unlimited); one may serve many recoveries.

    Time spent idle is not saved up: after a pause the rate holds from the next copy on (no burst).
    """

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._next: float | None = None

    async def wait(self) -> None:
        if self.rate <= 0:
            return
        now = asyncio.get_running_loop().time()
        slot = now if self._next is None or self._next < now else self._next
        self._next = slot + 1.0 / self.rate
        if slot > now:
            await asyncio.sleep(slot - now)


class BookieRecovery:
    """Moves every fragment of ``source`` to other bookies; see the module docstring."""

    def __init__(self, ops: BookieOps, source: str, dest: str | None = None, passwords: Sequence[bytes] = (), *,
                 skip_open: bool = False, keep_writers: bool = False, parallel: int = 4, window: int = DEFAULT_WINDOW,
                 max_entries_per_second: float = 0.0, pacer: EntryPacer | None = None,
                 guard: Callable[[], Awaitable[None]] | None = None) -> None:
        if dest is not None and dest == source:
            raise RecoveryUsageError(f"the destination {dest} is the bookie being recovered")
        if parallel < 1 or window < 1:
            raise RecoveryUsageError("--parallel and the copy window must be >= 1")
        self.ops = ops
        self.source = source
        self.dest = dest
        self.passwords = list(dict.fromkeys([*passwords, b""]))
        self.skip_open = skip_open
        self.keep_writers = keep_writers
        self.parallel = parallel
        self.window = window
        self._pacer = pacer if pacer is not None else EntryPacer(max_entries_per_second)
        self._guard = guard
        """Awaited before every metadata change (recovery-close, ensemble update); raising aborts the ledger
        (AutoRecovery checks it still holds the ledger's lease)."""

    # --- discovery ------------------------------------------------------------------------------
    async def ledgers_on_source(self) -> list[tuple[int, LedgerMetadata]]:
        """Every ledger whose metadata names the source bookie, in id order."""
        return [(lid, md) async for lid, md in self.ops.list_ledgers() if self.source in md.bookies()]

    async def ledgers_to_recover(self) -> list[tuple[int, LedgerMetadata]]:
        """The ledgers naming the source, and those left IN_RECOVERY, in id order.

        An interrupted recovery-close (ours or a client's) may already have
        replaced the source in the ledger's last segment while the entries it
        re-replicates are not all written yet: finishing it is the safe move.
        """
        return [(lid, md) async for lid, md in self.ops.list_ledgers() if self._concerns(md)]

    def _concerns(self, md: LedgerMetadata) -> bool:
        return self.source in md.bookies() or md.state is LedgerState.IN_RECOVERY

    async def _check_dest(self) -> None:
        regs = await self.ops.refresh_placement()
        if self.dest is None:
            return
        rec = regs.get(self.dest)
        if rec is None:
            raise RecoveryUsageError(f"destination {self.dest} is not a registered bookie")
        if rec.state == READ_ONLY:
            raise RecoveryUsageError(f"destination {self.dest} is read-only")

    async def plan(self) -> list[str]:
        """What ``run`` would do, one line per ledger (``--dry-run``); changes nothing."""
        return [p.text for p in await self.plan_ledgers()]

    async def plan_ledgers(self) -> list[PlannedLedger]:
        """``plan`` with, for each ledger, whether the run would fail or skip it (its exit status 1)."""
        await self._check_dest()
        planned: list[PlannedLedger] = []
        for lid, md in await self.ledgers_to_recover():
            head = f"ledger {lid} ({md.state.value}): would "
            if self._password_for(md) is None:
                planned.append(PlannedLedger(lid, head + "fail: none of the passwords given is the ledger's "
                                                          "(give it with --password)", False))
                continue
            if not md.is_closed and self.skip_open:
                planned.append(PlannedLedger(lid, head + "skip it (open, --skip-open)", False))
                continue
            actions = [] if md.is_closed else ["recovery-close it"]
            ok = True
            for frag in fragments_of(lid, md, self.source):
                if not md.is_closed and frag.first_entry == md.ensembles[-1][0]:
                    what = f"the segment from entry {frag.first_entry} (its end is known once closed)"
                else:
                    what = f"{frag.span()} ({len(frag.entries(md))} entries on it)"
                target, found = self._describe_target(md, frag)
                ok = ok and found
                actions.append(f"copy {what} {self.source} -> {target}")
            text = head + ", then ".join(actions)
            planned.append(PlannedLedger(lid, text if ok else text.replace(": would ", ": would fail: ", 1), ok))
        return planned

    def _describe_target(self, md: LedgerMetadata, frag: Fragment) -> tuple[str, bool]:
        """Where a fragment would go, and whether there is such a place."""
        if self.dest is not None:
            if self.dest in frag.ensemble:
                return f"{self.dest} (refused: already in the ensemble)", False
            return self.dest, True
        try:
            return self._choose(md, frag, set()) + " (placement choice)", True
        except RecoveryError as exc:
            return f"nothing ({exc})", False

    # --- the run --------------------------------------------------------------------------------
    async def run(self, progress: RecoveryProgress | None = None,
                  ledgers: list[tuple[int, LedgerMetadata]] | None = None) -> RecoverySummary:
        """Recover every ledger on the source; ``progress`` counts ledgers and entries as they go.

        ``ledgers`` is a ``ledgers_to_recover()`` result already at hand.
        Raises ``RecoveryUsageError`` for a destination that is not a registered
        writable bookie and ``MetastoreError`` when the ledger list cannot be read.
        """
        await self._check_dest()
        if ledgers is None:
            ledgers = await self.ledgers_to_recover()
        queue: asyncio.Queue[int] = asyncio.Queue()
        for lid, _ in ledgers:
            queue.put_nowait(lid)
        outcomes: dict[int, LedgerOutcome] = {}

        async def worker() -> None:
            while not queue.empty():
                lid = queue.get_nowait()
                outcome = await self.recover_ledger(lid, progress)
                outcomes[lid] = outcome
                if progress is not None:
                    progress.ledger_done(outcome.line())

        await asyncio.gather(*(worker() for _ in range(min(self.parallel, max(1, len(ledgers))))))
        return RecoverySummary(self.source, [outcomes[lid] for lid, _ in ledgers])

    async def recover_ledger(self, ledger_id: int, progress: RecoveryProgress | None = None) -> LedgerOutcome:
        """Move every fragment of one ledger off the source; never raises for that ledger's own failures."""
        outcome = LedgerOutcome(ledger_id, "recovered")
        try:
            md, _ = await self.ops.read_metadata(ledger_id)
            if not self._concerns(md):
                outcome.status = "clean"
                return outcome
            password = self._password_for(md)
            if password is None:
                raise RecoveryError("none of the passwords given is the ledger's (give it with --password)")
            sealed_only = (self.keep_writers and md.state is LedgerState.OPEN
                           and self.source not in md.current_ensemble)
            if not md.is_closed and not sealed_only:
                if self.skip_open:
                    outcome.status = "skipped"
                    outcome.error = f"open ({md.state.value}) and --skip-open given"
                    return outcome
                if self._guard is not None:
                    await self._guard()
                bk = await self.ops.client()
                await bk.open_ledger(ledger_id, password=password)  # fence, recover the tail, close
                md, _ = await self.ops.read_metadata(ledger_id)
                outcome.closed_at = md.last_entry_id
            for frag in fragments_of(ledger_id, md, self.source):
                target, copied = await self._move(md, frag, password, progress)
                outcome.moves.append((frag, target, copied))
                if self._guard is not None:
                    await self._guard()
                md = await self.ops.replace_in_segment(ledger_id, frag.first_entry, self.source, target)
        except NoSuchLedgerError:
            outcome.status = "gone"
        except (RecoveryError, BKError, MetastoreError, ValueError) as exc:
            outcome.status = "failed"
            outcome.error = str(exc) or type(exc).__name__
            log.warning("ledger %d: recovery failed: %s", ledger_id, outcome.error)
        return outcome

    def _password_for(self, md: LedgerMetadata) -> bytes | None:
        return next((p for p in self.passwords if password_matches(md, p)), None)

    # --- one fragment ---------------------------------------------------------------------------
    def _choose(self, md: LedgerMetadata, frag: Fragment, tried: set[str]) -> str:
        if self.dest is not None:
            if self.dest in frag.ensemble:
                raise RecoveryError(f"destination {self.dest} is already in the ensemble of {frag.span()}")
            return self.dest
        try:
            return self.ops.policy.replace_bookie(md.ensemble_size, md.write_quorum, md.ack_quorum,
                                                  list(frag.ensemble), self.source,
                                                  exclude={self.source, *tried})
        except (PlacementNotEnoughBookiesError, NotEnoughBookiesError) as exc:
            raise RecoveryError(f"no bookie can replace {self.source} in {frag.span()}: {exc}") from None

    async def _move(self, md: LedgerMetadata, frag: Fragment, password: bytes,
                    progress: RecoveryProgress | None) -> tuple[str, int]:
        """Copy the fragment to a target; returns (target, entries copied)."""
        tried: set[str] = set()
        while True:
            target = self._choose(md, frag, tried)
            try:
                return target, await self._copy(md, frag, target, password, progress)
            except _TargetFailed as exc:
                tried.add(target)
                if self.dest is not None or len(tried) >= TARGET_ATTEMPTS:
                    raise RecoveryError(str(exc)) from None
                log.warning("ledger %d: %s; choosing another target", frag.ledger_id, exc)
                await self.ops.refresh_placement()

    async def _copy(self, md: LedgerMetadata, frag: Fragment, target: str, password: bytes,
                    progress: RecoveryProgress | None) -> int:
        entries = frag.entries(md)
        key = master_key(password)
        running: set[asyncio.Task[None]] = set()
        pending = iter(entries)
        try:
            while True:
                for entry_id in pending:
                    running.add(asyncio.create_task(self._copy_entry(md, frag, target, entry_id, password, key,
                                                                     progress)))
                    if len(running) >= self.window:
                        break
                if not running:
                    return len(entries)
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()  # the first failure ends the fragment
        finally:
            for t in running:
                t.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def _copy_entry(self, md: LedgerMetadata, frag: Fragment, target: str, entry_id: int, password: bytes,
                          key: bytes, progress: RecoveryProgress | None) -> None:
        await self._pacer.wait()
        payload = await self._read_any(md, frag, entry_id, password)
        try:
            await self.ops.write_payload(target, frag.ledger_id, entry_id, key, payload)
        except BKError as exc:
            raise _TargetFailed(f"cannot write entry {entry_id} to {target}: {exc}") from None
        if progress is not None:
            progress.entries_copied(1)

    async def _read_any(self, md: LedgerMetadata, frag: Fragment, entry_id: int, password: bytes) -> bytes:
        """The entry's payload from another member of its write set (the source itself last)."""
        others = [frag.ensemble[i] for i in md.write_set(entry_id) if i != frag.index]
        errors: list[str] = []
        for addr in _unique([*others, self.source]):
            try:
                payload = await self.ops.read_payload(addr, frag.ledger_id, entry_id)
                verify_payload(md, frag.ledger_id, entry_id, payload, password)
                return payload
            except DigestMismatchError as exc:
                errors.append(f"{addr}: bad digest ({exc})")
            except BKError as exc:
                errors.append(f"{addr}: {exc}")
        raise RecoveryError(f"entry {entry_id} has no readable replica ({'; '.join(errors)})")


class _TargetFailed(Exception):
    """Writing to the chosen target failed (another target may do)."""


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
