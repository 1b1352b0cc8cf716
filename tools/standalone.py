"""``quire standalone``: the embedded default cluster — lmdb metastore, N bookie processes and one hub, supervised.

    quire standalone --bookies 3 --data data

Prints one line per role when everything is up (``metastore lmdb://...``,
``bookie 127.0.0.1:PORT``, ``hub 127.0.0.1:4080``), restarts a bookie or hub
that dies, and stops every process cleanly on SIGINT/SIGTERM. The hub
listens on ``--hub-port`` (default 4080, Hedwig's) so clients find it at
``localhost:4080``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable

from tools.cluster import LocalCluster


def configure(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.add_argument("--bookies", type=int, default=3, help="number of bookie processes (default 3)")
    parser.add_argument("--data", default="data", help="data directory, kept across runs (default ./data)")
    parser.add_argument("--metastore", default="lmdb", help="lmdb (default), zookeeper, hbase or a URI")
    parser.add_argument("--hubs", type=int, default=1, help="number of hub processes (default 1)")
    parser.add_argument("--hub-port", type=int, default=4080, help="port of the first hub (default 4080; 0: any)")
    return run


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except RuntimeError as exc:
        sys.stderr.write(f"quire standalone: {exc}\n")
        return 1


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def _run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    cluster = LocalCluster(bookies=args.bookies, hubs=args.hubs, metastore=args.metastore, data_dir=args.data)
    if args.hubs and args.hub_port and _port_free(args.hub_port):
        cluster.set_hub_conf(0, server_port=str(args.hub_port))   # else: any free port (printed below)
    await cluster.start()
    try:
        print(f"metastore {cluster.metastore_uri}", flush=True)
        for addr in cluster.bookie_addresses:
            print(f"bookie {addr}", flush=True)
        for addr in cluster.hub_addresses:
            print(f"hub {addr}", flush=True)
        print("standalone ready (Ctrl-C stops it)", flush=True)
        await cluster.supervise(stop)
    finally:
        with contextlib.suppress(Exception):
            await cluster.stop()
    return 0
