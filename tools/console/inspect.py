"""The console's commands that look into and manage a cluster: show, grant, revoke, describe, release, compact,
readtopic."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tools.console.session import (
    CommandError,
    ConsoleSession,
    UsageError,
    format_message,
)

log = logging.getLogger(__name__)

READTOPIC_TAIL_WAIT = 3.0
"""Seconds ``readtopic`` waits for the LAC of a topic's open ledger to cover the entries its bookies
hold (three times the ledger client's default ``explicit_lac_interval``; at most the console's timeout)."""


class InspectCommands(ConsoleSession):
    """Hubs, topics, permissions and the stored log (``tools.console``)."""

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
        compaction = _compaction(found[0]) if found else None
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
                **({"compaction": compaction} if compaction is not None else {}),
            })
            return
        self.say(f"===== Topic Information : {args[1]} =====")
        self.say()
        self.say(f"Owner : {hub_address(owner[0]) if owner else 'NULL'}")
        self.say()
        self.say(">>> Persistence Info <<<")
        for r in ranges:
            self.say(f"Ledger {r.ledgerId} [ {_range_text(r)} ]")
        if compaction is not None:
            text = (f"Compacted ledger {compaction['ledger_id']} [ up to {compaction['compacted_up_to_seq_id']} ], "
                    f"{compaction['messages']} keys, last run {compaction['last_run_ms']} ms"
                    if compaction["ledger_id"] else "Compacted ledger: none yet")
            if compaction["pending_ledger_id"]:
                text += f", pending (half-written) ledger {compaction['pending_ledger_id']}"
            self.say(text)
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

    async def _topic_post(self, topic: str, verb: str) -> tuple[int, Any]:
        """POST ``/admin/v1/topics/{topic}/{verb}`` to a hub's admin API: (HTTP status, JSON answer)."""
        from urllib.parse import quote

        from tools.hub_http import HubHttpError, admin_call, hub_http_url
        try:
            url = await asyncio.wait_for(hub_http_url(await self.store(), self.server), self.settings.timeout)
            return await admin_call(url, "POST", f"/admin/v1/topics/{quote(topic, safe='')}/{verb}",
                                    token=self.admin_token, timeout=self.settings.timeout)
        except TimeoutError:
            raise CommandError(f"timed out after {self.settings.timeout} s") from None
        except HubHttpError as exc:
            raise CommandError(str(exc)) from None

    async def _topic_action(self, topic: str, verb: str, not_found: str) -> Any:
        """POST the admin action ``verb`` on ``topic``; its answer, or a CommandError (``not_found`` on 404)."""
        status, doc = await self._topic_post(topic, verb)
        if status != 200:
            why = doc.get("error", doc) if isinstance(doc, dict) else doc
            if status == 404:
                raise CommandError(f"Topic {topic} {not_found}.")
            raise CommandError(f"cannot {verb} topic {topic} (HTTP {status}): {why}")
        return doc

    async def cmd_release(self, args: list[str]) -> None:
        as_json, args = self._wants_json(args)
        if len(args) != 2 or args[0] != "topic":
            raise UsageError
        topic = args[1]
        doc = await self._topic_action(topic, "release", "is not owned by any hub: nothing to release")
        if as_json:
            self.emit(doc)
            return
        moved = doc.get("subscribers_moved") or []
        self.say(f"Topic {doc.get('released')} released by hub {doc.get('owner')} at seq id "
                 f"{doc.get('last_seq_id')}; subscribers moved: {', '.join(moved) if moved else 'none'}")

    async def cmd_compact(self, args: list[str]) -> None:
        as_json, args = self._wants_json(args)
        if len(args) != 2 or args[0] != "topic":
            raise UsageError
        topic = args[1]
        doc = await self._topic_action(topic, "compact", "does not exist: nothing to compact")
        if as_json:
            self.emit(doc)
            return
        self.say(f"Topic {topic} compacted up to seq id {doc.get('compacted_up_to_seq_id')} into ledger "
                 f"{doc.get('ledger_id')} ({doc.get('messages')} keys kept)")

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


def _compaction(ranges: Any) -> dict[str, Any] | None:
    """The topic's compaction record (``hub.compaction.state_json``), None when it was never compacted."""
    if not ranges.HasField("compaction"):
        return None
    from hub.compaction import state_json
    return state_json(ranges.compaction)


def _range_text(r: Any) -> str:
    end = r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded") else None
    first = r.startSeqIdIncluded or 1
    return f"{first} ~ {end if end is not None else ''}".rstrip()
