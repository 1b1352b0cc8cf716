"""Argument parsing, metastore resolution and error handling for ``quire shell``.

Every command takes ``--metastore URI`` or ``--conf FILE`` (a properties
file with ``metastore_uri``, or ``zk_host`` and ``zk_prefix``; its placement
keys choose the placement policy) and ``--timeout SECONDS`` (bounds opening
the metastore and each bookie request), before or after the command;
``QUIRE_METASTORE`` and ``QUIRE_CONF`` are the defaults. A bad argument or configuration
prints one line and exits 2; an unreachable metastore or a failed command
prints one line and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import NoReturn, TextIO

from bookie.errors import BKError
from bookie.errors import ConfError as BookieConfError
from bookie.ops import BookieOps
from bookie.rereplication import RecoveryUsageError
from metastore import MetaStore
from metastore.conf import ConfError
from metastore.errors import IllegalOpError, MetastoreError
from metastore.registry import scheme_of
from tools.cli_common import (
    CONF_ENV,
    BadMetastoreURIError,
    MetastoreOpenError,
    add_common_options,
    metastore_from_args,
    no_metastore_message,
    number_at_least,
    open_tool_metastore,
    quiet_logging,
)
from tools.shell import commands
from tools.shell.errors import MetastoreUnavailableError, ShellError, UsageError

Command = Callable[[BookieOps, argparse.Namespace, TextIO], Awaitable[int]]

DEFAULT_TIMEOUT = 10.0
EXAMPLE_URI = "lmdb://data/metastore"


class ShellArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``quire shell CMD: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def bookie_address(text: str) -> str:
    """``HOST:PORT`` with a port in range; ``ArgumentTypeError`` otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"bad bookie address {text!r}: expected HOST:PORT")
    return text


def bounded_int(what: str, least: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``least``, or a one-line ``ArgumentTypeError`` naming ``what``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad {what} {text!r}: expected a number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"bad {what} {text!r}: expected a number >= {least}")
        return value

    return parse


ledger_id = bounded_int("ledger id", 0)
entry_id = bounded_int("entry id", 0)
positive = bounded_int("count", 1)


non_negative_float = number_at_least(0)


def password(text: str) -> bytes:
    return text.encode("utf-8")


PASSWORD_ENV = "QUIRE_LEDGER_PASSWORD"


def _password_option(p: argparse.ArgumentParser) -> None:
    secret = p.add_mutually_exclusive_group()
    secret.add_argument("--password", type=password, default=None, metavar="TEXT",
                        help=f"the ledgers' password (default ${PASSWORD_ENV}, else empty; visible in ps: "
                             f"prefer --password-file or the variable)")
    secret.add_argument("--password-file", metavar="FILE", help="read the password from FILE's first line")


def _recovery_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--password", type=password, action="append", default=[], dest="passwords", metavar="TEXT",
                   help="a ledger password; repeat for ledgers with different ones (the empty one is always tried; "
                        f"${PASSWORD_ENV} is tried too)")
    p.add_argument("--password-file", action="append", default=[], dest="password_files", metavar="FILE",
                   help="ledger passwords, one per line (repeatable)")
    p.add_argument("--skip-open", action="store_true",
                   help="leave open ledgers alone (default: recovery-close them first, fencing their writer)")
    p.add_argument("--parallel", type=positive, default=4, metavar="N", help="ledgers recovered at once (default 4)")
    p.add_argument("--max-entries-per-second", type=non_negative_float, default=0.0, metavar="RATE",
                   help="throttle entry copies (default 0: unlimited)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: on when stderr is a terminal)")


# name -> (command, help, example arguments, options)
COMMANDS: dict[str, tuple[Command, str, str, Callable[[argparse.ArgumentParser], None]]] = {}


def _register(name: str, command: Command, help_text: str, example: str,
              options: Callable[[argparse.ArgumentParser], None]) -> None:
    COMMANDS[name] = (command, help_text, example, options)


def _json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (snake_case keys, bytes as integers, times as epoch ms)")


def _listbookies(p: argparse.ArgumentParser) -> None:
    p.add_argument("--readonly", action="store_true", help="list the read-only bookies instead of the writable ones")
    _json_option(p)


def _listledgers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bookie", type=bookie_address, metavar="ADDR", help="only ledgers with a segment on ADDR")
    p.add_argument("-l", "--long", action="store_true", help="also show state, quorums, last entry, length, bookies")
    _json_option(p)


def _ledgermetadata(p: argparse.ArgumentParser) -> None:
    p.add_argument("ledger_id", type=ledger_id, metavar="ID")
    _json_option(p)


def _readledger(p: argparse.ArgumentParser) -> None:
    p.add_argument("ledger_id", type=ledger_id, metavar="ID")
    p.add_argument("first", type=entry_id, nargs="?", metavar="FROM", help="first entry (default 0)")
    p.add_argument("last", type=entry_id, nargs="?", metavar="TO", help="last entry (default: last readable)")
    p.add_argument("--hex", action="store_true", help="print every entry as hex")
    _password_option(p)


def _simpletest(p: argparse.ArgumentParser) -> None:
    p.add_argument("-e", "--ensemble", type=positive, default=3, metavar="E", help="ensemble size (default 3)")
    p.add_argument("-w", "--write-quorum", type=positive, default=2, metavar="W", help="write quorum (default 2)")
    p.add_argument("-a", "--ack-quorum", type=positive, default=2, metavar="A", help="ack quorum (default 2)")
    p.add_argument("-n", "--entries", type=positive, default=100, metavar="N", help="entries to write (default 100)")
    p.add_argument("--keep", action="store_true", help="keep the test ledger (default: delete it)")
    _password_option(p)


def _bookieinfo(p: argparse.ArgumentParser) -> None:
    p.add_argument("address", type=bookie_address, metavar="ADDR")
    _json_option(p)


def _recover(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", type=bookie_address, metavar="SRC", help="the bookie whose data is re-replicated")
    p.add_argument("dest", type=bookie_address, nargs="?", metavar="DEST",
                   help="the bookie to copy to (default: chosen per fragment by the placement policy)")
    p.add_argument("--dry-run", action="store_true", help="list what would be done; change nothing")
    _recovery_options(p)


def _decommission(p: argparse.ArgumentParser) -> None:
    p.add_argument("address", type=bookie_address, metavar="ADDR", help="a stopped bookie")
    _recovery_options(p)


_register("listbookies", commands.listbookies, "list the registered writable (or read-only) bookies",
          "", _listbookies)
_register("listledgers", commands.listledgers, "list ledger ids (all, or those with a segment on one bookie)",
          "--bookie 127.0.0.1:3181 --long", _listledgers)
_register("ledgermetadata", commands.ledgermetadata, "print one ledger's metadata", "42", _ledgermetadata)
_register("readledger", commands.readledger, "print a ledger's entries (without fencing it)", "42 0 9",
          _readledger)
_register("simpletest", commands.simpletest, "write entries to a fresh ledger and read them back",
          "--ensemble 3 --write-quorum 2 --ack-quorum 2 --entries 100", _simpletest)
_register("bookieinfo", commands.bookieinfo, "free disk and state of one bookie", "127.0.0.1:3181", _bookieinfo)
_register("recover", commands.recover, "re-replicate every ledger fragment of a bookie onto other bookies",
          "127.0.0.1:3181 --dry-run", _recover)
_register("decommission", commands.decommission,
          "recover a stopped bookie's ledgers, check none names it, remove its registration",
          "127.0.0.1:3181", _decommission)


def _autorecovery(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("status", "enable", "disable"), nargs="?", default="status",
                   help="status (default), or enable/disable every replication worker of the cluster")
    _json_option(p)


def _lostbookierecoverydelay(p: argparse.ArgumentParser) -> None:
    p.add_argument("seconds", type=non_negative_float, nargs="?", metavar="SECONDS",
                   help="set the cluster-wide delay (default: print it)")


_register("listunderreplicated", commands.listunderreplicated,
          "list the ledgers AutoRecovery's auditor marked under-replicated (ledger, missing bookies, age)",
          "--json", _json_option)
_register("autorecovery", commands.autorecovery,
          "AutoRecovery status, or enable/disable its replication workers cluster-wide", "disable", _autorecovery)
_register("triggeraudit", commands.triggeraudit,
          "ask the AutoRecovery auditor for a full audit now (unregistered bookies that ledgers name, fragments)",
          "", lambda _p: None)
_register("lostbookierecoverydelay", commands.lostbookierecoverydelay,
          "print or set the cluster-wide seconds a bookie may be gone before its ledgers are re-replicated",
          "60", _lostbookierecoverydelay)


def configure(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Fill the ``quire shell`` sub-parser; returns the handler."""
    parser.description = "Ledger and bookie administration."
    add_common_options(parser, timeout=DEFAULT_TIMEOUT,
                       conf_help="properties file with metastore_uri (or zk_host/zk_prefix) and placement keys")
    sub = parser.add_subparsers(dest="shell_command", metavar="COMMAND", parser_class=ShellArgumentParser)
    for name, (_, help_text, example, options) in COMMANDS.items():
        epilog = f"example:\n  quire shell {name} --metastore {EXAMPLE_URI}" + (f" {example}" if example else "")
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        add_common_options(p, timeout=DEFAULT_TIMEOUT, in_command=True,
                           conf_help="properties file with metastore_uri (or zk_host/zk_prefix) and placement keys")
        options(p)
    parser.epilog = f"example:\n  quire shell listbookies --metastore {EXAMPLE_URI}"
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.set_defaults(shell_parser=parser)
    return run


def resolve_metastore(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """The metastore URI and the configuration keys (from ``--conf``) for the command.

    Raises ``UsageError`` when neither ``--metastore`` nor a ``--conf`` naming
    a metastore is given, or the conf file cannot be read.
    """
    try:
        uri, conf = metastore_from_args(args.metastore, args.conf)
    except ConfError as exc:
        raise UsageError(str(exc)) from None
    if not uri:
        raise UsageError(no_metastore_message(args.conf or os.environ.get(CONF_ENV)))
    return uri, conf


async def open_store(uri: str, timeout: float) -> MetaStore:
    """Open an existing metastore within ``timeout`` seconds.

    Raises ``UsageError`` for a malformed URI and ``MetastoreUnavailableError``
    when the store cannot be reached or (lmdb) does not exist: a tool never
    creates a fresh, empty metastore by mistake.
    """
    try:
        scheme_of(uri)
    except IllegalOpError as exc:
        raise UsageError(str(exc)) from None
    try:
        return await open_tool_metastore(uri, timeout)
    except BadMetastoreURIError as exc:
        raise UsageError(str(exc)) from None
    except MetastoreOpenError as exc:
        raise MetastoreUnavailableError(str(exc)) from None


async def _main(args: argparse.Namespace, out: TextIO) -> int:
    command = COMMANDS[args.shell_command][0]
    uri, conf = resolve_metastore(args)
    store = await open_store(uri, args.timeout)
    try:
        try:
            ops = await BookieOps.open(store, conf, timeout=args.timeout or DEFAULT_TIMEOUT)
        except ValueError as exc:
            raise UsageError(f"placement configuration: {exc}") from None
        try:
            return await command(ops, args, out)
        finally:
            await ops.close()
    except (BookieConfError, ConfError, RecoveryUsageError) as exc:
        raise UsageError(str(exc)) from None
    except (BKError, MetastoreError) as exc:
        raise ShellError(str(exc) or type(exc).__name__) from None
    finally:
        await store.close()


def _secret_lines(path: str) -> list[bytes]:
    """The non-empty lines of a secret file (trailing newline and carriage return dropped); ``UsageError``."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read password file {path}: {exc.strerror or exc}") from None
    return [line.rstrip(b"\r") for line in text.split(b"\n") if line.rstrip(b"\r")]


def resolve_passwords(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> None:
    """Fill ``args.password`` / ``args.passwords`` from ``--password-file`` and ``$QUIRE_LEDGER_PASSWORD``.

    A password on the command line is visible to every user in ``ps``; a file
    or the variable is not. ``--password`` wins, then ``--password-file``, then
    the variable. Raises ``UsageError`` for an unreadable or empty file.
    """
    env = os.environ if env is None else env
    from_env = env.get(PASSWORD_ENV)
    if hasattr(args, "password_file"):
        if args.password is None and args.password_file:
            lines = _secret_lines(args.password_file)
            if not lines:
                raise UsageError(f"password file {args.password_file} is empty")
            args.password = lines[0]
        if args.password is None:
            args.password = from_env.encode() if from_env else b""
    if hasattr(args, "password_files"):
        for path in args.password_files:
            args.passwords.extend(_secret_lines(path))
        if from_env:
            args.passwords.append(from_env.encode())


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run the chosen shell command; returns its exit status (errors printed as one line on stderr)."""
    name = getattr(args, "shell_command", None)
    if name is None:
        args.shell_parser.print_help(sys.stderr)
        return 2
    quiet_logging(args, "kazoo")  # kazoo's reconnects: errors only
    try:
        resolve_passwords(args)
        return asyncio.run(_main(args, out if out is not None else sys.stdout))
    except ShellError as exc:
        sys.stderr.write(f"quire shell {name}: {exc}\n")
        return exc.exit_code
