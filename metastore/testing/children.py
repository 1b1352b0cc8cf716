"""Child Python processes for multi-process metastore tests (the kit's and backends' own).

    proc = child(SCRIPT, uri, "20")          # python -c SCRIPT uri 20, stdout/stderr piped
    try:
        assert await readline(proc) == "ready"
    finally:
        reap(proc)                           # killed if still running, waited for, pipes closed

``readline`` waits at most ``timeout`` seconds and fails with the child's
stderr when it ends without a line.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

__all__ = ["WAIT", "child", "readline", "reap"]

WAIT = 30.0


def child(script: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -c script args...`` with this interpreter, stdout and stderr piped as text."""
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


async def readline(proc: subprocess.Popen[str], timeout: float = WAIT) -> str:
    """The child's next stdout line, stripped; ``AssertionError`` with its stderr if it ends first."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"child process said nothing; stderr:\n{err[-2000:]}")
    return line.strip()


def reap(proc: subprocess.Popen[str], timeout: float = WAIT) -> None:
    """Kill the child if it still runs, wait for it, close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
