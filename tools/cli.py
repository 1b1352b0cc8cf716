"""The ``quire`` command line.

Each subcommand lives in its own module and is registered in ``SUBCOMMANDS``
as ``name -> "module:function"``; the function receives the argparse
sub-parser to fill and returns the handler ``(args) -> int``. Modules are
imported lazily so ``quire --help`` stays fast and a broken optional role
does not break the others.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from tools import __version__

Handler = Callable[[argparse.Namespace], int]

# name -> (module:function that configures the sub-parser and returns the handler, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "zookeeper": ("tools.zookeeper:configure", "run a local ZooKeeper server from the system jars"),
    "bench": ("tools.bench:configure", "run a benchmark; prints JSON lines"),
    "bookie": ("tools.launch:configure_bookie", "run one bookie process"),
    "hub": ("tools.launch:configure_hub", "run one hub process"),
    "standalone": ("tools.standalone:configure", "run the standalone cluster (lmdb metastore, bookies)"),
    "scan": ("tools.scan.cli:configure", "Spark reports over the metastore tables (ledgers per bookie, backlog, ...)"),
    "shell": ("tools.shell:configure", "ledger and bookie administration (listbookies, recover, ...)"),
    "console": ("tools.console:configure", "the Hedwig console: publish, subscribe, inspect topics"),
}


def _configure(name: str, parser: argparse.ArgumentParser) -> Handler | None:
    target, _ = SUBCOMMANDS[name]
    module_name, func = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None  # not built yet
        raise
    handler: Handler = getattr(module, func)(parser)
    return handler


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quire", description="Quire: replicated log and pub/sub")
    parser.add_argument("--version", action="version", version=f"quire {__version__}")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is not None and name != only:
            continue  # configured lazily: only the chosen subcommand is imported
        handler = _configure(name, p)
        if handler is None:
            sub._name_parser_map.pop(name, None)
            continue
        p.set_defaults(handler=handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=chosen if chosen in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0 if not argv else 2
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
