"""The README's Python blocks marked runnable, run as scripts against a real standalone cluster.

A block is runnable when the line before its opening fence is ``<!-- runnable ... -->``.
Each runs from the directory that holds the standalone's ``data/`` (so
``lmdb://data/metastore`` is its metastore, as from the repository root after
``make run``), with ``localhost:4080`` replaced by the hub's address (the test
cannot take port 4080 on a shared machine). When the paragraph after a block
starts with ``prints``, every backticked fragment of that sentence must appear in the
script's output.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARK = "<!-- runnable"
# Python blocks that are not complete scripts, and why
NOT_RUNNABLE = {
    "from tools.scan import register_datasource": "needs Spark 4 and Java 17 (tests/tools/test_scan_spark.py)",
}


@dataclass
class Snippet:
    line: int
    code: str
    prints: list[str]


def snippets() -> tuple[list[Snippet], list[Snippet]]:
    """(runnable, other) Python blocks of the README."""
    lines = README.read_text().splitlines()
    runnable, other = [], []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        start = i
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        code = "\n".join(lines[i + 1:end]) + "\n"
        after = next((lines[j] for j in range(end + 1, len(lines)) if lines[j].strip()), "")
        para = [after]
        for j in range(end + 2, len(lines)):
            if not lines[j].strip():
                break
            para.append(lines[j])
        sentence = re.match(r"prints (.*?`)\.(\s|$)", " ".join(para))   # up to the sentence's end
        prints = re.findall(r"`([^`]+)`", sentence.group(1)) if sentence else []
        snippet = Snippet(start + 1, code, prints)
        (runnable if start > 0 and lines[start - 1].startswith(MARK) else other).append(snippet)
        i = end + 1
    return runnable, other


RUNNABLE, OTHER = snippets()


def test_every_python_block_is_runnable_or_says_why_not() -> None:
    assert len(RUNNABLE) >= 4 and all(s.prints for s in RUNNABLE)   # each says what it prints
    for s in OTHER:
        assert any(s.code.startswith(prefix) for prefix in NOT_RUNNABLE), f"README.md:{s.line} is not runnable"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """``quire standalone --data data`` in a fresh directory: (that directory, the hub's address)."""
    root = tmp_path_factory.mktemp("readme")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "standalone", "--data", "data", "--hub-port", "0",
                             "--json"], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()   # the ready report; the fixture's bound is the test timeout
        assert line, "standalone exited before it was ready"
        report = json.loads(line)
        hub = next(p["address"] for p in report["processes"] if p["role"] == "hub")
        yield root, hub
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("snippet", RUNNABLE, ids=[f"README.md:{s.line}" for s in RUNNABLE])
def test_runnable_block(snippet: Snippet, standalone: tuple[Path, str], tmp_path: Path) -> None:
    root, hub = standalone
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code.replace("localhost:4080", hub))
    out = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f"README.md:{snippet.line} failed:\n{out.stderr[-3000:]}"
    for fragment in snippet.prints:
        assert fragment in out.stdout, f"README.md:{snippet.line}: {fragment!r} not in its output:\n{out.stdout}"
