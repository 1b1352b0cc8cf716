"""Per-role launchers: ``quire bookie`` and ``quire hub``.

    quire bookie --conf conf/bk_server.conf [--port 0] [--data DIR] [--metastore URI] [--set KEY=VALUE]

The bookie prints exactly one line to stdout once it serves and is
registered, ``bookie ready HOST:PORT`` (followed by ``stats=URL`` when the
stats endpoint is on), then runs until SIGTERM/SIGINT and stops cleanly
(in-flight commits finish, the registration is removed). A bad
configuration exits with status 2 and a one-line reason on stderr; a start
failure (port in use, metastore unreachable) with status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable

from bookie.conf import BookieConf
from bookie.errors import BKError, ConfError


def configure_bookie(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.add_argument("--conf", metavar="FILE", help="bk_server.conf properties file (default: built-in defaults)")
    parser.add_argument("--port", metavar="PORT", help="override bookie_port (0 picks a free port)")
    parser.add_argument("--data", metavar="DIR", help="override ledger_directories")
    parser.add_argument("--metastore", metavar="URI", help="override metastore_uri (lmdb:///path, zk://h:p/prefix)")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override any configuration key (repeatable)")
    return run_bookie_command


def bookie_conf_from_args(args: argparse.Namespace) -> BookieConf:
    """The configuration ``quire bookie`` runs with; ``ConfError`` when it is invalid."""
    overrides: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfError(f"--set expects KEY=VALUE, not {item!r}")
        overrides[key.strip()] = value.strip()
    for key, value in (("bookie_port", args.port), ("ledger_directories", args.data),
                       ("metastore_uri", args.metastore)):
        if value is not None:
            overrides[key] = value
    conf = BookieConf.from_file(args.conf, overrides)
    _ = conf.metastore  # a bookie cannot run without one
    return conf


def run_bookie_command(args: argparse.Namespace) -> int:
    try:
        conf = bookie_conf_from_args(args)
    except ConfError as exc:
        print(f"quire bookie: configuration error: {exc}", file=sys.stderr)
        return 2
    import uvloop

    sys.setswitchinterval(0.0005)
    return int(uvloop.run(_serve_bookie(conf)))


async def _serve_bookie(conf: BookieConf) -> int:
    from bookie.server import BookieServer
    from metastore.errors import MetastoreError

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = BookieServer(conf)
    try:
        await server.start()
    except (OSError, BKError, MetastoreError) as exc:
        print(f"quire bookie: cannot start: {exc}", file=sys.stderr)
        return 1
    try:
        line = f"bookie ready {server.address}"
        if server.stats_url:
            line += f" stats={server.stats_url}"
        print(line, flush=True)
        await stop.wait()
    finally:
        await server.stop()
    return 0


# --- quire hub ----------------------------------------------------------------------------------

def configure_hub(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """``quire hub --conf conf/hw_server.conf [--port 0] [--metastore URI] [--set KEY=VALUE]``.

    Prints ``hub ready HOST:PORT`` once it serves and is registered; runs until
    SIGTERM/SIGINT. A bad configuration exits 2 with one line on stderr; a
    start failure exits 1.
    """
    parser.add_argument("--conf", metavar="FILE", help="hw_server.conf properties file (default: built-in defaults)")
    parser.add_argument("--port", metavar="PORT", help="override server_port (0 picks a free port)")
    parser.add_argument("--metastore", metavar="URI", help="override metastore_uri")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override any configuration key (repeatable)")
    return run_hub_command


def run_hub_command(args: argparse.Namespace) -> int:
    from hub.conf import load_hub_conf
    from metastore.conf import ConfError as MetaConfError

    try:
        overrides: dict[str, str] = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise MetaConfError(f"--set expects KEY=VALUE, not {item!r}")
            overrides[key.strip()] = value.strip()
        for key, value in (("server_port", args.port), ("metastore_uri", args.metastore)):
            if value is not None:
                overrides[key] = value
        conf = load_hub_conf(args.conf, overrides)
    except MetaConfError as exc:
        print(f"quire hub: configuration error: {exc}", file=sys.stderr)
        return 2
    import uvloop

    return int(uvloop.run(_serve_hub(conf)))


async def _serve_hub(conf: object) -> int:
    from hub.errors import PubSubError
    from hub.server import HubServer
    from metastore.errors import MetastoreError

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = HubServer(conf)  # type: ignore[arg-type]
    from metastore.conf import ConfError

    try:
        await server.start()
    except ConfError as exc:      # e.g. the region client conf
        print(f"quire hub: configuration error: {exc}", file=sys.stderr)
        await server.stop()
        return 2
    except (OSError, BKError, MetastoreError, PubSubError) as exc:
        print(f"quire hub: cannot start: {exc}", file=sys.stderr)
        await server.stop()
        return 1
    try:
        line = f"hub ready {server.address}"
        if server.info.sslPort:
            line += f" ssl={server.conf.server_host}:{server.info.sslPort}"
        if server.stats_url:
            line += f" stats={server.stats_url}"
        print(line, flush=True)
        await stop.wait()
    finally:
        await server.stop()
    return 0
