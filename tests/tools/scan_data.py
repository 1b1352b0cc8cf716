"""A small, fully known set of metadata records for the scan tests (written through metastore.sync)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bookie.proto.bookie_pb2 import BookieRegistrationRecord
from bookie.proto.ledger_metadata_pb2 import LedgerMetadataFormat
from hub.proto.pubsub_pb2 import (
    HubInfo,
    HubLoad,
    LedgerRanges,
    SubscriptionPreferences,
    SubscriptionState,
)
from metastore import Value, Version, sync

NOW_MS = 1_800_000_000_000
HOUR_MS = 3_600_000
REGISTERED = ["127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183", "127.0.0.1:3184"]
DEAD = "127.0.0.1:3189"
ADDRESSES = [*REGISTERED, DEAD]
BAD_LEDGER_KEY = f"{121:020d}"  # right after the 120 good ledgers


def ensembles_of(i: int) -> list[tuple[int, list[str]]]:
    """Ledger i: one segment on three consecutive addresses; every third ledger has a second segment."""
    segs = [(0, [ADDRESSES[(i + j) % 5] for j in range(3)])]
    if i % 3 == 0:
        segs.append((100, [ADDRESSES[(i + 3 + j) % 5] for j in range(3)]))
    return segs


@dataclass
class Dataset:
    ledgers: int
    topics: dict[str, list[tuple[int, int, int | None]]] = field(default_factory=dict)  # ledger, start, end
    subscriptions: dict[tuple[str, str], int] = field(default_factory=dict)  # consumed

    def ctime(self, i: int) -> int:
        return NOW_MS - 2 * HOUR_MS if i % 2 else NOW_MS - 60_000  # odd: two hours old, even: a minute


def populate(uri: str, ledgers: int = 120) -> Dataset:
    """Write the data set; returns what was written."""
    data = Dataset(ledgers)
    ms = sync.open_metastore(uri)
    try:
        led = ms.create_scannable_table("ledgers")
        for i in range(1, ledgers + 1):
            m = LedgerMetadataFormat(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
                                     state=LedgerMetadataFormat.CLOSED if i % 4 else LedgerMetadataFormat.OPEN,
                                     last_entry_id=i * 10 - 1, length=i * 1000, digest_type="crc32c",
                                     ctime_ms=data.ctime(i))
            m.properties["owner"] = b"t%d" % (i % 7)
            for first, bookies in ensembles_of(i):
                seg = m.segments.add()
                seg.first_entry_id = first
                seg.ensemble.extend(bookies)
            led.put(f"{i:020d}", Value({"data": m.SerializeToString()}), Version.NEW)
        led.put(BAD_LEDGER_KEY, Value({"data": b"\xff\xff\xff"}), Version.NEW)

        bk = ms.create_scannable_table("bookies")
        for n, addr in enumerate(REGISTERED):
            rec = BookieRegistrationRecord(address=addr, network_location=f"/r/rack{n % 2}",
                                           state=BookieRegistrationRecord.READ_ONLY if n == 3 else 0,
                                           free_disk=100 + n, total_disk=1000, registered_ms=NOW_MS)
            bk.put(addr, Value({"data": rec.SerializeToString()}), Version.NEW)

        tp = ms.create_scannable_table("topic_persistence")
        subs = ms.create_scannable_table("subscriptions")
        ledger = 1
        for t in range(4):
            topic = f"topic-{t}"
            ranges: list[tuple[int, int, int | None]] = []
            start = 1
            for _closed in range(t):  # topic-t has t closed ranges of 10 messages, then a current ledger
                ranges.append((ledger, start, start + 9))
                ledger, start = ledger + 1, start + 10
            ranges.append((ledger + 1000 if t == 3 else ledger, start, None))  # topic-3's current: no such ledger
            ledger += 1
            msg = LedgerRanges()
            for lid, s, e in ranges:
                r = msg.ranges.add(ledgerId=lid, startSeqIdIncluded=s)
                if e is not None:
                    r.endSeqIdIncluded.localComponent = e
            tp.put(topic, Value({"data": msg.SerializeToString()}), Version.NEW)
            data.topics[topic] = ranges
            for s_i, consumed in enumerate((0, 5, 40)):
                sub = f"sub-{s_i}"
                state = SubscriptionState()
                state.msgId.localComponent = consumed
                prefs = SubscriptionPreferences(messageBound=s_i * 10, messageFilter="f" if s_i == 2 else "")
                subs.put(f"{topic}\x00{sub}", Value({"state": state.SerializeToString(),
                                                     "preferences": prefs.SerializeToString()}), Version.NEW)
                data.subscriptions[(topic, sub)] = consumed

        hubs = ms.create_scannable_table("hubs")
        for h in range(2):
            info = HubInfo(hostname="127.0.0.1", port=4080 + h, sslPort=9876 + h, czxid=77 + h)
            hubs.put(f"127.0.0.1:{4080 + h}:{9876 + h}", Value({"data": info.SerializeToString(),
                                                              "load": HubLoad(numTopics=h + 2).SerializeToString()}),
                     Version.NEW)

        misc = ms.create_scannable_table("misc")
        for k in range(30):
            fields = {"a": b"A%d" % k} if k % 2 else {"a": b"A%d" % k, "b": b"B%d" % k}
            misc.put(f"misc/{k:03d}", Value(fields), Version.NEW)
    finally:
        ms.close()
    return data


def cursor_rows(uri: str, table: str) -> dict[str, tuple[int, dict[str, bytes]]]:
    """key -> (version, fields) by one plain cursor scan: what every Spark scan must match."""
    ms = sync.open_metastore(uri)
    try:
        cur = ms.create_scannable_table(table).open_cursor()
        out: dict[str, tuple[int, dict[str, bytes]]] = {}
        while cur.has_more():
            for key, got in cur.read_entries(500):
                out[key] = (got.version.value, dict(got.value))
        cur.close()
    finally:
        ms.close()
    return out
