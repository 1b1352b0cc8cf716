"""`quire bookie` and `quire hub` with the shipped confs: the README's roles table, as a newcomer runs it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from hub.client import HedwigClient

ROOT = Path(__file__).resolve().parents[2]


async def _start(cwd: Path, *args: str) -> tuple[asyncio.subprocess.Process, str]:
    """``quire ARGS`` in ``cwd``; returns the process and its ready line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tools.cli", *args, cwd=cwd, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    async with asyncio.timeout(60):
        line = (await proc.stdout.readline()).decode().strip()
    if not line:
        err = (await proc.stderr.read()).decode()
        raise AssertionError(f"quire {' '.join(args)} exited with {await proc.wait()}: {err}")
    return proc, line


async def _stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        return await proc.wait()


async def test_stock_confs_start_a_working_cluster_on_the_embedded_metastore(tmp_path: Path) -> None:
    """Before: the bookie had no metastore (exit 2), the hub waited for a ZooKeeper on localhost:2181."""
    bookie, line = await _start(tmp_path, "bookie", "--conf", str(ROOT / "conf" / "bk_server.conf"), "--port", "0")
    hub = None
    try:
        assert line.startswith("bookie ready "), line
        # one bookie here, so ledgers of one; the stock E3 W2 A2 needs three (the README starts three)
        hub, hub_line = await _start(tmp_path, "hub", "--conf", str(ROOT / "conf" / "hw_server.conf"), "--port", "0",
                                     "--set", "bk_ensemble_size=1", "--set", "bk_write_quorum_size=1",
                                     "--set", "bk_ack_quorum_size=1")
        assert hub_line.startswith("hub ready "), hub_line
        assert (tmp_path / "data" / "metastore" / "data.mdb").is_file()   # both on lmdb://data/metastore
        client = await HedwigClient.connect(hub_line.split()[2])
        try:
            assert await asyncio.wait_for(client.publish(b"first-hour", b"hello"), 30) == 1
        finally:
            await client.close()
    finally:
        codes = [await _stop(p) for p in (hub, bookie) if p is not None]
    assert codes == [0] * len(codes)
