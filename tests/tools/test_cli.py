"""The `quire` console script: --help, --version, and bad usage."""

from __future__ import annotations

import subprocess
import sys

from tools import __version__


def quire(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True, timeout=60)


def test_version() -> None:
    out = quire("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"quire {__version__}"


def test_help_lists_the_roles() -> None:
    out = quire("--help")
    assert out.returncode == 0
    for sub in ("bookie", "standalone", "zookeeper", "bench"):
        assert sub in out.stdout


def test_unknown_subcommand_is_a_usage_error() -> None:
    out = quire("frobnicate")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_bench_lists_its_benchmarks() -> None:
    out = quire("bench", "--help")
    assert out.returncode == 0
    for name in ("metastore", "placement", "ledger"):
        assert name in out.stdout


def test_metastore_bench_prints_json_lines(tmp_path: object) -> None:
    import json

    out = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "metastore", "--count", "50"],
                         capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    cases = {(r["case"], r["client"].split()[0]) for r in rows}
    assert {("cas_put", "quire"), ("get", "quire"), ("cursor_scan", "quire"), ("get", "raw")} <= cases
    assert all(r["ops_per_sec"] > 0 for r in rows if "ops_per_sec" in r)
