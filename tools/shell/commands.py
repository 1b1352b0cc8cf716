"""The ``quire shell`` commands: each an async function ``(ops, args, out) -> exit status``.

They print results to ``out`` (stdout; notes such as "no ledgers" go to
stderr so scripts can loop over the output) and raise ``ShellError``
(one-line reason) on failure; ``tools.shell.cli`` parses the arguments, opens the metastore
and turns errors into exit statuses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import TextIO

from tqdm import tqdm

from bookie.autorecovery import UnderReplicationManager
from bookie.errors import BKError, NoSuchEntryError, NoSuchLedgerError
from bookie.metadata import metadata_dict
from bookie.ops import READ_ONLY, BookieOps, LedgerMetadata
from bookie.rereplication import BookieRecovery, RecoverySummary
from tools.shell.errors import ShellError, UsageError
from tools.shell.progress import RecoveryProgress, wants_progress


def human_bytes(n: int) -> str:
    return f"{n} ({tqdm.format_sizeof(n, 'B', 1024)})"


def _state_name(state: int) -> str:
    return "readonly" if state == READ_ONLY else "writable"


def write_json(out: TextIO, doc: object) -> None:
    """One JSON document (``--json``): snake_case keys, bytes as ints, times as epoch ms."""
    out.write(json.dumps(doc, indent=2) + "\n")


async def listbookies(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """One line per registered bookie: address, network location, state, free disk (writable ones, or --readonly)."""
    regs = await ops.registrations()
    wanted = READ_ONLY if args.readonly else None
    shown = {a: r for a, r in regs.items() if (r.state == READ_ONLY) == (wanted is not None)}
    if args.json:
        write_json(out, [{"address": addr, "network_location": rec.network_location or None,
                          "state": _state_name(rec.state), "free_disk": int(rec.free_disk),
                          "total_disk": int(rec.total_disk)} for addr, rec in sorted(shown.items())])
    else:
        for addr, rec in sorted(shown.items()):
            out.write(f"{addr}\t{rec.network_location or '-'}\t{_state_name(rec.state)}\t"
                      f"free={tqdm.format_sizeof(rec.free_disk, 'B', 1024)}\n")
    if not shown:
        sys.stderr.write(f"no {'read-only' if args.readonly else 'writable'} bookies registered\n")
    return 0


def _brief(lid: int, md: LedgerMetadata) -> str:
    bookies = ",".join(sorted(md.bookies()))
    return (f"{lid}\t{md.state.value}\tE{md.ensemble_size} W{md.write_quorum} A{md.ack_quorum}\t"
            f"last={md.last_entry_id}\tlength={md.length}\t{bookies}")


def _ledger_json(lid: int, md: LedgerMetadata, long: bool) -> dict[str, object]:
    if not long:
        return {"ledger_id": lid}
    return {**metadata_dict(lid, md), "bookies": sorted(md.bookies())}


async def listledgers(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """Ledger ids in order, one per line (only those on --bookie ADDR; --long adds their metadata).

    ``--json``: a list of ``{"ledger_id": N}``, or with ``--long`` of the
    ``ledgermetadata --json`` objects plus ``bookies``; written as the ledgers
    are listed, not gathered first.
    """
    n = 0
    if args.json:
        out.write("[")
    async for lid, md in ops.list_ledgers():
        if args.bookie is not None and args.bookie not in md.bookies():
            continue
        if args.json:
            out.write(("," if n else "") + "\n  " + json.dumps(_ledger_json(lid, md, args.long)))
        else:
            out.write((_brief(lid, md) if args.long else str(lid)) + "\n")
        n += 1
    if args.json:
        out.write("\n]\n" if n else "]\n")
    if n == 0:
        sys.stderr.write("no ledgers" + (f" on {args.bookie}" if args.bookie else "") + "\n")
    return 0


async def ledgermetadata(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """The ledger's metadata, as ``key: value`` lines (or --json)."""
    try:
        md, _ = await ops.read_metadata(args.ledger_id)
    except NoSuchLedgerError:
        raise ShellError(f"no ledger {args.ledger_id}") from None
    d = metadata_dict(args.ledger_id, md)
    if args.json:
        out.write(json.dumps(d, indent=2) + "\n")
        return 0
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(md.ctime_ms / 1000))
    for key in ("ledger_id", "state", "ensemble_size", "write_quorum", "ack_quorum", "digest", "last_entry_id",
                "length", "has_password"):
        out.write(f"{key}: {d[key]}\n")
    out.write(f"ctime: {created} UTC\n")
    out.write("ensembles:\n")
    for first, ens in md.ensembles:
        out.write(f"  {first}: {', '.join(ens)}\n")
    if md.properties:
        out.write("properties:\n")
        for k, v in sorted(d["properties"].items()):  # type: ignore[attr-defined]
            out.write(f"  {k}: {v}\n")
    return 0


def _show(data: bytes, as_hex: bool) -> str:
    if not as_hex:
        try:
            text = data.decode("utf-8")
            if text.isprintable():
                return text
        except UnicodeDecodeError:
            pass
    return data.hex()


async def readledger(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """Entries FROM..TO (default: all readable) as ``entry_id<TAB>data`` lines, without fencing the ledger."""
    bk = await ops.client()
    try:
        lh = await bk.open_ledger_no_recovery(args.ledger_id, password=args.password)
    except NoSuchLedgerError:
        raise ShellError(f"no ledger {args.ledger_id}") from None
    last_readable = lh.last_add_confirmed
    first = args.first if args.first is not None else 0
    last = args.last if args.last is not None else last_readable
    if last_readable < 0 and args.first is None:
        out.write(f"ledger {args.ledger_id} has no readable entries\n")
        return 0
    if first > last:
        raise UsageError(f"FROM {first} is after TO {last}")
    if last > last_readable:
        raise ShellError(f"ledger {args.ledger_id}: entry {last} is past the last readable entry {last_readable}")
    try:
        # closed at once when writing fails (`| head -1`: BrokenPipeError), so the reads in flight are
        # cancelled before the bookie connections close (else each one's failure is printed at exit)
        async with contextlib.aclosing(lh.read(first, last)) as entries:
            async for e in entries:
                out.write(f"{e.entry_id}\t{_show(e.data, args.hex)}\n")
    except NoSuchEntryError as exc:
        raise ShellError(f"ledger {args.ledger_id}: {exc}") from None
    return 0


async def simpletest(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """Create a ledger, write N entries, close it, open it afresh and read every entry back."""
    bk = await ops.client()
    try:
        lh = await bk.create_ledger(ensemble=args.ensemble, write_quorum=args.write_quorum,
                                    ack_quorum=args.ack_quorum, password=args.password)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    lid = lh.ledger_id
    out.write(f"created ledger {lid} on {', '.join(lh.metadata.current_ensemble)}\n")
    payloads = [f"quire simpletest {lid}:{i}".encode() for i in range(args.entries)]
    start = time.monotonic()
    ids = await lh.add_entries(payloads) if payloads else []
    written = time.monotonic() - start
    await lh.close()
    out.write(f"wrote {len(ids)} entries in {written:.3f} s\n")
    reader = await bk.open_ledger(lid, password=args.password)
    got: list[bytes] = []
    if reader.last_add_confirmed >= 0:
        got = [e.data async for e in reader.read(0, reader.last_add_confirmed)]
    if got != payloads:
        bad = next((i for i, (a, b) in enumerate(zip(got, payloads, strict=False)) if a != b), min(len(got),
                                                                                                   len(payloads)))
        raise ShellError(f"simpletest FAILED: ledger {lid} read back {len(got)} entries, "
                         f"wrote {len(payloads)}; first difference at entry {bad}")
    out.write(f"read back {len(got)} entries: OK\n")
    if not args.keep:
        await bk.delete_ledger(lid)
        out.write(f"deleted ledger {lid}\n")
    return 0


async def bookieinfo(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """Free and total disk and the state the bookie reports, with its registration."""
    regs = await ops.registrations()
    try:
        info = await ops.bookie_info(args.address)
    except BKError as exc:
        registered = "registered" if args.address in regs else "not registered"
        raise ShellError(f"bookie {args.address} ({registered}) did not answer: {exc}") from None
    rec = regs.get(args.address)
    used = 1 - info.free_disk / info.total_disk if info.total_disk else 0.0
    if args.json:
        write_json(out, {"bookie": args.address, "state": "readonly" if info.read_only else "writable",
                         "free_disk": info.free_disk, "total_disk": info.total_disk, "disk_usage": round(used, 4),
                         "registered": rec is not None,
                         "network_location": (rec.network_location or None) if rec is not None else None})
        return 0
    out.write(f"bookie: {args.address}\n")
    out.write(f"state: {'readonly' if info.read_only else 'writable'}\n")
    out.write(f"free_disk: {human_bytes(info.free_disk)}\n")
    out.write(f"total_disk: {human_bytes(info.total_disk)}\n")
    out.write(f"disk_usage: {used:.1%}\n")
    out.write(f"registered: {'yes' if rec is not None else 'no'}\n")
    if rec is not None:
        out.write(f"network_location: {rec.network_location or '-'}\n")
    return 0


def _recovery(ops: BookieOps, args: argparse.Namespace, source: str, dest: str | None) -> BookieRecovery:
    return BookieRecovery(ops, source, dest, args.passwords, skip_open=args.skip_open, parallel=args.parallel,
                          max_entries_per_second=args.max_entries_per_second)


async def _run_recovery(recovery: BookieRecovery, args: argparse.Namespace, out: TextIO) -> RecoverySummary:
    ledgers = await recovery.ledgers_to_recover()
    with RecoveryProgress(len(ledgers), wants_progress(args.progress), out=out) as progress:
        summary = await recovery.run(progress, ledgers=ledgers)
    out.write(summary.line() + "\n")
    return summary


async def recover(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """Re-replicate every fragment of SRC (onto DEST, or where the placement policy says)."""
    recovery = _recovery(ops, args, args.source, args.dest)
    if args.dry_run:
        if await _is_running(ops, args.source):
            sys.stderr.write(f"note: {args.source} is running (registered and answering): recover copies its "
                             f"fragments to other bookies while it keeps serving; to retire it, stop it and "
                             f"use decommission\n")
        planned = await recovery.plan_ledgers()
        for p in planned:
            out.write(p.text + "\n")
        stuck = sum(not p.completes for p in planned)
        verdict = f"{stuck} would fail or be skipped" if stuck else "all would be done"
        out.write(f"dry run: {len(planned)} ledgers on {args.source}, {verdict}; nothing changed\n")
        return 1 if stuck else 0
    summary = await _run_recovery(recovery, args, out)
    return 1 if summary.failed or summary.count("skipped") else 0


async def _is_running(ops: BookieOps, address: str) -> bool:
    """Whether ``address`` is registered and answers a bookie-info request."""
    if address not in await ops.registrations():
        return False
    try:
        await ops.bookie_info(address)
    except BKError:
        return False
    return True


async def decommission(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """Recover ADDR's ledgers, check none names it any more, then remove its registration."""
    try:
        await ops.bookie_info(args.address)
    except BKError:
        pass
    else:
        raise ShellError(f"bookie {args.address} is still running: stop it before decommissioning it "
                         f"(to move its data off while it runs, use recover)")
    recovery = _recovery(ops, args, args.address, None)
    summary = await _run_recovery(recovery, args, out)
    left = [lid for lid, _ in await recovery.ledgers_on_source()]
    if left:
        shown = ", ".join(str(lid) for lid in left[:20]) + (" ..." if len(left) > 20 else "")
        raise ShellError(f"{len(left)} ledgers still name {args.address} ({shown}); its registration is kept "
                         f"({summary.failed} failed, {summary.count('skipped')} skipped)")
    removed = await ops.remove_registration(args.address)
    out.write(f"decommissioned {args.address}: no ledger names it"
              + ("; registration removed\n" if removed else "; it was not registered\n"))
    return 0


# --- AutoRecovery -------------------------------------------------------------------------------

def _age(marked_ms: int, now_ms: float) -> str:
    seconds = max(0, int((now_ms - marked_ms) / 1000))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


async def listunderreplicated(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """The ledgers the auditor marked: ``ledger<TAB>missing bookies<TAB>age``, in id order (or --json)."""
    urm = await UnderReplicationManager.open(ops.store)
    now_ms = time.time() * 1000
    marks = await urm.list()
    if args.json:
        write_json(out, [{"ledger_id": rec.ledger_id, "missing_bookies": sorted(rec.missing),
                          "marked_ms": rec.marked_ms} for rec in marks])
        return 0
    for rec in marks:
        out.write(f"{rec.ledger_id}\t{','.join(sorted(rec.missing))}\t{_age(rec.marked_ms, now_ms)}\n")
    return 0


async def autorecovery(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """``status``: switch, auditor, delay, marks; ``enable``/``disable``: the cluster-wide switch."""
    urm = await UnderReplicationManager.open(ops.store)
    if args.action in ("enable", "disable"):
        if args.json:
            raise UsageError("--json goes with autorecovery status only")
        await urm.set_enabled(args.action == "enable")
        out.write(f"autorecovery {args.action}d cluster-wide\n")
        return 0
    delay = await urm.lost_bookie_recovery_delay_override()
    auditor = await urm.auditor()
    if args.json:
        write_json(out, {"enabled": await urm.enabled(), "auditor": auditor or None,
                         "lost_bookie_recovery_delay_s": delay, "under_replicated_ledgers": len(await urm.list())})
        return 0
    out.write(f"autorecovery: {'enabled' if await urm.enabled() else 'disabled'}\n")
    out.write(f"auditor: {auditor or 'none'}\n")
    out.write(f"lost_bookie_recovery_delay: {_delay_text(delay)}\n")
    out.write(f"under-replicated ledgers: {len(await urm.list())}\n")
    return 0


async def triggeraudit(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """Ask the auditor for a full audit now (BookKeeper's ``triggeraudit``)."""
    urm = await UnderReplicationManager.open(ops.store)
    await urm.request_audit()
    auditor = await urm.auditor()
    if auditor is None:
        out.write("audit requested; no auditor is elected now: the next one audits every ledger's bookies "
                  "when it is\n")
    else:
        out.write(f"audit requested: the auditor ({auditor}) checks every ledger's bookies and fragments "
                  f"within about a second; see listunderreplicated\n")
    return 0


def _delay_text(delay: float | None) -> str:
    if delay is None:
        return "not set cluster-wide (each bookie's lost_bookie_recovery_delay applies; default 30)"
    return f"{delay:g} s (cluster-wide)"


async def lostbookierecoverydelay(ops: BookieOps, args: argparse.Namespace, out: TextIO) -> int:
    """Print the cluster-wide delay, or set it to SECONDS."""
    urm = await UnderReplicationManager.open(ops.store)
    if args.seconds is not None:
        await urm.set_lost_bookie_recovery_delay(args.seconds)
        out.write(f"lost_bookie_recovery_delay: {_delay_text(args.seconds)}\n")
        return 0
    out.write(f"lost_bookie_recovery_delay: {_delay_text(await urm.lost_bookie_recovery_delay_override())}\n")
    return 0
