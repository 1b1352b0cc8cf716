"""A whole Quire cluster on one machine, every role a real OS process.

    from tools.cluster import LocalCluster
    async with LocalCluster(bookies=3, hubs=0, metastore="lmdb", data_dir=tmp) as cluster:
        cluster.metastore_uri            # pass to BookKeeper.connect(...)
        cluster.bookie_addresses         # ["127.0.0.1:PORT", ...]
        await cluster.kill_bookie(0)     # SIGKILL; returns once the process is dead
        await cluster.restart_bookie(0)  # same address and data; returns once it serves and is registered

``metastore`` is a backend name — ``lmdb`` (a store under ``data_dir``),
``zookeeper`` (a server started from the system jars unless
``conf_overrides`` has ``zk_host``), ``hbase`` (the Thrift gateway emulator,
a test double, as a separate process) — or a full metastore URI.
``conf_overrides`` are ``key=value`` strings added to every bookie's conf.
A ``data_dir`` given by the caller is never deleted; without one a temporary
directory is used and removed on exit. Hubs come with the hub issue: only
``hubs=0`` is accepted for now.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


@dataclass
class _Role:
    """One role process: its conf file, address once known, and the running process."""

    name: str
    conf_path: Path
    log_path: Path
    address: str = ""
    stats_url: str = ""
    proc: asyncio.subprocess.Process | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


def _write_conf(path: Path, values: Mapping[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))


class LocalCluster:
    """See the module docstring."""

    def __init__(self, bookies: int = 3, hubs: int = 0, metastore: str = "lmdb",
                 data_dir: str | os.PathLike[str] | None = None, region: str = "standalone",
                 conf_overrides: Mapping[str, str] | None = None, regions: list[str] | None = None) -> None:
        if hubs:
            raise NotImplementedError("hub processes are not built yet; use hubs=0")
        if regions:
            raise NotImplementedError("multi-region clusters come with the hub issue")
        if bookies < 0:
            raise ValueError("bookies must be >= 0")
        self.region = region
        self.metastore = metastore
        self.conf_overrides = {k: str(v) for k, v in (conf_overrides or {}).items()}
        self._owns_dir = data_dir is None
        self.data_dir = (Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="quire-"))).resolve()
        self.metastore_uri = ""
        self._bookies = [
            _Role(f"bookie-{i}", self.data_dir / f"bookie-{i}" / "bk_server.conf",
                  self.data_dir / f"bookie-{i}" / "bookie.log")
            for i in range(bookies)
        ]
        for role in self._bookies:
            self._reuse_address(role)
        self._zk: Any = None
        self._emulator: asyncio.subprocess.Process | None = None
        self._started = False

    # --- properties -----------------------------------------------------------------------------
    @property
    def bookie_addresses(self) -> list[str]:
        return [b.address for b in self._bookies]

    @property
    def hub_addresses(self) -> list[str]:
        return []

    @property
    def hub_addresses_by_region(self) -> dict[str, list[str]]:
        return {self.region: []}

    @property
    def stats_urls(self) -> list[str]:
        return [b.stats_url for b in self._bookies if b.stats_url]

    # --- lifecycle ------------------------------------------------------------------------------
    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the metastore (if it is ours) and every bookie; return once all are registered."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.metastore_uri = await self._start_metastore()
            await asyncio.gather(*(self._start_bookie(b) for b in self._bookies))
        except BaseException:
            await self.stop()
            raise
        self._started = True

    async def _start_metastore(self) -> str:
        m = self.metastore
        if "://" in m:
            return m
        if m == "lmdb":
            return f"lmdb://{self.data_dir / 'metastore'}"
        if m in ("zookeeper", "zk"):
            if "zk_host" in self.conf_overrides:
                prefix = self.conf_overrides.get("zk_prefix", "/quire")
                return f"zk://{self.conf_overrides['zk_host']}{prefix}"
            from tools.zookeeper import ZooKeeperServer

            self._zk = ZooKeeperServer(self.data_dir / "zookeeper")
            await asyncio.to_thread(self._zk.start)
            return f"zk://{self._zk.connect_string}/quire"
        if m == "hbase":
            self._emulator = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "metastore.testing.hbase_thrift_emulator", "--port", "0",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
            assert self._emulator.stdout is not None
            line = (await asyncio.wait_for(self._emulator.stdout.readline(), START_TIMEOUT)).decode()
            port = int(line.strip().rsplit(":", 1)[-1].split()[-1])
            return f"hbase://127.0.0.1:{port}/quire{uuid.uuid4().hex[:6]}"
        raise ValueError(f"unknown metastore {m!r}: use lmdb, zookeeper, hbase or a URI")

    @staticmethod
    def _reuse_address(role: _Role) -> None:
        """Keep a bookie's port across runs on one data dir: ledger metadata names bookies by address."""
        if not role.conf_path.is_file():
            return
        from bookie.conf import read_properties

        props = read_properties(role.conf_path)
        port = props.get("bookie_port", "0")
        if port.isdigit() and int(port) > 0:
            role.address = f"{props.get('bookie_host') or '127.0.0.1'}:{port}"
        stats = props.get("stats_http_port", "0")
        if stats.isdigit() and int(stats) > 0:
            role.stats_url = f"http://127.0.0.1:{stats}/metrics"

    def _bookie_conf(self, role: _Role) -> dict[str, str]:
        values = {
            "bookie_host": "127.0.0.1",
            "bookie_port": role.address.rsplit(":", 1)[1] if role.address else "0",
            "ledger_directories": str(role.conf_path.parent / "data"),
            "metastore_uri": self.metastore_uri,
            # -1: the bookie picks a free port and names it in its ready line
            "stats_http_port": role.stats_url.rsplit(":", 1)[1].split("/")[0] if role.stats_url else "-1",
        }
        values.update(self.conf_overrides)
        values.update(role.extra)
        for k in ("zk_host", "zk_prefix"):
            values.pop(k, None)
        values["metastore_uri"] = self.metastore_uri
        return values

    async def _start_bookie(self, role: _Role) -> None:
        _write_conf(role.conf_path, self._bookie_conf(role))
        logf = open(role.log_path, "ab")
        try:
            role.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tools.cli", "bookie", "--conf", str(role.conf_path),
                stdout=asyncio.subprocess.PIPE, stderr=logf, env=self._child_env())
        finally:
            logf.close()
        line = await self._ready_line(role, "bookie ready ")
        parts = line.split()
        role.address = parts[2]
        for p in parts[3:]:
            if p.startswith("stats="):
                role.stats_url = p.removeprefix("stats=")
        _write_conf(role.conf_path, self._bookie_conf(role))  # record the ports it got, for restarts

    @staticmethod
    def _child_env() -> dict[str, str]:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    async def _ready_line(self, role: _Role, prefix: str) -> str:
        assert role.proc is not None and role.proc.stdout is not None
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while True:
                    raw = await role.proc.stdout.readline()
                    if not raw:
                        await role.proc.wait()
                        raise RuntimeError(f"{role.name} exited with {role.proc.returncode} before it was "
                                           f"ready; log tail:\n{self._tail(role.log_path)}")
                    line = raw.decode().strip()
                    if line.startswith(prefix):
                        return line
        except TimeoutError:
            raise RuntimeError(f"{role.name} not ready after {START_TIMEOUT}s; log tail:\n"
                               f"{self._tail(role.log_path)}") from None

    @staticmethod
    def _tail(path: Path, n: int = 4000) -> str:
        try:
            return path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    async def kill_bookie(self, i: int) -> None:
        """SIGKILL bookie ``i``; returns once the process is dead."""
        await self._kill(self._bookies[i], signal.SIGKILL)

    async def stop_bookie(self, i: int) -> None:
        """SIGTERM bookie ``i`` (a clean shutdown); returns once it has exited."""
        await self._kill(self._bookies[i], signal.SIGTERM)

    async def restart_bookie(self, i: int) -> None:
        """Start bookie ``i`` again on its address and data; returns once it serves and is registered."""
        role = self._bookies[i]
        if role.alive:
            raise RuntimeError(f"{role.name} is still running")
        await self._start_bookie(role)

    def set_bookie_conf(self, i: int, **values: str) -> None:
        """Extra ``key=value`` settings for bookie ``i`` only, used from its next (re)start."""
        self._bookies[i].extra.update({k: str(v) for k, v in values.items()})

    def bookie_data_dir(self, i: int) -> Path:
        """Where bookie ``i`` keeps its entry storage (for test hooks such as corrupting an entry)."""
        return self._bookies[i].conf_path.parent / "data"

    def bookie_pid(self, i: int) -> int | None:
        proc = self._bookies[i].proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def _kill(self, role: _Role, sig: int) -> None:
        proc = role.proc
        if proc is None or proc.returncode is not None:
            return
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def supervise(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Restart any bookie that exits on its own until ``stop`` is set (``quire standalone``)."""
        while not stop.is_set():
            for i, role in enumerate(self._bookies):
                if role.proc is not None and role.proc.returncode is not None:
                    log.warning("%s exited with %s; restarting it", role.name, role.proc.returncode)
                    try:
                        await self.restart_bookie(i)
                    except RuntimeError as exc:
                        log.error("cannot restart %s: %s", role.name, exc)
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass

    async def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after a bound); remove a temporary data dir."""
        await asyncio.gather(*(self._kill(b, signal.SIGTERM) for b in self._bookies))
        if self._zk is not None:
            await asyncio.to_thread(self._zk.stop)
            self._zk = None
        if self._emulator is not None:
            self._emulator.terminate()
            try:
                await asyncio.wait_for(self._emulator.wait(), STOP_TIMEOUT)
            except TimeoutError:
                self._emulator.kill()
                await self._emulator.wait()
            self._emulator = None
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
