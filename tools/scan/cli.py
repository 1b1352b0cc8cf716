"""``quire scan REPORT``: run a Spark report over the metastore, print it, optionally write it.

    quire scan ledgers-per-bookie --metastore lmdb://data/metastore
    quire scan orphan-ledgers --metastore zk://127.0.0.1:2181/quire --min-age 2h \\
        --master spark://127.0.0.1:7077 --out orphans.parquet

The metastore is checked from this process before Spark starts; a bad
argument, a missing lmdb store or an unreachable metastore prints one line
(``quire scan: error: ...``) and exits 1 (argparse errors exit 2).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metastore.conf import ConfError
from tools.cli_common import (
    CONF_ENV,
    MetastoreOpenError,
    add_common_options,
    metastore_from_args,
    needs_extra_message,
    no_metastore_message,
    probe_metastore,
)
from tools.scan.catalog import REPORT_HELP, missing_scan_module
from tools.scan.errors import ScanError

OUT_FORMATS = (".csv", ".parquet")
DEFAULT_TIMEOUT = 30.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$")

EXAMPLE = """example:
  quire scan {name} --metastore lmdb://data/metastore
  quire scan {name} --metastore zk://127.0.0.1:2181/quire --master spark://127.0.0.1:7077 --out {out}
"""


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``15m``, ``2h`` or ``7d``; ``argparse.ArgumentTypeError`` otherwise."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: use a number with s, m, h or d (e.g. 2h)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def configure(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    missing = missing_scan_module()
    install = f"\n{needs_extra_message('scan', missing, 'scan')}\n" if missing else ""
    parser.epilog = EXAMPLE.format(name="ledgers-per-bookie", out="per-bookie.parquet") + install
    add_common_options(parser, timeout=DEFAULT_TIMEOUT)
    sub = parser.add_subparsers(dest="report", metavar="REPORT", required=True)
    for name, help_text in REPORT_HELP.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           epilog=EXAMPLE.format(name=name, out=f"{name}.csv") + install,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        add_common_options(p, timeout=DEFAULT_TIMEOUT, in_command=True)
        p.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
        p.add_argument("--out", metavar="PATH", help="also write the result to PATH.csv or PATH.parquet")
        p.add_argument("--partitions", type=_positive, help="key ranges per scanned table (default 2 x CPUs)")
        p.add_argument("--limit", type=_positive, default=100, help="rows to print (default 100)")
        if name == "orphan-ledgers":
            p.add_argument("--min-age", type=parse_duration, default=3600.0, metavar="DURATION",
                           help="only ledgers created at least this long ago (default 1h; e.g. 0, 90s, 2h, 7d)")
    return run


def metastore_uri(args: argparse.Namespace) -> str:
    """The URI from ``--metastore`` or from ``--conf`` (``ConfError`` when the file names none)."""
    uri, _ = metastore_from_args(args.metastore, args.conf)
    if uri is None:
        raise ConfError(no_metastore_message(args.conf or os.environ.get(CONF_ENV)))
    return uri


def check_metastore(uri: str, timeout: float | None = DEFAULT_TIMEOUT) -> None:
    """Open and close ``uri`` from this process within ``timeout`` s; raises ``ScanError`` with the reason."""
    from tools.scan.datasource import check_visible

    check_visible(uri, "this")
    try:
        probe_metastore(uri, timeout)
    except MetastoreOpenError as exc:
        raise ScanError(str(exc)) from None


def one_line(exc: BaseException) -> str:
    """The most specific ``SomeError: reason`` line of an exception (Spark wraps Python tracebacks)."""
    text = str(exc)
    found = [m for m in (_ERROR_LINE.match(line.strip()) for line in text.splitlines()) if m]
    ours = [m for m in found if not m.group(1).startswith(("Py4J", "Spark", "Analysis", "PythonException"))]
    if ours:
        m = ours[-1]
        return f"{m.group(1)}: {m.group(2)}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first[:500]


def write_out(table: Any, path: str) -> None:
    """Write an Arrow table to ``path`` (``.csv`` or ``.parquet``); ``ScanError`` on failure."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    try:
        if path.endswith(".parquet"):
            pq.write_table(table, path)
        else:
            pcsv.write_csv(table, path)
    except OSError as exc:
        raise ScanError(f"cannot write {path}: {exc}") from None


def render(table: Any, limit: int) -> str:
    from tabulate import tabulate

    rows = table.slice(0, limit).to_pylist()
    text = tabulate([list(r.values()) for r in rows], headers=table.column_names, tablefmt="simple")
    more = table.num_rows - len(rows)
    tail = f"\n... {more} more rows (use --out to get them all)" if more > 0 else ""
    return f"{text}{tail}\n({table.num_rows} rows)"


def run(args: argparse.Namespace) -> int:
    missing = missing_scan_module()
    if missing is not None:    # `make run` installs no extras: say what to install, before anything else
        print(needs_extra_message("scan", missing, "scan"), file=sys.stderr)
        return 2
    try:
        if args.out and not args.out.endswith(OUT_FORMATS):
            raise ScanError(f"--out {args.out}: the name must end in .csv or .parquet")
        if args.out and not Path(args.out).resolve().parent.is_dir():
            raise ScanError(f"--out {args.out}: directory {Path(args.out).resolve().parent} does not exist")
        uri = metastore_uri(args)
        check_metastore(uri, args.timeout)
        kwargs: dict[str, Any] = {"partitions": args.partitions}
        if args.report == "orphan-ledgers":
            kwargs["min_age_s"] = args.min_age
        result = _run_spark(args.master, args.report, uri, kwargs)
    except (ScanError, ConfError) as exc:
        print(f"quire scan: error: {exc}", file=sys.stderr)
        return 1
    print(render(result, args.limit))
    if args.out:
        try:
            write_out(result, args.out)
        except ScanError as exc:
            print(f"quire scan: error: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {result.num_rows} rows to {args.out}")
    return 0


def _run_spark(master: str, report: str, uri: str, kwargs: dict[str, Any]) -> Any:
    """The report as an Arrow table, on a session for ``master``: a new one, stopped at the end; or, when this
    process already has an active session (``quire scan`` called in a process that uses Spark), that one,
    which is left running for its owner."""
    from pyspark.sql import SparkSession

    from tools.scan.reports import run_report
    from tools.scan.session import spark_session

    started_here = SparkSession.getActiveSession() is None
    try:
        spark = spark_session(master)
    except Exception as exc:  # Spark start-up fails in many ways (bad master URL, no Java)
        raise ScanError(f"cannot start Spark on {master}: {one_line(exc)}") from None
    from tools.scan.datasource import probe_executors
    from tools.scan.errors import MetastoreNotVisibleError

    try:
        probe_executors(spark, uri)
        return run_report(spark, report, uri, **kwargs).toArrow()
    except MetastoreNotVisibleError as exc:   # the probe's own answer, named as a failed job's would be
        raise ScanError(f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # a failed job arrives as a Py4J/pyspark error wrapping the Python one
        raise ScanError(one_line(exc)) from None
    finally:
        if started_here:
            spark.stop()
