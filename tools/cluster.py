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
Every bookie runs AutoRecovery (``autorecovery_enabled=true``; override it
with ``"false"`` to test manual recovery alone).
A ``data_dir`` given by the caller is never deleted; without one a temporary
directory is used and removed on exit. ``hubs=N`` starts N hub processes
after the bookies (``hub_addresses``, ``kill_hub``, ``restart_hub``);
``conf_overrides`` keys of ``hub.conf.HubConf`` go to the hubs, the others
to the bookies.

``regions=["r1", "r2", ...]`` runs one independent cluster per region (its
own metastore, bookies and hubs; the first region is this object, the others
live under ``data_dir/region-NAME``), wired through each region's
``hw_region_client.conf`` (``remote_hubs``; over TLS when ``conf_overrides``
has ``ssl_enabled=true``; ``ssl_ca_file``, ``ssl_verify``, ``auth_token``, ``auth_token_file`` in
``conf_overrides`` go there) and the hubs' ``regions``:
``hub_addresses_by_region``, ``region_clusters[name]`` (for ``kill_hub`` and
friends in that region), ``stats_urls`` of every region.

Every role process dies with the process that started it (``PR_SET_PDEATHSIG``:
it gets SIGTERM when its parent dies, even by SIGKILL), so a killed test run or
``quire standalone`` leaves no orphans. (Linux ties that to the thread that
started the process: run the cluster's event loop on a thread that lives as
long as the cluster. A ZooKeeper server or HBase emulator started for
``metastore="zookeeper"``/``"hbase"`` is not covered.) After its ready line a role's stdout is
copied into its log file (``processes()`` lists every process's address,
metrics URL, log file and pid). One data directory runs one cluster at a time:
``start`` takes ``DATA_DIR/cluster.lock`` and raises ``ClusterRunningError``
("already running (pid N)") while another process holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
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

from bookie.testing import READY_PREFIX, bookie_command, parse_ready_line, write_conf
from tools import forkserver
from tools.launch import PARENT_PID_ENV  # in every role's environment: the role dies with this process

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0
LOCK_NAME = "cluster.lock"


class ClusterRunningError(RuntimeError):
    """Another process already runs a cluster on this data directory; the message names its pid."""


@dataclass(frozen=True)
class ProcessInfo:
    """One role process of a running cluster, as ``quire standalone`` prints it."""

    role: str           # "bookie" or "hub"
    name: str           # "bookie-0", "hub-0"
    address: str        # host:port it serves
    metrics_url: str    # http://127.0.0.1:PORT/metrics ("" when off)
    log_path: str
    pid: int | None     # None once it has exited


@dataclass
class _Role:
    """One role process: its conf file, address once known, and the running process."""

    name: str
    conf_path: Path
    log_path: Path
    address: str = ""
    stats_url: str = ""
    ssl_address: str = ""
    proc: asyncio.subprocess.Process | forkserver.ForkedProcess | None = None
    extra: dict[str, str] = field(default_factory=dict)
    drain: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


_BOOKIE_SHARED = frozenset({"zk_host", "zk_prefix", "metastore_uri", "stats_http_port", "http_server_host",
                            "http_admin_token", "http_admin_token_file"})
# the cluster gives every process its own HTTP port (stats_http_port, kept across restarts)
_CLUSTER_PORTS = ("http_server_port",)
# conf_overrides keys for hw_region_client.conf only
_REGION_CLIENT_KEYS = ("ssl_ca_file", "ssl_verify", "auth_token", "auth_token_file")


def _hub_keys() -> frozenset[str]:
    """Keys of the hub's conf: ``conf_overrides`` entries among them go to hubs, the rest to bookies."""
    from hub.conf import HubConf
    from metastore.conf import conf_keys

    return frozenset(conf_keys(HubConf))


async def _spawn(cmd: list[str], stderr: Any,
                 env: dict[str, str]) -> asyncio.subprocess.Process | forkserver.ForkedProcess:
    """Start a role process, stdout on a pipe: exec'd, or forked by the fork server (``tools.forkserver``)."""
    if forkserver.enabled() and forkserver.is_role_command(cmd):
        return await forkserver.spawn(cmd, env, stderr)
    return await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env)


def _write_conf(path: Path, values: Mapping[str, str]) -> None:
    write_conf(path, values)


class LocalCluster:
    """See the module docstring."""

    def __init__(self, bookies: int = 3, hubs: int = 0, metastore: str = "lmdb",
                 data_dir: str | os.PathLike[str] | None = None, region: str = "standalone",
                 conf_overrides: Mapping[str, str] | None = None, regions: list[str] | None = None) -> None:
        if bookies < 0 or hubs < 0:
            raise ValueError("bookies and hubs must be >= 0")
        if regions:
            if len(set(regions)) != len(regions) or not all(regions):
                raise ValueError(f"regions must be distinct non-empty names, not {regions!r}")
            if "://" in metastore:
                raise ValueError("regions share nothing: give a metastore backend name, not one URI")
            region = regions[0]
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
        self._hubs = [
            _Role(f"hub-{i}", self.data_dir / f"hub-{i}" / "hw_server.conf", self.data_dir / f"hub-{i}" / "hub.log")
            for i in range(hubs)
        ]
        for role in self._hubs:
            self._reuse_hub_address(role)
        self._zk: Any = None
        self._emulator: asyncio.subprocess.Process | None = None
        self._started = False
        self._lock_fd: int | None = None
        # the other regions: independent clusters (own metastore, bookies, hubs) under our data dir
        self.region_clusters: dict[str, LocalCluster] = {region: self}
        for name in (regions or [])[1:]:
            self.region_clusters[name] = LocalCluster(bookies, hubs, metastore, self.data_dir / f"region-{name}",
                                                      region=name, conf_overrides=conf_overrides)

    # --- properties -----------------------------------------------------------------------------
    @property
    def bookie_addresses(self) -> list[str]:
        return [b.address for b in self._bookies]

    @property
    def hub_addresses(self) -> list[str]:
        return [h.address for h in self._hubs]

    @property
    def hub_ssl_addresses(self) -> list[str]:
        """``host:ssl_port`` per hub when ``ssl_enabled`` (empty strings otherwise)."""
        return [h.ssl_address for h in self._hubs]

    @property
    def hub_addresses_by_region(self) -> dict[str, list[str]]:
        """Region name -> its hubs' addresses (this cluster's own region first)."""
        return {name: c.hub_addresses for name, c in self.region_clusters.items()}

    @property
    def stats_urls(self) -> list[str]:
        """One ``http://127.0.0.1:PORT/metrics`` per hub and bookie process (hubs first)."""
        own = [r.stats_url for r in [*self._hubs, *self._bookies] if r.stats_url]
        return own + [u for c in self.region_clusters.values() if c is not self for u in c.stats_urls]

    # --- lifecycle ------------------------------------------------------------------------------
    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def processes(self) -> list[ProcessInfo]:
        """Every role process of this cluster (bookies, then hubs), then of the other regions."""
        own = [ProcessInfo(role.name.split("-")[0], role.name, role.address, role.stats_url, str(role.log_path),
                           role.proc.pid if role.alive and role.proc is not None else None)
               for role in [*self._bookies, *self._hubs]]
        return own + [p for c in self.region_clusters.values() if c is not self for p in c.processes()]

    @staticmethod
    def running_pid(data_dir: str | os.PathLike[str]) -> int | None:
        """The pid of the process running a cluster on ``data_dir`` now, or ``None``."""
        path = Path(data_dir) / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        finally:
            os.close(fd)  # also drops the shared lock if we got it
        return None

    def _lock(self) -> None:
        """Take ``DATA_DIR/cluster.lock`` (released when this process exits, however it exits)."""
        path = self.data_dir / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ClusterRunningError(f"already running (pid {holder}) on {self.data_dir}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        if getattr(self, "_lock_fd", None) is not None:
            assert self._lock_fd is not None
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    async def start(self) -> None:
        """Start the metastore (if it is ours) and every bookie; return once all are registered.

        Raises ``ClusterRunningError`` when another process runs a cluster on ``data_dir``,
        ``RuntimeError`` naming the role (with its log tail) when one fails to start.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        others = [c for c in self.region_clusters.values() if c is not self]
        try:
            if others:
                self._wire_regions()
            await asyncio.gather(self._start_own(), *(c.start() for c in others))
        except BaseException:
            await self.stop()
            raise
        self._started = True

    async def _start_own(self) -> None:
        self.metastore_uri = await self._start_metastore()
        await asyncio.gather(*(self._start_bookie(b) for b in self._bookies))
        await asyncio.gather(*(self._start_hub(h) for h in self._hubs))

    def _wire_regions(self) -> None:
        """Fix every region's hub ports, then give each hub ``regions`` and a ``hw_region_client.conf``."""
        from tools.zookeeper import free_port

        tls = self.conf_overrides.get("ssl_enabled", "false").lower() == "true"
        for c in self.region_clusters.values():
            for h in c._hubs:
                if not h.address:
                    h.address = f"127.0.0.1:{free_port()}"
                if tls and not h.ssl_address:
                    h.ssl_address = f"127.0.0.1:{free_port()}"
        for name, c in self.region_clusters.items():
            remote = {n: o for n, o in self.region_clusters.items() if n != name}
            path = c.data_dir / "hw_region_client.conf"
            # on one machine a region that does not answer within 5 s is down
            values = {"server_ack_response_timeout": "5000", "ssl_enabled": "true" if tls else "false"}
            values.update({k: self.conf_overrides[k] for k in _REGION_CLIENT_KEYS if k in self.conf_overrides})
            # with TLS hubs are named host:port:sslport, and the region client uses the TLS port
            values["remote_hubs"] = " ".join(
                f"{n}={','.join(h.address + (':' + h.ssl_address.rsplit(':', 1)[1] if tls else '') for h in o._hubs)}"
                for n, o in remote.items() if o._hubs)
            _write_conf(path, values)
            for h in c._hubs:
                h.extra.update(regions=" ".join(remote), region_client_conf=str(path))

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
        from metastore.conf import read_properties

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
            # every bookie runs an AutoRecovery auditor candidate and worker (conf_overrides may turn it off)
            "autorecovery_enabled": "true",
        }
        hub_keys = _hub_keys()
        values.update({k: v for k, v in self.conf_overrides.items()
                       if (k not in hub_keys and k not in _REGION_CLIENT_KEYS) or k in _BOOKIE_SHARED})
        values.update(role.extra)
        for k in ("zk_host", "zk_prefix", *_CLUSTER_PORTS):
            values.pop(k, None)
        values["metastore_uri"] = self.metastore_uri
        return values

    async def _start_bookie(self, role: _Role) -> None:
        _write_conf(role.conf_path, self._bookie_conf(role))
        logf = open(role.log_path, "ab")
        try:
            role.proc = await _spawn(bookie_command(role.conf_path), logf, self._child_env())
        finally:
            logf.close()
        line = await self._ready_line(role, READY_PREFIX)
        role.address, stats_url = parse_ready_line(line)
        role.stats_url = stats_url or role.stats_url
        _write_conf(role.conf_path, self._bookie_conf(role))  # record the ports it got, for restarts

    @staticmethod
    def _child_env() -> dict[str, str]:
        env = dict(os.environ)
        env[PARENT_PID_ENV] = str(os.getpid())
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
                        # from now on its stdout goes to its log: a full pipe would block the role
                        role.drain = asyncio.create_task(self._drain(role.proc.stdout, role.log_path))
                        return line
        except TimeoutError:
            raise RuntimeError(f"{role.name} not ready after {START_TIMEOUT}s; log tail:\n"
                               f"{self._tail(role.log_path)}") from None

    @staticmethod
    async def _drain(stream: asyncio.StreamReader, log_path: Path) -> None:
        """Copy what a role writes to stdout after its ready line into its log, until it exits."""
        with open(log_path, "ab") as logf:
            while chunk := await stream.read(1 << 16):
                logf.write(chunk)
                logf.flush()

    @staticmethod
    async def _end_drain(role: _Role) -> None:
        """Let the drain of an exited role reach end of file (bounded), else cancel it."""
        task, role.drain = role.drain, None
        if task is None:
            return
        try:
            await asyncio.wait_for(task, STOP_TIMEOUT)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
        except OSError as exc:
            log.warning("%s: copying its stdout to %s failed: %s", role.name, role.log_path, exc)

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
        await self._end_drain(role)
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
        await self._end_drain(role)

    async def supervise(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Restart any bookie or hub that exits on its own until ``stop`` is set (``quire standalone``)."""
        while not stop.is_set():
            for i, role in enumerate(self._hubs):
                if role.proc is not None and role.proc.returncode is not None:
                    log.warning("%s exited with %s; restarting it", role.name, role.proc.returncode)
                    try:
                        await self.restart_hub(i)
                    except RuntimeError as exc:
                        log.error("cannot restart %s: %s", role.name, exc)
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

    # --- hubs -----------------------------------------------------------------------------------
    @staticmethod
    def _reuse_hub_address(role: _Role) -> None:
        """Keep a hub's port across restarts (clients and owner records name hubs by address)."""
        if not role.conf_path.is_file():
            return
        from metastore.conf import read_properties

        props = read_properties(role.conf_path)
        port = props.get("server_port", "0")
        if port.isdigit() and int(port) > 0:
            role.address = f"127.0.0.1:{port}"
        stats = props.get("stats_http_port", "0")
        if stats.isdigit() and int(stats) > 0:
            role.stats_url = f"http://127.0.0.1:{stats}/metrics"
        ssl_port = props.get("ssl_server_port", "0")
        if props.get("ssl_enabled") == "true" and ssl_port.isdigit() and int(ssl_port) > 0:
            role.ssl_address = f"127.0.0.1:{ssl_port}"

    def _hub_conf(self, role: _Role) -> dict[str, str]:
        hub_keys = _hub_keys()
        values = {
            "server_host": "127.0.0.1",
            "server_port": role.address.rsplit(":", 1)[1] if role.address else "0",
            "region": self.region,
        }
        values.update({k: v for k, v in self.conf_overrides.items() if k in hub_keys})
        values.update(role.extra)
        for k in ("zk_host", "zk_prefix", "stats_http_port", *_CLUSTER_PORTS):
            values.pop(k, None)
        values["metastore_uri"] = self.metastore_uri
        # -1: the hub picks a free port and names it in its ready line (kept for restarts)
        values["stats_http_port"] = role.stats_url.rsplit(":", 1)[1].split("/")[0] if role.stats_url else "-1"
        if role.ssl_address:                   # the TLS port it got, kept across restarts
            values["ssl_server_port"] = role.ssl_address.rsplit(":", 1)[1]
        elif "ssl_server_port" not in values:  # several hubs on one machine: each picks a free port
            values["ssl_server_port"] = "0"
        return values

    async def _start_hub(self, role: _Role) -> None:
        _write_conf(role.conf_path, self._hub_conf(role))
        logf = open(role.log_path, "ab")
        try:
            role.proc = await _spawn([sys.executable, "-m", "tools.cli", "hub", "--conf", str(role.conf_path)],
                                     logf, self._child_env())
        finally:
            logf.close()
        line = await self._ready_line(role, "hub ready ")
        parts = line.split()
        role.address = parts[2]
        for p in parts[3:]:
            if p.startswith("stats="):
                role.stats_url = p.removeprefix("stats=")
            elif p.startswith("ssl="):
                role.ssl_address = p.removeprefix("ssl=")
        _write_conf(role.conf_path, self._hub_conf(role))  # record the port it got, for restarts

    async def kill_hub(self, i: int) -> None:
        """SIGKILL hub ``i``; returns once the process is dead."""
        await self._kill(self._hubs[i], signal.SIGKILL)

    async def stop_hub(self, i: int) -> None:
        """SIGTERM hub ``i`` (clean shutdown: topics released); returns once it has exited."""
        await self._kill(self._hubs[i], signal.SIGTERM)

    async def restart_hub(self, i: int) -> None:
        """Start hub ``i`` again on its address; returns once it serves and is registered."""
        role = self._hubs[i]
        if role.alive:
            raise RuntimeError(f"{role.name} is still running")
        await self._end_drain(role)
        await self._start_hub(role)

    def set_hub_conf(self, i: int, **values: str) -> None:
        """Extra ``key=value`` settings for hub ``i`` only, used from its next (re)start."""
        self._hubs[i].extra.update({k: str(v) for k, v in values.items()})

    def hub_pid(self, i: int) -> int | None:
        proc = self._hubs[i].proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after a bound); remove a temporary data dir."""
        others = [c for c in getattr(self, "region_clusters", {}).values() if c is not self]
        await asyncio.gather(*(c.stop() for c in others))
        await asyncio.gather(*(self._kill(h, signal.SIGTERM) for h in getattr(self, "_hubs", [])))
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
        for role in [*getattr(self, "_hubs", []), *self._bookies]:
            await self._end_drain(role)
        self._unlock()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
