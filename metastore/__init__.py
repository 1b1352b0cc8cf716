"""Quire's pluggable metadata store.

    from metastore import open_metastore, Value, Version, ALL_FIELDS, Order
    ms = await open_metastore("lmdb://data/metastore")

See ``metastore.api`` for the contract and ``metastore.sync`` for the
blocking facade.
"""

from metastore.api import (
    ALL_FIELDS,
    Counters,
    EventType,
    MetaStore,
    MetastoreCursor,
    MetastoreScannableTable,
    MetastoreTable,
    Order,
    Session,
    Value,
    Version,
    Versioned,
    WatchEvent,
)
from metastore.registry import open_existing_metastore, open_metastore

__all__ = [
    "ALL_FIELDS",
    "Counters",
    "EventType",
    "MetaStore",
    "MetastoreCursor",
    "MetastoreScannableTable",
    "MetastoreTable",
    "Order",
    "Session",
    "Value",
    "Version",
    "Versioned",
    "WatchEvent",
    "open_existing_metastore",
    "open_metastore",
]
