"""The raw clients the metastore benchmark compares against (same operations, no Quire layer).

Each raw client offers blocking ``put(key, data)``, ``get(key)`` and
``scan() -> count`` on its own namespace, using the backend's library
directly: an LMDB write transaction committed with sync, kazoo ``set``/``get``,
happybase ``put``/``row``. Living in ``metastore`` keeps the rule that nothing
above ``metastore/`` imports lmdb, kazoo or happybase.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Protocol
from urllib.parse import urlsplit


class RawClient(Protocol):
    name: str

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def scan(self) -> int: ...

    def close(self) -> None: ...


class RawLmdb:
    name = "raw lmdb txn"

    def __init__(self, path: str) -> None:
        import lmdb

        os.makedirs(path, exist_ok=True)
        self.env = lmdb.open(path, map_size=1 << 30, sync=True, metasync=True, max_dbs=2)
        self.db = self.env.open_db(b"raw")

    def put(self, key: str, data: bytes) -> None:
        with self.env.begin(write=True, db=self.db) as txn:
            txn.put(key.encode(), data)

    def get(self, key: str) -> bytes:
        with self.env.begin(db=self.db) as txn:
            return bytes(txn.get(key.encode()) or b"")

    def scan(self) -> int:
        n = 0
        with self.env.begin(db=self.db) as txn:
            for _k, _v in txn.cursor():
                n += 1
        return n

    def close(self) -> None:
        self.env.close()


class RawKazoo:
    name = "raw kazoo"

    def __init__(self, hosts: str) -> None:
        from kazoo.client import KazooClient

        self.zk: Any = KazooClient(hosts=hosts, timeout=10.0)
        self.zk.start(timeout=10)
        self.root = f"/quire-rawbench-{uuid.uuid4().hex[:8]}"
        self.zk.ensure_path(self.root)

    def put(self, key: str, data: bytes) -> None:
        from kazoo.exceptions import NoNodeError

        path = f"{self.root}/{key}"
        try:
            self.zk.set(path, data)
        except NoNodeError:
            self.zk.create(path, data)

    def get(self, key: str) -> bytes:
        return bytes(self.zk.get(f"{self.root}/{key}")[0])

    def scan(self) -> int:
        children = self.zk.get_children(self.root)
        for c in children:
            self.zk.get(f"{self.root}/{c}")
        return len(children)

    def close(self) -> None:
        self.zk.delete(self.root, recursive=True)
        self.zk.stop()
        self.zk.close()


class RawHappybase:
    name = "raw happybase thrift"

    def __init__(self, host: str, port: int) -> None:
        import happybase

        self.conn: Any = happybase.Connection(host=host, port=port, autoconnect=True)
        self.table_name = f"rawbench_{uuid.uuid4().hex[:8]}"
        self.conn.create_table(self.table_name, {"f": {}})
        self.table = self.conn.table(self.table_name)

    def put(self, key: str, data: bytes) -> None:
        self.table.put(key.encode(), {b"f:v": data})

    def get(self, key: str) -> bytes:
        return bytes(self.table.row(key.encode())[b"f:v"])

    def scan(self) -> int:
        return sum(1 for _ in self.table.scan(batch_size=1000))

    def close(self) -> None:
        self.conn.delete_table(self.table_name, disable=True)
        self.conn.close()


def lmdb_decoding_scan(path: str, table: str) -> int:
    """Walk a Quire lmdb table with a raw LMDB cursor, decoding every record; returns the count.

    The fair peer of a Quire cursor scan: one read transaction, and for each
    record the same work a caller needs to use it (the ``str`` key, the
    8-byte big-endian version, the protobuf ``Record`` as a ``dict``), with
    none of Quire's layers. The store must not be open in this process
    (LMDB forbids opening one environment twice).
    """
    import struct

    import lmdb

    from metastore.proto.metastore_pb2 import Record

    version = struct.Struct(">Q").unpack_from
    parse = Record.FromString
    env = lmdb.open(path, max_dbs=2, subdir=True, readonly=True, lock=True)
    try:
        db = env.open_db(("t:" + table).encode(), create=False)
        n = 0
        with env.begin(db=db) as txn:
            for k, raw in txn.cursor():
                _entry = (k.decode("utf-8", "surrogatepass"), version(raw)[0], dict(parse(raw[8:]).fields))
                n += 1
        return n
    finally:
        env.close()


def raw_client_for(uri: str) -> RawClient:
    """The raw client for the backend named by ``uri`` (its own namespace beside the store's)."""
    parts = urlsplit(uri)
    if parts.scheme == "lmdb":
        return RawLmdb((parts.netloc + parts.path).rstrip("/") + "-raw")
    if parts.scheme in ("zk", "zookeeper"):
        return RawKazoo(parts.netloc)
    if parts.scheme == "hbase":
        return RawHappybase(parts.hostname or "127.0.0.1", parts.port or 9090)
    raise ValueError(f"no raw client for scheme {parts.scheme!r}")
