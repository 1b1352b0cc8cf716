"""Per-role launchers: ``quire bookie``, ``quire hub`` and ``quire autorecovery``.

    quire bookie --conf conf/bk_server.conf [--port 0] [--data DIR] [--metastore URI] [--set KEY=VALUE]
    quire autorecovery --conf conf/bk_server.conf [--metastore URI] [--set KEY=VALUE]

``quire autorecovery`` runs AutoRecovery (an auditor candidate and a
replication worker, ``bookie.autorecovery``) without a bookie, from the
bookie's configuration file; it prints ``autorecovery ready session=ID``
(and ``stats=URL``) once started.

The bookie prints exactly one line to stdout once it serves and is
registered, ``bookie ready HOST:PORT`` (followed by ``stats=URL`` when the
stats endpoint is on), then runs until SIGTERM/SIGINT/SIGHUP and stops cleanly
(in-flight commits finish, the registration is removed). A bad
configuration exits with status 2 and a one-line reason on stderr; a start
failure (port in use, metastore unreachable) with status 1.

Started by ``tools.cluster.LocalCluster`` (``quire standalone``), a role
finds ``QUIRE_PARENT_PID`` in its environment and dies with that process
(``die_with_parent``): SIGTERM, so it still stops cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from bookie.conf import BookieConf
from bookie.errors import BKError
from metastore.conf import ConfError

if TYPE_CHECKING:
    from hub.conf import HubConf

log = logging.getLogger(__name__)

PARENT_PID_ENV = "QUIRE_PARENT_PID"
_PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""A role stops cleanly on each (SIGHUP: its terminal or its supervisor went away)."""


def die_with_parent(env: dict[str, str] | None = None) -> None:
    """Get SIGTERM when the process named by ``QUIRE_PARENT_PID`` dies (Linux ``PR_SET_PDEATHSIG``).

    Nothing happens without the variable. When that process is already gone
    (it died between starting us and this call) the SIGTERM is sent at once.
    Elsewhere than Linux, only that check is made.
    """
    # taken out of the environment: a process this role starts must not compare itself with our parent
    value = (os.environ.pop(PARENT_PID_ENV, "") if env is None else env.get(PARENT_PID_ENV, ""))
    if not value.isdigit():
        return
    libc_name = ctypes.util.find_library("c")
    if sys.platform.startswith("linux") and libc_name:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
    if os.getppid() != int(value):
        os.kill(os.getpid(), signal.SIGTERM)


# --set and these options become configuration overrides: option dest -> configuration key per role
_BOOKIE_OPTIONS = {"port": "bookie_port", "data": "ledger_directories", "metastore": "metastore_uri"}
_HUB_OPTIONS = {"port": "server_port", "metastore": "metastore_uri"}


class _Server(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def _add_role_options(parser: argparse.ArgumentParser, conf_file: str, port_key: str, metastore_help: str,
                      data: bool = False) -> None:
    """The options both launchers take (``--data`` for the bookie only), in ``--help`` order."""
    parser.add_argument("--conf", metavar="FILE", help=f"{conf_file} properties file (default: built-in defaults)")
    parser.add_argument("--port", metavar="PORT", help=f"override {port_key} (0 picks a free port)")
    if data:
        parser.add_argument("--data", metavar="DIR", help="override ledger_directories")
    parser.add_argument("--metastore", metavar="URI", help=metastore_help)
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override any configuration key (repeatable)")


def _overrides(args: argparse.Namespace, options: dict[str, str]) -> dict[str, str]:
    """The ``--set KEY=VALUE`` items, then the ``options`` given on the command line, as configuration keys.

    Raises ``metastore.conf.ConfError`` for a ``--set`` item without ``=`` or a key.
    """
    overrides: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfError(f"--set expects KEY=VALUE, not {item!r}")
        overrides[key.strip()] = value.strip()
    for dest, key in options.items():
        value = getattr(args, dest)
        if value is not None:
            overrides[key] = value
    return overrides


async def _serve(role: str, server: _Server, ready_line: Callable[[], str],
                 conf_errors: tuple[type[Exception], ...], start_errors: tuple[type[Exception], ...]) -> int:
    """Start ``server``, print its ready line, serve until SIGTERM/SIGINT, stop it; returns the exit status.

    A start failure prints one line on stderr and stops what was started:
    one of ``conf_errors`` exits 2 (``configuration error``), one of
    ``start_errors`` exits 1 (``cannot start``).
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except conf_errors as exc:
        print(f"quire {role}: configuration error: {exc}", file=sys.stderr)
        await server.stop()
        return 2
    except start_errors as exc:
        print(f"quire {role}: cannot start: {exc}", file=sys.stderr)
        await server.stop()
        return 1
    # What starting allocated (modules, configuration, connections) lives as long as the process:
    # freeze it, so a full collection walks only what serving allocates. A 5 000 msg/s publish run
    # saw 34 ms gen-2 pauses in the hub without this.
    gc.collect()
    gc.freeze()
    try:
        print(ready_line(), flush=True)
        await stop.wait()
    finally:
        await server.stop()
    return 0


# --- quire bookie -------------------------------------------------------------------------------

def configure_bookie(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    _add_role_options(parser, "bk_server.conf", "bookie_port",
                      "override metastore_uri (lmdb:///path, zk://h:p/prefix)", data=True)
    return run_bookie_command


def bookie_conf_from_args(args: argparse.Namespace) -> BookieConf:
    """The configuration ``quire bookie`` runs with; ``ConfError`` when it is invalid."""
    conf = BookieConf.from_file(args.conf, _overrides(args, _BOOKIE_OPTIONS))
    _ = conf.metastore  # a bookie cannot run without one
    return conf


def run_bookie_command(args: argparse.Namespace) -> int:
    try:
        conf = bookie_conf_from_args(args)
    except ConfError as exc:
        print(f"quire bookie: configuration error: {exc}", file=sys.stderr)
        return 2
    import uvloop

    from bookie.server import tune_gc

    die_with_parent()
    sys.setswitchinterval(0.0005)
    tune_gc()
    return int(uvloop.run(_serve_bookie(conf)))


async def _serve_bookie(conf: BookieConf) -> int:
    from bookie.server import BookieServer
    from metastore.errors import MetastoreError

    server = BookieServer(conf)

    def ready_line() -> str:
        line = f"bookie ready {server.address}"
        if server.stats_url:
            line += f" stats={server.stats_url}"
        return line

    # a failed start has already stopped the bookie (the second stop does nothing); a bookie's
    # ConfError is a BKError, so a start failure is always "cannot start"
    return await _serve("bookie", server, ready_line, (), (OSError, BKError, MetastoreError))


# --- quire autorecovery -------------------------------------------------------------------------

_AUTORECOVERY_OPTIONS = {"metastore": "metastore_uri"}


def configure_autorecovery(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """``quire autorecovery --conf conf/bk_server.conf [--metastore URI] [--set KEY=VALUE]``."""
    parser.add_argument("--conf", metavar="FILE", help="bk_server.conf properties file (default: built-in defaults)")
    parser.add_argument("--metastore", metavar="URI", help="override metastore_uri (lmdb:///path, zk://h:p/prefix)")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override any configuration key (repeatable)")
    return run_autorecovery_command


def run_autorecovery_command(args: argparse.Namespace) -> int:
    try:
        conf = BookieConf.from_file(args.conf, _overrides(args, _AUTORECOVERY_OPTIONS))
    except ConfError as exc:
        print(f"quire autorecovery: configuration error: {exc}", file=sys.stderr)
        return 2
    import uvloop

    die_with_parent()
    return int(uvloop.run(_serve_autorecovery(conf)))


async def _serve_autorecovery(conf: BookieConf) -> int:
    from bookie.autorecovery import AutoRecoveryServer
    from metastore.errors import MetastoreError

    server = AutoRecoveryServer(conf)

    def ready_line() -> str:
        ar = server.autorecovery
        session = ar.session if ar is not None else None
        line = f"autorecovery ready session={session.session_id if session is not None else '-'}"
        if server.stats_url:
            line += f" stats={server.stats_url}"
        return line

    return await _serve("autorecovery", server, ready_line, (), (OSError, BKError, MetastoreError))


# --- quire hub ----------------------------------------------------------------------------------

def configure_hub(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """``quire hub --conf conf/hw_server.conf [--port 0] [--metastore URI] [--set KEY=VALUE]``.

    Prints ``hub ready HOST:PORT`` once it serves and is registered; runs until
    SIGTERM/SIGINT. A bad configuration exits 2 with one line on stderr; a
    start failure exits 1.
    """
    _add_role_options(parser, "hw_server.conf", "server_port", "override metastore_uri")
    return run_hub_command


def run_hub_command(args: argparse.Namespace) -> int:
    from hub.conf import load_hub_conf

    try:
        conf = load_hub_conf(args.conf, _overrides(args, _HUB_OPTIONS))
    except ConfError as exc:
        print(f"quire hub: configuration error: {exc}", file=sys.stderr)
        return 2
    import uvloop

    from hub.gcwatch import tune_gc

    die_with_parent()
    tune_gc()
    return int(uvloop.run(_serve_hub(conf)))


async def _serve_hub(conf: HubConf) -> int:
    from hub.errors import PubSubError
    from hub.server import HubServer
    from metastore.errors import MetastoreError

    server = HubServer(conf)

    def ready_line() -> str:
        line = f"hub ready {server.address}"
        if server.info.sslPort:
            line += f" ssl={server.conf.server_host}:{server.info.sslPort}"
        if server.stats_url:
            line += f" stats={server.stats_url}"
        return line

    # ConfError: e.g. the region client conf
    return await _serve("hub", server, ready_line, (ConfError,), (OSError, BKError, MetastoreError, PubSubError))
