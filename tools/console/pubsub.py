"""The console's publish and subscribe commands: pub, sub, closesub, unsub, rmsub, consume, consumeto, pubsub."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import logging
import time
from typing import Any

from tools.console.session import (
    CommandError,
    ConsoleSession,
    UsageError,
    format_message,
    format_msg_id,
)

log = logging.getLogger(__name__)

DELAY_OPTIONS = {"--deliver-after": "deliver_after_ms", "--deliver-at": "deliver_at_ms"}


def _delay_options(args: list[str]) -> tuple[list[str], dict[str, int]]:
    """``pub``'s words without ``--deliver-after MS`` / ``--deliver-at ISO8601`` (wherever they are), and the
    ``publish`` keyword they give; ``CommandError`` (one line) for a bad or a second one."""
    from tools.cli_common import count_at_least, iso_time_ms
    rest: list[str] = []
    delay: dict[str, int] = {}
    words = iter(args)
    for word in words:
        if word not in DELAY_OPTIONS:
            rest.append(word)
            continue
        value = next(words, None)
        if value is None:
            raise CommandError(f"{word} needs a value: {word} {'MS' if word == '--deliver-after' else 'ISO8601'}")
        if delay:
            raise CommandError("give one of --deliver-after MS and --deliver-at ISO8601, not both")
        try:
            delay[DELAY_OPTIONS[word]] = (count_at_least(0) if word == "--deliver-after" else iso_time_ms)(value)
        except argparse.ArgumentTypeError as exc:
            what = "a number of milliseconds >= 0" if word == "--deliver-after" else "an ISO 8601 time"
            raise CommandError(f"{word} must be {what}: {exc}") from None
    return rest, delay


def _utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


class PubSubCommands(ConsoleSession):
    """Publishing, subscribing and consuming (``tools.console``)."""

    async def cmd_pub(self, args: list[str]) -> None:
        args, delay = _delay_options(args)
        if len(args) < 2:
            raise UsageError
        client = await self.client()
        seq = await self._op(client.publish(args[0].encode(), " ".join(args[1:]).encode(), **delay))
        if delay:       # a plain pub prints nothing but its timing line, as Hedwig's
            when = (f"{delay['deliver_after_ms']} ms after it was stored" if "deliver_after_ms" in delay
                    else _utc(delay["deliver_at_ms"]))
            self.say(f"Published {format_msg_id(seq)}: SHARED and KEY_SHARED subscriptions get it "
                     f"no earlier than {when}.")

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
