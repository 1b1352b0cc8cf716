"""Disk usage of a bookie: when it turns read-only, and why a commit failed.

    monitor = DiskUsageMonitor(data_dir, threshold=0.95, lwm_threshold=0.90, check_bytes=16 << 20,
                               map_usage=storage.map_usage)
    usage, changed = monitor.check()          # one statvfs; applies the thresholds
    if monitor.note_written(nbytes):          # after each commit: True every check_bytes written
        usage, changed = monitor.check()
    monitor.read_only                         # adds are refused while True
    describe_commit_error(exc, data_dir)      # "no space left on device (ENOSPC) ..." and the like

The used fraction is the largest of the filesystem's, the journal
directory's filesystem's (``extra_paths``) and the LMDB map's
(``map_usage()`` returns ``(used, size)`` bytes): a bookie turns read-only at
``threshold`` and writable again below ``lwm_threshold``, so it stops taking
adds while the map can still grow and the disk still has room, rather than
when a commit fails. The periodic check runs every ``disk_check_interval``;
commits add a check every ``check_bytes`` written, counted in memory (no
system call per add). ``override_file`` (a file holding a used fraction
such as ``0.97``) replaces the filesystem's measure in tests.

``force_read_only`` turns the bookie read-only at once (a commit failed for
lack of space); the next check may turn it writable again once usage is
below ``lwm_threshold``.
"""

from __future__ import annotations

import errno
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import lmdb

log = logging.getLogger(__name__)

__all__ = ["DiskUsage", "DiskUsageMonitor", "describe_commit_error"]


class DiskUsage(NamedTuple):
    used_fraction: float
    free: int
    total: int


MapUsage = Callable[[], tuple[int, int]]
"""``(used, size)`` bytes of the storage map."""


class DiskUsageMonitor:
    """Samples the usage of the ledger directory's filesystem and storage map; see the module docstring."""

    def __init__(self, path: Path, threshold: float, lwm_threshold: float, override_file: str = "", *,
                 check_bytes: int = 16 << 20, map_usage: MapUsage | None = None,
                 extra_paths: tuple[Path, ...] = ()) -> None:
        self.path = path
        self.extra_paths = extra_paths  # the journal directory: its filesystem counts too
        self.threshold = threshold
        self.lwm_threshold = lwm_threshold
        self.override_file = Path(override_file) if override_file else None
        self.check_bytes = check_bytes
        self.map_usage = map_usage
        self.read_only = False
        self._written = 0

    def sample(self) -> DiskUsage:
        """The current usage (one ``statvfs``); ``OSError`` when the directory cannot be measured."""
        du = shutil.disk_usage(self.path)
        total = max(du.total, 1)
        usage = DiskUsage((total - du.free) / total, du.free, total)
        for extra in self.extra_paths:
            try:
                edu = shutil.disk_usage(extra)
            except FileNotFoundError:
                continue
            etotal = max(edu.total, 1)
            if (etotal - edu.free) / etotal > usage.used_fraction:
                usage = DiskUsage((etotal - edu.free) / etotal, edu.free, etotal)
        override = self._override()
        if override is not None:
            usage = DiskUsage(override, int(total * (1.0 - override)), total)
        if self.map_usage is not None:
            used, size = self.map_usage()
            if size > 0 and used / size > usage.used_fraction:
                usage = DiskUsage(used / size, min(size - used, usage.free), size)
        return usage

    def _override(self) -> float | None:
        if self.override_file is None:
            return None
        try:
            text = self.override_file.read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read disk usage override %s: %s", self.override_file, exc)
            return None
        if not text:
            return None
        try:
            return min(max(float(text), 0.0), 1.0)
        except ValueError:
            log.warning("ignoring disk usage override %r (not a fraction)", text)
            return None

    def check(self) -> tuple[DiskUsage, bool]:
        """Sample and apply the thresholds; returns the sample and whether the state changed."""
        self._written = 0
        usage = self.sample()
        was = self.read_only
        if not was and usage.used_fraction >= self.threshold:
            self.read_only = True
            log.warning("disk usage %.3f >= %.3f: bookie turns read-only", usage.used_fraction,
                        self.threshold)
        elif was and usage.used_fraction < self.lwm_threshold:
            self.read_only = False
            log.info("disk usage %.3f < %.3f: bookie is writable again", usage.used_fraction,
                     self.lwm_threshold)
        return usage, self.read_only != was

    def note_written(self, nbytes: int) -> bool:
        """Count bytes committed; True once ``check_bytes`` were written since the last check."""
        self._written += nbytes
        return self._written >= self.check_bytes

    def force_read_only(self, reason: str) -> bool:
        """Turn read-only now; returns whether the state changed."""
        if self.read_only:
            return False
        self.read_only = True
        log.warning("bookie turns read-only: %s", reason)
        return True


def describe_commit_error(exc: BaseException, path: Path) -> tuple[str, bool]:
    """A one-line reason for a failed commit, and whether it is a lack of space.

    LMDB reports a full map as ``MDB_MAP_FULL`` and a full disk as an I/O
    error of ``mdb_txn_commit`` (``ENOSPC`` from ``write``, or ``EIO`` from
    ``fsync`` after a failed writeback): an I/O error while the filesystem
    has less free space than a commit may need is named ENOSPC.
    """
    if isinstance(exc, lmdb.MapFullError):
        return "storage map full (raise ledger_storage_map_size): MDB_MAP_FULL", True
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code == errno.ENOSPC or isinstance(exc, lmdb.DiskError) or "No space left" in text:
        return f"no space left on device (ENOSPC) in {path}: {text}", True
    if code == errno.EIO or "Input/output error" in text:
        try:
            free = shutil.disk_usage(path).free
        except OSError:
            free = -1
        if 0 <= free < _LOW_SPACE:
            return f"no space left on device (ENOSPC: {free} bytes free in {path}): {text}", True
    return text, False


_LOW_SPACE = 64 << 20
"""Free bytes under which an I/O error of a commit is taken for a full disk."""
