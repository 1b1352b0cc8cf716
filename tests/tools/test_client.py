"""`quire client produce|consume` against a real LocalCluster (a bookie and a hub process)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

ONE_BOOKIE = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=1, hubs=1, data_dir=tmp_path_factory.mktemp("client"),
                            conf_overrides=ONE_BOOKIE) as c:
        yield c


@pytest.fixture(scope="module")
def hub(cluster: LocalCluster) -> str:
    return cluster.hub_addresses[0]


async def client(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
                 ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tools.cli", "client", *args, env={**os.environ, **(env or {})},
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def subscribed(proc: asyncio.subprocess.Process) -> None:
    """Wait for the consumer's ``subscribed to ...`` line (its subscription exists from then on)."""
    assert proc.stderr is not None
    async with asyncio.timeout(60):
        line = (await proc.stderr.readline()).decode()
    assert line.startswith("subscribed to "), line + (await proc.stderr.read()).decode()


async def finish(proc: asyncio.subprocess.Process, stdin: bytes | None = None) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_produce_and_consume(hub: str) -> None:
    text = await client("consume", "greetings", "-s", "reader", "-n", "5", "--server", hub)
    as_json = await client("consume", "greetings", "-s", "auditor", "-n", "5", "--json",
                           env={"QUIRE_SERVER": hub})      # the server from the environment
    await asyncio.gather(subscribed(text), subscribed(as_json))
    rc, out, err = await finish(await client("produce", "greetings", "-m", "hello", "-n", "3", "--server", hub))
    assert (rc, out, err) == (0, "produced 3 messages to greetings (seq ids 1..3)\n", "")
    rc, out, _ = await finish(await client("produce", "greetings", "--server", hub, stdin=b""), b"x\ny\n")
    assert (rc, out) == (0, "produced 2 messages to greetings (seq ids 4..5)\n")
    rc, out, _ = await finish(text)
    assert rc == 0 and out.splitlines() == ["1\thello", "2\thello", "3\thello", "4\tx", "5\ty"]
    rc, out, _ = await finish(as_json)
    assert rc == 0
    assert [(m["seq_id"], m["body"], m["src_region"]) for m in map(json.loads, out.splitlines())] == [
        (1, "hello", "standalone"), (2, "hello", "standalone"), (3, "hello", "standalone"),
        (4, "x", "standalone"), (5, "y", "standalone")]
    # what a consumer printed it consumed: attaching again starts after it
    again = await client("consume", "greetings", "-s", "reader", "-n", "1", "--server", hub)
    await subscribed(again)
    await finish(await client("produce", "greetings", "-m", "later", "--server", hub))
    assert (await finish(again))[1] == "6\tlater\n"


async def test_rate_paces_the_publishes(hub: str) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    rc, out, _ = await finish(await client("produce", "paced", "-m", "tick", "-n", "5", "--rate", "10",
                                           "--server", hub))
    assert rc == 0 and out == "produced 5 messages to paced (seq ids 1..5)\n"
    assert loop.time() - start >= 0.4   # 5 messages at 10/s: the last leaves 0.4 s after the first


async def test_unreachable_hub_is_one_line(tmp_path: Path) -> None:
    rc, out, err = await finish(await client("produce", "t", "-m", "x", "--server", "127.0.0.1:1", "--timeout", "5"))
    assert rc == 1 and out == ""
    assert err.splitlines() == [err.strip()]
    assert err.startswith("quire client produce: cannot connect to hub 127.0.0.1:1")
    assert err.count("cannot connect") == 1, err   # the client's own wording is not repeated inside


async def test_one_message_is_singular_json_has_properties_and_a_closed_pipe_ends_quietly(hub: str) -> None:
    as_json = await client("consume", "small", "-s", "j", "-n", "1", "--json", "--server", hub)
    # `consume | head -1`: stdout is a pipe whose reader leaves after the first line
    read_end, write_end = os.pipe()
    piped = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tools.cli", "client", "consume", "small", "-s", "h", "--server", hub,
        stdin=asyncio.subprocess.DEVNULL, stdout=write_end, stderr=asyncio.subprocess.PIPE)
    os.close(write_end)
    await asyncio.gather(subscribed(as_json), subscribed(piped))
    rc, out, err = await finish(await client("produce", "small", "-m", "one", "--server", hub))
    assert (rc, out, err) == (0, "produced 1 message to small (seq id 1)\n", "")
    rc, out, _ = await finish(as_json)
    assert rc == 0 and json.loads(out) == {"seq_id": 1, "body": "one", "src_region": "standalone", "properties": {}}
    with open(read_end, "rb") as reader:
        assert await asyncio.to_thread(reader.readline) == b"1\tone\n"
    # the reader is gone; the next message's line cannot be written
    await finish(await client("produce", "small", "-m", "two", "--server", hub))
    assert piped.stderr is not None
    async with asyncio.timeout(60):
        rest = await piped.stderr.read()      # after its "subscribed to" line
        assert (await piped.wait(), rest) == (141, b"")


async def test_shared_consumers_side_by_side_form_a_work_queue_and_keys_travel(hub: str) -> None:
    workers = [await client("consume", "jobs", "-s", "workers", "-n", "3", "--type", "shared", "--json",
                            "--ack-timeout", "30000", "--server", hub) for _ in range(2)]
    await asyncio.gather(*(subscribed(w) for w in workers))
    rc, out, _ = await finish(await client("produce", "jobs", "-m", "job", "-n", "6", "--key", "k1",
                                           "--server", hub))
    assert (rc, out) == (0, "produced 6 messages to jobs (seq ids 1..6)\n")
    lines = []
    for w in workers:
        rc, out, _ = await finish(w)
        assert rc == 0
        lines += [json.loads(line) for line in out.splitlines()]
    assert sorted(m["seq_id"] for m in lines) == [1, 2, 3, 4, 5, 6]       # each job to one worker
    assert {m["key"] for m in lines} == {"k1"}
    rc, _, err = await finish(await client("consume", "jobs", "-s", "workers", "--type", "failover",
                                           "--server", hub))
    assert rc == 1 and "SUBSCRIPTION_TYPE_MISMATCH" in err


async def test_produce_deliver_after_is_held_for_a_shared_consumer_and_bad_delays_exit_2(hub: str) -> None:
    from hub.delayed import now_ms

    worker = await client("consume", "later", "-s", "w", "-n", "1", "--type", "shared", "--json", "--server", hub)
    await subscribed(worker)
    rc, out, _ = await finish(await client("produce", "later", "-m", "late", "--deliver-after", "1500",
                                           "--server", hub))
    assert (rc, out) == (0, "produced 1 message to later (seq id 1)\n")
    assert worker.stdout is not None
    async with asyncio.timeout(60):
        line = await worker.stdout.readline()
    printed_at = now_ms()
    got = json.loads(line)
    assert got["body"] == "late" and printed_at >= got["deliver_at_ms"] > 0   # printed no earlier than due
    rc, _, _ = await finish(worker)
    assert rc == 0
    for bad in (["--deliver-after", "-5"], ["--deliver-after", "5", "--deliver-at", "2030-01-01T00:00:00"],
                ["--deliver-at", "tomorrow"]):
        rc, _, err = await finish(await client("produce", "later", "-m", "x", *bad, "--server", hub))
        assert rc == 2 and "--deliver" in err, err


async def test_consume_compacted_reads_the_newest_per_key_without_a_subscription(cluster: LocalCluster,
                                                                                  hub: str) -> None:
    from hub.client import HedwigClient
    from tools.hub_http import admin_call

    http_url = cluster.stats_urls[0].removesuffix("/metrics")

    async with await HedwigClient.connect(hub) as c:
        for key, body in ((b"ACME", b"10"), (b"INIT", b"5"), (b"ACME", b"11"), (None, b"no key"), (b"INIT", b"")):
            await c.publish(b"prices", body, key=key)
    status, doc = await admin_call(http_url, "POST", "/admin/v1/topics/prices/compact", token="", timeout=30)
    assert status == 200 and doc["compacted_up_to_seq_id"] == 5, doc
    # up to the compaction point only ACME's newest (INIT's empty body deleted it; keyless left out), then the rest
    reader = await client("consume", "prices", "--compacted", "-n", "2", "--json", "--server", hub)
    assert reader.stderr is not None
    async with asyncio.timeout(60):
        assert (await reader.stderr.readline()).decode() == "reading prices compacted from seq id 1\n"
    rc, out, _ = await finish(await client("produce", "prices", "-m", "12", "--key", "ACME", "--server", hub))
    assert (rc, out) == (0, "produced 1 message to prices (seq id 6)\n")
    rc, out, _ = await finish(reader)
    assert rc == 0
    assert [(m["seq_id"], m["key"], m["body"]) for m in map(json.loads, out.splitlines())] == [
        (3, "ACME", "11"), (6, "ACME", "12")]
    rc, out, _ = await finish(await client("consume", "prices", "--compacted", "--start-seq", "4", "-n", "1",
                                           "--server", hub))
    assert (rc, out) == (0, "6\t12\n")                  # from seq id 4: ACME's 3 is before it
    status, doc = await admin_call(http_url, "GET", "/admin/v1/topics/prices/stats", token="", timeout=30)
    assert (status, doc["subscriptions"]) == (200, {})   # the readers kept no subscription
    rc, _, err = await finish(await client("consume", "never-made", "--compacted", "--server", hub))
    assert rc == 1 and err.startswith("quire client consume: NO_SUCH_TOPIC"), err
    for bad in (["-s", "sub"], ["--start-time", "2026-01-01T00:00:00"], ["--type", "shared"]):
        rc, _, err = await finish(await client("consume", "prices", "--compacted", *bad, "--server", hub))
        assert rc == 2 and "--compacted reads without a subscription" in err and bad[0] in err, err
    rc, _, err = await finish(await client("consume", "prices", "--server", hub))
    assert rc == 2 and "-s/--subscription" in err, err
