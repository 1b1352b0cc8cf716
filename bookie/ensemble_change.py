"""Ensemble change of a ledger writer: replacements for failed bookies, the new segment written by CAS.

    md = new_segment(md, failed, avoid, policy, quarantined, first_entry, ledger_id=..., recovery=...)
    md, version = await write_new_segment(ctx, ledger_id, replace, current=(metadata, version))
    quorum_reachable(index_of, write_sets, ack_quorum, down)   # delayed ensemble change still possible?

``bookie.writer.LedgerWriter`` decides when (a bookie failed, a delayed one
is retried); this module says what the new ensemble is and writes it.

Delayed ensemble change (client key ``delay_ensemble_change``, BookKeeper's
``delayEnsembleChange``): when no replacement exists but every write set of
the current ensemble still holds ``ack_quorum`` bookies that have not failed
(so ``write_quorum > ack_quorum``, e.g. E3 W3 A2 losing one bookie), adds go
on to the rest of the ensemble: each entry is acknowledged by the live
bookies of its write set, and is stored on fewer than ``write_quorum``
bookies until AutoRecovery re-replicates it. The writer asks placement for a
replacement again every ``bookie_watch_interval_ms``; once one exists, the
new segment starts after ``last_add_confirmed`` as usual. A further failure
that leaves a write set short of the ack quorum fails the adds as without
the key. Recovery writers never delay (they need the whole write quorum).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from bookie.context import ClientContext
from bookie.errors import LedgerClosedError, LedgerFencedError, NotEnoughBookiesError
from bookie.metadata import LedgerMetadata, LedgerState
from metastore import Version
from placement import EnsemblePlacementPolicy
from placement import NotEnoughBookiesError as PlacementNotEnoughBookiesError

log = logging.getLogger(__name__)

__all__ = ["new_segment", "quorum_reachable", "write_new_segment"]


def new_segment(md: LedgerMetadata, failed: set[str], avoid: set[str], policy: EnsemblePlacementPolicy,
                quarantined: set[str], first: int, *, ledger_id: int, recovery: bool) -> LedgerMetadata:
    """``md`` with each of ``failed`` in its current ensemble replaced, from entry ``first`` on.

    Replacements avoid the ensemble, ``failed`` and ``avoid`` (bookies about
    to be replaced), and ``quarantined`` ones unless only those are left.
    Raises ``LedgerFencedError`` when the ledger is being recovered (unless
    ``recovery``), ``LedgerClosedError`` when it was closed, placement's
    ``NotEnoughBookiesError`` when no bookie can replace one.
    """
    if md.state is not LedgerState.OPEN and not recovery:
        raise LedgerFencedError(f"ledger {ledger_id} is being recovered")
    if md.is_closed:
        raise LedgerClosedError(f"ledger {ledger_id} was closed")
    ensemble = list(md.current_ensemble)
    exclude = set(ensemble) | failed | avoid
    for addr in failed:
        if addr not in ensemble:
            continue
        try:  # a bookie that just failed elsewhere is not a good replacement, unless it is the only one
            replacement = policy.replace_bookie(md.ensemble_size, md.write_quorum, md.ack_quorum, ensemble,
                                                addr, exclude | quarantined)
        except PlacementNotEnoughBookiesError:
            if not quarantined - exclude:
                raise
            replacement = policy.replace_bookie(md.ensemble_size, md.write_quorum, md.ack_quorum, ensemble,
                                                addr, exclude)
        ensemble[ensemble.index(addr)] = replacement
        exclude.add(replacement)
    if md.ensembles[-1][0] >= first:
        md.ensembles[-1] = (md.ensembles[-1][0], ensemble)
    else:
        md.ensembles.append((first, ensemble))
    return md


async def write_new_segment(ctx: ClientContext, ledger_id: int,
                            replace: Callable[[LedgerMetadata], LedgerMetadata], *,
                            current: tuple[LedgerMetadata, Version]) -> tuple[LedgerMetadata, Version]:
    """Apply ``replace`` to the ledger's metadata by CAS (from ``current``); the metadata written.

    When placement finds no replacement the bookie list is refreshed and
    the update tried once more; then ``NotEnoughBookiesError`` (the
    client's). Other errors of ``replace`` or of the update propagate.
    """
    ledgers = ctx.ledgers
    try:
        md, version = await ledgers.update(ledger_id, replace, current=current)
    except PlacementNotEnoughBookiesError:
        await ctx.watcher.refresh()
        try:
            md, version = await ledgers.update(ledger_id, replace)
        except PlacementNotEnoughBookiesError as exc:
            raise NotEnoughBookiesError(str(exc)) from None
    log.info("ledger %d: new ensemble from entry %d: %s", ledger_id, md.ensembles[-1][0], md.current_ensemble)
    return md, version


def quorum_reachable(index_of: Mapping[str, int], write_sets: Iterable[tuple[int, ...]], quorum: int,
                     down: set[str]) -> bool:
    """Whether every write set keeps ``quorum`` bookies outside ``down`` (``index_of``: address -> index)."""
    mask = 0
    for addr in down:
        idx = index_of.get(addr)
        if idx is not None:
            mask |= 1 << idx
    return all(sum(1 for i in ws if not mask >> i & 1) >= quorum for ws in write_sets)
