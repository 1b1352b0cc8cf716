"""``quire console`` against a real LocalCluster (bookie and hub processes): -c, stdin and a real pty."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tools.cluster import LocalCluster

CONF = {"bk_ensemble_size": "2", "bk_write_quorum_size": "2", "bk_ack_quorum_size": "2",
        "consume_interval": "1", "max_entries_per_ledger": "3"}
TIMEOUT = 90


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=2, hubs=1, data_dir=tmp_path_factory.mktemp("console"),
                            conf_overrides=CONF) as c:
        yield c


def _console_args(cluster: LocalCluster) -> list[str]:
    return [sys.executable, "-m", "tools.cli", "console", "--server", cluster.hub_addresses[0],
            "--metastore", cluster.metastore_uri]


async def _run(cluster: LocalCluster, *commands: str, stdin: str | None = None,
               extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    args = [*_console_args(cluster), *extra]
    for c in commands:
        args += ["-c", c]
    return await asyncio.to_thread(subprocess.run, args, input=stdin or "", capture_output=True, text=True,
                                   timeout=TIMEOUT)


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_publish_describe_readtopic(cluster: LocalCluster) -> None:
    res = await _run(cluster, "sub ctopic csub 0", "closesub ctopic csub",
                     *(f"pub ctopic hello {i}" for i in range(1, 6)), "describe topic ctopic",
                     "readtopic ctopic", "show topics", "show hubs")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert out.count("Finished ") == 11
    assert "===== Topic Information : ctopic =====" in out
    hub = cluster.hub_addresses[0]
    assert re.search(rf"Owner : {re.escape(hub)}:\d+", out)
    # five messages, three entries per ledger (one message per entry when published one at a time)
    assert re.search(r"Ledger \d+ \[ 1 ~ 3 \]", out), out
    assert "Subscriber csub : consumeSeqId: local:0" in out
    # readtopic shows every acknowledged publish: message 5, the newest entry of the open ledger, once the
    # hub's writer sent its LAC explicitly (explicit_lac_interval after the publish)
    for i in range(1, 6):
        assert f"---------- MSGID=LOCAL({i}) ----------\nMsgId:     LOCAL({i})\nSrcRegion: standalone\n" \
               f"Message:\n\nhello {i}\n" in out
    assert "Topic List:\n[" in out and "ctopic" in out.split("Topic List:")[1]
    assert re.search(rf"Available Hub Servers:\n\s+{re.escape(hub)}:\d+ :\s+\d+", out)


async def test_readtopic_shows_the_last_publish_of_an_idle_topic(cluster: LocalCluster) -> None:
    res = await _run(cluster, "pub ltopic first", "pub ltopic second", "readtopic ltopic 1")
    assert res.returncode == 0, res.stdout + res.stderr
    read = res.stdout.split(">>>>> Ledger", 1)[1]
    assert "Message:\n\nfirst\n" in read
    assert "---------- MSGID=LOCAL(2) ----------" in read and "Message:\n\nsecond\n" in read
    waited = float(re.findall(r"Finished (\d+\.\d+) s\.", res.stdout)[-1])
    assert waited < 2.5, f"readtopic took {waited} s"   # about explicit_lac_interval (1 s), not the 3 s bound


async def test_consume_moves_the_pointer_and_readtopic_starts_after_it(cluster: LocalCluster) -> None:
    res = await _run(cluster, "sub ptopic psub", "closesub ptopic psub",
                     *(f"pub ptopic m{i}" for i in range(1, 6)),
                     "consume ptopic psub 2", "describe topic ptopic", "readtopic ptopic",
                     "consumeto ptopic psub 3", "describe topic ptopic")
    assert res.returncode == 0, res.stdout + res.stderr
    first, second = res.stdout.split("Consumed up to LOCAL(3).")
    assert "Subscriber psub : consumeSeqId: local:2" in first
    read = first.split(">>>>> Ledger", 1)[1]
    assert "MSGID=LOCAL(1)" not in read and "MSGID=LOCAL(2)" not in read
    assert "MSGID=LOCAL(3)" in read and "MSGID=LOCAL(4)" in read
    assert "Subscriber psub : consumeSeqId: local:3" in second


async def test_consume_and_consumeto_keep_the_stored_preferences(cluster: LocalCluster) -> None:
    from hub.client import HedwigClient
    from hub.message import SubscriptionPreferences
    from hub.metadata import SubscriptionDataManager
    from metastore import open_metastore

    options = {"filter.header": b"type", "filter.value": b"History"}
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(b"kptopic", b"kpsub", message_bound=7, message_window_size=3, options=options,
                          message_filter="hub.filters.HeaderMatchFilter")
        await c.close_subscription(b"kptopic", b"kpsub")
        for i in range(5):
            await c.publish(b"kptopic", b"m%d" % i, properties={"type": b"History"})
    res = await _run(cluster, "consume kptopic kpsub 2", "consumeto kptopic kpsub 4")
    assert res.returncode == 0, res.stdout + res.stderr
    ms = await open_metastore(cluster.metastore_uri)
    try:
        found = await SubscriptionDataManager(ms).read_subscription_data(b"kptopic", b"kpsub")
    finally:
        await ms.close()
    assert found is not None
    data = found[0]
    assert data.state.msgId.localComponent == 4
    assert SubscriptionPreferences.from_proto(data.preferences) == SubscriptionPreferences(   # old code: wiped
        options=options, message_bound=7, message_filter="hub.filters.HeaderMatchFilter", message_window_size=3)


async def test_pubsub_and_sub_prints_deliveries(cluster: LocalCluster) -> None:
    res = await _run(cluster, "pubsub stopic tsub- 20 availability check", "sub dtopic dsub",
                     "pub dtopic delivered body", "set")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Starting PUBSUB test ..." in res.stdout
    assert re.search(r"Received message : availability check-\d+", res.stdout)
    assert re.search(r"PUBSUB SUCCESS\. TIME: \d+ MS", res.stdout)
    assert "timeout = 10.0" in res.stdout


async def test_failures_exit_non_zero_and_the_console_goes_on(cluster: LocalCluster) -> None:
    res = await _run(cluster, "bogus", "sub", "sub t s 7", "unsub never-topic nobody", "pub ok-topic still works",
                     "describe topic ok-topic")
    assert res.returncode == 1
    out = res.stdout
    assert "Unknown command: bogus" in out
    assert "usage: sub {topic} {subscriber} [mode]" in out
    assert "mode must be 0 (CREATE), 1 (ATTACH) or 2 (CREATE_OR_ATTACH)" in out
    assert "CLIENT_NOT_SUBSCRIBED" in out
    assert re.search(r"Ledger \d+ \[ 1 ~", out), "the publish after the failures went through"
    assert out.count("Finished ") == 5  # an unknown command prints no timing line


async def test_commands_from_stdin_help_history_redo(cluster: LocalCluster) -> None:
    res = await _run(cluster, stdin="help\nhelp pub\npub htopic one\nredo 2\npub htopic two\nhistory\nquit\n"
                                                "pub never run\n")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "Available commands:\n        pub\n        sub\n" in out
    assert "pub: Publish a message to a topic in Hedwig\nusage: pub {topic} {message}" in out
    assert "3 - pub htopic one" in out  # redo 2 ran "pub htopic one" again and recorded it
    res = await _run(cluster, "readtopic htopic 1")
    assert res.stdout.count("Message:\n\none\n") == 2


async def test_bad_arguments_give_one_line(cluster: LocalCluster, tmp_path: Path) -> None:
    bad = tmp_path / "hw_server.conf"
    bad.write_text("no_such_key=1\n")
    res = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "tools.cli", "console", "--conf", str(bad),
                                                   "-c", "show hubs"], capture_output=True, text=True,
                                  timeout=TIMEOUT)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["quire console: hw_server.conf: unknown key 'no_such_key'"]
    res = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "tools.cli", "console", "--server",
                                                   "127.0.0.1:1", "-c", "pub t x"], capture_output=True,
                                  text=True, timeout=TIMEOUT)
    assert res.returncode == 1
    assert "cannot connect to hub server 127.0.0.1:1" in res.stdout


async def test_interactive_session_in_a_pty(cluster: LocalCluster, tmp_path: Path) -> None:
    """A real terminal: the prompt, line editing (a backspace), history, and quit."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the console on the pty
        os.environ["HOME"] = str(tmp_path)
        os.execv(sys.executable, _console_args(cluster))
    try:
        seen = await asyncio.to_thread(_read_until, fd, "[hedwig: (standalone) 0] ")
        assert "Welcome to Hedwig!" in seen
        os.write(fd, b"pub itopic typoo\x7f\r")  # the backspace erases the second 'o'
        seen = await asyncio.to_thread(_read_until, fd, "[hedwig: (standalone) 1] ")
        assert "Finished " in seen
        os.write(fd, b"pub itopic second\r")
        seen = await asyncio.to_thread(_read_until, fd, "[hedwig: (standalone) 2] ")
        os.write(fd, b"readtopic itopic 1\r")
        seen = await asyncio.to_thread(_read_until, fd, "[hedwig: (standalone) 3] ")
        assert "Message:\r\n\r\ntypo\r\n" in seen
        os.write(fd, b"quit\r")
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (tmp_path / ".quire_console_history").read_text().count("itopic") == 3
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def _read_until(fd: int, marker: str, timeout: float = TIMEOUT) -> str:
    deadline = time.monotonic() + timeout
    buf = ""
    while marker not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {marker!r} within {timeout} s; got {buf!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk.decode(errors="replace")
    return buf


def _describe_text(doc: dict) -> list[str]:  # type: ignore[type-arg]
    """The text ``describe topic`` prints (without its last, empty line), rebuilt from its JSON document."""
    ledgers = [f"Ledger {r['ledger_id']} [ {r['start_seq_id']} ~ {'' if r['end_seq_id'] is None else r['end_seq_id']}"
               .rstrip() + " ]" for r in doc["ledgers"]]
    subs = [f"Subscriber {s['subscriber']} : consumeSeqId: local:{s['consume_seq_id']}"
            + "".join(f", {k}:{v}" for k, v in sorted(s["remote_consume_seq_ids"].items()))
            for s in doc["subscriptions"]]
    return [f"===== Topic Information : {doc['topic']} =====", "", f"Owner : {doc['owner'] or 'NULL'}", "",
            ">>> Persistence Info <<<", *ledgers, "", ">>> Subscription Info <<<", *subs]


async def test_json_of_show_and_describe_carries_the_text_facts(cluster: LocalCluster) -> None:
    res = await _run(cluster, "sub jtopic jsub 0", "closesub jtopic jsub", *(f"pub jtopic m{i}" for i in range(1, 5)),
                     "consume jtopic jsub 1")
    assert res.returncode == 0, res.stdout + res.stderr
    commands = ("show hubs", "show topics", "describe topic jtopic")
    text = await _run(cluster, *commands)
    per_command = await _run(cluster, *(f"{c} --json" for c in commands), "describe --json topic nosuch")
    assert text.returncode == per_command.returncode == 0, per_command.stdout + per_command.stderr
    blocks = [b.strip("\n").splitlines() for b in re.split(r"Finished \d+\.\d+ s\.\n", text.stdout)[:-1]]
    lines = per_command.stdout.splitlines()
    assert [line for line in lines if line.startswith("Finished ")] == lines[1::2] and len(lines) == 8
    hubs, topics, described, nosuch = (json.loads(line) for line in lines[0::2])

    # show hubs: the hub of the cluster, as the text lists it
    assert blocks[0][0] == "Available Hub Servers:"
    listed = [re.split(r"\s+:\s+", line.strip()) for line in blocks[0][1:]]
    assert [address for address, _ in listed] == [h["address"] for h in hubs]
    # the load is the hub's, republished as it acquires topics: it may move between the two runs
    assert all(int(n) >= 1 for _, n in listed) and all(isinstance(h["num_topics"], int) and h["num_topics"] >= 1
                                                       for h in hubs)
    assert [f"{h['hostname']}:{h['port']}" for h in hubs] == cluster.hub_addresses
    assert all(h["address"] == f"{h['hostname']}:{h['port']}:{h['ssl_port']}" for h in hubs)
    # show topics
    assert blocks[1] == ["Topic List:", "[" + ", ".join(t["topic"] for t in topics) + "]"]
    assert "jtopic" in {t["topic"] for t in topics}
    # describe topic: the same lines rebuilt from the document
    assert _describe_text(described) == blocks[2]
    assert described["owner"].startswith(cluster.hub_addresses[0] + ":")
    assert [(r["start_seq_id"], r["end_seq_id"]) for r in described["ledgers"]] == [(1, 3), (4, None)]
    assert described["subscriptions"] == [{"subscriber": "jsub", "consume_seq_id": 1, "remote_consume_seq_ids": {}}]
    assert nosuch == {"topic": "nosuch", "owner": None, "ledgers": [], "subscriptions": []}

    # quire console --json: stdout is only the documents, the rest goes to stderr
    whole = await _run(cluster, *commands, "set", "describe topic", extra=("--json",))
    assert whole.returncode == 1, "the usage error still counts"
    docs = [json.loads(line) for line in whole.stdout.splitlines()]
    assert [[h["address"] for h in docs[0]], docs[1], docs[2]] == [[h["address"] for h in hubs], topics, described]
    assert whole.stderr.count("Finished ") == 5
    assert "timeout = 10.0" in whole.stderr and "usage: describe topic {topic} [--json]" in whole.stderr


async def test_one_command_after_the_options_runs_as_in_hedwig(cluster: LocalCluster) -> None:
    """``HedwigConsole [options] [command] [args]``: what a newcomer types first (it used to be refused)."""
    run = functools.partial(asyncio.to_thread, subprocess.run, capture_output=True, text=True, timeout=TIMEOUT)
    res = await run([*_console_args(cluster), "-c", "pub atopic first", "pub", "atopic", "two words"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("Finished ") == 2
    args = _console_args(cluster)
    res = await run([*args[:4], "readtopic", "atopic", *args[4:]])   # the options may follow the command
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Message:\n\nfirst\n" in res.stdout and "Message:\n\ntwo words\n" in res.stdout
    res = await run([*_console_args(cluster), "describe", "topic", "atopic", "--json"])   # a word of the command
    assert res.returncode == 0 and json.loads(res.stdout.splitlines()[0])["topic"] == "atopic", res.stdout
    res = await run([*_console_args(cluster), "nosuchcommand", "x"])
    assert res.returncode == 1 and "Unknown command: nosuchcommand" in res.stdout


async def test_sub_with_a_type_and_describe_shows_type_consumers_and_unacked(cluster: LocalCluster) -> None:
    res = await _run(cluster, "sub qtopic qworkers --type shared", "describe topic qtopic --json",
                     "describe topic qtopic", "sub qtopic qworkers --type failover")
    assert res.returncode == 1, res.stdout + res.stderr     # the last command failed (and said why)
    doc = next(json.loads(line) for line in res.stdout.splitlines() if line.startswith("{"))
    (sub,) = doc["subscriptions"]
    assert (sub["subscriber"], sub["type"], sub["consumers"], sub["unacked"]) == ("qworkers", "SHARED", 1, 0)
    assert "Subscriber qworkers : consumeSeqId: local:0, type: SHARED, consumers: 1, unacked: 0" in res.stdout
    assert "SUBSCRIPTION_TYPE_MISMATCH" in res.stdout + res.stderr


async def test_pub_with_a_delay_and_bad_delays_are_one_line_each(cluster: LocalCluster) -> None:
    from hub.client import HedwigClient

    res = await _run(cluster, "pub dltopic soon --deliver-after 1500", "pub dltopic --deliver-at 2030-01-01T00:00:00Z "
                     "new year", "pub dltopic x --deliver-after -5",
                     "pub dltopic x --deliver-after 5 --deliver-at 2030-01-01T00:00:00", "pub dltopic x --deliver-at "
                     "tomorrow", "pub dltopic x --deliver-after", "pub dltopic --deliver-after 10", "pub dltopic plain")
    assert res.returncode == 1, res.stdout + res.stderr      # the bad ones failed, and the console went on
    lines = [line for line in res.stdout.splitlines() if not line.startswith("Finished ")]
    assert lines == [
        "Published LOCAL(1): SHARED and KEY_SHARED subscriptions get it no earlier than 1500 ms after it was stored.",
        "Published LOCAL(2): SHARED and KEY_SHARED subscriptions get it no earlier than 2030-01-01 00:00:00.000 UTC.",
        "--deliver-after must be a number of milliseconds >= 0: expected a number >= 0, not '-5'",
        "give one of --deliver-after MS and --deliver-at ISO8601, not both",
        "--deliver-at must be an ISO 8601 time: 'tomorrow' is not an ISO 8601 time (e.g. 2026-11-28T01:00:00Z)",
        "--deliver-after needs a value: --deliver-after MS",
        "usage: pub {topic} {message} [--deliver-after MS | --deliver-at ISO8601]"], res.stdout
    assert res.stdout.count("Finished ") == 8
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:   # what the hub stored
        async with await c.reader(b"dltopic", start_seq_id=1) as reader:     # a reader gets them at once
            got = [await reader.read_next(timeout=30) for _ in range(3)]
    assert [(m.seq_id, m.body) for m in got] == [(1, b"soon"), (2, b"new year"), (3, b"plain")]
    assert got[0].deliver_at_ms - got[0].publish_time_ms == 1500
    assert got[1].deliver_at_ms == 1893456000000 and not got[2].deliver_at_ms
