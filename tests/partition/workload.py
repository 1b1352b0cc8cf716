"""A partition test's client, run on a test host: ``python -m tests.partition.workload publish|subscribe ...``.

It writes its history as JSON lines (see ``tests.partition.checker``) to
``--out``, one line per event, flushed at once, so a history survives the
process being killed. It prints ``workload ready`` once connected (a
subscriber: once subscribed) and runs until its standard input closes or
reads ``stop``.

``publish``: message N of producer P has body ``P-N`` and sequence id N
(exactly-once publishing); a publish that fails is retried with the same
sequence id until it is acknowledged, so the owner stores it at most once.
``subscribe``: records every message its handler receives.
``queue``: a consumer of the SHARED subscription ``--subscriber`` named
``--consumer``; records each message handed to it (``recv``) and each ack
it sent (``acked``), the work-queue history ``checker.check_queue`` reads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any, TextIO

from hub.client import HedwigClient
from hub.message import Message
from tools.launch import die_with_parent

log = logging.getLogger("tests.partition.workload")


def _record(out: TextIO, **event: Any) -> None:
    event["t"] = time.monotonic()
    out.write(json.dumps(event) + "\n")
    out.flush()


async def _stopped(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line or line.strip() == b"stop":
            stop.set()
            return


async def _client(args: argparse.Namespace) -> HedwigClient:
    conf = {"server_ack_response_timeout": str(args.ack_timeout_ms), "subscribe_reconnect_retry_wait_time": "200"}
    deadline = time.monotonic() + 30
    while True:
        try:
            return await HedwigClient.connect(args.hubs, conf)
        except Exception as exc:  # the hub may still be starting on its host
            if time.monotonic() > deadline:
                raise
            log.info("connect: %s", exc)
            await asyncio.sleep(0.2)


async def publish(args: argparse.Namespace, out: TextIO, stop: asyncio.Event) -> None:
    client = await _client(args)
    print("workload ready", flush=True)
    producer = args.producer
    n = 0
    try:
        while not stop.is_set() and (args.count == 0 or n < args.count):
            n += 1
            body = f"{producer}-{n}"
            while True:
                _record(out, op="attempt", producer=producer, n=n, body=body)
                try:
                    seq = await client.publish(args.topic.encode(), body.encode(), producer=producer.encode(),
                                               sequence_id=n)
                except Exception as exc:
                    _record(out, op="fail", producer=producer, n=n, body=body, error=f"{type(exc).__name__}: {exc}")
                    if stop.is_set():
                        return
                    await asyncio.sleep(0.1)
                    continue
                _record(out, op="ack", producer=producer, n=n, body=body, seq=seq)
                break
            if args.interval:
                await asyncio.sleep(args.interval)
    finally:
        await client.close()


async def subscribe(args: argparse.Namespace, out: TextIO, stop: asyncio.Event) -> None:
    client = await _client(args)
    topic, sub = args.topic.encode(), args.subscriber.encode()

    async def handler(t: bytes, s: bytes, m: Message) -> None:
        _record(out, op="deliver", sub=args.subscriber, seq=m.seq_id, body=m.body.decode())

    while True:
        try:
            await client.subscribe(topic, sub)
            break
        except Exception as exc:
            log.info("subscribe: %s", exc)
            await asyncio.sleep(0.2)
    await client.start_delivery(topic, sub, handler)
    print("workload ready", flush=True)
    try:
        await stop.wait()
    finally:
        await client.close()


async def queue(args: argparse.Namespace, out: TextIO, stop: asyncio.Event) -> None:
    client = await _client(args)
    topic, sub, name = args.topic.encode(), args.subscriber.encode(), args.consumer
    while True:
        try:
            consumer = await client.consumer(topic, sub, subscription_type="SHARED", receiver_queue_size=20)
            break
        except Exception as exc:
            log.info("consumer: %s", exc)
            await asyncio.sleep(0.2)
    print("workload ready", flush=True)

    async def work() -> None:
        while True:
            try:
                msg = await consumer.receive()
            except Exception as exc:   # closed by the hub: nothing more comes to this consumer
                log.info("receive: %s", exc)
                return
            _record(out, op="recv", consumer=name, seq=msg.seq_id, count=msg.redelivery_count)
            if args.interval:
                await asyncio.sleep(args.interval)
            try:
                await consumer.ack(msg)
            except Exception as exc:
                log.info("ack %d: %s", msg.seq_id, exc)
                continue
            _record(out, op="acked", consumer=name, seq=msg.seq_id)

    worker = asyncio.create_task(work())
    try:
        await stop.wait()
    finally:
        worker.cancel()
        await client.close()


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    watcher = asyncio.create_task(_stopped(stop))
    with open(args.out, "a") as out:
        try:
            await {"publish": publish, "subscribe": subscribe, "queue": queue}[args.role](args, out, stop)
        finally:
            watcher.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["publish", "subscribe", "queue"])
    p.add_argument("--hubs", required=True, help="host:port[,host:port]")
    p.add_argument("--topic", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--producer", default="p")
    p.add_argument("--subscriber", default="s")
    p.add_argument("--consumer", default="c", help="queue: this consumer's name in the history")
    p.add_argument("--count", type=int, default=0, help="publishes (0: until stopped)")
    p.add_argument("--interval", type=float, default=0.0, help="seconds between publishes")
    p.add_argument("--ack-timeout-ms", type=int, default=30000)
    die_with_parent()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main(p.parse_args()))
