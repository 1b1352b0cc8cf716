"""The README's worked plugin example (tests/plugin_example) registers and passes the kit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from metastore.registry import available_schemes, backend_class


def test_example_plugin_is_registered_through_the_entry_point() -> None:
    assert "sqlite" in available_schemes()
    assert backend_class("sqlite").__name__ == "SqliteMetaStore"


def test_kit_cli_passes_the_example_plugin(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path}/meta.db"
    proc = subprocess.run([sys.executable, "-m", "metastore.testing", "--uri", uri],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the example backend offers no native counter: the kit skips those two cases and says why
    assert "25 passed, 0 failed, 2 skipped" in proc.stdout
    assert "backend sqlite has no counter capability" in proc.stdout
    assert "ephemeral_dies_with_owner  PASSED" in proc.stdout


def test_kit_cli_reports_failures_with_nonzero_exit(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "metastore.testing", "--uri", "nosuch://x",
                           "-k", "create_and_get"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "create_and_get  FAILED" in proc.stdout
    assert "unknown metastore scheme 'nosuch'" in proc.stdout


async def test_example_plugin_refuses_an_unknown_option_naming_it(tmp_path: Path) -> None:
    import pytest

    from metastore import open_metastore
    from metastore.errors import IllegalOpError

    with pytest.raises(IllegalOpError, match="sqlite metastore options: unknown key 'busy_timout'"):
        await open_metastore(f"sqlite://{tmp_path}/meta.db?busy_timout=3")
    ms = await open_metastore(f"sqlite://{tmp_path}/meta.db", busy_timeout="2.5")
    try:
        assert ms.options.busy_timeout == 2.5  # type: ignore[attr-defined]
    finally:
        await ms.close()
