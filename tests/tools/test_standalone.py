"""`quire standalone` as a supervisor: explicit ports, its report, one per data dir, no orphans, drained pipes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tools.cluster import ClusterRunningError, LocalCluster

ROOT = Path(__file__).resolve().parents[2]


def quire(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait (on pidfds, no polling) until every pid has exited; returns those still alive after ``timeout``."""
    fds = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(pid)] = pid
    remaining = dict(fds)
    end = time.monotonic() + timeout
    while remaining:
        left = end - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(list(remaining), [], [], left)
        for fd in ready:
            remaining.pop(fd)
    for fd in fds:
        os.close(fd)
    return sorted(remaining.values())


@contextlib.asynccontextmanager
async def standalone(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, dict[str, object]]]:
    """``quire standalone --json ARGS``; yields the process and its ready report; kills it on the way out."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tools.cli", "standalone", "--json", *args,
                                                cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(90):
            line = await proc.stdout.readline()
        if not line:
            raise AssertionError(f"standalone exited: {(await proc.stderr.read()).decode()}")
        yield proc, json.loads(line)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_bad_counts_and_a_busy_hub_port_are_one_line_errors() -> None:
    res = quire("standalone", "--bookies", "0")
    assert res.returncode == 2 and "--bookies" in res.stderr and "expected a number >= 1" in res.stderr
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = quire("standalone", "--hub-port", str(port), "--data", "/nonexistent/never-created")
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"quire standalone: hub port {port} is in use (stop what holds it, or pass --hub-port 0 for any free port; "
        "make run HUB_PORT=0, also BOOKIES=N DATA=DIR)"]
    assert not Path("/nonexistent/never-created").exists()


@pytest.mark.slow
async def test_a_restart_right_after_stopping_with_a_client_connected(tmp_path: Path) -> None:
    """The stopped hub closed its client's connection first, so the port has a TIME_WAIT connection for up to a
    minute: the port check binds as the hub does (SO_REUSEADDR) and the restart comes up at once."""
    from hub.proto import pubsub_pb2 as pb
    from hub.protocol import encode

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = ("--bookies", "1", "--hub-port", str(port), "--data", str(tmp_path / "sa"))
    async with standalone(*args) as (proc, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(encode(pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PING, txnId=1)))
            async with asyncio.timeout(20):
                assert len(await reader.readexactly(4)) == 4       # answered: the hub holds the connection
            proc.send_signal(signal.SIGINT)                   # Ctrl-C with the client still connected
            assert await asyncio.wait_for(proc.wait(), 60) == 0
            async with asyncio.timeout(20):
                while await reader.read(4096):                # the hub closed it (so its side is in TIME_WAIT)
                    pass
        finally:
            writer.close()
    with socket.socket() as plain, pytest.raises(OSError):   # the condition: a bind without SO_REUSEADDR fails
        plain.bind(("127.0.0.1", port))
    async with standalone(*args) as (_, report):
        hub = [p for p in report["processes"] if p["role"] == "hub"]  # type: ignore[union-attr,index]
        assert hub[0]["address"] == f"127.0.0.1:{port}"


@pytest.mark.slow
async def test_report_lock_and_no_orphans_after_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "sa"
    async with standalone("--bookies", "1", "--hub-port", "0", "--data", str(data)) as (proc, report):
        assert report["metastore"] == f"lmdb://{data / 'metastore'}"
        procs = report["processes"]
        assert isinstance(procs, list) and [p["role"] for p in procs] == ["bookie", "hub"]
        for p in procs:
            assert p["address"].startswith("127.0.0.1:") and p["metrics_url"].endswith("/metrics")
            assert Path(p["log_path"]).is_file() and isinstance(p["pid"], int)
        # a second standalone on the same data directory (and so the same hub port) refuses, naming the first
        hub_port = procs[1]["address"].rsplit(":", 1)[1]
        second = await asyncio.to_thread(quire, "standalone", "--hub-port", hub_port, "--data", str(data))
        assert second.returncode == 1
        assert second.stderr.strip().splitlines() == [
            f"quire standalone: already running (pid {proc.pid}) on {data}"]
        # SIGKILL the supervisor: its bookie and hub must not outlive it
        proc.kill()
        await proc.wait()
        assert await asyncio.to_thread(wait_gone, [p["pid"] for p in procs], 30) == []


@pytest.mark.slow
async def test_sighup_stops_it_cleanly(tmp_path: Path) -> None:
    async with standalone("--bookies", "1", "--hubs", "0", "--data", str(tmp_path / "sa")) as (proc, report):
        pids = [p["pid"] for p in report["processes"]]  # type: ignore[union-attr]
        proc.send_signal(signal.SIGHUP)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        assert await asyncio.to_thread(wait_gone, pids, 5) == []
    # the lock went with it: the same data directory starts again
    async with LocalCluster(bookies=1, data_dir=tmp_path / "sa") as cluster:
        assert len(cluster.bookie_addresses) == 1


FAKE_BOOKIE = """
import sys
print("bookie ready 127.0.0.1:1", flush=True)
for _ in range(256):
    sys.stdout.write("x" * 1023 + "\\n")
sys.stdout.flush()
"""


async def test_a_role_writing_after_its_ready_line_does_not_block(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """256 KiB of stdout after the ready line: before, the pipe filled at 64 KiB and the role hung."""
    monkeypatch.setattr("tools.cluster.bookie_command", lambda conf: [sys.executable, "-c", FAKE_BOOKIE])
    cluster = LocalCluster(bookies=1, metastore=f"lmdb://{tmp_path / 'meta'}", data_dir=tmp_path / "c")
    await cluster.start()
    try:
        proc = cluster._bookies[0].proc
        assert proc is not None
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        await cluster.stop()
    log = (tmp_path / "c" / "bookie-0" / "bookie.log").read_text()
    assert log.count("x" * 1023 + "\n") == 256


async def test_one_cluster_per_data_directory(tmp_path: Path) -> None:
    first = LocalCluster(bookies=0, metastore=f"lmdb://{tmp_path / 'meta'}", data_dir=tmp_path / "c")
    await first.start()
    try:
        with pytest.raises(ClusterRunningError, match=f"already running \\(pid {os.getpid()}\\)"):
            await LocalCluster(bookies=0, metastore=f"lmdb://{tmp_path / 'meta'}", data_dir=tmp_path / "c").start()
    finally:
        await first.stop()
    again = LocalCluster(bookies=0, metastore=f"lmdb://{tmp_path / 'meta'}", data_dir=tmp_path / "c")
    await again.start()
    await again.stop()


def test_a_bad_or_test_double_metastore_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    data = tmp_path / "never-created"
    res = quire("standalone", "--metastore", "bogus", "--data", str(data))
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "quire standalone: unknown metastore 'bogus': use lmdb, zookeeper, a URI (zk://HOST:PORT/PREFIX, "
        "hbase://HOST:PORT/PREFIX, lmdb://DIR) or hbase with --allow-test-double"]
    res = quire("standalone", "--metastore", "hbase", "--data", str(data))
    assert res.returncode == 2, res.stderr
    [line] = res.stderr.strip().splitlines()
    assert "test double: nothing persists" in line and "--allow-test-double" in line
    assert not data.exists()


@pytest.mark.slow
async def test_the_hbase_test_double_runs_when_asked_and_says_nothing_persists(tmp_path: Path) -> None:
    args = ("--metastore", "hbase", "--allow-test-double", "--bookies", "1", "--hubs", "0",
            "--data", str(tmp_path / "sa"))
    async with standalone(*args) as (proc, report):
        assert str(report["metastore"]).startswith("hbase://127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
    assert "WARNING: the metastore is the in-memory HBase Thrift emulator" in err


def test_a_role_failing_to_start_shows_why(tmp_path: Path) -> None:
    """An unreachable ZooKeeper: before, 'bookie-0 exited with 1 before it was ready; log tail:' and nothing."""
    res = quire("standalone", "--metastore", "zk://127.0.0.1:1/q", "--bookies", "1", "--hubs", "0",
                "--data", str(tmp_path / "sa"))
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert lines[0] == "quire standalone: bookie-0 exited with 1 before it was ready; log tail:"
    assert any("cannot connect to ZooKeeper at 127.0.0.1:1" in line for line in lines[1:]), res.stderr
    assert "Traceback" not in res.stderr
