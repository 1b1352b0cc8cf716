"""``quire console``: the Hedwig console of the seed, against a Quire hub and its metastore.

    quire console --server 127.0.0.1:4080 --metastore lmdb:///path/to/meta
    [hedwig: (standalone) 0] pub mytopic hello
    Finished 0.0042 s.
    [hedwig: (standalone) 1] describe topic mytopic

    quire console -c "pub t hello" -c "show topics"        # non-interactive; exits 1 if a command failed
    quire console readtopic t                              # one command after the options (Hedwig's form)
    echo "show hubs" | quire console --conf conf/hw_server.conf

Commands (``help CMD`` prints each one's usage): pub, sub, closesub, unsub,
rmsub, consume, consumeto, pubsub, show hubs|topics|grants|policies, describe topic,
readtopic, release topic, compact topic, grant, revoke, set, history, redo, help, quit, exit. ``grant``,
``revoke`` and ``show grants`` act on the metastore's ``permissions`` table
(``hub.permissions``); hubs apply a change within their
``permissions_refresh_interval``. ``set policy PREFIX KEY=VALUE ...`` and
``show policies`` act on the ``topic_policies`` table (``hub.policies``);
hubs apply a change within their ``policies_refresh_interval``. After every command the
console prints ``Finished N s.``. Interactive and admin commands talk to the
hub through ``hub.client.HedwigClient``; ``show``, ``describe`` and
``readtopic`` read the metastore (and the topic's ledgers) directly, so what
they show of subscriptions may lag behind the hub, which persists consume
pointers lazily (every ``consume_interval`` consumes). ``readtopic`` shows
each ledger up to its last-add-confirmed, as BookKeeper readers do. The
hub's ledger writer sends its LAC explicitly after ``explicit_lac_interval``
(1 s) without an add, so when the bookies hold entries of the topic's open
ledger past its LAC, ``readtopic`` long-polls the LAC for up to
``READTOPIC_TAIL_WAIT`` seconds until it covers them: every acknowledged
publish shows, the newest about a second after it was made.

``release topic T`` asks the hub admin HTTP API (``tools.hub_http``: the
``--server`` hub, which forwards to the owner) to release the topic as load
shedding does; it needs the admin token (the ``--conf``'s
``http_admin_token``/``http_admin_token_file``, else
``$QUIRE_HTTP_ADMIN_TOKEN``). A topic no hub owns is an error.
``compact topic T`` asks it likewise to compact the topic (``hub.compaction``:
``POST /admin/v1/topics/{topic}/compact``) and waits for the run; ``describe
topic`` shows the compacted ledger once there is one.

``pub T MSG --deliver-after MS`` (or ``--deliver-at ISO8601``) publishes a
delayed message (``hub.delayed``: SHARED and KEY_SHARED subscriptions get it
no earlier than that) and prints its id and due time; a negative delay, both
options or a bad time is one line and nothing is published.

JSON for scripts: ``show hubs``, ``show topics``, ``show grants``, ``show policies``, ``describe topic``,
``release topic`` and ``compact topic`` take
a ``--json`` word (``show hubs --json``) and then print one JSON document on
one line instead of the text; ``quire console --json`` makes them all do so
and sends everything else the console prints (``Finished N s.``, errors,
other commands' output) to stderr, so stdout holds only those documents, one
per line::

    quire console --json -c "show hubs" -c "describe topic t" | jq .

Keys are snake_case; seq ids are integers, a missing value is ``null``.

Where to connect: ``--server HOST:PORT`` (default: the hub conf's
``server_port`` on 127.0.0.1, else 127.0.0.1:4080) and ``--metastore URI``
(default: the hub conf's ``metastore_uri``). ``--conf FILE`` names a hub
server conf (``hw_server.conf``), ``--client-conf FILE`` a client conf
(``hw_client.conf``); the environment variables ``HEDWIG_CONSOLE_SERVER_CONF``
and ``HEDWIG_CONSOLE_CLIENT_CONF`` stand in for those two options, as in
Hedwig. ``--auth-token TOKEN`` / ``--auth-token-file FILE`` (else
``$QUIRE_AUTH_TOKEN`` when the client conf names no token) give the token
for a hub with ``authentication_enabled``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tools.console.inspect import READTOPIC_TAIL_WAIT, InspectCommands, read_ledger_messages
from tools.console.pubsub import PubSubCommands
from tools.console.session import (
    COMMANDS,
    Command,
    CommandError,
    ConsoleSession,
    ConsoleSettings,
    UsageError,
    format_message,
    format_msg_id,
)

__all__ = ["COMMANDS", "EXAMPLE", "READTOPIC_TAIL_WAIT", "Command", "CommandError", "ConsoleSession", "ConsoleSettings",
           "HedwigConsole", "InspectCommands", "PubSubCommands", "UsageError", "command_lines", "configure",
           "console_from_args", "format_message", "format_msg_id", "read_ledger_messages", "run_console"]

Handler = Callable[[argparse.Namespace], int]

log = logging.getLogger(__name__)

EXAMPLE = """example:
  quire console --server 127.0.0.1:4080 --metastore lmdb://data/metastore
  quire console -c "pub mytopic hello" -c "describe topic mytopic"
  quire console readtopic mytopic                                 # one command after the options
  quire console --json -c "show hubs" -c "describe topic mytopic"   # one JSON document per line
"""


@dataclass
class HedwigConsole(PubSubCommands, InspectCommands):
    """One console session with every command group (``tools.console.session.ConsoleSession``)."""


def configure(parser: argparse.ArgumentParser) -> Handler:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLE
    parser.add_argument("--server", metavar="HOST:PORT",
                        help="hub server to connect to (default $QUIRE_SERVER, else the --conf's server_port on "
                             "127.0.0.1, else 127.0.0.1:4080)")
    from tools.cli_common import add_common_options

    add_common_options(parser, timeout=10.0, conf_help="hub server conf (hw_server.conf: metastore_uri, "
                       "server_port, region)", conf_default="$HEDWIG_CONSOLE_SERVER_CONF, then $QUIRE_CONF")
    parser.add_argument("--client-conf", metavar="FILE", help="client conf (hw_client.conf); "
                        "default $HEDWIG_CONSOLE_CLIENT_CONF")
    from tools.cli_common import add_auth_token_options

    add_auth_token_options(parser)
    parser.add_argument("-c", dest="commands", metavar="COMMAND", action="append", default=[],
                        help="run this command and exit (repeatable)")
    parser.add_argument("--json", action="store_true",
                        help="show hubs, show topics, show grants, describe topic, release topic and compact topic "
                             "print one JSON document per line on stdout; everything else (Finished lines, errors, "
                             "other output) goes to stderr")
    # nargs="*", not REMAINDER: the options still work after the command ("readtopic t --metastore URI"), as
    # for every tool; a word that starts with "-" goes in a -c command instead
    parser.add_argument("command", nargs="*", metavar="COMMAND [ARGS]",
                        help="run this one command (after any -c ones) and exit, as Hedwig's "
                             "HedwigConsole [options] [command] [args]")
    return run_console


def command_lines(args: argparse.Namespace) -> list[str]:
    """The commands to run without a prompt: each ``-c``, then the one given after the options."""
    lines = list(args.commands)
    if getattr(args, "command", None):
        lines.append(shlex.join(args.command))
    return lines


def console_from_args(args: argparse.Namespace) -> HedwigConsole:
    """The console ``quire console`` runs; ``ConfError`` for a bad conf file."""
    from metastore.conf import ConfError, read_properties
    from tools.cli_common import metastore_from_args
    server_conf_path = args.conf or os.environ.get("HEDWIG_CONSOLE_SERVER_CONF")
    client_conf_path = args.client_conf or os.environ.get("HEDWIG_CONSOLE_CLIENT_CONF")
    # a hub conf: zk_prefix defaults to /hedwig as in hw_server.conf
    metastore_uri, server_conf = metastore_from_args(args.metastore, server_conf_path or None,
                                                     default_zk_prefix="/hedwig")
    client_conf = read_properties(client_conf_path) if client_conf_path else {}
    from tools.cli_common import auth_token_conf

    token = auth_token_conf(args)      # --auth-token/--auth-token-file win; the env var only fills a gap
    if token and (getattr(args, "auth_token", None) or getattr(args, "auth_token_file", None)
                  or not (client_conf.get("auth_token") or client_conf.get("auth_token_file"))):
        client_conf = {k: v for k, v in client_conf.items() if k not in ("auth_token", "auth_token_file")}
        client_conf.update(token)
    if server_conf_path:
        from hub.conf import HubConf
        from metastore.conf import parse_conf
        parse_conf(HubConf, server_conf, source=os.path.basename(server_conf_path))  # one-line error if bad
    server = args.server or os.environ.get("QUIRE_SERVER") or f"127.0.0.1:{server_conf.get('server_port', '4080')}"
    console = HedwigConsole(server=server, metastore_uri=metastore_uri,
                            region=server_conf.get("region", "standalone"), client_conf=client_conf)
    if getattr(args, "timeout", None):
        console.settings.timeout = args.timeout
    console.json_output = bool(getattr(args, "json", False))
    from bookie.http import admin_token
    try:
        console.admin_token = admin_token(server_conf.get("http_admin_token", ""),
                                          server_conf.get("http_admin_token_file", ""))
    except OSError as exc:
        raise ConfError(f"cannot read http_admin_token_file: {exc}") from None
    return console


async def _interactive(console: HedwigConsole) -> None:
    with contextlib.suppress(ImportError):
        import readline  # line editing and history for input()

        history_file = os.path.expanduser("~/.quire_console_history")
        with contextlib.suppress(OSError):
            readline.read_history_file(history_file)
    console.say(f"Connecting to default hub server {console.server}")
    console.say("Welcome to Hedwig!")
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                line = await loop.run_in_executor(None, input, console.prompt)
            except EOFError:
                console.say()
                break
            if not await console.run_line(line):
                break
    finally:
        with contextlib.suppress(Exception):
            import readline

            readline.write_history_file(os.path.expanduser("~/.quire_console_history"))


async def _main(console: HedwigConsole, commands: Sequence[str], interactive: bool) -> int:
    try:
        if commands:
            for line in commands:
                if not await console.run_line(line):
                    break
        elif interactive:
            await _interactive(console)
        else:
            for line in sys.stdin:
                if not await console.run_line(line):
                    break
    finally:
        await console.close()
    return 1 if console.failed else 0


def run_console(args: argparse.Namespace) -> int:
    from metastore.conf import ConfError
    try:
        console = console_from_args(args)
    except ConfError as exc:
        print(f"quire console: {exc}", file=sys.stderr)
        return 2
    import uvloop

    from tools.cli_common import quiet_logging

    quiet_logging(args)  # the console prints; libraries stay quiet
    return uvloop.run(_main(console, command_lines(args), sys.stdin.isatty()))
