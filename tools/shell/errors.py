"""Errors of ``quire shell``: each carries the one line the command prints before it exits.

    raise UsageError("bad bookie address 'x': expected HOST:PORT")     # exit status 2
    raise ShellError("no ledger 42")                                    # exit status 1
"""

from __future__ import annotations


class ShellError(Exception):
    """A command failed; ``str(exc)`` is the one-line reason. Exit status ``exit_code`` (1)."""

    exit_code = 1


class UsageError(ShellError):
    """A bad argument or configuration (exit status 2)."""

    exit_code = 2


class MetastoreUnavailableError(ShellError):
    """The metastore cannot be opened (unreachable, missing, malformed URI)."""


class RecoveryError(ShellError):
    """Re-replication of one ledger failed (no readable replica, no replacement bookie...)."""
