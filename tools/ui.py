"""``quire ui``: the web console's address for the standalone cluster (``make run``).

    quire ui [--data data] [--open]
    quire ui --metastore zk://host:2181/quire [--open]      # any cluster: a live hub's console

Prints ``http://127.0.0.1:PORT/ui/`` of the standalone cluster running on
``--data`` (default ``./data``, ``make run``'s): the first hub's HTTP port
is in its conf file there (``hub-0/hw_server.conf``, kept across restarts).
``--open`` also opens it in the default browser (``webbrowser``). No cluster
running on that directory, or one whose hub serves no HTTP, is a one-line
error and exit status 1. ``--metastore URI`` finds the console of any
cluster instead: a live hub that registered an HTTP server (every hub
serves ``/ui/`` on its ``http_server_port``); none, or a metastore that
cannot be opened, is the same one-line error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["cluster_console_url", "configure", "console_url", "run", "standalone_console_url"]

UI_PATH = "/ui/"


def console_url(stats_url: str) -> str:
    """The console of the hub whose metrics are at ``stats_url`` (``http://HOST:PORT/metrics``)."""
    return stats_url.removesuffix("/metrics") + UI_PATH


def standalone_console_url(data_dir: str | Path) -> str:
    """The console URL of the standalone cluster on ``data_dir``; ``LookupError`` saying why there is none."""
    from metastore.conf import read_properties
    from tools.cluster import LocalCluster

    data = Path(data_dir)
    if LocalCluster.running_pid(data) is None:
        raise LookupError(f"no standalone cluster is running on {data.resolve()} (start one with `make run`)")
    conf = data / "hub-0" / "hw_server.conf"
    if not conf.is_file():
        raise LookupError(f"the cluster on {data.resolve()} has no hub (quire standalone --hubs 1)")
    port = read_properties(conf).get("stats_http_port", "")
    if not port.isdigit() or int(port) <= 0:
        raise LookupError(f"hub-0 on {data.resolve()} serves no HTTP (stats_http_port={port!r} in {conf})")
    return console_url(f"http://127.0.0.1:{port}/metrics")


async def cluster_console_url(uri: str, timeout: float) -> str:
    """The console URL of a live hub of the cluster on metastore ``uri``; ``LookupError`` saying why there is none."""
    from tools.cli_common import BadMetastoreURIError, MetastoreUnreachableError, open_tool_metastore
    from tools.hub_http import HubHttpError, hub_http_url

    try:
        store = await open_tool_metastore(uri, timeout)
    except (BadMetastoreURIError, MetastoreUnreachableError) as exc:
        raise LookupError(str(exc)) from None
    try:
        return await asyncio.wait_for(hub_http_url(store, ""), timeout) + UI_PATH
    except HubHttpError as exc:
        raise LookupError(str(exc)) from None
    except TimeoutError:
        raise LookupError(f"metastore {uri} did not answer within {timeout:g} s") from None
    finally:
        await store.close()


def configure(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.add_argument("--data", default="data", help="the standalone cluster's data directory (default ./data)")
    parser.add_argument("--metastore", metavar="URI", default=None,
                        help="instead: any cluster, by its metastore; the console of a live hub that serves HTTP")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for the metastore (with --metastore)")
    parser.add_argument("--open", action="store_true", help="also open it in the default web browser")
    return run


def run(args: argparse.Namespace) -> int:
    try:
        if args.metastore:
            url = asyncio.run(cluster_console_url(args.metastore, args.timeout))
        else:
            url = standalone_console_url(args.data)
    except LookupError as exc:
        sys.stderr.write(f"quire ui: {exc}\n")
        return 1
    print(url, flush=True)
    if args.open:
        import webbrowser

        if not webbrowser.open(url):
            sys.stderr.write("quire ui: no web browser to open it with here; open the address above\n")
    return 0
