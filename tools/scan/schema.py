"""Spark schemas and record decoders for the metadata tables a scan knows.

    from tools.scan.schema import spec_for
    spec = spec_for("ledgers")                    # TableSpec
    spec.schema                                   # pyspark StructType: key, version, ..., error
    row = spec.row("00000000000000000007", versioned)   # one tuple in schema order

Every row starts with ``key`` (string) and ``version`` (long: the backend's
integer version, ``Version.value``) and ends with ``error`` (string, null
when the record decoded). A record that does not decode keeps its key,
version and the message in ``error``; its decoded columns are null, so a
malformed record is visible and loses nothing.

Known tables and their decoded columns (records as DESIGN.md section 3):

* ``ledgers`` (``data`` = ``LedgerMetadataFormat``): ``ledger_id``,
  ``ensemble_size``, ``write_quorum``, ``ack_quorum``, ``state``
  (OPEN/IN_RECOVERY/CLOSED), ``last_entry_id``, ``length``, ``digest_type``,
  ``ctime_ms``, ``ensembles`` (array of ``{first_entry, bookies}``),
  ``properties`` (map string -> binary).
* ``bookies`` (``data`` = ``BookieRegistrationRecord``): ``address``,
  ``network_location``, ``state`` (WRITABLE/READ_ONLY), ``free_disk``,
  ``total_disk``, ``registered_ms``.
* ``subscriptions`` (key ``topic \\x00 subscriber``; ``state`` =
  ``SubscriptionState``, ``preferences`` = ``SubscriptionPreferences``):
  ``topic``, ``subscriber``, ``consumed_seq_id``, ``message_bound``,
  ``message_filter``, ``message_window_size``, ``options``.
* ``topic_persistence`` (key topic; ``data`` = ``LedgerRanges``): ``topic``,
  ``ranges`` (array of ``{ledger_id, start_seq_id, end_seq_id}``,
  ``end_seq_id`` null for the topic's current ledger).
* ``hubs`` (key ``host:port:sslport``; ``data`` = ``HubInfo``, ``load`` =
  ``HubLoad``): ``hostname``, ``port``, ``ssl_port``, ``czxid``,
  ``num_topics``.

Any other table: ``fields`` (map string -> binary, every field of the
record) or, when the caller names the fields (``columns=["a", "b"]``), one
binary column per named field (null when a record lacks it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from bookie.proto.bookie_pb2 import BookieRegistrationRecord
from bookie.proto.ledger_metadata_pb2 import LedgerMetadataFormat
from hub.proto.pubsub_pb2 import HubInfo, HubLoad, LedgerRanges, SubscriptionPreferences, SubscriptionState
from metastore import Value, Versioned

Row = tuple[Any, ...]
Decoder = Callable[[str, Value], Row]

_S, _L, _I, _B = StringType(), LongType(), IntegerType(), BinaryType()
_BYTES_MAP = MapType(_S, _B)


@dataclass(frozen=True)
class TableSpec:
    """How one table becomes rows: its decoded columns and the decoder that fills them."""

    table: str
    columns: tuple[tuple[str, DataType], ...]
    decode: Decoder
    fields: frozenset[str] | None = None  # metastore fields to fetch; None = all

    @property
    def schema(self) -> StructType:
        cols = [StructField("key", _S, False), StructField("version", _L, False)]
        cols += [StructField(name, tp, True) for name, tp in self.columns]
        cols.append(StructField("error", _S, True))
        return StructType(cols)

    def row(self, key: str, got: Versioned) -> Row:
        """``(key, version, *decoded, error)``; never raises for a malformed record."""
        try:
            decoded = self.decode(key, got.value)
        except Exception as exc:  # any malformed record: report it in the row, keep scanning
            return (key, got.version.value, *([None] * len(self.columns)), f"{type(exc).__name__}: {exc}")
        return (key, got.version.value, *decoded, None)


def _field(value: Value, name: str) -> bytes:
    raw = value.get(name)
    if raw is None:
        raise ValueError(f"record has no {name!r} field")
    return raw


_LEDGER_STATES = {v: k for k, v in LedgerMetadataFormat.State.items()}
_BOOKIE_STATES = {v: k for k, v in BookieRegistrationRecord.State.items()}


def _ledger(key: str, value: Value) -> Row:
    m = LedgerMetadataFormat.FromString(_field(value, "data"))
    return (int(key), m.ensemble_size, m.write_quorum_size, m.ack_quorum_size, _LEDGER_STATES.get(m.state),
            m.last_entry_id, m.length, m.digest_type, m.ctime_ms,
            [(s.first_entry_id, list(s.ensemble)) for s in m.segments], dict(m.properties))


def _bookie(key: str, value: Value) -> Row:
    r = BookieRegistrationRecord.FromString(_field(value, "data"))
    return (r.address or key, r.network_location, _BOOKIE_STATES.get(r.state), r.free_disk, r.total_disk,
            r.registered_ms)


def split_subscription_key(key: str) -> tuple[str, str]:
    """``topic \\x00 subscriber`` -> ``(topic, subscriber)``; ``ValueError`` without the separator."""
    topic, sep, subscriber = key.partition("\x00")
    if not sep:
        raise ValueError("subscription key has no \\x00 between topic and subscriber")
    return topic, subscriber


def _subscription(key: str, value: Value) -> Row:
    topic, subscriber = split_subscription_key(key)
    state = SubscriptionState.FromString(value.get("state") or b"")
    prefs = SubscriptionPreferences.FromString(value.get("preferences") or b"")
    bound = prefs.messageBound or state.messageBound
    return (topic, subscriber, state.msgId.localComponent, bound, prefs.messageFilter, prefs.messageWindowSize,
            {e.key: e.value for e in prefs.options.entries})


def _topic_persistence(key: str, value: Value) -> Row:
    ranges = LedgerRanges.FromString(_field(value, "data"))
    return (key, [(r.ledgerId, r.startSeqIdIncluded,
                   r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded") else None)
                  for r in ranges.ranges])


def _hub(key: str, value: Value) -> Row:
    info = HubInfo.FromString(_field(value, "data"))
    load = HubLoad.FromString(value.get("load") or b"")
    return (info.hostname, info.port, info.sslPort, info.czxid, load.numTopics)


def _all_fields(key: str, value: Value) -> Row:
    return (dict(value),)


KNOWN: dict[str, TableSpec] = {
    "ledgers": TableSpec("ledgers", (
        ("ledger_id", _L), ("ensemble_size", _I), ("write_quorum", _I), ("ack_quorum", _I), ("state", _S),
        ("last_entry_id", _L), ("length", _L), ("digest_type", _S), ("ctime_ms", _L),
        ("ensembles", ArrayType(StructType([StructField("first_entry", _L), StructField("bookies", ArrayType(_S))]))),
        ("properties", _BYTES_MAP)), _ledger, frozenset({"data"})),
    "bookies": TableSpec("bookies", (
        ("address", _S), ("network_location", _S), ("state", _S), ("free_disk", _L), ("total_disk", _L),
        ("registered_ms", _L)), _bookie, frozenset({"data"})),
    "subscriptions": TableSpec("subscriptions", (
        ("topic", _S), ("subscriber", _S), ("consumed_seq_id", _L), ("message_bound", _L), ("message_filter", _S),
        ("message_window_size", _L), ("options", _BYTES_MAP)), _subscription, frozenset({"state", "preferences"})),
    "topic_persistence": TableSpec("topic_persistence", (
        ("topic", _S),
        ("ranges", ArrayType(StructType([StructField("ledger_id", _L), StructField("start_seq_id", _L),
                                         StructField("end_seq_id", _L)])))), _topic_persistence, frozenset({"data"})),
    "hubs": TableSpec("hubs", (
        ("hostname", _S), ("port", _I), ("ssl_port", _I), ("czxid", _L), ("num_topics", _L)),
        _hub, frozenset({"data", "load"})),
}


def spec_for(table: str, columns: Sequence[str] = ()) -> TableSpec:
    """The spec of a known table, else a generic one (``fields`` map, or one binary column per name in ``columns``)."""
    if table in KNOWN and not columns:
        return KNOWN[table]
    if columns:
        names = tuple(dict.fromkeys(columns))
        bad = [n for n in names if n in ("key", "version", "error") or not n]
        if bad:
            raise ValueError(f"column name {bad[0]!r} is reserved or empty")

        def _named(key: str, value: Value) -> Row:
            return tuple(value.get(n) for n in names)

        return TableSpec(table, tuple((n, _B) for n in names), _named, frozenset(names))
    return TableSpec(table, (("fields", _BYTES_MAP),), _all_fields)
