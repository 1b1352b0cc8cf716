"""The comparison peers of ``quire bench publish|fanout``: Redis Streams and NATS JetStream.

    from tools.bench.peers import RedisPeer, NatsPeer, PeerNotInstalled
    with RedisPeer(tmp_dir) as redis:       # redis-server on a free loopback port
        redis.url                           # "redis://127.0.0.1:PORT"
    with NatsPeer(tmp_dir) as nats:         # nats-server -js, file storage under tmp_dir
        nats.url                            # "nats://127.0.0.1:PORT"

Each peer is the Debian package's server binary (``make bench-deps``), run as
a child process bound to 127.0.0.1 with its data under the given directory.
Redis runs with ``appendonly yes`` and ``appendfsync always`` and no RDB
snapshots, so an XADD is answered only after the append-only file was
fsynced. NATS runs JetStream with file storage; ``NatsPeer.durability``
states what its acknowledgement means (nats-server 2.9 syncs its file store
on a timer, not per message).

``start()`` returns once the server answers on its port, or raises
``PeerNotInstalled`` (no binary on ``PATH``) or ``PeerStartError`` (it exited
or did not answer within ``timeout``; the message holds its log tail).
``stop()`` sends SIGTERM, waits, and SIGKILLs after ``STOP_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import csv
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tools.zookeeper import free_port

log = logging.getLogger(__name__)

START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
HOST = "127.0.0.1"


class PeerNotInstalled(RuntimeError):
    """The peer's server binary is not on ``PATH`` (install it with ``make bench-deps``)."""


class PeerStartError(RuntimeError):
    """The peer exited or did not answer in time; the message holds its log tail."""


class Started:
    """``with X(...) as x``: ``start()`` on entry (returning what it returns), ``stop()`` on exit."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class Peer(Started):
    """One peer server process; subclasses say how it starts and how to tell it is ready."""

    binary = ""
    name = ""

    def __init__(self, data_dir: str | os.PathLike[str], timeout: float = START_TIMEOUT) -> None:
        self.data_dir = Path(data_dir).resolve() / self.name
        self.timeout = timeout
        self.port = 0
        self.version = ""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs, else ``None``."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def pids(self) -> list[int]:
        """``[pid]`` while the server runs, else ``[]``: the processes whose CPU counts for this peer."""
        pid = self.pid
        return [] if pid is None else [pid]

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def _args(self, exe: str) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        """True once the server answers on ``self.port``; ``OSError`` while it does not listen yet."""
        raise NotImplementedError

    def start(self) -> Self:
        """Start the server and wait until it answers. Raises as the module docstring says."""
        exe = shutil.which(self.binary)
        if exe is None:
            raise PeerNotInstalled(f"{self.binary} is not installed (`make bench-deps` installs it from Debian; "
                                   "without it in the archive this comparison is skipped)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port(HOST)
        self.version = _version(exe)
        with open(self.log_path, "ab") as logf:
            self._proc = subprocess.Popen(self._args(exe), cwd=self.data_dir, stdin=subprocess.DEVNULL,
                                          stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.timeout
        while True:
            if self._proc.poll() is not None:
                raise PeerStartError(f"{self.binary} exited with status {self._proc.returncode}: {self.log_tail()}")
            try:
                if self._ready():
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise PeerStartError(f"{self.binary} did not answer within {self.timeout:.0f} s: {self.log_tail()}")
            time.sleep(0.05)
        log.info("%s %s serving on %s:%d (data %s)", self.binary, self.version, HOST, self.port, self.data_dir)
        return self

    def stop(self) -> None:
        """SIGTERM, wait up to ``STOP_TIMEOUT``, then SIGKILL. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", self.binary, STOP_TIMEOUT)
            proc.kill()
            proc.wait(STOP_TIMEOUT)

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a peer process's log, or ``(no log)``."""
    try:
        return "\n".join(path.read_text("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _version(exe: str) -> str:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"v=?(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip()


class RedisPeer(Peer):
    """redis-server with AOF and ``appendfsync always``: XADD is acknowledged after fsync."""

    binary = "redis-server"
    name = "redis"
    durability = "appendonly yes, appendfsync always: each reply after the AOF write is fsynced"

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}"

    def _args(self, exe: str) -> list[str]:
        return [exe, "--bind", HOST, "--port", str(self.port), "--dir", str(self.data_dir),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--daemonize", "no", "--protected-mode", "yes", "--logfile", ""]

    def _ready(self) -> bool:
        with socket.create_connection((HOST, self.port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")


async def redis_capacity(peer: RedisPeer, clients: int, pipeline: int, count: int, size: int) -> dict[str, Any]:
    """The redis-server's own XADD capacity: ``redis-benchmark`` (the C client shipped with it).

    Same connections (``-c``), in-flight depth per connection (``-P``), body
    size and count as the Python peer; returns ``ops_per_sec`` and latency
    percentiles in ms, or ``skipped`` when ``redis-benchmark`` is missing.
    """
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return {"skipped": "redis-benchmark is not installed (Debian package redis-tools)"}
    proc = await asyncio.create_subprocess_exec(
        exe, "-h", HOST, "-p", str(peer.port), "-c", str(clients), "-P", str(pipeline), "-n", str(count),
        "--csv", "XADD", "bench:capacity", "*", "body", "x" * size,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    rows = list(csv.reader(out.decode().splitlines()))
    if proc.returncode != 0 or len(rows) < 2:
        return {"skipped": f"redis-benchmark failed: {err.decode().strip()[:200]}"}
    row = dict(zip(rows[0], rows[1], strict=False))
    return {"ops_per_sec": float(row["rps"]), "p50_ms": float(row["p50_latency_ms"]),
            "p99_ms": float(row["p99_latency_ms"])}


class NatsPeer(Peer):
    """nats-server with JetStream on file storage."""

    binary = "nats-server"
    name = "nats"

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    @property
    def durability(self) -> str:
        major_minor = tuple(int(x) for x in re.findall(r"\d+", self.version)[:2] or (0, 0))
        if major_minor >= (2, 10):
            return "JetStream file storage with the default sync_interval (2 min): not fsynced per message"
        return (f"JetStream file storage; nats-server {self.version} does not fsync per message "
                "(the file store is synced on a 2-minute timer; sync_interval=always only exists from 2.10)")

    def _args(self, exe: str) -> list[str]:
        return [exe, "-js", "-a", HOST, "-p", str(self.port), "-sd", str(self.data_dir / "store")]

    def _ready(self) -> bool:
        with socket.create_connection((HOST, self.port), timeout=1.0) as s:
            line = s.recv(4096)
        if not line.startswith(b"INFO "):
            return False
        info = json.loads(line[5:].strip())
        return bool(info.get("jetstream"))
