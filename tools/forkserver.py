"""Start ``python -m tools.cli ROLE ...`` processes by forking one interpreter that imported Quire once.

A bookie or hub process spends about 0.9 s of CPU importing its modules
(aiohttp, protobuf, kazoo, uvloop, Quire itself) before it does anything.
The test suite starts over a thousand of them on a 2-core machine, so about
half its CPU went to imports. With ``QUIRE_FORK_SERVER=1`` in the
environment, ``tools.cluster.LocalCluster`` starts its roles through a fork
server instead: one process per parent that imported those modules once and
forks a child for each role. The child is a real OS process of its own (its
own pid, memory, sockets and LMDB environments; ``kill -9`` works on it) that
runs the same ``tools.cli.main`` with the same arguments, environment,
working directory, stdout and stderr as the exec'd interpreter would. What
differs: its parent is the fork server, not the caller (it dies with the fork
server, which ends its children and exits when its caller goes away), and
its ``__main__`` module is this one.

The suite turns it on (``tests/conftest.py``); ``quire standalone`` and
``make run`` exec each role as before unless the variable is set.

Protocol (one ``SOCK_SEQPACKET`` Unix socket pair per caller process;
requests carry file descriptors with ``SCM_RIGHTS``): the caller sends one JSON message per start,
``{"id", "argv", "env", "cwd"}`` with its stdout and stderr descriptors; the
server answers ``{"id", "pid"}`` (or ``{"id", "error"}``) at once and
``{"pid", "exit"}`` when that child ends (``exit`` as ``returncode`` reads:
negative for a signal).
"""

from __future__ import annotations

import array
import asyncio
import atexit
import contextlib
import importlib
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

ENV = "QUIRE_FORK_SERVER"
# what a bookie's and a hub's process import, by its roots (each pulls in the rest)
PRELOAD = (
    "uvloop", "tools.cli", "tools.launch", "bookie.server", "bookie.autorecovery", "hub.server", "hub.admin",
    "hub.ui.pages", "hub.ui.cluster", "metastore.lease", "metastore.backends.lmdb",
    "metastore.backends.zookeeper", "metastore.backends.hbase", "encodings.idna", "jproperties",
)
_MAX_REQUEST = 1 << 20
_FDS_PER_REQUEST = 2


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def is_role_command(cmd: Sequence[str]) -> bool:
    """Whether ``cmd`` is ``this-python -m tools.cli ...``: what the fork server can start."""
    return len(cmd) > 3 and cmd[0] == sys.executable and cmd[1] == "-m" and cmd[2] == "tools.cli"


# --- the server ----------------------------------------------------------------------------------------


def _preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as exc:   # an optional backend's library is absent: its roles import it themselves
            log.warning("fork server: not preloading %s: %s", name, exc)


def _child(request: dict[str, Any], fds: list[int], ctrl: socket.socket, sel: selectors.BaseSelector,
           siblings: list[int]) -> None:
    """In the forked child: become ``python -m tools.cli ARGS``; never returns."""
    code = 1
    try:
        sel.close()
        ctrl.close()
        for fd in siblings:
            os.close(fd)
        out_fd, err_fd = fds
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from tools.launch import PARENT_PID_ENV
        if PARENT_PID_ENV in os.environ:        # the role dies with its parent: this server
            os.environ[PARENT_PID_ENV] = str(os.getppid())
        argv = request["argv"]
        cli = sys.modules["tools.cli"]
        sys.argv = [str(cli.__file__), *argv]
        code = int(cli.main(argv) or 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            sys.stderr.write(f"{exc.code}\n")   # as the interpreter shows sys.exit("message")
    except BaseException:  # the child reports anything as the interpreter would, then exits 1
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _send(ctrl: socket.socket, msg: dict[str, Any]) -> None:
    ctrl.send(json.dumps(msg).encode() + b"\n")


def serve(ctrl: socket.socket) -> None:
    """The fork server's loop: start a child per request, report each exit; return when the caller is gone."""
    sel = selectors.DefaultSelector()
    sel.register(ctrl, selectors.EVENT_READ, None)
    children: dict[int, int] = {}   # pidfd -> pid
    while True:
        for key, _ in sel.select():
            if key.data is None:
                fds = array.array("i")
                try:
                    data, ancdata, _flags, _addr = ctrl.recvmsg(_MAX_REQUEST, socket.CMSG_LEN(
                        _FDS_PER_REQUEST * fds.itemsize))
                except ConnectionResetError:
                    data, ancdata = b"", []
                for level, kind, cdata in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.frombytes(cdata[:len(cdata) - len(cdata) % fds.itemsize])
                if not data:                       # the caller is gone: so are its roles
                    for pid in children.values():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGTERM)
                    return
                request = json.loads(data)
                try:
                    pid = os.fork()
                except OSError as exc:
                    _send(ctrl, {"id": request["id"], "error": str(exc)})
                    pid = -1
                if pid == 0:
                    _child(request, list(fds), ctrl, sel, list(children))
                for fd in fds:
                    os.close(fd)
                if pid > 0:
                    pidfd = os.pidfd_open(pid)
                    children[pidfd] = pid
                    sel.register(pidfd, selectors.EVENT_READ, pid)
                    _send(ctrl, {"id": request["id"], "pid": pid})
            else:
                pidfd = key.fd
                sel.unregister(pidfd)
                os.close(pidfd)
                pid = children.pop(pidfd)
                _, status = os.waitpid(pid, 0)
                _send(ctrl, {"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


def main() -> int:
    fd = int(sys.argv[1])
    ctrl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=fd)
    _preload()
    import gc
    gc.collect()
    gc.freeze()               # the children share these pages until they write them
    sys.stdout.flush()
    sys.stderr.flush()
    _send(ctrl, {"ready": os.getpid()})
    serve(ctrl)
    return 0


# --- the caller's side ---------------------------------------------------------------------------------


class ForkedProcess:
    """A started role, with the parts of ``asyncio.subprocess.Process`` the cluster uses."""

    def __init__(self, pid: int, stdout: asyncio.StreamReader | None) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[int]]] = []
        self._lock = threading.Lock()

    def _exited(self, code: int) -> None:
        with self._lock:
            self.returncode = code
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):   # that loop is closed: nobody waits there any more
                loop.call_soon_threadsafe(_resolve, fut, code)

    async def wait(self) -> int:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            self._waiters.append((loop, fut))
        return await fut

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _resolve(fut: asyncio.Future[int], code: int) -> None:
    if not fut.done():
        fut.set_result(code)


class ForkServer:
    """The caller's handle on its fork server: one per process, shared by every event loop and thread."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tools.forkserver", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
        theirs.close()
        self._sock = mine
        self._rfile = mine.makefile("rb")
        self._lock = threading.Lock()
        self._next_id = 0
        self._starting: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._running: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}
        hello = self._rfile.readline()
        if not hello:
            raise RuntimeError(f"the fork server exited with {self._proc.wait()} before it was ready")
        self.alive = True
        self._reader = threading.Thread(target=self._read, name="quire-forkserver", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._rfile:
            msg = json.loads(line)
            if "id" in msg:
                with self._lock:
                    event, slot = self._starting.pop(msg["id"])
                slot.append(msg)
                event.set()
            else:
                with self._lock:
                    proc = self._running.pop(msg["pid"], None)
                    if proc is None:      # ended before its start was registered
                        self._early_exits[msg["pid"]] = msg["exit"]
                if proc is not None:
                    proc._exited(msg["exit"])
        # the server is gone (killed, or out of memory): its children got SIGTERM
        with self._lock:
            self.alive = False
            running, self._running = self._running, {}
            starting, self._starting = self._starting, {}
        for proc in running.values():
            proc._exited(-signal.SIGTERM)
        for event, slot in starting.values():
            slot.append({"error": "the fork server exited"})
            event.set()

    def start(self, argv: Sequence[str], env: dict[str, str], stdout_fd: int, stderr_fd: int) -> int:
        """Fork ``python -m tools.cli *argv``; blocks until the server named its pid (a few ms)."""
        event, slot = threading.Event(), list[dict[str, Any]]()
        with self._lock:
            if not self.alive:
                raise RuntimeError("the fork server exited")
            self._next_id += 1
            rid = self._next_id
            self._starting[rid] = (event, slot)
            msg = json.dumps({"id": rid, "argv": list(argv), "env": env, "cwd": os.getcwd()}).encode() + b"\n"
            fds = array.array("i", [stdout_fd, stderr_fd])
            self._sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
        if not event.wait(30):
            raise RuntimeError("the fork server did not answer within 30 s")
        answer = slot[0]
        if "error" in answer:
            raise OSError(f"the fork server could not start {' '.join(argv)}: {answer['error']}")
        return int(answer["pid"])

    def register(self, proc: ForkedProcess) -> None:
        with self._lock:
            code = self._early_exits.pop(proc.pid, None)
            if code is None:
                self._running[proc.pid] = proc
        if code is not None:
            proc._exited(code)


_server: ForkServer | None = None
_server_lock = threading.Lock()


def _get_server() -> ForkServer:
    global _server
    with _server_lock:
        if _server is None or not _server.alive:
            _server = ForkServer()
        return _server


async def spawn(cmd: Sequence[str], env: dict[str, str], stderr: Any) -> ForkedProcess:
    """Start ``cmd`` (``python -m tools.cli ...``) through the fork server, stdout on a pipe.

    ``stderr`` is an open file, as ``asyncio.create_subprocess_exec`` takes it.
    """
    assert is_role_command(cmd), cmd
    server = await asyncio.to_thread(_get_server)
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    try:
        pid = await asyncio.to_thread(server.start, list(cmd[3:]), env, w, stderr.fileno())
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    reader = asyncio.StreamReader(limit=1 << 16, loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(r, "rb", 0))
    proc = ForkedProcess(pid, reader)
    server.register(proc)
    return proc


if __name__ == "__main__":
    sys.exit(main())
