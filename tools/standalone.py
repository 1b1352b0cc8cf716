"""``quire standalone``: the embedded default cluster — lmdb metastore and N bookie processes, supervised.

    quire standalone --bookies 3 --data data

Prints one line per role when everything is up (``metastore lmdb://...``,
``bookie 127.0.0.1:PORT``), restarts a bookie that dies, and stops every
process cleanly on SIGINT/SIGTERM. A hub process joins with the hub issue.
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
    return run


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except RuntimeError as exc:
        sys.stderr.write(f"quire standalone: {exc}\n")
        return 1


async def _run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    cluster = LocalCluster(bookies=args.bookies, hubs=0, metastore=args.metastore, data_dir=args.data)
    await cluster.start()
    try:
        print(f"metastore {cluster.metastore_uri}", flush=True)
        for addr in cluster.bookie_addresses:
            print(f"bookie {addr}", flush=True)
        print("standalone ready (Ctrl-C stops it)", flush=True)
        await cluster.supervise(stop)
    finally:
        with contextlib.suppress(Exception):
            await cluster.stop()
    return 0
