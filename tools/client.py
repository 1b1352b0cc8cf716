"""``quire client``: publish and receive from the command line, like ``pulsar-client``.

    quire client produce TOPIC -m TEXT [-m TEXT ...] [-n COUNT] [--rate R] [--server HOST:PORT]
    seq 10 | quire client produce TOPIC            # no -m: one message per line of standard input
    quire client consume TOPIC -s SUB [-n COUNT] [--json] [--server HOST:PORT]
    quire client produce TOPIC -m TEXT --key K        # a message key (KEY_SHARED keeps a key on one consumer)
    quire client produce TOPIC -m TEXT --deliver-after 60000   # or --deliver-at ISO8601: delayed delivery
    quire client consume TOPIC -s SUB --type shared [--ack-timeout MS]   # several side by side: a work queue
    quire client consume TOPIC -s SUB --start-seq N | --start-time 2026-11-28T01:00:00Z   # replay from there
    quire client consume TOPIC --compacted [--start-seq N]   # the newest message per key, then the rest (no -s)

``produce`` publishes each ``-m`` body ``COUNT`` times (default 1), at most
``--rate`` messages per second (default 0: as fast as each publish is
acknowledged), and prints ``produced N messages to TOPIC (seq ids A..B)``
(``produced 1 message to TOPIC (seq id A)``). ``--deliver-after MS`` or
``--deliver-at ISO8601`` (no zone: UTC) publishes delayed messages: SHARED
and KEY_SHARED subscriptions get them no earlier than that (``hub.delayed``).
``consume`` subscribes (creating the subscription, or attaching to it; a new
one starts after the topic's last message), says ``subscribed to TOPIC as
SUB`` on stderr, then prints each message as ``SEQ<TAB>BODY`` (or one JSON
object per line with ``--json``) and consumes it once printed; it exits after
``COUNT`` messages (default 0: until Ctrl-C), leaving later ones unconsumed.
With ``--type shared|failover|key_shared`` (default exclusive: Hedwig's one
subscriber) it attaches a consumer of that subscription type
(``HedwigClient.consumer``) and acknowledges each message once printed;
``--ack-timeout MS`` has the hub hand a message it did not acknowledge in
time to another consumer. ``--json`` adds ``key``, ``redelivery_count`` and
``deliver_at_ms`` when they are set.
``--start-seq N`` or ``--start-time ISO8601`` (no zone: UTC) seeks the
subscription first (``HedwigClient.seek``): printing starts at seq id N, or
at the first message published at or after that time.
``--compacted`` reads instead of subscribing (``HedwigClient.reader(...,
compacted=True)``; Pulsar's ``readCompacted``): from ``--start-seq`` (default
1) it prints, up to the topic's compaction point (``compact topic`` in the
console), only the newest message of each key, then every message after that
point, as they come; it says ``reading TOPIC compacted from seq id N`` on
stderr. It keeps no subscription (its temporary ``reader-...`` one is removed
on exit), so it takes no ``-s``, ``--type``, ``--ack-timeout`` or
``--start-time`` (exit status 2); ``--json`` shows each message's ``key``. A
topic never compacted reads every message; a topic that does not exist is
``NO_SUCH_TOPIC`` and exit status 1.

The hub is ``--server``, else ``$QUIRE_SERVER``, else 127.0.0.1:4080. For a
hub with ``authentication_enabled``, ``--auth-token TOKEN`` or
``--auth-token-file FILE`` (else ``$QUIRE_AUTH_TOKEN``) gives the token
(client conf ``auth_token``/``auth_token_file``).
Failures (hub unreachable, a refused publish) print one line and exit 1;
output into a closed pipe (``consume ... | head -1``) ends quietly with
status 141, as every ``quire`` command does. ``--json`` lines always carry
``properties`` (``{}`` when the message has none).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from tools.cli_common import (
    AUTH_TOKEN_ENV,
    add_auth_token_options,
    auth_token_conf,
    connect_failure,
    count_at_least,
    iso_time_ms,
    number_at_least,
    seconds,
)

SERVER_ENV = "QUIRE_SERVER"
DEFAULT_SERVER = "127.0.0.1:4080"
DEFAULT_TIMEOUT = 30.0


class ClientCommandError(Exception):
    """The command failed; the message is the one line printed."""


_count = count_at_least(0)
_rate = number_at_least(0, what="messages per second")


def configure(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.description = "Publish and receive messages (like pulsar-client)."
    sub = parser.add_subparsers(dest="client_command", metavar="COMMAND", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", metavar="HOST:PORT",
                        help=f"hub to talk to (default ${SERVER_ENV}, else {DEFAULT_SERVER})")
    common.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"bound for connecting and each publish (default {DEFAULT_TIMEOUT:g})")
    add_auth_token_options(common)
    p = sub.add_parser("produce", parents=[common], help="publish messages to a topic",
                       description="Publish each -m body COUNT times, or each line of standard input.")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("-m", "--message", dest="messages", action="append", default=[], metavar="TEXT",
                   help="a message body (repeatable; default: one message per line of standard input)")
    p.add_argument("-n", "--num-produce", dest="count", type=_count, default=1, metavar="COUNT",
                   help="times to send each -m body (default 1)")
    p.add_argument("-k", "--key", default=None, metavar="K", help="the messages' key (default: none)")
    p.add_argument("-r", "--rate", type=_rate, default=0.0, metavar="R",
                   help="messages per second (default 0: each once the previous is acknowledged)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--deliver-after", dest="deliver_after", type=_count, default=None, metavar="MS",
                      help="delayed delivery: SHARED and KEY_SHARED subscriptions get the messages MS "
                           "milliseconds after they are stored")
    when.add_argument("--deliver-at", dest="deliver_at", type=iso_time_ms, default=None, metavar="ISO8601",
                      help="delayed delivery: SHARED and KEY_SHARED subscriptions get the messages no earlier "
                           "than this time (no zone: UTC)")
    c = sub.add_parser("consume", parents=[common], help="subscribe and print messages",
                       description="Subscribe and print each message's seq id and body.")
    c.add_argument("topic", metavar="TOPIC")
    c.add_argument("-s", "--subscription", metavar="SUB",
                   help="subscriber id (required, except with --compacted, which keeps no subscription)")
    c.add_argument("-n", "--num-messages", dest="count", type=_count, default=0, metavar="COUNT",
                   help="exit after COUNT messages (default 0: run until Ctrl-C)")
    c.add_argument("--json", action="store_true", help="one JSON object per message")
    c.add_argument("--type", dest="subscription_type", default="exclusive", type=str.lower,
                   choices=["exclusive", "shared", "failover", "key_shared"],
                   help="subscription type (default exclusive; the others make a consumer)")
    c.add_argument("--ack-timeout", dest="ack_timeout", type=_count, default=0, metavar="MS",
                   help="redeliver a message unacknowledged this long (consumers only; default 0: never)")
    start = c.add_mutually_exclusive_group()
    start.add_argument("--start-seq", dest="start_seq", type=count_at_least(1), default=None, metavar="N",
                       help="seek the subscription so that delivery starts at seq id N (with --compacted: "
                            "the reader's first seq id, default 1)")
    start.add_argument("--start-time", dest="start_time", type=iso_time_ms, default=None, metavar="ISO8601",
                       help="seek the subscription to the first message published at or after this time "
                            "(no zone: UTC)")
    c.add_argument("--compacted", action="store_true",
                   help="read the topic's compacted view without a subscription (no -s): the newest message "
                        "of each key up to the compaction point, then every later message; from --start-seq "
                        "(default 1)")
    c.set_defaults(consume_parser=c)
    return run


async def _seek(client: Any, args: argparse.Namespace, topic: bytes, sub: bytes) -> None:
    """``--start-seq`` / ``--start-time``: move the subscription before its messages are printed."""
    if args.start_seq is not None:
        await client.seek(topic, sub, seq_id=args.start_seq)
    elif args.start_time is not None:
        await client.seek(topic, sub, publish_time_ms=args.start_time)


def server_of(args: argparse.Namespace) -> str:
    """``--server``, else ``$QUIRE_SERVER``, else 127.0.0.1:4080."""
    return str(args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER)


def run(args: argparse.Namespace) -> int:
    import uvloop

    from hub.errors import AuthenticationError, PubSubError

    command = produce if args.client_command == "produce" else consume
    if args.client_command == "consume":
        problem = consume_problem(args)
        if problem:
            args.consume_parser.error(problem)      # usage and the one line, exit status 2
    try:
        return int(uvloop.run(command(args)))
    except BrokenPipeError:
        raise              # `consume | head -1`: ends quietly like every quire command (tools.cli)
    except AuthenticationError as exc:
        sys.stderr.write(f"quire client {args.client_command}: {exc.status}: {exc} (give a token with "
                         f"--auth-token, --auth-token-file or ${AUTH_TOKEN_ENV})\n")
        return 1
    except (ClientCommandError, PubSubError, OSError) as exc:
        status = f"{exc.status}: " if isinstance(exc, PubSubError) else ""
        sys.stderr.write(f"quire client {args.client_command}: {status}{exc}\n")
        return 1


async def _connect(args: argparse.Namespace, conf: dict[str, str] | None = None) -> Any:
    from hub.client import HedwigClient
    from hub.errors import AuthenticationError, PubSubError

    server = server_of(args)
    conf = {**(conf or {}), **auth_token_conf(args)}
    try:
        return await asyncio.wait_for(HedwigClient.connect(server, conf=conf or None), args.timeout or None)
    except AuthenticationError:
        raise
    except (OSError, TimeoutError, PubSubError) as exc:
        raise ClientCommandError(connect_failure(server, exc)) from None


def _bodies(args: argparse.Namespace) -> Iterable[bytes]:
    if args.messages:
        for _ in range(args.count):
            yield from (m.encode() for m in args.messages)
        return
    for line in sys.stdin.buffer:
        yield line.rstrip(b"\r\n")


async def produce(args: argparse.Namespace) -> int:
    """Publish the bodies in order, paced by ``--rate``; prints one summary line."""
    client = await _connect(args)
    topic = args.topic.encode()
    key = args.key.encode() if args.key is not None else None
    seqs: list[int] = []
    start = time.monotonic()
    try:
        for i, body in enumerate(_bodies(args)):
            if args.rate:
                delay = start + i / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing: nothing to wait for but the clock
            try:
                publish = client.publish(topic, body, key=key, deliver_after_ms=args.deliver_after,
                                         deliver_at_ms=args.deliver_at)
                seqs.append(await asyncio.wait_for(publish, args.timeout or None))
            except TimeoutError:
                raise ClientCommandError(f"publish to {args.topic} not acknowledged within {args.timeout:g} s "
                                         f"({len(seqs)} produced)") from None
    finally:
        await client.close()
    span = "" if not seqs else f" (seq id {seqs[0]})" if len(seqs) == 1 else f" (seq ids {seqs[0]}..{seqs[-1]})"
    print(f"produced {len(seqs)} message{'' if len(seqs) == 1 else 's'} to {args.topic}{span}", flush=True)
    return 0


def _line(message: Any, as_json: bool) -> str:
    if not as_json:
        return f"{message.seq_id}\t{message.body.decode('utf-8', 'backslashreplace')}"
    out: dict[str, Any] = {"seq_id": message.seq_id, "src_region": message.src_region}
    try:
        out["body"] = message.body.decode("utf-8")
    except UnicodeDecodeError:
        out["body_base64"] = base64.b64encode(message.body).decode()
    if message.message_type:
        out["message_type"] = message.message_type
    if message.key is not None:
        out["key"] = message.key.decode("utf-8", "backslashreplace")
    if message.redelivery_count:
        out["redelivery_count"] = message.redelivery_count
    if message.deliver_at_ms:
        out["deliver_at_ms"] = message.deliver_at_ms
    out["properties"] = {k: v.decode("utf-8", "backslashreplace") for k, v in message.properties.items()}
    return json.dumps(out)


def consume_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with a ``consume`` command line that argparse alone does not see, or None."""
    if not args.compacted:
        return None if args.subscription else "the following arguments are required: -s/--subscription " \
            "(or --compacted to read without a subscription)"
    given = [name for name, value in (("-s/--subscription", args.subscription),
                                      ("--start-time", args.start_time is not None),
                                      ("--type", args.subscription_type != "exclusive"),
                                      ("--ack-timeout", args.ack_timeout)) if value]
    if given:
        return f"--compacted reads without a subscription, from a seq id: not with {', '.join(given)}"
    return None


async def consume_compacted(args: argparse.Namespace) -> int:
    """``consume --compacted``: a compacted reader (``HedwigClient.reader``) that keeps no subscription."""
    client = await _connect(args)
    start = args.start_seq or 1
    try:
        try:
            reader = await asyncio.wait_for(client.reader(args.topic.encode(), start_seq_id=start, compacted=True),
                                            args.timeout or None)
        except TimeoutError:
            raise ClientCommandError(f"reader of {args.topic} not answered within {args.timeout:g} s") from None
        sys.stderr.write(f"reading {args.topic} compacted from seq id {start}\n")
        sys.stderr.flush()
        async with reader:             # closing removes the reader's temporary subscription
            printed = 0
            while not args.count or printed < args.count:
                print(_line(await reader.read_next(), args.json), flush=True)
                printed += 1
    finally:
        await client.close()
    return 0


async def consume_typed(args: argparse.Namespace) -> int:
    """``consume --type ...``: a consumer that prints and acknowledges each message."""
    client = await _connect(args)
    topic, sub = args.topic.encode(), args.subscription.encode()
    try:
        try:
            attach = client.consumer(topic, sub, subscription_type=args.subscription_type.upper(),
                                     ack_timeout_ms=args.ack_timeout)
            consumer = await asyncio.wait_for(attach, args.timeout or None)
        except TimeoutError:
            raise ClientCommandError(f"subscribe to {args.topic} not answered within {args.timeout:g} s") from None
        await _seek(client, args, topic, sub)
        sys.stderr.write(f"subscribed to {args.topic} as {args.subscription} ({args.subscription_type})\n")
        sys.stderr.flush()
        async with consumer:
            printed = 0
            while not args.count or printed < args.count:
                message = await consumer.receive()
                print(_line(message, args.json), flush=True)
                await consumer.ack(message)
                printed += 1
    finally:
        await client.close()
    return 0


async def consume(args: argparse.Namespace) -> int:
    """Subscribe, print and consume ``--num-messages`` messages (or until interrupted)."""
    if args.compacted:
        return await consume_compacted(args)
    if args.subscription_type != "exclusive" or args.ack_timeout:
        return await consume_typed(args)
    # consumes are sent by hand once a message is printed, so what was not printed stays unconsumed
    client = await _connect(args, conf={"auto_send_consume_message_enabled": "false"})
    topic, sub = args.topic.encode(), args.subscription.encode()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def handler(_topic: bytes, _sub: bytes, message: Any) -> None:
        await queue.put(message)

    try:
        await asyncio.wait_for(client.subscribe(topic, sub), args.timeout or None)
        await _seek(client, args, topic, sub)
        await client.start_delivery(topic, sub, handler)
        sys.stderr.write(f"subscribed to {args.topic} as {args.subscription}\n")
        sys.stderr.flush()
        printed = 0
        while not args.count or printed < args.count:
            message = await queue.get()
            print(_line(message, args.json), flush=True)
            await client.consume(topic, sub, message.seq_id)
            printed += 1
        await client.close_subscription(topic, sub)
    except TimeoutError:
        raise ClientCommandError(f"subscribe to {args.topic} not answered within {args.timeout:g} s") from None
    finally:
        await client.close()
    return 0
