"""The console session (``quire console``): settings, connections, the command table, running a line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shlex
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TextIO

log = logging.getLogger(__name__)

class CommandError(Exception):
    """A command failed; the message is printed and the console goes on (exit status 1 at the end)."""


@dataclass(frozen=True)
class Command:
    name: str
    summary: str
    usage: str
    args_help: str = ""


COMMANDS: dict[str, Command] = {c.name: c for c in [
    Command("pub", "Publish a message to a topic in Hedwig",
            "pub {topic} {message} [--deliver-after MS | --deliver-at ISO8601]",
            "  {topic}   : topic name.\n              any printable string without spaces.\n"
            "  {message} : message body.\n              remaining arguments are used as message body to publish.\n"
            "  --deliver-after MS      : delayed delivery: SHARED and KEY_SHARED subscriptions get the\n"
            "                            message MS milliseconds after the hub stored it (others at once).\n"
            "  --deliver-at ISO8601    : delayed delivery: no earlier than this time (no zone: UTC).\n"
            "  either option may stand anywhere after {topic}; the pub then prints the message's id."),
    Command("sub", "Subscribe a topic and print the messages it receives",
            "sub {topic} {subscriber} [mode] [--type exclusive|shared|failover|key_shared]",
            "  {topic}      : topic name.\n  {subscriber} : subscriber id.\n"
            "  [mode]       : 0 = CREATE, 1 = ATTACH, 2 = CREATE_OR_ATTACH (default).\n"
            "  --type T     : the subscription type (exclusive, the default; shared, failover, key_shared)."),
    Command("closesub", "Close the subscription of a subscriber to a topic", "closesub {topic} {subscriber}"),
    Command("unsub", "Unsubscribe a topic for a subscriber", "unsub {topic} {subscriber}"),
    Command("rmsub", "Remove subscriptions for topics",
            "rmsub {topic_prefix} {start_topic} {end_topic} {subscriber_prefix} {start_sub} {end_sub}",
            "  unsubscribes {subscriber_prefix}{j} from {topic_prefix}{i} for every i in\n"
            "  [start_topic, end_topic] and j in [start_sub, end_sub]."),
    Command("consume", "Move the consume pointer of a subscription forward by N messages",
            "consume {topic} {subscriber} {num_messages_to_consume}"),
    Command("consumeto", "Move the consume pointer of a subscription to a message id",
            "consumeto {topic} {subscriber} {message_id}"),
    Command("pubsub", "Check that a published message reaches a fresh subscriber",
            "pubsub {topic} {subscriber} {timeout_secs} {message}",
            "  subscribes {subscriber}-{timestamp} to {topic}, publishes {message}-{timestamp}\n"
            "  and waits up to {timeout_secs} seconds for it to arrive."),
    Command("show", "List the live hubs (with their number of topics), all topics, the grants or the policies",
            "show hubs [--json] | show topics [--json] | show grants [{role}] [--json] | show policies [--json]",
            "  --json : print one JSON document on one line: show hubs, a list of\n"
            "           {address, hostname, port, ssl_port, num_topics}; show topics,\n"
            "           a list of {topic}; show grants, a list of {role, prefix, actions};\n"
            "           show policies, an object {prefix: {key: value}}."),
    Command("grant", "Let a role produce and/or consume on every topic starting with a prefix",
            "grant {role} {prefix} {actions}",
            "  {role}    : the token subject (quire token create --subject).\n"
            "  {prefix}  : topic name prefix; \"\" means every topic.\n"
            "  {actions} : produce, consume, or produce,consume (added to what the role has).\n"
            "  written to the metastore; hubs apply it within permissions_refresh_interval."),
    Command("revoke", "Take a role's actions on a topic prefix away", "revoke {role} {prefix} [action]",
            "  [action] : produce or consume; default both."),
    Command("describe", "Show a topic's owner, ledger ranges and subscriptions (from the metastore)",
            "describe topic {topic} [--json]",
            "  --json : print one JSON document on one line: {topic, owner, ledgers:\n"
            "           [{ledger_id, start_seq_id, end_seq_id}], subscriptions: [{subscriber,\n"
            "           consume_seq_id, remote_consume_seq_ids}], compaction: {ledger_id,\n"
            "           compacted_up_to_seq_id, last_run_ms, messages, pending_ledger_id}};\n"
            "           end_seq_id is null for the open ledger, owner null when no hub owns\n"
            "           the topic; compaction only once the topic was compacted."),
    Command("release", "Make the owner hub give a topic up, as load shedding does",
            "release topic {topic} [--json]",
            "  attached subscribers get TOPIC_MOVED, consume pointers are persisted and\n"
            "  the ledger is closed; the next access lands on the least loaded hub.\n"
            "  --json : print one JSON document on one line: {released, owner,\n"
            "           last_seq_id, subscribers_moved}."),
    Command("compact", "Compact a topic: keep the newest message of each key (Pulsar's compaction)",
            "compact topic {topic} [--json]",
            "  the owner hub writes the newest message of each key up to the topic's last\n"
            "  seq id into a new compacted ledger (keyless messages are left out, an empty\n"
            "  body deletes its key); readers with compacted=True read it, then the rest.\n"
            "  --json : print one JSON document on one line: {topic, status, ledger_id,\n"
            "           compacted_up_to_seq_id, last_run_ms, messages, pending_ledger_id,\n"
            "           last_error}."),
    Command("readtopic", "Print a topic's messages from its ledgers, from the oldest unconsumed one",
            "readtopic {topic} [start_msg_id]"),
    Command("set", "Show or set a console setting, or set a topic prefix's lifecycle policy",
            "set [{name} {value}] | set policy {prefix} {key}={value} ...",
            "  timeout          : seconds to wait for a hub operation (default 10).\n"
            "  print_messages   : print messages received by sub (default true).\n"
            "  policy           : merge keys into the policy of topics starting with {prefix}\n"
            "                     (\"\" means every topic): message_ttl_seconds,\n"
            "                     retention_time_minutes, retention_size_mb (-1: for ever),\n"
            "                     backlog_quota_limit_bytes, compaction_threshold_bytes,\n"
            "                     backlog_quota_policy = producer_request_hold |\n"
            "                     producer_exception | consumer_backlog_eviction.\n"
            "                     Written to the metastore; hubs\n"
            "                     apply it within policies_refresh_interval."),
    Command("history", "List the last commands", "history"),
    Command("redo", "Run a command of the history again", "redo {cmdno} | redo !"),
    Command("help", "List the commands, or show one command's usage", "help [command]"),
    Command("quit", "Quit the console", "quit"),
    Command("exit", "Exit the console", "exit"),
]}


def format_msg_id(local: int, remote: dict[str, int] | None = None) -> str:
    """``LOCAL(3)``, with ``;REMOTE(region=seq)`` parts for the other regions' components."""
    text = f"LOCAL({local})"
    for region, seq in sorted((remote or {}).items()):
        text += f";REMOTE({region}={seq})"
    return text


def format_message(message: Any) -> str:
    """The seed's MSGID block for one ``hub.message.Message``."""
    msg_id = format_msg_id(message.msg_id.local, dict(message.msg_id.remote))
    body = message.body.decode("utf-8", "replace")
    return (f"---------- MSGID={msg_id} ----------\nMsgId:     {msg_id}\n"
            f"SrcRegion: {message.src_region}\nMessage:\n\n{body}\n")


class UsageError(Exception):
    """Wrong arguments for a command: the console prints its usage."""


@dataclass
class ConsoleSettings:
    timeout: float = 10.0
    print_messages: bool = True


@dataclass
class ConsoleSession:
    """One console session: the command table, the history and the connections (opened lazily).

    The commands are methods ``cmd_NAME(args)``, in groups (``tools.console.pubsub``,
    ``tools.console.inspect``); ``tools.console.HedwigConsole`` has them all.
    """

    server: str
    metastore_uri: str | None
    region: str = "standalone"
    client_conf: dict[str, str] = field(default_factory=dict)
    out: TextIO = sys.stdout
    admin_token: str = ""
    """Bearer token for the hub admin HTTP API (``release topic``)."""
    json_output: bool = False
    """``quire console --json``: show/describe print JSON; everything else goes to ``err``."""
    err: TextIO = sys.stderr
    settings: ConsoleSettings = field(default_factory=ConsoleSettings)
    history: list[str] = field(default_factory=list)
    failed: bool = False
    _client: Any = None
    _store: Any = None
    _bk: Any = None
    _subscribed: set[tuple[bytes, bytes]] = field(default_factory=set)

    # ---- plumbing ------------------------------------------------------------------------------

    def say(self, text: str = "") -> None:
        print(text, file=self.err if self.json_output else self.out, flush=True)

    def emit(self, doc: object) -> None:
        """One JSON document on one line of ``out``."""
        print(json.dumps(doc), file=self.out, flush=True)

    def _wants_json(self, args: list[str]) -> tuple[bool, list[str]]:
        """Whether the command prints JSON (``--json`` word or ``quire console --json``); the other words."""
        rest = [a for a in args if a != "--json"]
        return self.json_output or len(rest) != len(args), rest

    @property
    def prompt(self) -> str:
        return f"[hedwig: ({self.region}) {len(self.history)}] "

    async def client(self) -> Any:
        if self._client is None:
            from hub.client import HedwigClient
            from hub.errors import PubSubError
            try:
                self._client = await asyncio.wait_for(
                    HedwigClient.connect(self.server, conf=self.client_conf or None), self.settings.timeout)
            except (OSError, TimeoutError, PubSubError) as exc:
                from tools.cli_common import connect_failure
                raise CommandError(connect_failure(self.server, exc, "hub server")) from None
        return self._client

    async def store(self) -> Any:
        if self._store is None:
            from tools.cli_common import MetastoreOpenError, no_metastore_message, open_tool_metastore
            if not self.metastore_uri:
                raise CommandError(no_metastore_message())
            try:
                self._store = await open_tool_metastore(self.metastore_uri, self.settings.timeout)
            except MetastoreOpenError as exc:
                raise CommandError(str(exc)) from None
        return self._store

    async def bookkeeper(self) -> Any:
        if self._bk is None:
            from bookie.client import BookKeeper
            await self.store()
            self._bk = await BookKeeper.connect(await self.store())
        return self._bk

    async def close(self) -> None:
        for closer in (self._client, self._bk, self._store):
            if closer is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(closer.close(), self.settings.timeout)
        self._client = self._bk = self._store = None

    async def _op(self, awaitable: Awaitable[Any]) -> Any:
        from hub.errors import PubSubError
        try:
            return await asyncio.wait_for(awaitable, self.settings.timeout)
        except TimeoutError:
            raise CommandError(f"timed out after {self.settings.timeout} s") from None
        except PubSubError as exc:
            raise CommandError(f"{exc.status}: {exc}") from None

    # ---- running commands -------------------------------------------------------------------

    async def run_line(self, line: str) -> bool:
        """Run one command line; False when the console should stop (quit/exit)."""
        line = line.strip()
        if not line:
            return True
        try:
            words = shlex.split(line)
        except ValueError as exc:
            self.say(f"cannot parse the command: {exc}")
            self.failed = True
            return True
        name = words[0]
        if name == "redo":
            line, words = self._redo(words)
            if not words:
                return True
            name = words[0]
        self.history.append(line)
        if name in ("quit", "exit"):
            return False
        if name not in COMMANDS:
            self.say(f"Unknown command: {name}")
            self.say("Type 'help' to list the available commands.")
            self.failed = True
            return True
        started = time.perf_counter()
        try:
            await getattr(self, f"cmd_{name}")(words[1:])
        except CommandError as exc:
            self.say(str(exc))
            self.failed = True
        except UsageError:
            cmd = COMMANDS[name]
            self.say(f"usage: {cmd.usage}")
            self.failed = True
        except Exception as exc:   # a bookie or metastore that fails mid-command: one line, the console goes on
            log.debug("%s failed", name, exc_info=True)
            self.say(f"{name} failed: {type(exc).__name__}: {exc}")
            self.failed = True
        self.say(f"Finished {time.perf_counter() - started:.4f} s.")
        return True

    def _redo(self, words: list[str]) -> tuple[str, list[str]]:
        if len(words) != 2:
            self.say("usage: redo {cmdno} | redo !")
            self.failed = True
            return "", []
        try:
            index = len(self.history) - 1 if words[1] == "!" else int(words[1])
            line = self.history[index]
            if index < 0:
                raise IndexError
        except (ValueError, IndexError):
            self.say(f"no command number {words[1]} in the history")
            self.failed = True
            return "", []
        return line, shlex.split(line)

    # ---- utility commands -------------------------------------------------------------------

    async def cmd_help(self, args: list[str]) -> None:
        if args:
            cmd = COMMANDS.get(args[0])
            if cmd is None:
                raise CommandError(f"Unknown command: {args[0]}")
            self.say(f"{cmd.name}: {cmd.summary}")
            self.say(f"usage: {cmd.usage}")
            if cmd.args_help:
                self.say()
                self.say(cmd.args_help)
            self.say()
            return
        self.say("HedwigConsole [options] [command] [args]")
        self.say()
        self.say("Available commands:")
        for name in COMMANDS:
            self.say(f"        {name}")
        self.say()

    async def cmd_history(self, args: list[str]) -> None:
        first = max(0, len(self.history) - 11)
        for i in range(first, len(self.history)):
            self.say(f"{i} - {self.history[i]}")

    async def cmd_set(self, args: list[str]) -> None:
        if args[:1] == ["policy"]:
            await self._set_policy(args[1:])
            return
        if not args:
            self.say(f"timeout = {self.settings.timeout}")
            self.say(f"print_messages = {str(self.settings.print_messages).lower()}")
            return
        if len(args) != 2:
            raise UsageError
        name, value = args
        if name == "timeout":
            try:
                seconds = float(value)
            except ValueError:
                raise CommandError(f"timeout must be a number of seconds, not {value!r}") from None
            if not seconds > 0:
                raise CommandError("timeout must be > 0")
            self.settings.timeout = seconds
        elif name == "print_messages":
            if value.lower() not in ("true", "false"):
                raise CommandError("print_messages must be true or false")
            self.settings.print_messages = value.lower() == "true"
        else:
            raise CommandError(f"unknown setting {name!r} (timeout, print_messages)")

    async def _policy_store(self) -> Any:
        from hub.policy_store import PolicyStore
        store = PolicyStore(await self.store())
        await store.start()
        return store

    async def _set_policy(self, args: list[str]) -> None:
        from hub.policies import PolicyError, parse_assignments
        if len(args) < 2:
            raise UsageError
        try:
            values = parse_assignments(args[1:])      # every word checked before anything is written
            stored = await (await self._policy_store()).update(args[0], values)
        except PolicyError as exc:
            raise CommandError(f"{exc.key}: {exc}") from None
        keys = " ".join(f"{k}={v}" for k, v in sorted(stored.items()))
        self.say(f"Policy of topics starting with {args[0]!r}: {keys}")
