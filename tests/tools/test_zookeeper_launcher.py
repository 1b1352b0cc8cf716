"""The ZooKeeper launcher (tools.zookeeper) and ``quire zookeeper``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

import tools.zookeeper as launcher
from tests.fixtures.zookeeper import in_ci
from tools.zookeeper import ZooKeeperNotInstalled, ZooKeeperServer, four_letter_word

pytestmark = [pytest.mark.zookeeper, pytest.mark.timeout(90)]

WAIT = 30.0


def _answers(server: ZooKeeperServer) -> bool:
    try:
        return "Mode: standalone" in four_letter_word(server.host, server.port, "srvr", timeout=1.0)
    except OSError:
        return False


def _installed_or_skip() -> None:
    try:
        launcher.find_java()
        launcher.find_classpath()
    except ZooKeeperNotInstalled as exc:
        if in_ci():
            pytest.fail(f"ZooKeeper must be installed in CI: {exc}", pytrace=False)
        pytest.skip(f"ZooKeeper not installed: {exc}")


def test_start_answer_stop_restart(zk_server_private: ZooKeeperServer) -> None:
    zk = zk_server_private
    assert zk.running and zk.pid and zk.port > 0
    assert zk.connect_string == f"127.0.0.1:{zk.port}"
    assert _answers(zk)
    assert four_letter_word(zk.host, zk.port, "ruok") == "imok"
    assert (zk.data_dir / "zoo.cfg").read_text().count(f"clientPort={zk.port}") == 1

    client = KazooClient(hosts=zk.connect_string, timeout=5.0)
    client.start(timeout=10.0)
    try:
        client.create("/kept", b"data", makepath=True)
    finally:
        client.stop()
        client.close()

    port, pid = zk.port, zk.pid
    zk.restart()
    assert zk.port == port and zk.pid not in (None, pid) and _answers(zk)
    client = KazooClient(hosts=zk.connect_string, timeout=5.0)
    client.start(timeout=10.0)
    try:
        assert client.get("/kept")[0] == b"data"  # same data dir
    finally:
        client.stop()
        client.close()

    zk.stop()
    assert zk.pid is None and not zk.running and not _answers(zk)
    zk.stop()  # idempotent
    zk.start()  # a plain start after stop also keeps the port
    assert zk.port == port and _answers(zk)


def test_kill_is_a_crash_and_start_recovers(zk_server_private: ZooKeeperServer) -> None:
    zk = zk_server_private
    pid = zk.pid
    assert pid is not None
    zk.kill()
    assert not zk.running and not _answers(zk)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    zk.start()
    assert _answers(zk)


def test_context_manager(tmp_path: Path) -> None:
    _installed_or_skip()
    with ZooKeeperServer(tmp_path / "zk") as zk:
        assert _answers(zk)
        pid = zk.pid
    assert not zk.running
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_bad_config_fails_with_log_tail(tmp_path: Path) -> None:
    _installed_or_skip()
    zk = ZooKeeperServer(tmp_path / "zk", extra_config={"tickTime": "not-a-number"})
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        zk.start(timeout=20.0)
    assert not isinstance(info.value, ZooKeeperNotInstalled)
    assert "exited" in str(info.value) and "not-a-number" in str(info.value)
    assert time.monotonic() - t0 < 20.0
    assert not zk.running


def test_missing_jars_or_java_is_not_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(launcher, "DEFAULT_JAR_DIRS", ())
    monkeypatch.setenv("QUIRE_ZOOKEEPER_JARS", str(tmp_path))
    monkeypatch.delenv("ZOOKEEPER_HOME", raising=False)
    with pytest.raises(ZooKeeperNotInstalled, match=r"zookeeper\.jar"):
        launcher.find_classpath()
    with pytest.raises(ZooKeeperNotInstalled):
        ZooKeeperServer(tmp_path / "zk").start()
    monkeypatch.undo()
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(ZooKeeperNotInstalled, match="java"):
        launcher.find_java()


def test_versioned_jar_names_are_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("zookeeper-3.8.0.jar", "zookeeper-3.10.1.jar", "zookeeper-jute-3.8.0.jar",
                 "zookeeper-recipes-lock-3.9.jar", "slf4j-api-1.7.32.jar"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setattr(launcher, "DEFAULT_JAR_DIRS", ())
    monkeypatch.setenv("QUIRE_ZOOKEEPER_JARS", str(tmp_path))
    monkeypatch.delenv("ZOOKEEPER_HOME", raising=False)
    names = [Path(p).name for p in launcher.find_classpath()]
    assert names == ["zookeeper-3.10.1.jar", "zookeeper-jute-3.8.0.jar", "slf4j-api-1.7.32.jar"]


def test_cli_runs_in_foreground_until_sigterm(tmp_path: Path) -> None:
    _installed_or_skip()
    data = tmp_path / "cli"
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "zookeeper", "--port", "0",
                             "--data", str(data)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(Path(__file__).resolve().parents[2]))
    try:
        stdout = proc.stdout
        assert stdout is not None
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(WAIT)
        assert line and line[0].strip(), proc.stderr.read() if proc.stderr else ""
        host, _, port = line[0].strip().rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        assert "Mode:" in four_letter_word(host, int(port), "srvr")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0
        with pytest.raises(OSError):
            four_letter_word(host, int(port), "srvr")
        assert (data / "zookeeper.log").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT)


def _listening_socket() -> socket.socket:
    """A socket listening on a free loopback port (the "other process" holding it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def test_cli_on_a_busy_port_prints_one_line_and_exits_1(tmp_path: Path) -> None:
    _installed_or_skip()
    with _listening_socket() as busy:
        port = busy.getsockname()[1]
        data = tmp_path / "busy"
        res = subprocess.run([sys.executable, "-m", "tools.cli", "zookeeper", "--port", str(port),
                              "--data", str(data)], capture_output=True, text=True, timeout=WAIT,
                             cwd=str(Path(__file__).resolve().parents[2]))
    assert res.returncode == 1
    assert res.stderr.splitlines() == [f"quire zookeeper: cannot listen on 127.0.0.1:{port}: address already in use"]
    assert res.stdout == ""
    assert not (data / "zookeeper.log").exists(), "found before a JVM was started"


def test_the_jvm_bind_failure_is_the_same_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The port taken between the check and the JVM's bind: the JVM's log line maps to CannotListen."""
    _installed_or_skip()
    monkeypatch.setattr(launcher, "check_listen", lambda host, port: None)
    with _listening_socket() as busy:
        port = busy.getsockname()[1]
        zk = ZooKeeperServer(tmp_path / "zk", port=port)
        with pytest.raises(launcher.CannotListen) as info:
            zk.start(timeout=WAIT)
    assert str(info.value) == f"cannot listen on 127.0.0.1:{port}: address already in use"
    assert "Address already in use" in zk.log_path.read_text(), "the JVM did try and fail"
    assert not zk.running


def test_check_listen_allows_a_just_stopped_port(zk_server_private: ZooKeeperServer) -> None:
    """A listening server makes its port unusable; once stopped (TIME_WAIT left behind) it is usable again."""
    zk = zk_server_private
    assert four_letter_word(zk.host, zk.port, "ruok") == "imok"   # a connection the server closes
    with pytest.raises(launcher.CannotListen, match="address already in use"):
        launcher.check_listen(zk.host, zk.port)
    zk.stop()
    launcher.check_listen(zk.host, zk.port)
    zk.restart()   # a fixed port now: start() checks it first
    assert _answers(zk)


def test_free_port_is_picked_below_the_ephemeral_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ports from bind(0) are the ones other processes take next (outgoing connections, their own
    # bind(0)); a port picked for a process that binds it later comes from below that range
    fake = tmp_path / "range"
    fake.write_text("40000\t60999\n")
    monkeypatch.setattr(launcher, "_EPHEMERAL_RANGE", fake)
    ports = {launcher.free_port() for _ in range(20)}
    assert all(10000 <= p < 40000 for p in ports), ports
    assert len(ports) > 1                    # random, not the same port for every caller
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))   # and free
    fake.write_text("10000\t60999\n")        # no room below the range: the kernel picks
    assert launcher.free_port() > 0
