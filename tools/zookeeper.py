"""Run a local ZooKeeper server from the system jars (Debian package ``zookeeper``).

Used by the test fixtures (``tests/fixtures/zookeeper.py``), by
``tools.cluster`` and by people through ``quire zookeeper``::

    from tools.zookeeper import ZooKeeperServer
    with ZooKeeperServer("/tmp/zk") as zk:          # free loopback port
        uri = f"zk://{zk.connect_string}/quire"
        ...
        zk.restart()                                 # same port, same data

The server is one JVM child process (``QuorumPeerMain`` in standalone mode)
whose output goes to ``<data_dir>/zookeeper.log``. ``start`` returns once the
server answers the ``srvr`` four-letter word in serving mode, or raises
``RuntimeError`` with the tail of that log. ``ZooKeeperNotInstalled`` (a
``RuntimeError``) means java or the jars are missing, so callers can skip
rather than fail; ``CannotListen`` (a ``RuntimeError`` of one line, e.g.
``cannot listen on 127.0.0.1:2181: address already in use``) means the given
port is taken (or the address is not local), found before the JVM starts or
read from its log.

Jars are looked up by their unversioned Debian names (``zookeeper.jar`` ...)
in ``$QUIRE_ZOOKEEPER_JARS`` (a directory), ``$ZOOKEEPER_HOME/lib`` and
``/usr/share/java``, falling back to a versioned name (``zookeeper-3.8.0.jar``).
Java is ``$JAVA_HOME/bin/java`` or ``java`` on ``PATH``.
"""

from __future__ import annotations

import argparse
import atexit
import glob
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
REQUIRED_JARS = ("zookeeper", "zookeeper-jute", "slf4j-api")
OPTIONAL_JARS = ("slf4j-simple", "metrics-core", "commons-cli", "netty-all")
DEFAULT_JAR_DIRS = ("/usr/share/java", "/usr/share/zookeeper/lib", "/usr/lib/zookeeper/lib")
JVM_OPTS = (
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Dzookeeper.admin.enableServer=false",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
)
LOG_NAME = "zookeeper.log"
CFG_NAME = "zoo.cfg"


class ZooKeeperNotInstalled(RuntimeError):
    """Java or the ZooKeeper jars cannot be found on this machine."""


class CannotListen(RuntimeError):
    """The server cannot listen on its address: one line, ``cannot listen on HOST:PORT: REASON``."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {reason}")
        self.host = host
        self.port = port
        self.reason = reason


def check_listen(host: str, port: int) -> None:
    """Raise ``CannotListen`` unless a server could listen on ``host:port`` now.

    Binds and listens a socket, then closes it. ``SO_REUSEADDR`` is set as the
    JVM sets it on Linux: a port held only by ``TIME_WAIT`` connections of a
    server stopped a moment ago (``restart``) is usable, one a process listens
    on is not.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CannotListen(host, port, exc.strerror or str(exc)) from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sockaddr)
            s.listen(1)
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise CannotListen(host, port, reason[:1].lower() + reason[1:]) from None


def find_java() -> str:
    """Path of the ``java`` executable; ``ZooKeeperNotInstalled`` if there is none."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise ZooKeeperNotInstalled("java not found (install a JRE, e.g. openjdk-17-jre-headless, "
                                    "or set JAVA_HOME)")
    return found


def _jar_dirs() -> list[str]:
    dirs: list[str] = []
    if os.environ.get("QUIRE_ZOOKEEPER_JARS"):
        dirs.append(os.environ["QUIRE_ZOOKEEPER_JARS"])
    if os.environ.get("ZOOKEEPER_HOME"):
        dirs.append(os.path.join(os.environ["ZOOKEEPER_HOME"], "lib"))
        dirs.append(os.environ["ZOOKEEPER_HOME"])
    dirs.extend(DEFAULT_JAR_DIRS)
    return dirs


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", os.path.basename(path)))


def _find_jar(name: str, dirs: list[str]) -> str | None:
    for d in dirs:
        plain = os.path.join(d, f"{name}.jar")
        if os.path.isfile(plain):
            return plain
        # versioned: name-1.2.3.jar (not name-something-else-1.2.jar)
        versioned = [p for p in glob.glob(os.path.join(glob.escape(d), f"{name}-*.jar"))
                     if re.fullmatch(re.escape(name) + r"-\d[\w.\-]*\.jar", os.path.basename(p))]
        if versioned:
            return max(versioned, key=_version_key)
    return None


def find_classpath() -> list[str]:
    """The jars to run the server with; ``ZooKeeperNotInstalled`` if a required one is missing."""
    dirs = _jar_dirs()
    jars: list[str] = []
    missing: list[str] = []
    for name in REQUIRED_JARS:
        jar = _find_jar(name, dirs)
        if jar is None:
            missing.append(name)
        else:
            jars.append(jar)
    if missing:
        raise ZooKeeperNotInstalled(
            f"ZooKeeper jars not found: {', '.join(n + '.jar' for n in missing)} "
            f"(looked in {', '.join(dirs)}; install the Debian package 'zookeeper' "
            "or set QUIRE_ZOOKEEPER_JARS)")
    for name in OPTIONAL_JARS:
        jar = _find_jar(name, dirs)
        if jar is None:
            log.debug("optional jar %s.jar not found; continuing without it", name)
        else:
            jars.append(jar)
    return jars


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago, for a process that binds it later.

    Picked below the kernel's ephemeral range where the machine says what that is: a port that
    ``bind(0)`` handed out is the next one other processes get for their outgoing connections and their
    own ``bind(0)``, so between the pick and the bind someone else often took it (a CI flake of
    region hubs). Falls back to ``bind(0)`` when no port below the range is free.
    """
    low = 32768
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.SystemRandom()
    for _ in range(64 if low > 11024 else 0):
        port = rng.randrange(10000, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        got: int = s.getsockname()[1]
        return got


def four_letter_word(host: str, port: int, word: str = "srvr", timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter word and return the reply ('' when the server closed at once).

    Raises ``OSError`` when nothing listens.
    """
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(word.encode("ascii"))
        chunks: list[bytes] = []
        while True:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


_live_servers: weakref.WeakSet[ZooKeeperServer] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:  # pragma: no cover - interpreter shutdown
    for server in list(_live_servers):
        try:
            server.stop(timeout=3.0)
        except Exception:
            pass


class ZooKeeperServer:
    """One standalone ZooKeeper server in a child JVM.

    ``port=0`` picks a free port at the first ``start``; ``restart`` keeps it.
    ``tick_time_ms`` defaults to 500 so sessions may be as short as 1 s
    (ZooKeeper bounds session timeouts to ``[2, 20] * tickTime`` unless
    ``minSessionTimeout``/``maxSessionTimeout`` say otherwise; the latter is
    raised to 60 s here). ``extra_config`` adds or overrides ``zoo.cfg`` lines.
    """

    def __init__(self, data_dir: str | os.PathLike[str], port: int = 0, host: str = "127.0.0.1", *,
                 tick_time_ms: int = 500, extra_config: dict[str, str] | None = None,
                 heap: str = "256m") -> None:
        if not 0 <= int(port) <= 65535:
            raise ValueError(f"bad port {port}")
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self._port = int(port)
        self._auto_port = self._port == 0
        self.tick_time_ms = int(tick_time_ms)
        self.extra_config = dict(extra_config or {})
        self.heap = heap
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: int | None = None
        self._lock = threading.RLock()

    # -- properties ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The client port (0 until the first ``start`` when it was chosen automatically)."""
        return self._port

    @property
    def connect_string(self) -> str:
        """``host:port`` for a ZooKeeper client."""
        if self._port == 0:
            raise RuntimeError("the server has no port yet: call start() first")
        return f"{self.host}:{self._port}"

    @property
    def pid(self) -> int | None:
        """The JVM's pid while it runs, else ``None``."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_NAME

    @property
    def config_path(self) -> Path:
        return self.data_dir / CFG_NAME

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- lifecycle ----------------------------------------------------------------------------

    def _write_config(self) -> None:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        cfg = {
            "tickTime": str(self.tick_time_ms),
            "dataDir": str(self.data_dir / "data"),
            "clientPort": str(self._port),
            "clientPortAddress": self.host,
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "srvr,ruok",
            "maxClientCnxns": "0",
            "maxSessionTimeout": "60000",
            "preAllocSize": "4096",
            "autopurge.snapRetainCount": "3",
            "autopurge.purgeInterval": "1",
        }
        cfg.update(self.extra_config)
        text = "".join(f"{k}={v}\n" for k, v in cfg.items())
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.config_path)

    def command(self) -> list[str]:
        """The java command line (raises ``ZooKeeperNotInstalled``)."""
        java = find_java()
        classpath = os.pathsep.join(find_classpath())
        opts = [o if not o.startswith("-Xmx") else f"-Xmx{self.heap}" for o in JVM_OPTS]
        return [java, *opts, "-cp", classpath, MAIN_CLASS, str(self.config_path)]

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        """Launch the JVM and wait (at most ``timeout`` s) until it serves.

        Raises ``ZooKeeperNotInstalled``, ``CannotListen`` (a fixed port is taken) or
        ``RuntimeError`` (with the log tail).
        """
        with self._lock:
            if self.running:
                return self
            cmd = self.command()  # ZooKeeperNotInstalled before anything is written
            if not self._auto_port:
                check_listen(self.host, self._port)  # CannotListen: one line, before a JVM and its log
            self.data_dir.mkdir(parents=True, exist_ok=True)
            attempts = 3 if self._auto_port else 1
            for attempt in range(attempts):
                if self._auto_port and (attempt > 0 or self._port == 0):
                    self._port = free_port(self.host)
                try:
                    self._launch(cmd, timeout)
                    _live_servers.add(self)
                    return self
                except _PortTaken:
                    log.info("port %d was taken; retrying on another one", self._port)
                    continue
            raise RuntimeError(f"ZooKeeper could not bind a free port after {attempts} attempts\n"
                               f"{self.log_tail()}")

    def _launch(self, cmd: list[str], timeout: float) -> None:
        self._write_config()
        with open(self.log_path, "ab") as logf:
            logf.write(f"=== starting ZooKeeper on {self.host}:{self._port} at {time.ctime()}\n".encode())
            logf.flush()
            log_offset = logf.tell()
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                cwd=str(self.data_dir), start_new_session=True, close_fds=True,
            )
        log.info("started ZooKeeper pid %d on %s:%d (data %s)", self._proc.pid, self.host, self._port,
                 self.data_dir)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                rc = self._proc.returncode
                tail = self._log_since(log_offset)
                self._proc = None
                if "Address already in use" in tail:
                    if self._auto_port:
                        raise _PortTaken()
                    # taken between check_listen and the JVM's bind
                    raise CannotListen(self.host, self._port, "address already in use")
                raise RuntimeError(f"ZooKeeper exited with status {rc} during start\n{tail}")
            try:
                reply = four_letter_word(self.host, self._port, "srvr", timeout=1.0)
                if "Mode:" in reply:
                    log.info("ZooKeeper on %s:%d is serving", self.host, self._port)
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                self._terminate(5.0)
                raise RuntimeError(f"ZooKeeper did not serve on {self.host}:{self._port} within "
                                   f"{timeout:.0f} s\n{self._log_since(log_offset)}")
            time.sleep(0.05)

    def _log_since(self, offset: int, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _terminate(self, timeout: float, sig: int = signal.SIGTERM) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("ZooKeeper pid %d ignored signal %d for %.0f s; killing it",
                            proc.pid, sig, timeout)
                proc.kill()
                proc.wait(timeout=10.0)
            except ProcessLookupError:
                pass
        self._proc = None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the JVM, SIGKILL it if it is still alive after ``timeout`` s. Idempotent."""
        with self._lock:
            if self._proc is not None:
                log.info("stopping ZooKeeper pid %d", self._proc.pid)
            self._terminate(timeout)
            _live_servers.discard(self)

    def kill(self) -> None:
        """SIGKILL the JVM (a crash, for fault tests)."""
        with self._lock:
            self._terminate(10.0, signal.SIGKILL)
            _live_servers.discard(self)

    def restart(self, timeout: float = 30.0) -> ZooKeeperServer:
        """Stop and start again on the same port with the same data."""
        with self._lock:
            self.stop()
            if self._port:
                self._auto_port = False  # keep the port clients know
            return self.start(timeout)

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZooKeeperServer({str(self.data_dir)!r}, port={self._port}, pid={self.pid})"


class _PortTaken(Exception):
    pass


# -- CLI: quire zookeeper ---------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Fill the ``quire zookeeper`` sub-parser; return its handler."""
    parser.add_argument("--port", type=int, default=2181, help="client port (default 2181; 0 = any free)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help="data directory (default: a temporary one, removed on exit)")
    parser.add_argument("--tick-time", type=int, default=2000, metavar="MS",
                        help="ZooKeeper tickTime in ms (default 2000)")
    parser.add_argument("--start-timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the server to serve (default 60)")
    return run


def run(args: argparse.Namespace) -> int:
    """Run a server in the foreground until SIGINT/SIGTERM; print its connect string."""
    temp_dir = None
    data = args.data
    if data is None:
        temp_dir = tempfile.mkdtemp(prefix="quire-zookeeper-")
        data = temp_dir
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    server = ZooKeeperServer(data, port=args.port, host=args.host, tick_time_ms=args.tick_time)
    try:
        try:
            server.start(timeout=args.start_timeout)
        except ZooKeeperNotInstalled as exc:
            print(f"quire zookeeper: {exc}", file=sys.stderr)
            return 2
        except CannotListen as exc:
            print(f"quire zookeeper: {exc}", file=sys.stderr)
            return 1
        except RuntimeError as exc:
            print(f"quire zookeeper: {exc}", file=sys.stderr)
            return 1
        print(server.connect_string, flush=True)
        log.info("ZooKeeper serving at %s (pid %s, data %s, log %s); Ctrl-C stops it",
                 server.connect_string, server.pid, server.data_dir, server.log_path)
        while not stop.wait(0.5):
            if not server.running:
                print(f"quire zookeeper: the server exited unexpectedly\n{server.log_tail()}",
                      file=sys.stderr)
                return 1
        return 0
    finally:
        server.stop()
        for s, handler in old.items():
            signal.signal(s, handler)
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
