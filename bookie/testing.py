"""Test support for bookies: a real ``quire bookie`` OS process and a raw-protocol client.

    conf = BookieProcess.write_conf(tmp / "bk_server.conf", {"bookie_port": 0, "metastore_uri": uri, ...})
    bookie = BookieProcess(conf, tmp / "bookie.log").start()    # returns once it printed its ready line
    client = await RawBookieClient.connect(bookie.address)
    response = await client.call(protocol.read_lac_request(0, ledger_id))
    client.send_raw(b"garbage")                                 # malformed input, for hostile tests
    await client.close()
    bookie.terminate()                                          # SIGTERM, returns the exit status
    bookie.rss()                                                # resident memory in bytes (Linux)

Used by the bookie tests and by ``quire bench bookie``. ``BookieProcess.start``
raises ``RuntimeError`` with the log's tail when the bookie does not start;
``RawBookieClient`` fails outstanding requests with ``BookieUnavailableError``
when the connection is lost.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bookie import protocol as proto
from bookie.connection import BookieConnection, ResponseCallback

__all__ = ["READY_PREFIX", "BookieProcess", "RawBookieClient", "bookie_command", "parse_ready_line", "write_conf"]

READY_PREFIX = "bookie ready "
"""How the one stdout line of a ``quire bookie`` that serves and is registered starts."""


def bookie_command(conf_path: str | os.PathLike[str], *extra_args: str) -> list[str]:
    """The command line of a bookie process on ``conf_path`` (this interpreter, ``-m tools.cli``)."""
    return [sys.executable, "-m", "tools.cli", "bookie", "--conf", str(conf_path), *extra_args]


def parse_ready_line(line: str) -> tuple[str, str]:
    """``(address, stats_url)`` from ``bookie ready HOST:PORT [stats=URL]``; ``ValueError`` otherwise."""
    parts = line.split()
    if not line.startswith(READY_PREFIX) or len(parts) < 3:
        raise ValueError(f"not a bookie ready line: {line!r}")
    stats = next((p.removeprefix("stats=") for p in parts[3:] if p.startswith("stats=")), "")
    return parts[2], stats


def write_conf(path: Path, settings: Mapping[str, Any]) -> Path:
    """Write ``key=value`` lines (a ``.conf`` file) to ``path``, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


Callback = ResponseCallback
"""Receives the ``Response``, or a ``BKError`` when the connection is lost."""


class RawBookieClient:
    """A pipelined bookie connection for tests and ``quire bench bookie``: a ``BookieConnection``.

    ``submit(request, callback)`` sends without waiting (writes are batched
    per loop turn; a txn id is assigned when the request has none);
    ``await call(request)`` waits for the response. Responses that match no
    request (txn id 0: the bookie could not decode a frame) go to the
    ``orphans`` queue. ``closed`` resolves when the connection is lost;
    outstanding callbacks then get ``BookieUnavailableError``.
    """

    def __init__(self, conn: BookieConnection) -> None:
        self.conn = conn
        self.orphans: asyncio.Queue[proto.Response] = asyncio.Queue()
        conn.on_orphan = self.orphans.put_nowait

    @classmethod
    async def connect(cls, address: str, timeout: float = 10.0,
                      max_frame_size: int = proto.DEFAULT_MAX_FRAME_SIZE) -> RawBookieClient:
        """Connect; ``BookieUnavailableError`` when the bookie cannot be reached in ``timeout``."""
        return cls(await BookieConnection.connect(address, timeout, max_frame_size))

    @property
    def closed(self) -> asyncio.Future[None]:
        return self.conn.done

    def submit(self, request: proto.Request, callback: Callback) -> None:
        """Send ``request`` (a txn id is assigned when it has none)."""
        self.conn.submit(request, callback)

    def send_raw(self, data: bytes) -> None:
        """Queue raw bytes (tests send malformed frames with it)."""
        self.conn.send_raw(data)

    def flush(self) -> None:
        self.conn.flush()

    async def call(self, request: proto.Request, timeout: float = 10.0) -> proto.Response:
        """Send and wait; raises ``BookieUnavailableError`` if the connection is lost."""
        if not request.txn_id:
            request.txn_id = self.conn.next_txn_id()
        return await self.conn.request(request, timeout)

    async def close(self) -> None:
        self.conn.close()
        await asyncio.wait_for(asyncio.shield(self.closed), 10.0)


class BookieProcess:
    """A ``python -m tools.cli bookie`` OS process; ``start`` returns once it printed its ready line."""

    def __init__(self, conf_path: Path, log_path: Path, extra_args: Sequence[str] = ()) -> None:
        self.conf_path = conf_path
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.stats_url = ""
        self.ready_line = ""

    @classmethod
    def write_conf(cls, path: Path, settings: Mapping[str, Any]) -> Path:
        return write_conf(path, settings)

    def start(self, timeout: float = 30.0) -> BookieProcess:
        """Start and wait for ``bookie ready``; ``RuntimeError`` (with the log tail) on failure."""
        cmd = bookie_command(self.conf_path, *self.extra_args)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        assert self.proc.stdout is not None
        line = _readline(self.proc, timeout)
        if not line.startswith(READY_PREFIX):
            self.kill()
            raise RuntimeError(f"bookie did not start ({line!r}); log tail:\n{self.log_tail()}")
        self.ready_line = line
        self.address, self.stats_url = parse_ready_line(line)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def rss(self) -> int:
        """Resident memory of the process in bytes (``/proc``, Linux); 0 when it is gone."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0


def _readline(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """One stdout line of ``proc`` within ``timeout`` (``""`` on exit or timeout)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                break
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    return buf.decode(errors="replace").strip()
