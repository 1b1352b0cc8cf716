"""``quire ui``: the web console's address for the standalone cluster (``make run``).

    quire ui [--data data] [--open]

Prints ``http://127.0.0.1:PORT/ui/`` of the standalone cluster running on
``--data`` (default ``./data``, ``make run``'s): the first hub's HTTP port
is in its conf file there (``hub-0/hw_server.conf``, kept across restarts).
``--open`` also opens it in the default browser (``webbrowser``). No cluster
running on that directory, or one whose hub serves no HTTP, is a one-line
error and exit status 1. Another cluster: every hub serves ``/ui/`` on its
``http_server_port`` (the URL is in the hub's ready line, ``stats=``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["configure", "console_url", "run", "standalone_console_url"]

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


def configure(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.add_argument("--data", default="data", help="the standalone cluster's data directory (default ./data)")
    parser.add_argument("--open", action="store_true", help="also open it in the default web browser")
    return run


def run(args: argparse.Namespace) -> int:
    try:
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
