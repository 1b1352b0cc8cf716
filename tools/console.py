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
readtopic, release topic, grant, revoke, set, history, redo, help, quit, exit. ``grant``,
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

JSON for scripts: ``show hubs``, ``show topics``, ``show grants``, ``show policies``, ``describe topic`` and
``release topic`` take
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
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

Handler = Callable[[argparse.Namespace], int]

log = logging.getLogger(__name__)

EXAMPLE = """example:
  quire console --server 127.0.0.1:4080 --metastore lmdb://data/metastore
  quire console -c "pub mytopic hello" -c "describe topic mytopic"
  quire console readtopic mytopic                                 # one command after the options
  quire console --json -c "show hubs" -c "describe topic mytopic"   # one JSON document per line
"""


class CommandError(Exception):
    """A command failed; the message is printed and the console goes on (exit status 1 at the end)."""


@dataclass(frozen=True)
class Command:
    name: str
    summary: str
    usage: str
    args_help: str = ""


COMMANDS: dict[str, Command] = {c.name: c for c in [
    Command("pub", "Publish a message to a topic in Hedwig", "pub {topic} {message}",
            "  {topic}   : topic name.\n              any printable string without spaces.\n"
            "  {message} : message body.\n              remaining arguments are used as message body to publish."),
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
            "           consume_seq_id, remote_consume_seq_ids}]}; end_seq_id is null for\n"
            "           the open ledger, owner null when no hub owns the topic."),
    Command("release", "Make the owner hub give a topic up, as load shedding does",
            "release topic {topic} [--json]",
            "  attached subscribers get TOPIC_MOVED, consume pointers are persisted and\n"
            "  the ledger is closed; the next access lands on the least loaded hub.\n"
            "  --json : print one JSON document on one line: {released, owner,\n"
            "           last_seq_id, subscribers_moved}."),
    Command("readtopic", "Print a topic's messages from its ledgers, from the oldest unconsumed one",
            "readtopic {topic} [start_msg_id]"),
    Command("set", "Show or set a console setting, or set a topic prefix's lifecycle policy",
            "set [{name} {value}] | set policy {prefix} {key}={value} ...",
            "  timeout          : seconds to wait for a hub operation (default 10).\n"
            "  print_messages   : print messages received by sub (default true).\n"
            "  policy           : merge keys into the policy of topics starting with {prefix}\n"
            "                     (\"\" means every topic): message_ttl_seconds,\n"
            "                     retention_time_minutes, retention_size_mb (-1: for ever),\n"
            "                     backlog_quota_limit_bytes, backlog_quota_policy =\n"
            "                     producer_request_hold | producer_exception |\n"
            "                     consumer_backlog_eviction. Written to the metastore; hubs\n"
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


@dataclass
class ConsoleSettings:
    timeout: float = 10.0
    print_messages: bool = True


@dataclass
class HedwigConsole:
    """One console session: the command table, the history and the connections (opened lazily)."""

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

    # ---- running commands ----------------------------------------------------------------------

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

    # ---- utility commands ----------------------------------------------------------------------

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

    # ---- interactive commands ------------------------------------------------------------------

    async def cmd_pub(self, args: list[str]) -> None:
        if len(args) < 2:
            raise UsageError
        client = await self.client()
        await self._op(client.publish(args[0].encode(), " ".join(args[1:]).encode()))

    async def cmd_sub(self, args: list[str]) -> None:
        stype = "EXCLUSIVE"
        if "--type" in args:    # sub TOPIC SUB [mode] --type shared|failover|key_shared
            at = args.index("--type")
            if at + 1 >= len(args):
                raise UsageError
            stype = args[at + 1].upper()
            args = args[:at] + args[at + 2:]
        if len(args) not in (2, 3):
            raise UsageError
        modes = {"0": "CREATE", "1": "ATTACH", "2": "CREATE_OR_ATTACH"}
        mode = modes.get(args[2], args[2].upper()) if len(args) == 3 else "CREATE_OR_ATTACH"
        if mode not in modes.values():
            raise CommandError(f"mode must be 0 (CREATE), 1 (ATTACH) or 2 (CREATE_OR_ATTACH), not {args[2]!r}")
        topic, sub = args[0].encode(), args[1].encode()
        client = await self.client()
        try:
            await self._op(client.subscribe(topic, sub, create_or_attach=mode, subscription_type=stype))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self._subscribed.add((topic, sub))

        async def show(t: bytes, s: bytes, message: Any) -> None:
            if self.settings.print_messages:
                self.say(f"Received message from topic {t.decode(errors='replace')} "
                         f"for subscriber {s.decode(errors='replace')}:")
                self.say(format_message(message))

        await self._op(client.start_delivery(topic, sub, show))

    async def _closesub(self, topic: bytes, sub: bytes) -> None:
        client = await self.client()
        await self._op(client.close_subscription(topic, sub))
        self._subscribed.discard((topic, sub))

    async def cmd_closesub(self, args: list[str]) -> None:
        if len(args) != 2:
            raise UsageError
        await self._closesub(args[0].encode(), args[1].encode())

    async def cmd_unsub(self, args: list[str]) -> None:
        if len(args) != 2:
            raise UsageError
        topic, sub = args[0].encode(), args[1].encode()
        client = await self.client()
        await self._op(client.unsubscribe(topic, sub))
        self._subscribed.discard((topic, sub))

    async def cmd_rmsub(self, args: list[str]) -> None:
        if len(args) != 6:
            raise UsageError
        try:
            t0, t1, s0, s1 = int(args[1]), int(args[2]), int(args[4]), int(args[5])
        except ValueError:
            raise CommandError("start and end numbers must be integers") from None
        from hub.errors import ClientNotSubscribedError
        client = await self.client()
        removed = 0
        for i in range(t0, t1 + 1):
            for j in range(s0, s1 + 1):
                topic, sub = f"{args[0]}{i}".encode(), f"{args[3]}{j}".encode()
                try:
                    await asyncio.wait_for(client.unsubscribe(topic, sub), self.settings.timeout)
                    removed += 1
                except ClientNotSubscribedError:
                    continue
        self.say(f"Removed {removed} subscriptions.")

    async def _stored_subscription(self, topic: bytes, sub: bytes) -> Any:
        """The subscription's stored ``SubscriptionData`` (pointer and preferences); CLIENT_NOT_SUBSCRIBED if none."""
        from hub.metadata import SubscriptionDataManager
        mgr = SubscriptionDataManager(await self.store())
        await mgr.start()
        found = await mgr.read_subscription_data(topic, sub)
        if found is None:
            raise CommandError(f"CLIENT_NOT_SUBSCRIBED: {sub.decode(errors='replace')} has no subscription "
                               f"to {topic.decode(errors='replace')}")
        return found[0]

    async def _consume_to(self, topic: bytes, sub: bytes, seq_id: int, stored: Any = None) -> None:
        """Consume up to ``seq_id``; a subscription not attached here is attached with its stored preferences.

        (A subscribe replaces the stored preferences with the ones it
        carries, so attaching with none would wipe its filter, bound and
        window.)
        """
        from hub.message import SubscriptionPreferences
        client = await self.client()
        attached_here = (topic, sub) in self._subscribed
        if not attached_here:
            if stored is None:
                stored = await self._stored_subscription(topic, sub)
            prefs = SubscriptionPreferences.from_proto(stored.preferences)
            await self._op(client.subscribe(topic, sub, create_or_attach="ATTACH",
                                            message_bound=prefs.message_bound,
                                            message_window_size=prefs.message_window_size,
                                            options=prefs.options, message_filter=prefs.message_filter or None))
        try:
            await self._op(client.consume(topic, sub, seq_id))
        finally:
            if not attached_here:  # closing flushes the consume and persists the pointer
                await self._op(client.close_subscription(topic, sub))

    async def cmd_consume(self, args: list[str]) -> None:
        if len(args) != 3:
            raise UsageError
        try:
            count = int(args[2])
        except ValueError:
            raise CommandError(f"num_messages_to_consume must be an integer, not {args[2]!r}") from None
        topic, sub = args[0].encode(), args[1].encode()
        stored = await self._stored_subscription(topic, sub)
        target = int(stored.state.msgId.localComponent) + count
        await self._consume_to(topic, sub, target, stored)
        self.say(f"Consumed up to {format_msg_id(target)}.")

    async def cmd_consumeto(self, args: list[str]) -> None:
        if len(args) != 3:
            raise UsageError
        try:
            target = int(args[2])
        except ValueError:
            raise CommandError(f"message_id must be an integer (the local seq id), not {args[2]!r}") from None
        await self._consume_to(args[0].encode(), args[1].encode(), target)
        self.say(f"Consumed up to {format_msg_id(target)}.")

    async def cmd_pubsub(self, args: list[str]) -> None:
        if len(args) < 4:
            raise UsageError
        try:
            timeout = float(args[2])
        except ValueError:
            raise CommandError(f"timeout_secs must be a number, not {args[2]!r}") from None
        stamp = int(time.time() * 1000)
        topic, sub = args[0].encode(), f"{args[1]}-{stamp}".encode()
        body = f"{' '.join(args[3:])}-{stamp}".encode()
        client = await self.client()
        self.say("Starting PUBSUB test ...")
        started = time.perf_counter()
        received = asyncio.get_running_loop().create_future()

        async def handler(t: bytes, s: bytes, message: Any) -> None:
            if message.body == body and not received.done():
                received.set_result(message)

        self.say(f"Sub topic {args[0]}, subscriber id {sub.decode()}")
        await self._op(client.subscribe(topic, sub, create_or_attach="CREATE_OR_ATTACH"))
        try:
            await self._op(client.start_delivery(topic, sub, handler))
            self.say(f"Pub topic {args[0]} : {body.decode()}")
            await self._op(client.publish(topic, body))
            try:
                message = await asyncio.wait_for(received, timeout)
            except TimeoutError:
                raise CommandError(f"PUBSUB FAILED: no message within {timeout} s") from None
            self.say(f"Received message : {message.body.decode(errors='replace')}")
            self.say(f"PUBSUB SUCCESS. TIME: {int((time.perf_counter() - started) * 1000)} MS")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.unsubscribe(topic, sub), self.settings.timeout)

    # ---- admin commands (read the metastore) ---------------------------------------------------

    async def cmd_show(self, args: list[str]) -> None:
        as_json, args = self._wants_json(args)
        if args == ["hubs"]:
            from hub.metadata import HubRegistry, hub_address
            registry = HubRegistry(await self.store())
            await registry.start()
            hubs = sorted(await registry.live_hubs(), key=lambda h: hub_address(h[0]))
            if as_json:
                self.emit([{"address": hub_address(info), "hostname": info.hostname, "port": info.port,
                            "ssl_port": info.sslPort, "num_topics": load.numTopics} for info, load in hubs])
                return
            self.say("Available Hub Servers:")
            for info, load in hubs:
                self.say(f"        {hub_address(info)} :       {load.numTopics}")
        elif args == ["policies"]:
            await self._show_policies(as_json)
        elif args[:1] == ["grants"] and len(args) <= 2:
            await self._show_grants(args[1] if len(args) == 2 else None, as_json)
        elif args == ["topics"]:
            topics = await self._topics()
            if as_json:
                self.emit([{"topic": t} for t in topics])
                return
            self.say("Topic List:")
            self.say("[" + ", ".join(topics) + "]")
        else:
            raise UsageError

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

    async def _show_policies(self, as_json: bool) -> None:
        policies = await (await self._policy_store()).policies()
        if as_json:
            self.emit(policies)
            return
        self.say("Policies (topic prefix: keys; a topic takes each key from its longest prefix, else the hub conf):")
        for prefix, keys in policies.items():
            self.say(f"        {prefix or '(every topic)'}:    "
                     + " ".join(f"{k}={v}" for k, v in sorted(keys.items())))

    async def _permissions(self) -> Any:
        from hub.permissions import PermissionStore
        store = PermissionStore(await self.store())
        await store.start()
        return store

    async def _show_grants(self, role: str | None, as_json: bool) -> None:
        grants = [g for g in await (await self._permissions()).grants() if role is None or g.role == role]
        if as_json:
            self.emit([g.to_json() for g in grants])
            return
        self.say("Grants (role, topic prefix, actions):")
        for g in grants:
            self.say(f"        {g.role}    {g.prefix or '(every topic)'}    {','.join(g.actions)}")

    async def cmd_grant(self, args: list[str]) -> None:
        if len(args) != 3:
            raise UsageError
        try:
            grant = await (await self._permissions()).grant(args[0], args[1], args[2])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.say(f"Role {grant.role} may now {' and '.join(grant.actions)} on topics starting with {grant.prefix!r}")

    async def cmd_revoke(self, args: list[str]) -> None:
        if len(args) not in (2, 3):
            raise UsageError
        try:
            left = await (await self._permissions()).revoke(args[0], args[1], args[2] if len(args) == 3 else None)
        except (ValueError, LookupError) as exc:
            raise CommandError(str(exc)) from None
        what = f"may still {' and '.join(left.actions)}" if left else "has no grant left"
        self.say(f"Role {args[0]} {what} on topics starting with {args[1]!r}")

    async def _topics(self) -> list[str]:
        store = await self.store()
        names: set[str] = set()
        for table_name in ("topic_persistence", "topic_owners"):
            table = await store.create_table(table_name)
            cursor = await table.open_cursor(fields=set())
            try:
                while cursor.has_more():
                    names.update(key for key, _ in await cursor.read_entries(1000))
            finally:
                await cursor.close()
        return sorted(names)

    async def cmd_describe(self, args: list[str]) -> None:
        as_json, args = self._wants_json(args)
        if len(args) != 2 or args[0] != "topic":
            raise UsageError
        from hub.metadata import (
            SubscriptionDataManager,
            TopicOwnershipManager,
            TopicPersistenceManager,
            hub_address,
        )
        from hub.subscriptions import type_name as pb_type_name
        store = await self.store()
        topic = args[1].encode()
        owners, persistence, subs = (TopicOwnershipManager(store), TopicPersistenceManager(store),
                                     SubscriptionDataManager(store))
        for mgr in (owners, persistence, subs):
            await mgr.start()
        owner = await owners.read_owner_info(topic)
        found = await persistence.read_topic_persistence_info(topic)
        ranges = list(found[0].ranges) if found else []
        subscriptions = sorted((await subs.read_subscriptions(topic)).items())
        typed = any(data.preferences.subscriptionType for data, _ in dict(subscriptions).values())
        live = await self._live_subscriptions(args[1]) if typed else {}

        def consumer_view(sub_id: bytes, data: Any) -> dict[str, Any]:
            """type, consumers and unacked of a SHARED/FAILOVER/KEY_SHARED subscription (Hedwig's EXCLUSIVE
            ones print as they always did)."""
            if not data.preferences.subscriptionType:
                return {}
            got = live.get(sub_id.decode(errors="replace"), {})
            return {"type": pb_type_name(data.preferences.subscriptionType),
                    "consumers": len(got["consumers"]) if "consumers" in got else None,
                    "unacked": got.get("unacked")}
        if as_json:
            self.emit({
                "topic": args[1],
                "owner": hub_address(owner[0]) if owner else None,
                "ledgers": [{"ledger_id": r.ledgerId, "start_seq_id": r.startSeqIdIncluded or 1,
                             "end_seq_id": r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded")
                             else None} for r in ranges],
                "subscriptions": [{"subscriber": sub_id.decode(errors="replace"),
                                   "consume_seq_id": data.state.msgId.localComponent,
                                   "remote_consume_seq_ids": {c.region.decode(errors="replace"): c.seqId
                                                              for c in data.state.msgId.remoteComponents},
                                   **consumer_view(sub_id, data)}
                                  for sub_id, (data, _) in subscriptions],
            })
            return
        self.say(f"===== Topic Information : {args[1]} =====")
        self.say()
        self.say(f"Owner : {hub_address(owner[0]) if owner else 'NULL'}")
        self.say()
        self.say(">>> Persistence Info <<<")
        for r in ranges:
            self.say(f"Ledger {r.ledgerId} [ {_range_text(r)} ]")
        self.say()
        self.say(">>> Subscription Info <<<")
        for sub_id, (data, _) in subscriptions:
            remote = {c.region.decode(errors="replace"): c.seqId for c in data.state.msgId.remoteComponents}
            seq = f"local:{data.state.msgId.localComponent}" + "".join(f", {k}:{v}" for k, v in sorted(remote.items()))
            view = consumer_view(sub_id, data)
            extra = f", type: {view['type']}" if view else ""
            if view.get("consumers") is not None:
                extra += f", consumers: {view['consumers']}, unacked: {view['unacked']}"
            self.say(f"Subscriber {sub_id.decode(errors='replace')} : consumeSeqId: {seq}{extra}")
        self.say()

    async def _live_subscriptions(self, topic: str) -> dict[str, Any]:
        """The owner's view of the topic's subscriptions (admin API stats); {} when no hub HTTP answers."""
        from urllib.parse import quote

        from tools.hub_http import HubHttpError, admin_call, hub_http_url
        try:
            url = await asyncio.wait_for(hub_http_url(await self.store(), self.server), self.settings.timeout)
            status, doc = await admin_call(url, "GET", f"/admin/v1/topics/{quote(topic, safe='')}/stats",
                                           token=self.admin_token, timeout=self.settings.timeout)
        except (TimeoutError, HubHttpError):
            return {}
        if status != 200 or not isinstance(doc, dict) or not doc.get("owned_here", True):
            return {}
        subs = doc.get("subscriptions")
        return subs if isinstance(subs, dict) else {}

    async def cmd_release(self, args: list[str]) -> None:
        as_json, args = self._wants_json(args)
        if len(args) != 2 or args[0] != "topic":
            raise UsageError
        from urllib.parse import quote

        from tools.hub_http import HubHttpError, admin_call, hub_http_url
        topic = args[1]
        try:
            url = await asyncio.wait_for(hub_http_url(await self.store(), self.server), self.settings.timeout)
            status, doc = await admin_call(url, "POST", f"/admin/v1/topics/{quote(topic, safe='')}/release",
                                           token=self.admin_token, timeout=self.settings.timeout)
        except TimeoutError:
            raise CommandError(f"timed out after {self.settings.timeout} s") from None
        except HubHttpError as exc:
            raise CommandError(str(exc)) from None
        if status != 200:
            why = doc.get("error", doc) if isinstance(doc, dict) else doc
            if status == 404:
                raise CommandError(f"Topic {topic} is not owned by any hub: nothing to release.")
            raise CommandError(f"cannot release topic {topic} (HTTP {status}): {why}")
        if as_json:
            self.emit(doc)
            return
        moved = doc.get("subscribers_moved") or []
        self.say(f"Topic {doc.get('released')} released by hub {doc.get('owner')} at seq id "
                 f"{doc.get('last_seq_id')}; subscribers moved: {', '.join(moved) if moved else 'none'}")

    async def cmd_readtopic(self, args: list[str]) -> None:
        if len(args) not in (1, 2):
            raise UsageError
        from hub.metadata import SubscriptionDataManager, TopicPersistenceManager
        topic = args[0].encode()
        store = await self.store()
        persistence, subs = TopicPersistenceManager(store), SubscriptionDataManager(store)
        await persistence.start()
        await subs.start()
        if len(args) == 2:
            try:
                start = int(args[1])
            except ValueError:
                raise CommandError(f"start_msg_id must be an integer, not {args[1]!r}") from None
        else:
            consumed = [d.state.msgId.localComponent for d, _ in (await subs.read_subscriptions(topic)).values()]
            start = (min(consumed) if consumed else 0) + 1
        found = await persistence.read_topic_persistence_info(topic)
        if found is None or not found[0].ranges:
            raise CommandError(f"topic {args[0]} has no persistence info")
        bk = await self.bookkeeper()
        for r in found[0].ranges:
            if r.HasField("endSeqIdIncluded") and r.endSeqIdIncluded.localComponent < start:
                continue
            self.say()
            self.say(f">>>>> Ledger {r.ledgerId} [ {_range_text(r)}] <<<<<")
            self.say()
            tail_wait = 0.0 if r.HasField("endSeqIdIncluded") else min(READTOPIC_TAIL_WAIT, self.settings.timeout)
            for message in await read_ledger_messages(bk, r.ledgerId, tail_wait=tail_wait):
                if message.seq_id >= start:
                    self.say(format_message(message))


async def read_ledger_messages(bk: Any, ledger_id: int, tail_wait: float = 0.0) -> list[Any]:
    """Every confirmed message of one topic ledger (each entry is a batch), without fencing or recovering it.

    With ``tail_wait`` > 0, an open ledger whose bookies hold entries past its
    LAC is long-polled (``wait_last_add_confirmed``) for up to that many
    seconds until its LAC covers them; what is still unconfirmed then is left out.
    """
    from hub.message import Message
    from hub.persistence import decode_batch
    lh = await bk.open_ledger_no_recovery(ledger_id)
    try:
        if tail_wait > 0 and not lh.is_closed and lh.last_entry_seen > lh.last_add_confirmed:
            await lh.wait_last_add_confirmed(after=lh.last_entry_seen - 1, timeout=tail_wait)
        out: list[Any] = []
        if lh.last_add_confirmed >= 0:
            async for entry in lh.read(0, lh.last_add_confirmed):
                out.extend(Message.from_proto(m) for m in decode_batch(entry.data))
        return out
    finally:
        await lh.close()


READTOPIC_TAIL_WAIT = 3.0
"""Seconds ``readtopic`` waits for the LAC of a topic's open ledger to cover the entries its bookies
hold (three times the ledger client's default ``explicit_lac_interval``; at most the console's timeout)."""


class UsageError(Exception):
    """Wrong arguments for a command: the console prints its usage."""


def _range_text(r: Any) -> str:
    end = r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded") else None
    first = r.startSeqIdIncluded or 1
    return f"{first} ~ {end if end is not None else ''}".rstrip()


# ---- the command line ------------------------------------------------------------------------------


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
                        help="show hubs, show topics, show grants, describe topic and release topic print one JSON "
                             "document per line on stdout; everything else (Finished lines, errors, other output) "
                             "goes to stderr")
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
