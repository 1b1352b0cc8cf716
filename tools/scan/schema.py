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

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
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
Entries = Sequence[tuple[str, Versioned]]
Columnar = Callable[[Entries, pa.Schema], list[pa.Array]]

_S, _L, _I, _B = StringType(), LongType(), IntegerType(), BinaryType()
_BYTES_MAP = MapType(_S, _B)


@dataclass(frozen=True)
class TableSpec:
    """How one table becomes rows: its decoded columns and the decoder that fills them."""

    table: str
    columns: tuple[tuple[str, DataType], ...]
    decode: Decoder
    fields: frozenset[str] | None = None  # metastore fields to fetch; None = all
    columnar: Columnar | None = None  # builds the Arrow columns of a batch directly (big tables)

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
            return (key, got.version.value, *([None] * len(self.columns)), _error(exc))
        return (key, got.version.value, *decoded, None)

    @property
    def arrow_schema(self) -> pa.Schema:
        return to_arrow_schema(self.schema)

    def batch(self, entries: Entries, arrow_schema: pa.Schema | None = None) -> pa.RecordBatch:
        """One Arrow record batch of ``entries``, the same values as ``row`` of each.

        Tables with a ``columnar`` builder (``ledgers``) append straight into
        flat column lists and build nested columns from offsets, so no tuple or
        list is made per row; the others go row by row.
        """
        schema = arrow_schema if arrow_schema is not None else self.arrow_schema
        if self.columnar is not None:
            arrays = self.columnar(entries, schema)
        else:
            rows = [self.row(k, got) for k, got in entries]
            columns: list[Sequence[Any]] = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
            arrays = [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


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


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _ledger_columns(entries: Entries, schema: pa.Schema) -> list[pa.Array]:
    """The ``ledgers`` batch column by column (``_ledger`` row by row gives the same values)."""
    keys: list[str] = []
    versions: list[int] = []
    ids: list[int | None] = []
    ens: list[int | None] = []
    wq: list[int | None] = []
    aq: list[int | None] = []
    states: list[str | None] = []
    last: list[int | None] = []
    lengths: list[int | None] = []
    digests: list[str | None] = []
    ctimes: list[int | None] = []
    errs: list[str | None] = []
    valid: list[bool] = []
    seg_offsets, bookie_offsets, prop_offsets = [0], [0], [0]
    firsts: list[int] = []
    bookies: list[str] = []
    prop_keys: list[str] = []
    prop_values: list[bytes] = []
    from_string, states_by_number = LedgerMetadataFormat.FromString, _LEDGER_STATES
    want_ensembles, want_properties = "ensembles" in schema.names, "properties" in schema.names
    for key, got in entries:
        keys.append(key)
        versions.append(got.version.value)
        try:
            m = from_string(_field(got.value, "data"))
            ledger_id = int(key)
        except Exception as exc:  # malformed: nulls and the reason, as ``TableSpec.row``
            for col in (ids, ens, wq, aq, states, last, lengths, digests, ctimes):
                col.append(None)
            errs.append(_error(exc))
            valid.append(False)
            seg_offsets.append(len(firsts))
            prop_offsets.append(len(prop_keys))
            continue
        ids.append(ledger_id)
        ens.append(m.ensemble_size)
        wq.append(m.write_quorum_size)
        aq.append(m.ack_quorum_size)
        states.append(states_by_number.get(m.state))
        last.append(m.last_entry_id)
        lengths.append(m.length)
        digests.append(m.digest_type)
        ctimes.append(m.ctime_ms)
        errs.append(None)
        valid.append(True)
        if want_ensembles:
            for seg in m.segments:
                firsts.append(seg.first_entry_id)
                bookies.extend(seg.ensemble)
                bookie_offsets.append(len(bookies))
            seg_offsets.append(len(firsts))
        if want_properties:
            if m.properties:
                for k, v in m.properties.items():
                    prop_keys.append(k)
                    prop_values.append(v)
            prop_offsets.append(len(prop_keys))
    mask = None if all(valid) else pa.array([not v for v in valid], pa.bool_())
    t = {f.name: f.type for f in schema}
    plain: dict[str, list[Any]] = {
        "key": keys, "version": versions, "ledger_id": ids, "ensemble_size": ens, "write_quorum": wq,
        "ack_quorum": aq, "state": states, "last_entry_id": last, "length": lengths, "digest_type": digests,
        "ctime_ms": ctimes, "error": errs}
    out: list[pa.Array] = []
    for name in schema.names:   # only the columns asked for (``spec_for(select=...)``)
        if name == "ensembles":
            segment_type = t[name].value_type
            segments = pa.StructArray.from_arrays(
                [pa.array(firsts, segment_type.field("first_entry").type),
                 pa.ListArray.from_arrays(pa.array(bookie_offsets, pa.int32()), pa.array(bookies, pa.string()),
                                          type=segment_type.field("bookies").type)],
                fields=list(segment_type))
            out.append(pa.ListArray.from_arrays(pa.array(seg_offsets, pa.int32()), segments, type=t[name], mask=mask))
        elif name == "properties":
            out.append(pa.MapArray.from_arrays(pa.array(prop_offsets, pa.int32()),
                                               pa.array(prop_keys, t[name].key_type),
                                               pa.array(prop_values, t[name].item_type), type=t[name], mask=mask))
        else:
            out.append(pa.array(plain[name], t[name]))
    return out


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


def _selected(spec: TableSpec, names: Sequence[str]) -> TableSpec:
    have = [name for name, _ in spec.columns]
    wanted = list(dict.fromkeys(n for n in names if n not in ("key", "version", "error")))
    unknown = [n for n in wanted if n not in have]
    if unknown:
        raise ValueError(f"table {spec.table!r} has no column {unknown[0]!r} (it has {', '.join(have)})")
    keep = [i for i, name in enumerate(have) if name in wanted]   # schema order
    full = spec.decode

    def decode(key: str, value: Value) -> Row:
        row = full(key, value)
        return tuple(row[i] for i in keep)

    return TableSpec(spec.table, tuple(spec.columns[i] for i in keep), decode, spec.fields, spec.columnar)


KNOWN: dict[str, TableSpec] = {
    "ledgers": TableSpec("ledgers", (
        ("ledger_id", _L), ("ensemble_size", _I), ("write_quorum", _I), ("ack_quorum", _I), ("state", _S),
        ("last_entry_id", _L), ("length", _L), ("digest_type", _S), ("ctime_ms", _L),
        ("ensembles", ArrayType(StructType([StructField("first_entry", _L), StructField("bookies", ArrayType(_S))]))),
        ("properties", _BYTES_MAP)), _ledger, frozenset({"data"}), _ledger_columns),
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


def spec_for(table: str, columns: Sequence[str] = (), select: Sequence[str] = ()) -> TableSpec:
    """The spec of a known table, else a generic one (``fields`` map, or one binary column per name in ``columns``).

    ``select`` keeps only those decoded columns of a known table (``key``,
    ``version`` and ``error`` always stay): Python data sources cannot
    prune columns on their own, and building (then converting in the JVM)
    nested columns a query never reads is most of a scan's cost.
    """
    if select:
        if table not in KNOWN or columns:
            raise ValueError(f"'columns' selects decoded columns of a known table ({', '.join(KNOWN)}); "
                             f"for {table!r} name the fields to read instead")
        return _selected(KNOWN[table], select)
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
