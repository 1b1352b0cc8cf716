"""``quire standalone``: the embedded default cluster — lmdb metastore, N bookie processes and one hub, supervised.

    quire standalone --bookies 3 --data data [--hub-port 4080] [--json]

Once everything is up it prints the metastore, then one line per process
(``bookie 127.0.0.1:PORT metrics=URL log=FILE pid=N``, ``hub ...``) and
``console http://127.0.0.1:PORT/ui/`` (the web console, ``quire ui``) and
``standalone ready ...`` (with ``--json``: one JSON document instead). It
restarts a bookie or hub that dies, and stops every process cleanly on
SIGINT, SIGTERM or SIGHUP; killed outright (SIGKILL), its processes get
SIGTERM from the kernel (``tools.launch.die_with_parent``). The hub listens
on ``--hub-port`` (default 4080, Hedwig's; 0 picks a free one): a port in use
is an error, never a silent move (a port held only by the TIME_WAIT
connections of a hub stopped a moment ago is free: the hub binds with
``SO_REUSEADDR``, and so does the check). A second standalone on the same data
directory exits with ``already running (pid N)``.

``--metastore hbase`` would run on the in-memory HBase Thrift emulator, a
test double where nothing persists: it is refused unless
``--allow-test-double`` is given (then a WARNING says so on stderr once the
cluster is up); a real HBase is ``hbase://HOST:PORT/PREFIX``. An unknown
metastore name is a one-line usage error (status 2) before anything starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from tools.cli_common import count_at_least
from tools.cluster import LocalCluster
from tools.launch import STOP_SIGNALS


def _port(text: str) -> int:
    value = count_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port (0-65535), not {text!r}")
    return value


def configure(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.add_argument("--bookies", type=count_at_least(1), default=3, help="number of bookie processes (default 3)")
    parser.add_argument("--data", default="data", help="data directory, kept across runs (default ./data)")
    parser.add_argument("--metastore", default="lmdb",
                        help="lmdb (default), zookeeper (a local ZooKeeper from the system jars), a URI "
                             "(zk://HOST:PORT/PREFIX, hbase://HOST:PORT/PREFIX, lmdb://DIR), or hbase: the "
                             "in-memory HBase emulator, a test double (needs --allow-test-double)")
    parser.add_argument("--allow-test-double", action="store_true",
                        help="let --metastore hbase run on the in-memory HBase Thrift emulator (nothing persists)")
    parser.add_argument("--hubs", type=count_at_least(0), default=1, help="number of hub processes (default 1)")
    parser.add_argument("--hub-port", type=_port, default=4080,
                        help="port of the first hub (default 4080; 0: any free port); a port in use is an error")
    parser.add_argument("--json", action="store_true",
                        help="on ready, print one JSON document (metastore, processes) instead of lines")
    return run


TAIL_LINES = 10
"""Lines of a failed role's log tail shown after the one-line error (the reason is usually the last)."""
METASTORE_NAMES = ("lmdb", "zookeeper", "zk", "hbase")
TEST_DOUBLE_WARNING = ("quire standalone: WARNING: the metastore is the in-memory HBase Thrift emulator (a test "
                       "double): nothing persists, every topic and ledger is forgotten when it stops")


def _metastore_problem(args: argparse.Namespace) -> str | None:
    """Why ``--metastore`` cannot be used as given (one line), or None."""
    m = args.metastore
    if "://" not in m and m not in METASTORE_NAMES:
        return (f"unknown metastore {m!r}: use lmdb, zookeeper, a URI (zk://HOST:PORT/PREFIX, "
                "hbase://HOST:PORT/PREFIX, lmdb://DIR) or hbase with --allow-test-double")
    if m == "hbase" and not args.allow_test_double:
        return ("--metastore hbase runs the in-memory HBase Thrift emulator, a test double: nothing persists. "
                "Give a real HBase as hbase://HOST:PORT/PREFIX, or pass --allow-test-double to run on the emulator")
    return None


def run(args: argparse.Namespace) -> int:
    problem = _metastore_problem(args)
    if problem is not None:
        sys.stderr.write(f"quire standalone: {problem}\n")
        return 2
    running = LocalCluster.running_pid(args.data)   # before the port: a second `make run` holds 4080 too
    if running is not None:
        sys.stderr.write(f"quire standalone: already running (pid {running}) on {Path(args.data).resolve()}\n")
        return 1
    if args.hubs and args.hub_port and not _port_free(args.hub_port):
        sys.stderr.write(f"quire standalone: hub port {args.hub_port} is in use "
                         f"(stop what holds it, or pass --hub-port 0 for any free port; "
                         f"make run HUB_PORT=0, also BOOKIES=N DATA=DIR)\n")
        return 1
    try:
        return asyncio.run(_run(args))
    except RuntimeError as exc:
        lines = str(exc).splitlines() or [type(exc).__name__]
        sys.stderr.write(f"quire standalone: {lines[0]}\n")
        for line in [ln for ln in lines[1:] if ln.strip()][-TAIL_LINES:]:   # the role's own last words
            sys.stderr.write(f"  {line}\n")
        return 1


def _port_free(port: int) -> bool:
    """Whether the hub could listen on ``port``: bound as the hub binds it (``SO_REUSEADDR``), so the
    connections of a hub stopped a moment ago (in TIME_WAIT for up to a minute) do not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _console(cluster: LocalCluster) -> str:
    """The first hub's web console URL (``tools.ui``), or ``""`` without a hub serving HTTP."""
    from tools.ui import console_url

    hub = next((p for p in cluster.processes() if p.role == "hub" and p.metrics_url), None)
    return console_url(hub.metrics_url) if hub is not None else ""


def ready_report(cluster: LocalCluster) -> dict[str, object]:
    """What ``--json`` prints: the metastore, the data directory, every process and the console's URL."""
    return {"metastore": cluster.metastore_uri, "data": str(cluster.data_dir),
            "processes": [asdict(p) for p in cluster.processes()], "console": _console(cluster)}


async def _run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    cluster = LocalCluster(bookies=args.bookies, hubs=args.hubs, metastore=args.metastore, data_dir=args.data)
    if args.hubs and args.hub_port:   # 0: the port it had on this data dir, else any free one
        cluster.set_hub_conf(0, server_port=str(args.hub_port))
    await cluster.start()
    ui = _console(cluster)
    try:
        if args.metastore == "hbase":      # allowed with --allow-test-double: said at start and once ready
            sys.stderr.write(TEST_DOUBLE_WARNING + "\n")
        if args.json:
            print(json.dumps(ready_report(cluster)), flush=True)
        else:
            print(f"metastore {cluster.metastore_uri}", flush=True)
            for p in cluster.processes():
                metrics = f" metrics={p.metrics_url}" if p.metrics_url else ""
                print(f"{p.role} {p.address}{metrics} log={p.log_path} pid={p.pid}", flush=True)
            if ui:
                print(f"console {ui} (quire ui --open)", flush=True)
            print("standalone ready (Ctrl-C stops it)", flush=True)
        await cluster.supervise(stop)
    finally:
        with contextlib.suppress(Exception):
            await cluster.stop()
    return 0


__all__ = ["configure", "ready_report", "run"]
