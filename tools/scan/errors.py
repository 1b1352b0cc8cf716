"""Errors of ``quire scan``; each message is one line an operator can act on."""

from __future__ import annotations


class ScanError(Exception):
    """A scan cannot run (bad option, unreachable or invisible metastore, bad report argument)."""


class MetastoreNotVisibleError(ScanError):
    """An lmdb metastore directory does not exist where the code runs (driver or executor)."""
