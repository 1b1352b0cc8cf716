"""Lifecycle policies on real hub and bookie processes: the admin API and console, retention by size and by
time, each backlog quota policy at its boundary with several subscriptions, across an owner change."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio

from bookie.client import BookKeeper
from bookie.errors import NoSuchLedgerError
from hub.client import HedwigClient
from hub.errors import BacklogQuotaExceededError, ServiceDownError, UncertainStateError
from metastore import open_metastore
from tests.fixtures.polling import eventually
from tools.cluster import LocalCluster

from .conftest import hub_url

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

TOKEN = "policies-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONF = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1", "zk_timeout": "1000",
        "session_timeout": "1000", "http_admin_token": TOKEN, "rebalance_interval_sec": "0",
        "max_entries_per_ledger": "1",                       # one publish, one ledger: many small ledgers
        "messages_consumed_thread_run_interval": "200", "policies_refresh_interval": "200",
        "backlog_quota_hold_timeout": "1500", "consume_interval": "1"}
MANUAL = {"auto_send_consume_message_enabled": "false"}
TIME_PREFIX = "rt-"
STARTED: dict[str, Any] = {}     # the retention-by-time topic: set up by the first test, checked by the last


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[LocalCluster, BookKeeper]]:
    async with LocalCluster(bookies=2, hubs=2, data_dir=tmp_path_factory.mktemp("policies"),
                            conf_overrides=CONF) as cluster:
        ms = await open_metastore(cluster.metastore_uri)
        bk = await BookKeeper.connect(ms)
        try:
            yield cluster, bk
        finally:
            await bk.close()
            await ms.close()


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


async def call(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.request(method, url, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


def policy_url(cluster: LocalCluster, prefix: str, i: int = 0) -> str:
    return f"{hub_url(cluster, i)}/admin/v1/policies/{quote(prefix, safe='')}"


async def put_policy(cluster: LocalCluster, http: aiohttp.ClientSession, prefix: str, **values: Any) -> None:
    status, body = await call(http, "PUT", policy_url(cluster, prefix), json=values, headers=AUTH)
    assert status == 200, body


async def stats(cluster: LocalCluster, http: aiohttp.ClientSession, topic: str) -> dict[str, Any]:
    status, body = await call(http, "GET", f"{hub_url(cluster, 0)}/admin/v1/topics/{quote(topic, safe='')}/stats")
    assert status == 200, body
    return dict(body)


async def in_force(cluster: LocalCluster, http: aiohttp.ClientSession, topic: str, **values: Any) -> dict[str, Any]:
    """The topic's stats once its owner applies ``values`` (the policy re-read: policies_refresh_interval)."""
    async def check() -> dict[str, Any] | None:
        s = await stats(cluster, http, topic)
        return s if all(s["policy"][k] == v for k, v in values.items()) else None
    return dict(await eventually(check))


def name(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:8]


async def ledger_sizes(bk: BookKeeper, st: dict[str, Any]) -> list[int]:
    return [(await bk.ledgers.read(r["ledger_id"]))[0].length for r in st["ledgers"]]


# --- admin API and console -----------------------------------------------------------------------

async def test_admin_api_validates_names_the_key_and_keeps_serving(env: tuple[LocalCluster, BookKeeper],
                                                                   http: aiohttp.ClientSession) -> None:
    cluster, _ = env
    # the retention-by-time topic starts its clock now; the last test checks it (a minute is the unit)
    await put_policy(cluster, http, TIME_PREFIX, retention_time_minutes=1)
    topic, hedwig = name(TIME_PREFIX), name("rh-")
    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:
        for t in (topic, hedwig):
            await c.subscribe(t.encode(), b"a")
        await in_force(cluster, http, topic, retention_time_minutes=1)
        STARTED.update(topic=topic, at=time.monotonic())
        for t in (topic, hedwig):
            for i in range(4):
                await c.publish(t.encode(), b"x%d" % i)
            await c.consume(t.encode(), b"a", 4)
            await c.close_subscription(t.encode(), b"a")

    async def hedwig_trimmed() -> bool:        # the consumed-ledger timer has run since
        return len((await stats(cluster, http, hedwig))["ledgers"]) == 1
    await eventually(hedwig_trimmed)
    st = await stats(cluster, http, topic)
    if st["owner"] == (await stats(cluster, http, hedwig))["owner"]:   # the same hub's timer: a fair comparison
        assert len(st["ledgers"]) == 4, st["ledgers"]   # consumed, kept for the minute

    prefix = "adm/é "
    url = policy_url(cluster, prefix)
    assert (await call(http, "PUT", url, json={"retention_size_mb": 5}))[0] == 401     # no admin token
    for body, key in (({"retention_size_mb": -5}, "retention_size_mb"),
                      ({"backlog_quota_policy": "drop"}, "backlog_quota_policy"),
                      ({"retention_sise_mb": 1}, "retention_sise_mb"),
                      ({"message_ttl_seconds": "1h"}, "message_ttl_seconds")):
        status, got = await call(http, "PUT", url, json=body, headers=AUTH)
        assert status == 400 and got["key"] == key and key in got["error"], got
    status, got = await call(http, "PUT", f"{hub_url(cluster, 0)}/admin/v1/policies/bad%FF%FEprefix",
                             json={"retention_size_mb": 1}, headers=AUTH)
    assert status == 400 and got["key"] == "prefix" and "UTF-8" in got["error"]
    status, got = await call(http, "PUT", url, data=b"{not json", headers=AUTH)
    assert status == 400 and got["key"] == "body"
    assert (await call(http, "GET", url))[0] == 404                                  # nothing was stored
    want = {"retention_size_mb": 5, "backlog_quota_policy": "producer_exception"}
    assert await call(http, "PUT", url, json=want, headers=AUTH) == (200, want)
    assert await call(http, "GET", url) == (200, want)
    assert await call(http, "GET", policy_url(cluster, prefix, 1)) == (200, want)    # the same table on any hub
    assert (await call(http, "GET", f"{hub_url(cluster, 1)}/admin/v1/policies"))[1][prefix] == want
    # the other hub applies it within its policies_refresh_interval (a topic it owns shows it)
    topic2 = prefix + "t"
    async with await HedwigClient.connect(cluster.hub_addresses[1]) as c:
        assert await c.publish(topic2.encode(), b"still serving") == 1
    await in_force(cluster, http, topic2, retention_size_mb=5, backlog_quota_policy="producer_exception")
    assert await call(http, "DELETE", url, headers=AUTH) == (200, want)
    assert (await call(http, "DELETE", url, headers=AUTH))[0] == 404
    await in_force(cluster, http, topic2, retention_size_mb=0)                       # back to the hub default


async def test_console_set_and_show_policies(env: tuple[LocalCluster, BookKeeper]) -> None:
    cluster, _ = env

    def console(*commands: str) -> subprocess.CompletedProcess[str]:
        args = [sys.executable, "-m", "tools.cli", "console", "--metastore", cluster.metastore_uri]
        for cmd in commands:
            args += ["-c", cmd]
        return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])

    done = await asyncio.to_thread(console, "set policy con/ retention_size_mb=3 backlog_quota_limit_bytes=100",
                                   "set policy con/ backlog_quota_policy=consumer_backlog_eviction")
    assert done.returncode == 0, done.stderr
    assert "backlog_quota_limit_bytes=100" in done.stdout
    bad = await asyncio.to_thread(console, "set policy con/ retention_size_mb=-4")
    assert bad.returncode == 1 and "retention_size_mb" in bad.stdout + bad.stderr
    bad = await asyncio.to_thread(console, "set policy con/ backlog_quota_policy=nope")
    assert bad.returncode == 1 and "backlog_quota_policy" in bad.stdout + bad.stderr
    shown = await asyncio.to_thread(console, "show policies --json")
    assert shown.returncode == 0, shown.stderr
    doc = next(line for line in shown.stdout.splitlines() if line.startswith("{"))
    assert json.loads(doc)["con/"] == {"retention_size_mb": 3, "backlog_quota_limit_bytes": 100,
                                       "backlog_quota_policy": "consumer_backlog_eviction"}
    text = await asyncio.to_thread(console, "show policies")
    assert "con/:" in text.stdout and "retention_size_mb=3" in text.stdout


# --- retention -----------------------------------------------------------------------------------

async def test_retention_by_size_keeps_the_newest_consumed_ledgers(env: tuple[LocalCluster, BookKeeper],
                                                                   http: aiohttp.ClientSession) -> None:
    cluster, bk = env
    await put_policy(cluster, http, "rs-", retention_size_mb=1)
    await put_policy(cluster, http, "rf-", retention_size_mb=-1)
    kept, forever, hedwig = name("rs-"), name("rf-"), name("rh-")
    body = b"r" * 100_000                       # 100 kB a ledger: 1 MB is ten of them
    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:
        for t in (kept, forever, hedwig):
            await c.subscribe(t.encode(), b"a")
            await c.subscribe(t.encode(), b"b")
        await in_force(cluster, http, kept, retention_size_mb=1)
        await in_force(cluster, http, forever, retention_size_mb=-1)
        for t in (kept, forever, hedwig):
            for _ in range(20):
                await c.publish(t.encode(), body)
            await c.consume(t.encode(), b"a", 20)
            await c.consume(t.encode(), b"b", 20)

        async def hedwig_deleted() -> bool:
            return len((await stats(cluster, http, hedwig))["ledgers"]) == 1   # only the last stays
        await eventually(hedwig_deleted)

        limit = 1 << 20

        async def size_trimmed() -> tuple[dict[str, Any], list[int]] | None:
            s = await stats(cluster, http, kept)
            try:
                sizes = (await ledger_sizes(bk, s))[:-1]   # the consumed ledgers kept (the last one always stays)
            except NoSuchLedgerError:   # a trim deleted one between the stats and this read: not settled yet
                return None
            # just enough of the newest consumed ledgers to hold 1 MB: one fewer would not
            return (s, sizes) if sum(sizes) >= limit and sum(sizes[1:]) < limit else None
        st, sizes = await eventually(size_trimmed)
        assert 10 <= len(sizes) < 19, sizes
        assert st["ledgers"][-1]["end_seq_id"] == 20 and st["storage_bytes"] >= limit
        assert st["backlog_bytes"] == 0
        assert len((await stats(cluster, http, forever))["ledgers"]) == 20         # -1: kept for ever
        # released: the next acquisition (on whichever hub) learns the ledgers' sizes and keeps the rule
        status, got = await call(http, "POST", f"{hub_url(cluster, 0)}/admin/v1/topics/{quote(kept, safe='')}"
                                               "/release", headers=AUTH)
        assert status == 200, got
        first_kept = st["ledgers"][0]["ledger_id"]
        for _ in range(5):
            await c.publish(kept.encode(), body)

        async def consumed_again() -> bool:   # the release moved the subscriptions: they come back by themselves
            try:
                await c.consume(kept.encode(), b"a", 25)
                await c.consume(kept.encode(), b"b", 25)
            except ServiceDownError:           # "... is reconnecting": not resubscribed yet
                return False
            return True
        await eventually(consumed_again)

        async def trimmed_again() -> tuple[dict[str, Any], list[int]] | None:
            got = await size_trimmed()
            return got if got is not None and got[0]["ledgers"][0]["ledger_id"] != first_kept else None
        st, sizes = await eventually(trimmed_again)
        assert st["ledgers"][-1]["end_seq_id"] == 25 and 10 <= len(sizes) < 19


# --- backlog quotas ------------------------------------------------------------------------------

async def entry_bytes(cluster: LocalCluster, http: aiohttp.ClientSession, c: HedwigClient, topic: str,
                      body: bytes) -> int:
    """Publish one message of ``body`` to ``topic`` (with a lagging subscription): its stored bytes."""
    assert await c.publish(topic.encode(), body) == 1
    size = (await stats(cluster, http, topic))["backlog_bytes"]
    assert size > len(body)
    return int(size)


async def test_producer_exception_at_the_boundary_and_after_an_owner_change(
        env: tuple[LocalCluster, BookKeeper], http: aiohttp.ClientSession) -> None:
    cluster, _ = env
    topic = name("qe-")
    body = b"q" * 100
    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:
        await c.subscribe(topic.encode(), b"fast")
        await c.subscribe(topic.encode(), b"slow")
        size = await entry_bytes(cluster, http, c, topic, body)
        await put_policy(cluster, http, "qe-", backlog_quota_limit_bytes=3 * size,
                         backlog_quota_policy="producer_exception")
        await in_force(cluster, http, topic, backlog_quota_limit_bytes=3 * size)
        await c.consume(topic.encode(), b"fast", 1)
        st = await stats(cluster, http, topic)
        assert st["storage_bytes"] == size and isinstance(st["msg_rate_in"], float)
        assert await c.publish(topic.encode(), body) == 2       # backlog 1 message: under
        assert await c.publish(topic.encode(), body) == 3       # 2 messages: under
        await c.consume(topic.encode(), b"fast", 3)             # the slowest decides, not the fastest
        with pytest.raises(BacklogQuotaExceededError, match="quota"):
            await c.publish(topic.encode(), body)               # 3 messages: at the quota
        st = await stats(cluster, http, topic)
        assert st["last_seq_id"] == 3 and st["backlog_bytes"] == 3 * size    # nothing was stored
        await c.consume(topic.encode(), b"slow", 1)
        assert await c.publish(topic.encode(), body) == 4       # room for one again
        with pytest.raises(BacklogQuotaExceededError):
            await c.publish(topic.encode(), body)
        await c.close_subscription(topic.encode(), b"slow")
        await c.close_subscription(topic.encode(), b"fast")
    owner = cluster.hub_addresses.index((await stats(cluster, http, topic))["owner"])
    await cluster.kill_hub(owner)                               # kill -9: the other hub takes the topic over
    try:
        # stats from the metastore meanwhile: the closed ledgers count (2 and 3, and 1 unless the timer deleted
        # it: both subscriptions consumed it); the 4th is still open
        status, st = await call(http, "GET", f"{hub_url(cluster, 1 - owner)}/admin/v1/topics/{quote(topic)}/stats",
                                headers={"X-Quire-Forwarded": "test"})
        assert status == 200 and st["owned_here"] is False and st["msg_rate_in"] == 0.0, st
        closed = [r for r in st["ledgers"] if r["start_seq_id"] <= 3]
        assert st["storage_bytes"] == len(closed) * size and st["backlog_bytes"] == 2 * size, (size, st)
        async with await HedwigClient.connect(cluster.hub_addresses[1 - owner]) as c:
            with pytest.raises(BacklogQuotaExceededError):      # the new owner knows the backlog at once
                await c.publish(topic.encode(), body)
    finally:
        await cluster.restart_hub(owner)


async def test_producer_request_hold_waits_for_room_then_fails(env: tuple[LocalCluster, BookKeeper],
                                                               http: aiohttp.ClientSession) -> None:
    cluster, _ = env
    topic = name("qh-")
    body = b"h" * 100
    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:
        await c.subscribe(topic.encode(), b"s1")
        await c.subscribe(topic.encode(), b"s2")
        size = await entry_bytes(cluster, http, c, topic, body)
        await put_policy(cluster, http, "qh-", backlog_quota_limit_bytes=2 * size,
                         backlog_quota_policy="producer_request_hold")
        await in_force(cluster, http, topic, backlog_quota_limit_bytes=2 * size)
        assert await c.publish(topic.encode(), body) == 2       # backlog 1 message: under
        held = asyncio.ensure_future(c.publish(topic.encode(), body))   # 2 messages: at the quota, held
        done, _ = await asyncio.wait([held], timeout=0.5)
        assert not done and (await stats(cluster, http, topic))["last_seq_id"] == 2
        await c.consume(topic.encode(), b"s1", 2)
        await c.consume(topic.encode(), b"s2", 1)               # the slowest now has one message of backlog
        assert await asyncio.wait_for(held, 10) == 3            # stored once there was room
        t0 = time.monotonic()
        with pytest.raises(BacklogQuotaExceededError):          # no room comes: fails after the hold timeout
            await c.publish(topic.encode(), body)
        assert 1.3 < time.monotonic() - t0 < 10
        assert (await stats(cluster, http, topic))["last_seq_id"] == 3


async def test_consumer_backlog_eviction_acks_the_oldest_for_the_slowest(env: tuple[LocalCluster, BookKeeper],
                                                                         http: aiohttp.ClientSession) -> None:
    cluster, _ = env
    topic = name("qv-")
    body = b"v" * 100
    got: list[int] = []

    async def handler(t: bytes, s: bytes, msg: Any) -> None:
        got.append(msg.seq_id)

    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:
        for sub in (b"fast", b"idle", b"attached"):
            await c.subscribe(topic.encode(), sub)
        await c.close_subscription(topic.encode(), b"idle")
        size = await entry_bytes(cluster, http, c, topic, body)
        await c.consume(topic.encode(), b"fast", 1)
        await put_policy(cluster, http, "qv-", backlog_quota_limit_bytes=3 * size,
                         backlog_quota_policy="consumer_backlog_eviction")
        await in_force(cluster, http, topic, backlog_quota_limit_bytes=3 * size)
        for seq in range(2, 8):
            assert await c.publish(topic.encode(), body) == seq   # never refused
            await c.consume(topic.encode(), b"fast", seq)

        async def fast_consumed_all() -> Any:   # consume is one-way: the stats request may overtake the last one
            got_st = await stats(cluster, http, topic)
            return got_st if got_st["subscriptions"]["fast"]["consumed_seq_id"] == 7 else None

        st = await eventually(fast_consumed_all, timeout=10)
        subs = st["subscriptions"]
        # after each publish the backlog is under 3 messages again: the slowest were acked up to 7 - 2
        assert subs["idle"]["consumed_seq_id"] == 5 and subs["attached"]["consumed_seq_id"] == 5
        assert subs["fast"]["consumed_seq_id"] == 7 and st["backlog_bytes"] == 2 * size
        await c.start_delivery(topic.encode(), b"attached", handler)   # delivery goes on after what was acked
        await eventually(lambda: got == [6, 7])


async def test_message_ttl_acks_for_every_subscription_once_expired(env: tuple[LocalCluster, BookKeeper],
                                                                     http: aiohttp.ClientSession) -> None:
    cluster, _ = env
    topic = name("tt-")
    await put_policy(cluster, http, "tt-", message_ttl_seconds=2)
    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:
        for sub in (b"a", b"b", b"c"):
            await c.subscribe(topic.encode(), sub)
        await c.close_subscription(topic.encode(), b"c")
        await in_force(cluster, http, topic, message_ttl_seconds=2)
        for _ in range(3):
            await c.publish(topic.encode(), b"expires")
        last_write = time.monotonic()
        await c.consume(topic.encode(), b"a", 1)

        async def expired() -> dict[str, Any] | None:
            s = await stats(cluster, http, topic)
            return s if all(v["consumed_seq_id"] == 3 for v in s["subscriptions"].values()) else None
        st = await eventually(expired)
        assert time.monotonic() - last_write >= 2.0          # not before the TTL
        assert st["backlog_bytes"] == 0
        assert await c.publish(topic.encode(), b"fresh") == 4   # a new message is not expired at once
        assert (await stats(cluster, http, topic))["subscriptions"]["b"]["consumed_seq_id"] == 3


async def test_message_ttl_on_a_shared_subscription_with_outstanding_individual_acks(
        env: tuple[LocalCluster, BookKeeper], http: aiohttp.ClientSession) -> None:
    """TTL on a SHARED subscription with two consumers holding messages and acks beyond the first unacked one,
    and an EXCLUSIVE consumer on the same topic: the expired messages count as acknowledged for both (the
    held ones are not redelivered; their late ack or nack is harmless), the individual acks after them are
    kept (nothing acknowledged comes again) and newer messages are delivered as usual."""
    cluster, _ = env
    topic = name("ts-").encode()
    await put_policy(cluster, http, "ts-", message_ttl_seconds=2)
    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:
        w1 = await c.consumer(topic, b"work", subscription_type="SHARED", receiver_queue_size=10)
        w2 = await c.consumer(topic, b"work", subscription_type="SHARED", receiver_queue_size=10)
        excl = await c.consumer(topic, b"excl")                 # EXCLUSIVE (the default)
        await in_force(cluster, http, topic.decode(), message_ttl_seconds=2)
        for i in range(10):
            await c.publish(topic, b"old%d" % i)                # 1..10 expire first
        await asyncio.sleep(1.0)                                # time passes: 11..14 are a second younger
        for i in range(4):
            await c.publish(topic, b"new%d" % i)
        received: dict[int, list[int]] = {}                     # seq id -> consumers (1, 2) it went to
        held = {}
        while len(received) < 14:
            for n, w in ((1, w1), (2, w2)):
                try:
                    m = await w.receive(timeout=0.2)
                except TimeoutError:
                    continue
                received.setdefault(m.seq_id, []).append(n)
                held[m.seq_id] = (w, m)
        acked = {2, 4, 6, 8, 12, 13}                            # beyond the first unacked (1)
        for seq in sorted(acked):
            w, m = held.pop(seq)
            await w.ack(m)
        excl_got = [(await excl.receive(timeout=10)).seq_id for _ in range(14)]
        assert excl_got == list(range(1, 15))                   # the EXCLUSIVE one acks nothing

        async def expired() -> dict[str, Any] | None:
            # 1..10 expired (and 11..14 too if the timer came a second later): what is still held is 11 and 14
            # (once the acks just sent have arrived: the timer may have run before them)
            s = await stats(cluster, http, topic.decode())
            work, excl_sub = s["subscriptions"]["work"], s["subscriptions"]["excl"]
            return s if work["consumed_seq_id"] >= 10 and excl_sub["consumed_seq_id"] >= 10 and \
                work["unacked"] == (2 if work["consumed_seq_id"] < 11 else 0) else None
        await eventually(expired)
        for seq in (1, 3):                                      # a late ack / nack of an expired message
            w, m = held.pop(seq)
            await w.ack(m)
        w, m = held.pop(5)
        await w.nack(m)
        for seq in (11, 14):
            w, m = held.pop(seq)
            await w.ack(m)

        async def all_consumed() -> bool:
            subs = (await stats(cluster, http, topic.decode()))["subscriptions"]
            return subs["work"]["consumed_seq_id"] == 14 and subs["work"]["unacked"] == 0
        await eventually(all_consumed)
        assert await c.publish(topic, b"fresh") == 15
        later: list[tuple[int, int]] = []
        for w in (w1, w2):      # within the nack delay (1 s) and more: 15 once, nothing expired comes back
            try:
                while True:
                    m = await w.receive(timeout=1.5)
                    later.append((m.seq_id, m.redelivery_count))
            except TimeoutError:
                pass
        assert later == [(15, 0)]
        assert all(len(v) == 1 for v in received.values()), received   # nothing was handed out twice
        assert (await excl.receive(timeout=10)).seq_id == 15            # no expired message came again
        st = await stats(cluster, http, topic.decode())
        assert st["subscriptions"]["excl"]["consumed_seq_id"] >= 10
        for w in (w1, w2, excl):
            await w.close()


async def stats_via(cluster: LocalCluster, http: aiohttp.ClientSession, topic: str, i: int) -> dict[str, Any]:
    """The topic's stats through hub ``i`` (its owner's, forwarded; from the metastore when nobody owns it)."""
    status, body = await call(http, "GET", f"{hub_url(cluster, i)}/admin/v1/topics/{quote(topic, safe='')}/stats")
    assert status == 200, body
    return dict(body)


async def test_policies_hold_across_a_clean_owner_stop_and_a_kill_9(env: tuple[LocalCluster, BookKeeper],
                                                                   http: aiohttp.ClientSession) -> None:
    """Each policy on a topic with two subscriptions, after its topic moved to the other hub: the owner of
    the held topic stops cleanly (SIGTERM), then the other hub is killed (kill -9), so every topic moved at
    least once. producer_request_hold: a publish held while its owner stops or is killed is stored once or
    fails with a clear error (never lost silently), and the hold works at its boundary on the new owner.
    Then on the last owner: TTL (a SHARED subscription with acks beyond the first unacked one and an idle
    Hedwig one), retention (-1 keeps every consumed ledger, a topic without policy is trimmed) and
    consumer_backlog_eviction at its boundary."""
    cluster, _ = env
    tag = uuid.uuid4().hex[:6]
    ttl_t, keep_t, plain_t = f"mt{tag}-a", f"mr{tag}-a", f"rh-{tag}"
    hold_t, evict_t = f"mq{tag}-a", f"mv{tag}-a"
    # a TTL long enough that nothing expires before it is received on a loaded machine; cut to 2 s below
    await put_policy(cluster, http, f"mt{tag}-", message_ttl_seconds=600)
    await put_policy(cluster, http, f"mr{tag}-", retention_size_mb=-1)
    addrs = ",".join(cluster.hub_addresses)
    conf = {**MANUAL, "server_ack_response_timeout": "15000"}
    async with await HedwigClient.connect(addrs, conf) as c:
        w = await c.consumer(ttl_t.encode(), b"w", subscription_type="SHARED", receiver_queue_size=10)
        await c.subscribe(ttl_t.encode(), b"h")
        await c.close_subscription(ttl_t.encode(), b"h")
        for t in (keep_t, plain_t):
            for sub in (b"a", b"b"):
                await c.subscribe(t.encode(), sub)
            if t == keep_t:   # its owner re-reads policies every policies_refresh_interval: wait for this one
                await in_force(cluster, http, t, retention_size_mb=-1)
            for i in range(3):
                await c.publish(t.encode(), b"r%d" % i)
            await c.consume(t.encode(), b"a", 3)
            await c.consume(t.encode(), b"b", 3)
            await c.close_subscription(t.encode(), b"a")
            await c.close_subscription(t.encode(), b"b")
        for t, subs in ((hold_t, (b"s1", b"s2")), (evict_t, (b"slow", b"idle"))):
            for sub in subs:
                await c.subscribe(t.encode(), sub)
        await c.close_subscription(evict_t.encode(), b"idle")
        body = b"q" * 100
        size = await entry_bytes(cluster, http, c, hold_t, body)       # one message's stored size
        assert await c.publish(evict_t.encode(), body) == 1
        await put_policy(cluster, http, f"mq{tag}-", backlog_quota_limit_bytes=2 * size,
                         backlog_quota_policy="producer_request_hold")
        await put_policy(cluster, http, f"mv{tag}-", backlog_quota_limit_bytes=3 * size,
                         backlog_quota_policy="consumer_backlog_eviction")
        await in_force(cluster, http, hold_t, backlog_quota_limit_bytes=2 * size)
        await in_force(cluster, http, evict_t, backlog_quota_limit_bytes=3 * size)
        first = cluster.hub_addresses.index((await stats(cluster, http, hold_t))["owner"])
        other = 1 - first

        async def consumed_to(n: int) -> bool:
            try:
                await c.consume(hold_t.encode(), b"s1", n)
                await c.consume(hold_t.encode(), b"s2", n)
            except ServiceDownError:           # not resubscribed yet
                return False
            return True

        assert await c.publish(hold_t.encode(), body) == 2      # backlog 1 message: under
        held = asyncio.ensure_future(c.publish(hold_t.encode(), body))   # 2: at the quota, held
        done, _ = await asyncio.wait([held], timeout=0.3)
        assert not done
        await cluster.stop_hub(first)                            # SIGTERM while the publish is held
        try:
            try:                     # failed over: held again at the new owner, then refused (no room comes)
                outcome: int | str = await asyncio.wait_for(held, 20)
            except (BacklogQuotaExceededError, UncertainStateError) as exc:
                # (uncertain: its retry was sent to the stopping hub as it closed the connection, never read)
                outcome = type(exc).__name__

            async def owned_by(i: int) -> dict[str, Any] | None:   # the subscribers' resubscribe claims it
                got = await stats_via(cluster, http, hold_t, i)
                # owned_here: loaded there (while its claim's recovery runs, the stored stats may lag the tail)
                return got if got["owner"] == cluster.hub_addresses[i] and got["owned_here"] else None
            st = await eventually(functools.partial(owned_by, other))
            assert st["last_seq_id"] == (3 if outcome == 3 else 2), (outcome, st)
            last = int(st["last_seq_id"])
            print(json.dumps({"held_publish_at_owner_stop": outcome}), flush=True)
            # at its boundary on the new owner: held until room comes, then stored
            await eventually(functools.partial(consumed_to, last - 1))   # backlog 1: one more fits
            assert await c.publish(hold_t.encode(), body) == last + 1
            held = asyncio.ensure_future(c.publish(hold_t.encode(), body))
            done, _ = await asyncio.wait([held], timeout=0.3)
            assert not done
            assert await consumed_to(last)
            assert await asyncio.wait_for(held, 10) == last + 2
            await cluster.restart_hub(first)

            # held again while that owner is killed: stored once or a clear error, never silently lost
            held = asyncio.ensure_future(c.publish(hold_t.encode(), body))
            done, _ = await asyncio.wait([held], timeout=0.3)
            assert not done
            await cluster.kill_hub(other)
            try:
                outcome = await asyncio.wait_for(held, 30)
            except (UncertainStateError, BacklogQuotaExceededError) as exc:
                outcome = type(exc).__name__
            st = await eventually(functools.partial(owned_by, first), timeout=30)   # once its session is gone
            print(json.dumps({"held_publish_at_owner_kill": outcome}), flush=True)
            if isinstance(outcome, int):
                assert st["last_seq_id"] == outcome == last + 3, (outcome, st)
            else:
                assert st["last_seq_id"] == last + 2, (outcome, st)   # held in the killed hub: never stored

            # every topic has moved once at least; on its owner now:
            # TTL: 1..4 expire for both subscriptions; acked ones are not delivered again
            async def ttl_in_force(ttl: int) -> bool:
                return bool((await stats_via(cluster, http, ttl_t, first))["policy"]["message_ttl_seconds"] == ttl)
            await eventually(functools.partial(ttl_in_force, 600))     # the policy moved with the topic
            await w.close()      # (its subscription moved twice: a consumer attached to it now, whatever the
            w = await c.consumer(ttl_t.encode(), b"w", subscription_type="SHARED",   # old one's re-attach did)
                                 create_or_attach="ATTACH", receiver_queue_size=10)
            for i in range(4):
                await c.publish(ttl_t.encode(), b"t%d" % i)
            published = time.monotonic()
            got = {m.seq_id: m for m in [await w.receive(timeout=20) for _ in range(4)]}
            await w.ack(got[2])
            await w.ack(got[4])
            status, answer = await call(http, "PUT", policy_url(cluster, f"mt{tag}-", first),
                                        json={"message_ttl_seconds": 2}, headers=AUTH)
            assert status == 200, answer
            await eventually(functools.partial(ttl_in_force, 2))

            async def expired() -> dict[str, Any] | None:
                subs = (await stats_via(cluster, http, ttl_t, first))["subscriptions"]
                return subs if all(subs[s]["consumed_seq_id"] >= 4 for s in ("w", "h")) else None
            subs = await eventually(expired)
            assert time.monotonic() - published >= 2.0 and subs["w"]["unacked"] == 0, subs
            with pytest.raises(TimeoutError):
                await w.receive(timeout=0.5)

            # retention: attached here (so this hub owns them and runs their timer)
            for t in (keep_t, plain_t):
                await c.subscribe(t.encode(), b"a", create_or_attach="ATTACH")

            async def plain_trimmed() -> bool:
                return len((await stats_via(cluster, http, plain_t, first))["ledgers"]) == 1
            await eventually(plain_trimmed)
            kept = await stats_via(cluster, http, keep_t, first)
            assert kept["owner"] == cluster.hub_addresses[first]
            assert [r["start_seq_id"] for r in kept["ledgers"]][:3] == [1, 2, 3], kept["ledgers"]

            # consumer_backlog_eviction at its boundary
            for seq in range(2, 7):
                assert await c.publish(evict_t.encode(), body) == seq
            subs = (await stats_via(cluster, http, evict_t, first))["subscriptions"]
            assert subs["idle"]["consumed_seq_id"] == 4 and subs["slow"]["consumed_seq_id"] == 4, subs
        finally:
            for i in (first, other):
                if cluster.hub_pid(i) is None:
                    await cluster.restart_hub(i)


READER = """
import asyncio, sys
from hub.client import HedwigClient

async def main() -> None:
    c = await HedwigClient.connect(sys.argv[1])
    r = await c.reader(sys.argv[2].encode(), start_seq_id=1)
    for _ in range(2):
        await r.read_next(timeout=20)
    print("read", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_killed_readers_temporary_subscription_is_deleted(env: tuple[LocalCluster, BookKeeper],
                                                                  http: aiohttp.ClientSession) -> None:
    """A reader's temporary subscription goes with its client: a client process killed with SIGKILL while
    its reader holds the topic's ledgers leaves no subscription behind, and the consumed ledgers are
    deleted. A live reader keeps its position across a topic release (it subscribes again from it)."""
    cluster, _ = env
    topic = name("rd-")
    n = 6                                          # one ledger each (max_entries_per_ledger 1)
    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:
        await c.subscribe(topic.encode(), b"keep")
        for i in range(n):
            await c.publish(topic.encode(), b"m%d" % i)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", READER, cluster.hub_addresses[0], topic, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=Path(__file__).parents[2])
        try:
            assert proc.stdout is not None
            async with asyncio.timeout(30):
                line = await proc.stdout.readline()
            assert line == b"read\n", (line, await proc.stderr.read() if proc.stderr else b"")
            subs = (await stats(cluster, http, topic))["subscriptions"]
            readers = [s for s in subs if s.startswith("reader-")]
            assert len(readers) == 1 and subs[readers[0]]["consumed_seq_id"] < n, subs   # it holds the ledgers
            await c.consume(topic.encode(), b"keep", n)
        finally:
            proc.kill()                            # SIGKILL: no close, no unsubscribe
            await proc.wait()

        async def cleaned() -> dict[str, Any] | None:
            st = await stats(cluster, http, topic)
            return st if list(st["subscriptions"]) == ["keep"] and len(st["ledgers"]) == 1 else None
        st = await eventually(cleaned)
        assert st["ledgers"][0]["start_seq_id"] == n, st["ledgers"]   # those the reader held are gone

        # a live reader across a release (the new acquisition deletes the old temporary subscription)
        async with await c.reader(topic.encode(), start_seq_id=n) as r:
            assert (await r.read_next(timeout=20)).seq_id == n
            reader = r.consumer.subscriber.decode()
            status, got = await call(http, "POST", f"{hub_url(cluster, 0)}/admin/v1/topics/{quote(topic, safe='')}"
                                                   "/release", headers=AUTH)
            assert status == 200, got
            assert await c.publish(topic.encode(), b"after the release") == n + 1
            assert (await r.read_next(timeout=20)).seq_id == n + 1          # no gap, nothing again
            subs = (await stats(cluster, http, topic))["subscriptions"]
            assert set(subs) == {"keep", reader}, subs
        assert list((await stats(cluster, http, topic))["subscriptions"]) == ["keep"]


async def test_retention_by_time_lets_go_after_a_minute(env: tuple[LocalCluster, BookKeeper],
                                                        http: aiohttp.ClientSession) -> None:
    cluster, _ = env
    topic = STARTED["topic"]
    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:   # owned again (a hub was
        await c.subscribe(topic.encode(), b"a", create_or_attach="ATTACH")          # killed meanwhile)
        await c.close_subscription(topic.encode(), b"a")
    left = 62 - (time.monotonic() - STARTED["at"])

    async def trimmed() -> bool:
        return len((await stats(cluster, http, topic))["ledgers"]) == 1
    await eventually(trimmed, timeout=max(left, 0) + 20, interval=0.5)
    assert time.monotonic() - STARTED["at"] > 55
