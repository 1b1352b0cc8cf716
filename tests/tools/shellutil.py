"""Running `quire shell` as a real process from the tests."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass


@dataclass
class Shell:
    rc: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


async def shell(*args: str, timeout: float = 60.0, env: dict[str, str] | None = None,
                cwd: str | None = None) -> Shell:
    """Run ``quire shell ARGS`` as a process (``env``: variables added to ours); its exit status, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tools.cli", "shell", *args,
                                                env={**os.environ, **(env or {})}, cwd=cwd,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return Shell(proc.returncode, out.decode(), err.decode())


def one_line_error(r: Shell, needle: str) -> None:
    """The command failed with exactly one line on stderr that names the problem."""
    assert r.rc != 0, r.out
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1, r.err
    assert needle in lines[0], r.err
