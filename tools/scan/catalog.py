"""The built-in ``quire scan`` reports by name, with their one-line help.

No Spark here: ``quire scan --help`` lists the reports and their options in
a venv without the ``scan`` extra (what ``make run`` installs), and then says
what to install. ``tools.scan.reports`` pairs each name with its function.
"""

from __future__ import annotations

import importlib.util

__all__ = ["REPORT_HELP", "SCAN_MODULES", "missing_scan_module"]

REPORT_HELP: dict[str, str] = {
    "ledgers-per-bookie": "ledgers per bookie address, with registration state",
    "under-replicated": "ledgers with a fragment on a bookie that is not registered",
    "subscription-backlog": "per topic and subscriber: last published minus consumed",
    "orphan-ledgers": "ledgers no topic range references, older than --min-age",
}

SCAN_MODULES = ("pyspark", "pyarrow", "tabulate")
"""What the ``scan`` extra (pyproject.toml) installs that the reports import."""


def missing_scan_module() -> str | None:
    """The first module of the ``scan`` extra that is not installed, or None."""
    return next((m for m in SCAN_MODULES if importlib.util.find_spec(m) is None), None)
