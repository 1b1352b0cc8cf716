"""The fork server (tools.forkserver): roles forked from one preloaded interpreter are real, separate processes."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bookie.testing import bookie_command, write_conf
from tools import forkserver
from tools.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]


def _wait_gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` (not our child) ends within ``timeout``: a pidfd turns readable when it does."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


async def test_a_forked_role_reports_its_exit_status_and_output(tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    write_conf(conf, {"bookie_port": "0", "no_such_key": "1"})
    log_path = tmp_path / "bookie.log"
    with open(log_path, "ab") as logf:
        proc = await forkserver.spawn(bookie_command(conf), dict(os.environ), logf)
    assert proc.stdout is not None
    assert _parent_of(proc.pid) not in (os.getpid(), 1), "forked by the server, not by us"
    assert await asyncio.wait_for(proc.stdout.read(), 30) == b""
    assert await asyncio.wait_for(proc.wait(), 30) == 2
    assert proc.returncode == 2
    assert "unknown key 'no_such_key'" in log_path.read_text()


async def test_a_forked_role_is_killed_like_an_execed_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forkserver.ENV, "1")
    async with LocalCluster(bookies=1, hubs=1, data_dir=tmp_path / "c") as cluster:
        bookie, hub = cluster.bookie_pid(0), cluster.hub_pid(0)
        assert bookie is not None and hub is not None and bookie != hub
        server = _parent_of(bookie)
        assert server == _parent_of(hub) != os.getpid()
        await cluster.kill_hub(0)
        assert cluster._hubs[0].proc is not None and cluster._hubs[0].proc.returncode == -signal.SIGKILL
        with pytest.raises(ProcessLookupError):
            os.kill(hub, 0)
        assert cluster.bookie_pid(0) == bookie, "its sibling lives on"
        await cluster.restart_hub(0)
        assert cluster.hub_pid(0) not in (None, hub)
        # an orderly stop ends with status 0, as the exec'd role's does
        await cluster.stop_bookie(0)
        assert cluster._bookies[0].proc is not None and cluster._bookies[0].proc.returncode == 0


def test_roles_end_when_the_process_that_started_them_dies(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import asyncio, os, sys
        from tools.cluster import LocalCluster
        async def main():
            async with LocalCluster(bookies=1, hubs=1, data_dir={str(tmp_path / "c")!r}) as cluster:
                print(cluster.bookie_pid(0), cluster.hub_pid(0), flush=True)
                await asyncio.Event().wait()
        asyncio.run(main())
    """)
    env = {**os.environ, forkserver.ENV: "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the cluster did not start within 60 s"
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        server = _parent_of(pids[0])
        proc.kill()
        proc.wait(10)
        for pid in (*pids, server):
            assert _wait_gone(pid, 30), f"process {pid} outlived the process that started it"
    finally:
        proc.kill()
        proc.wait(10)
