"""``python -m metastore.testing --uri SCHEME://...``: run the conformance kit, print a table.

Exit status 0 when every case passed (skipped optional capabilities are
listed with their reason), 1 otherwise; 2 (one line naming the ``testing``
extra) when pytest is not installed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

try:
    import pytest
except ImportError:   # `make run` installs no extras: say which one runs the kit
    sys.stderr.write("python -m metastore.testing: the conformance kit runs on pytest, which is not installed: "
                     "run `pip install -e '.[testing]'` in the source tree (or `pip install pytest`)\n")
    raise SystemExit(2) from None

from metastore.testing import conformance


class _Kit:
    """pytest plugin object: supplies the URI and records outcomes."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.rows: list[tuple[str, str, str]] = []

    @pytest.fixture
    def conformance_uri(self) -> str:
        return self.uri

    def pytest_runtest_logreport(self, report: Any) -> None:
        name = report.nodeid.split("::")[-1].removeprefix("test_")
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            detail = ""
            if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
                detail = str(report.longrepr[2]).removeprefix("Skipped: ")
            elif report.outcome == "failed":
                lines = str(getattr(report.longrepr, "reprcrash", "") or "").splitlines()
                detail = lines[-1] if lines else "failed"
            self.rows.append((name, report.outcome, detail))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m metastore.testing",
                                     description="Run the Quire metastore conformance kit against a URI.")
    parser.add_argument("--uri", required=True, help="metastore URI, e.g. lmdb:///tmp/x or zk://host:2181/p")
    parser.add_argument("-k", dest="keyword", default=None, help="only cases matching this pytest -k expression")
    parser.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output")
    args = parser.parse_args(argv)
    kit = _Kit(args.uri)
    pytest_args = [conformance.__file__, "-p", "no:quire_metastore_conformance", "-p", "no:cacheprovider",
                   "-c", os.devnull, "--rootdir", os.path.dirname(conformance.__file__), "-o", "addopts="]
    pytest_args += ["-q", "--tb=short"] if args.verbose else ["-p", "no:terminal", "-p", "no:asyncio"]
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    code = pytest.main(pytest_args, plugins=[kit])
    width = max((len(r[0]) for r in kit.rows), default=10)
    out = sys.stdout
    out.write(f"Quire metastore conformance: {args.uri}\n")
    out.write(f"{'case'.ljust(width)}  result   detail\n{'-' * (width + 30)}\n")
    for name, outcome, detail in kit.rows:
        out.write(f"{name.ljust(width)}  {outcome.upper():7}  {detail}\n")
    passed = sum(1 for r in kit.rows if r[1] == "passed")
    failed = sum(1 for r in kit.rows if r[1] == "failed")
    skipped = sum(1 for r in kit.rows if r[1] == "skipped")
    out.write(f"{passed} passed, {failed} failed, {skipped} skipped\n")
    return 0 if failed == 0 and code in (0, 5) and kit.rows else 1


if __name__ == "__main__":
    sys.exit(main())
