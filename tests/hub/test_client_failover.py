"""The client leaves a hub that stops answering without closing the connection (a silent cut).

Scripted in-process hubs (``hub.protocol`` on plain asyncio servers) show the rule of
``hub.channel``: a request timing out on a connection that heard nothing since it was sent drops
the connection; a slow answer on a busy connection does not. The last test runs real processes:
the owner hub is stopped with SIGSTOP (TCP stays up, nothing answers: what a silent network cut
looks like to the client) while a producer publishes exactly-once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from hub import errors, protocol
from hub.channel import tcp_keepalive
from hub.client import HedwigClient, Message
from hub.proto import pubsub_pb2 as pb
from tests.fixtures.polling import eventually
from tools.cluster import LocalCluster

TIMEOUT_MS = 300


class ScriptedHub:
    """Answers SUCCESS to every request (publishes get seq ids 1, 2, ...) unless ``answers(request)`` is False."""

    def __init__(self) -> None:
        self.answers: Callable[[pb.PubSubRequest], bool] = lambda req: True
        self.requests: list[pb.PubSubRequest] = []
        self.connections = 0
        self.address = ""

    def answer(self, req: pb.PubSubRequest) -> bytes | None:
        self.requests.append(req)
        if not self.answers(req):
            return None
        resp = protocol.response(req.txnId, pb.SUCCESS, topic=req.topic)
        if req.type == pb.PUBLISH:
            resp.publishResponse.publishedMsgId.localComponent = sum(r.type == pb.PUBLISH for r in self.requests)
        return protocol.encode(resp)

    def seen(self, op: int) -> list[pb.PubSubRequest]:
        return [r for r in self.requests if r.type == op]


@asynccontextmanager
async def scripted_hub() -> AsyncIterator[ScriptedHub]:
    hub = ScriptedHub()
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hub.connections += 1
        writers.append(writer)
        machine = protocol.ServerConnection(1 << 20, 1 << 20)
        while data := await reader.read(65536):
            for ev in machine.receive_data(data):
                if isinstance(ev, protocol.RequestReceived) and (out := hub.answer(ev.request)) is not None:
                    writer.write(out)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    hub.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield hub
    finally:
        for w in writers:
            w.close()
        server.close()


async def test_a_silent_owner_is_dropped_and_the_publish_asked_again_elsewhere_with_its_sequence_id() -> None:
    async with scripted_hub() as a, scripted_hub() as b:
        conf = {"server_ack_response_timeout": str(TIMEOUT_MS), "subscribe_reconnect_retry_wait_time": "50"}
        async with await HedwigClient.connect(f"{a.address},{b.address}", conf=conf) as c:
            assert await c.publish(b"t", b"one", producer=b"p", sequence_id=1) == 1
            await c.subscribe(b"t", b"s")
            assert c.owner[b"t"] == a.address
            a.answers = lambda req: False                      # a goes silent; its connection stays up
            started = time.monotonic()
            seq = await asyncio.wait_for(c.publish(b"t", b"two", producer=b"p", sequence_id=2), 10)
            took = time.monotonic() - started
            assert seq == 1                                     # b's first publish
            assert c.owner[b"t"] == b.address
            assert a.address not in c.conns
            assert took < 2 * TIMEOUT_MS / 1000 + 1.0, took    # one timeout, then b answers at once
            # the same sequence id went to both: the owner that took the topic dedups it
            asked = [(h.address, r.publishRequest.msg.sequenceId) for h in (a, b) for r in h.seen(pb.PUBLISH)
                     if r.publishRequest.msg.body == b"two"]
            assert asked == [(a.address, 2), (b.address, 2)]
            # the subscription attached through the dropped connection attaches again at b
            await eventually(lambda: b.seen(pb.SUBSCRIBE), timeout=10, interval=0.02)
            # a plain publish goes to b from now on; a is not asked again
            before = len(a.requests)
            await c.publish(b"t", b"three")
            assert len(a.requests) == before


async def test_a_slow_answer_on_a_busy_connection_keeps_the_connection() -> None:
    async with scripted_hub() as hub:
        hub.answers = lambda req: req.topic != b"slow"
        async with await HedwigClient.connect(hub.address,
                                              conf={"server_ack_response_timeout": str(TIMEOUT_MS)}) as c:
            await c.publish(b"fast", b"x")
            conn = c.conns[hub.address]
            slow = asyncio.create_task(c.publish(b"slow", b"x"))
            for _ in range(2 * TIMEOUT_MS // 50):                 # other answers keep arriving meanwhile
                await c.publish(b"fast", b"x")
                await asyncio.sleep(0.05)
            with pytest.raises(errors.ResponseTimeoutError) as got:
                await slow
            assert not got.value.channel_dropped
            assert c.conns[hub.address] is conn and conn.alive
            assert hub.connections == 1


async def test_requests_in_flight_on_a_dropped_connection_fail_uncertain_at_once() -> None:
    async with scripted_hub() as hub:
        hub.answers = lambda req: False
        async with await HedwigClient.connect(hub.address, conf={"server_ack_response_timeout": "2000"}) as c:
            conn = c.conns[hub.address]
            loop = asyncio.get_running_loop()
            first = conn.request(pb.PubSubRequest(type=pb.PUBLISH, topic=b"t"), 0.2)
            second = conn.request(pb.PubSubRequest(type=pb.PUBLISH, topic=b"t"), 5.0)
            started = loop.time()
            with pytest.raises(errors.ResponseTimeoutError):
                await first
            with pytest.raises(errors.UncertainStateError, match="dropped"):
                await second
            assert loop.time() - started < 1.0
            assert not conn.alive and conn.dropped


async def test_silence_while_the_client_holds_reading_back_drops_nothing() -> None:
    async with scripted_hub() as hub:
        hub.answers = lambda req: False
        async with await HedwigClient.connect(hub.address, conf={"server_ack_response_timeout": "2000"}) as c:
            conn = c.conns[hub.address]
            conn.paused_by.add((b"t", b"s"))        # a subscription's handler is behind: nothing is read
            with pytest.raises(errors.ResponseTimeoutError) as got:
                await conn.request(pb.PubSubRequest(type=pb.PUBLISH, topic=b"t"), 0.2)
            assert not got.value.channel_dropped
            assert conn.alive and c.conns[hub.address] is conn


async def test_an_idle_subscriber_pings_a_silent_hub_and_attaches_elsewhere() -> None:
    """No request of its own would ever time out: the keep-alive PING does, and the connection is dropped."""
    async with scripted_hub() as a, scripted_hub() as b:
        conf = {"server_ack_response_timeout": str(TIMEOUT_MS), "keep_alive_interval": "200",
                "subscribe_reconnect_retry_wait_time": "50"}
        async with await HedwigClient.connect(f"{a.address},{b.address}", conf=conf) as c:
            await c.subscribe(b"t", b"s")
            conn = c.conns[a.address]
            await eventually(lambda: len(a.seen(pb.PING)) >= 2, timeout=10, interval=0.02)
            assert conn.alive                                  # answered pings keep it
            assert all(p.WhichOneof("body") == "pingRequest" for p in a.seen(pb.PING))
            a.answers = lambda req: False                      # a goes silent; its connection stays up
            await eventually(lambda: b.seen(pb.SUBSCRIBE), timeout=10, interval=0.02)
            assert not conn.alive and conn.dropped and a.address not in c.conns
            assert c.subs[(b"t", b"s")].conn is c.conns[b.address]


async def test_no_pings_with_keep_alive_off_and_none_while_the_hub_talks() -> None:
    async with scripted_hub() as hub:
        async with await HedwigClient.connect(hub.address, conf={"keep_alive_interval": "0"}) as off, \
                await HedwigClient.connect(hub.address, conf={"keep_alive_interval": "500"}) as idle, \
                await HedwigClient.connect(hub.address, conf={"keep_alive_interval": "1000"}) as busy:
            loop = asyncio.get_running_loop()
            end = loop.time() + 3.0
            while loop.time() < end:                           # busy hears an answer every 50 ms
                await busy.publish(b"t", b"x")
                await asyncio.sleep(0.05)
            pings = [c.conns[hub.address].pings for c in (off, idle, busy)]
            assert pings[0] == 0 and pings[1] >= 2 and pings[2] == 0, pings
            assert 2 <= len(hub.seen(pb.PING)) <= pings[1]        # all of them from idle (one may be on its way)


async def test_client_sockets_get_keepalive_and_a_user_timeout() -> None:
    async with scripted_hub() as hub:
        async with await HedwigClient.connect(hub.address, conf={"server_ack_response_timeout": "4000"}) as c:
            sock = c.conns[hub.address].transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
            if hasattr(socket, "TCP_KEEPIDLE"):
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 4
            if hasattr(socket, "TCP_USER_TIMEOUT"):
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 8000
    assert not tcp_keepalive(None, 1.0)


# --- real processes: SIGSTOP of the owner hub ------------------------------------------------------
STOP_CONF = {"bk_ensemble_size": "2", "bk_write_quorum_size": "2", "bk_ack_quorum_size": "2",
             "zk_timeout": "1000", "session_timeout": "1000", "max_entries_per_ledger": "20"}
ACK_TIMEOUT_MS = 2000
FAILOVER_BOUND = 2 * ACK_TIMEOUT_MS / 1000 + 6.0
"""Seconds from SIGSTOP to the first publish acknowledged by the other hub: the owner's lease (zk_timeout)
runs out, one answer timeout drops the silent connection, then the other hub claims the topic and
recovers (fences) the old owner's ledger."""


@pytest.mark.slow
@pytest.mark.parametrize("metastore", ["lmdb", "zookeeper"])   # the owner's lease / its ZooKeeper session expires
async def test_publishing_fails_over_from_a_stopped_owner_and_stores_nothing_twice(tmp_path: Path,
                                                                                   metastore: str) -> None:
    """SIGSTOP of the owner while one client publishes exactly-once (``producer_name``) and subscribes.

    The publish that times out drops the connection; it is asked again at the other hub with its
    sequence id, and the subscription (on the same connection) attaches there. Nothing acknowledged
    is lost or stored twice; after SIGCONT the stale owner acknowledges nothing."""
    from tests.hub.test_exactly_once import stored_bodies

    topic = uuid.uuid4().hex.encode()
    async with LocalCluster(bookies=2, hubs=2, data_dir=tmp_path, metastore=metastore,
                            conf_overrides=STOP_CONF) as cluster:
        conf = {"producer_name": "p", "server_ack_response_timeout": str(ACK_TIMEOUT_MS)}
        acked: list[tuple[float, int, bytes, str]] = []   # when, seq id, body, the hub that answered
        stop = asyncio.Event()
        failures: list[str] = []
        async with await HedwigClient.connect(",".join(cluster.hub_addresses), conf=conf) as c:
            await c.publish(topic, b"body-0")
            owner = cluster.hub_addresses.index(c.owner[topic])
            other = cluster.hub_addresses[1 - owner]
            delivered: list[tuple[int, bytes]] = []

            async def handler(t: bytes, s: bytes, m: Message) -> None:
                delivered.append((m.seq_id, m.body))

            await c.subscribe(topic, b"s")
            await c.start_delivery(topic, b"s", handler)

            async def publisher() -> None:
                i = 0
                while not stop.is_set():
                    i += 1
                    body = b"body-%d" % i
                    while True:     # the application gives up on nothing: a failure is retried (new seq id)
                        try:
                            seq = await c.publish(topic, body)
                            acked.append((time.monotonic(), seq, body, c.owner.get(topic, "")))
                            break
                        except errors.PubSubError as exc:
                            failures.append(f"{type(exc).__name__}: {exc}")
                            await asyncio.sleep(0.05)
                    await asyncio.sleep(0.01)

            task = asyncio.create_task(publisher())
            await eventually(lambda: len(acked) >= 20)
            pid = cluster.hub_pid(owner)
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                await eventually(lambda: any(t > stopped_at and by == other for t, _, _, by in acked),
                                 timeout=FAILOVER_BOUND + 10)
                resumed = next(t for t, _, _, by in acked if t > stopped_at and by == other) - stopped_at
                assert resumed < FAILOVER_BOUND, f"publishing resumed {resumed:.1f}s after SIGSTOP; {failures[-3:]}"
                n = len(acked)
                await eventually(lambda: len(acked) >= n + 20)
                # the subscription moved too, while the old owner is still stopped
                await eventually(lambda: delivered and delivered[-1][0] >= acked[n + 19][1])
                assert c.subs[(topic, b"s")].conn is c.conns[other]
            finally:
                os.kill(pid, signal.SIGCONT)
            # the stale owner, running again, acknowledges nothing: its ledger is fenced and it lets the topic go
            async with await HedwigClient.connect(cluster.hub_addresses[owner],
                                                  conf={"server_ack_response_timeout": "5000"}) as late:
                try:
                    seq = await late.publish(topic, b"late", producer=b"late", sequence_id=1)
                except errors.PubSubError as exc:
                    print(f"a publish to the stale owner: {type(exc).__name__}: {exc}")
                else:   # acknowledged, but by the new owner, through a redirect
                    assert late.owner[topic] == other, f"the stale owner acknowledged seq {seq}"
            await eventually(lambda: len(acked) >= n + 40)
            stop.set()
            await task
            await eventually(lambda: delivered and delivered[-1][0] >= max(s for _, s, _, _ in acked))
        print(f"failover after SIGSTOP: {resumed:.2f}s, {len(acked)} acknowledged, failures seen: {failures[:3]}")
        await cluster.stop_hub(owner)
        await cluster.stop_hub(1 - owner)        # release the topic: its ledgers closed, to be read back
        bodies = [b for b in await stored_bodies(cluster, topic) if b != b"late"]
    assert len(bodies) == len(set(bodies)), "a message stored twice"
    stored = set(bodies)
    missing = [b for _, _, b, _ in acked if b not in stored]
    assert not missing, f"acknowledged but not stored: {missing[:5]}"
    seqs = [s for _, s, _, _ in acked]
    assert len(set(seqs)) == len(seqs), "two publishes acknowledged with one seq id"
    assert not failures, f"a publish failed instead of failing over: {failures[:3]}"
    got = [s for s, _ in delivered]
    assert got == sorted(set(got)), "delivered in order, once"
    assert set(seqs) <= set(got), "every acknowledged publish delivered"


@pytest.mark.slow
async def test_an_idle_subscriber_of_a_stopped_owner_follows_its_topic_to_the_other_hub(tmp_path: Path) -> None:
    """SIGSTOP of the owner while a subscriber that sends nothing waits for messages: its keep-alive PING goes
    unanswered, the connection is dropped, and it attaches at the hub that took the topic over."""
    topic = uuid.uuid4().hex.encode()
    async with LocalCluster(bookies=2, hubs=2, data_dir=tmp_path, conf_overrides=STOP_CONF) as cluster:
        addresses = ",".join(cluster.hub_addresses)
        pub_conf = {"producer_name": "p", "server_ack_response_timeout": str(ACK_TIMEOUT_MS)}
        sub_conf = {"server_ack_response_timeout": str(ACK_TIMEOUT_MS), "keep_alive_interval": "500",
                    "subscribe_reconnect_retry_wait_time": "100"}
        async with await HedwigClient.connect(addresses, conf=pub_conf) as p, \
                await HedwigClient.connect(addresses, conf=sub_conf) as s:
            await p.publish(topic, b"claim")
            owner = cluster.hub_addresses.index(p.owner[topic])
            other = cluster.hub_addresses[1 - owner]
            delivered: list[bytes] = []

            async def handler(t: bytes, sub: bytes, m: Message) -> None:
                delivered.append(m.body)

            await s.subscribe(topic, b"idle")
            await s.start_delivery(topic, b"idle", handler)
            await p.publish(topic, b"before")
            await eventually(lambda: delivered == [b"before"])
            pid = cluster.hub_pid(owner)
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                while True:      # the publisher's own failover (test above); then one message for the subscriber
                    try:
                        await p.publish(topic, b"after")
                        break
                    except errors.PubSubError:
                        await asyncio.sleep(0.1)
                assert p.owner[topic] == other
                await eventually(lambda: b"after" in delivered, timeout=FAILOVER_BOUND + 10)
                assert s.subs[(topic, b"idle")].conn is s.conns[other]
                assert cluster.hub_addresses[owner] not in s.conns     # dropped while the old owner is stopped
            finally:
                os.kill(pid, signal.SIGCONT)
