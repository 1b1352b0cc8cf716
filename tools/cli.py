"""The ``quire`` command line.

Each subcommand lives in its own module and is registered in ``SUBCOMMANDS``
as ``name -> "module:function"``; the function receives the argparse
sub-parser to fill and returns the handler ``(args) -> int``. Modules are
imported lazily so ``quire --help`` stays fast and a broken optional role
does not break the others.

Every command shares one logging setup (``setup_logging``): ``--log-level``
(validated; default ``$QUIRE_LOG_LEVEL`` or INFO), ``--log-format text|json``
(one JSON object per line, python-json-logger), libraries (kazoo, happybase,
thriftpy2, py4j, asyncio) at WARNING unless the level asked for is DEBUG.
``quire --print-completion bash|zsh|...`` prints a shell completion
script of every command and option (shtab). Output cut short by a closed pipe (``quire shell listledgers | head``,
``quire --print-completion bash | head -3``) ends the command quietly with status 141, as a process killed by
SIGPIPE would.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from tools import __version__

Handler = Callable[[argparse.Namespace], int]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL_ENV = "QUIRE_LOG_LEVEL"
LIBRARY_LOGGERS = ("kazoo", "happybase", "thriftpy2", "py4j", "asyncio", "urllib3")
"""Quiet below WARNING unless the level asked for is DEBUG."""
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SIGPIPE_STATUS = 141

# name -> (module:function that configures the sub-parser and returns the handler, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "zookeeper": ("tools.zookeeper:configure", "run a local ZooKeeper server from the system jars"),
    "bench": ("tools.bench:configure", "run a benchmark; prints JSON lines"),
    "bookie": ("tools.launch:configure_bookie", "run one bookie process"),
    "hub": ("tools.launch:configure_hub", "run one hub process"),
    "autorecovery": ("tools.launch:configure_autorecovery",
                     "run AutoRecovery (auditor candidate and replication worker) without a bookie"),
    "standalone": ("tools.standalone:configure", "run the standalone cluster (lmdb metastore, bookies, a hub)"),
    "scan": ("tools.scan.cli:configure", "Spark reports over the metastore tables (ledgers per bookie, backlog, ...)"),
    "shell": ("tools.shell:configure", "ledger and bookie administration (listbookies, recover, ...)"),
    "console": ("tools.console:configure", "the Hedwig console: publish, subscribe, inspect topics"),
    "client": ("tools.client:configure", "produce and consume messages (like pulsar-client)"),
    "token": ("tools.token:configure", "make token secret keys and signed tokens (hub authentication)"),
    "ui": ("tools.ui:configure", "print (or --open) the standalone cluster's web console address"),
}


EXTRAS = {"pyspark": "scan", "pyarrow": "scan", "tabulate": "scan", "redis": "bench", "nats": "bench"}
"""Top-level modules of the optional extras (pyproject.toml) -> the extra that installs them."""


def _configure(name: str, parser: argparse.ArgumentParser) -> Handler | None:
    target, _ = SUBCOMMANDS[name]
    module_name, func = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None  # not built yet
        missing = (exc.name or "").split(".")[0]
        if missing not in EXTRAS:
            raise
        # `make run` installs no extras: the command stays listed and says what to install
        parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        return _needs_extra(name, missing, EXTRAS[missing])
    handler: Handler = getattr(module, func)(parser)
    return handler


def _needs_extra(command: str, missing: str, extra: str) -> Handler:
    def handler(_args: argparse.Namespace) -> int:
        from tools.cli_common import needs_extra_message

        print(needs_extra_message(command, missing, extra), file=sys.stderr)
        return 2
    return handler


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quire", description="Quire: replicated log and pub/sub")
    parser.add_argument("--version", action="version", version=f"quire {__version__}")
    import shtab

    shtab.add_argument_to(parser, ["--print-completion"],
                          help="print a shell completion script (bash: quire --print-completion bash "
                               "> ~/.local/share/bash-completion/completions/quire)")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, metavar="LEVEL",
                        default=os.environ.get(LOG_LEVEL_ENV, "INFO").upper(),
                        help=f"{', '.join(LOG_LEVELS)} (default ${LOG_LEVEL_ENV}, else INFO)")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="text (default) or json: one JSON object per line on stderr")
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


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """The one logging setup of every ``quire`` command: root handler on stderr, libraries quiet.

    ``level`` is one of ``LOG_LEVELS`` (``ValueError`` otherwise); ``fmt`` is ``text`` or ``json``.
    """
    if level.upper() not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r} (expected one of {', '.join(LOG_LEVELS)})")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                                           rename_fields={"levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING)


def _command_index(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (skipping the top-level options and their values)."""
    takes_value = {"--log-level", "--log-format", "--print-completion"}
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in takes_value:
            skip = True
            continue
        if not arg.startswith("-"):
            return arg
    return None


def _quiet_broken_pipe() -> int:
    """stdout's reader went away: point stdout at /dev/null so the exit flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return SIGPIPE_STATUS


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = _command_index(argv)
    parser = build_parser(only=chosen if chosen in SUBCOMMANDS else None)
    if os.environ.get(LOG_LEVEL_ENV, "INFO").upper() not in LOG_LEVELS:
        parser.error(f"{LOG_LEVEL_ENV}={os.environ[LOG_LEVEL_ENV]!r} is not a log level "
                     f"(expected one of {', '.join(LOG_LEVELS)})")
    try:
        args = parser.parse_args(argv)
    except BrokenPipeError:        # --print-completion, --help: printed while parsing
        return _quiet_broken_pipe()
    except SystemExit:
        try:
            sys.stdout.flush()   # what --help or --print-completion printed: a closed pipe shows here
        except BrokenPipeError:
            return _quiet_broken_pipe()
        raise
    setup_logging(args.log_level, args.log_format)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0 if not argv else 2
    try:
        status = int(handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
