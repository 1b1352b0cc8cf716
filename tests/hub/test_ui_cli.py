"""``quire ui`` and the console line of ``quire standalone`` (``make run``), on a real standalone cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.fixtures.standalone import quire_standalone

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)


def quire_ui(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli", "ui", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL, env=env)


async def test_standalone_prints_the_console_and_quire_ui_finds_it(tmp_path: Path) -> None:
    data = tmp_path / "sa"
    async with quire_standalone("--bookies", "1", "--hub-port", "0", "--data", str(data)) as lines:
        console = [line for line in lines if line.startswith("console ")]
        assert len(console) == 1 and console[0].endswith(" (quire ui --open)"), lines
        url = console[0].split()[1]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/ui/")
        res = quire_ui("--data", str(data))
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == url
        metastore = next(line.split()[1] for line in lines if line.startswith("metastore "))
        res = quire_ui("--metastore", metastore)                # any cluster, by its metastore
        assert res.returncode == 0 and res.stdout.strip() == url, res.stderr
        opener = tmp_path / "browser"           # $BROWSER, as webbrowser reads it: gets the address
        opener.write_text(f'#!/bin/sh\necho "$1" > {tmp_path / "opened"}\n')
        opener.chmod(0o755)
        res = quire_ui("--data", str(data), "--open", env={**os.environ, "BROWSER": str(opener)})
        assert res.returncode == 0 and res.stdout.strip() == url, res.stderr
        assert (tmp_path / "opened").read_text().strip() == url
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            async with http.get(url) as resp:
                assert resp.status == 200 and resp.content_type == "text/html"
                assert "<title>Overview · Quire console</title>" in await resp.text()
    res = quire_ui("--metastore", f"lmdb://{tmp_path / 'none'}")
    assert res.returncode == 1 and res.stderr.startswith("quire ui: no lmdb metastore at ")
    assert len(res.stderr.strip().splitlines()) == 1
    res = quire_ui("--data", str(data))                    # stopped: a one-line error
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        f"quire ui: no standalone cluster is running on {data.resolve()} (start one with `make run`)"]
