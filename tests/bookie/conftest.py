"""Fixtures for the bookie tests: real ``quire bookie`` OS processes and raw-protocol clients.

``start_bookie(name, **settings)`` writes a conf (free port, its own data
directory, the test's lmdb metastore, GC off unless asked) and returns a
``BookieProcess`` once it printed its ready line; every process is killed
at teardown. ``shared_bookie`` is one process for a whole module, for tests
that only talk to it. ``server`` is a ``BookieServer`` in the test's own
process (``start_server``), for tests that watch or patch its insides.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bookie import protocol as proto
from bookie.conf import BookieConf
from bookie.digest import encode_entry, master_key
from bookie.server import BookieServer
from bookie.storage import EntryStorage
from bookie.testing import BookieProcess, RawBookieClient

KEY = master_key(b"password")
StartBookie = Callable[..., BookieProcess]
WAIT = 10.0  # every await of an answer is bounded by this


async def start_server(tmp_path: Path, **settings: Any) -> BookieServer:
    """A started ``BookieServer`` in this process: a free port, data and lmdb metastore under ``tmp_path``,
    GC and the HTTP server off, then ``settings``."""
    props = {"bookie_port": "0", "ledger_directories": str(tmp_path / "data"),
             "metastore_uri": f"lmdb://{tmp_path / 'meta'}", "gc_wait_time": "0", "http_server_port": "-1",
             "ledger_storage_map_size": str(64 << 20), **{k: str(v) for k, v in settings.items()}}
    srv = BookieServer(BookieConf.from_properties(props))
    await srv.start()
    return srv


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BookieServer]:
    srv = await start_server(tmp_path)
    try:
        yield srv
    finally:
        await srv.stop()


def bookie_settings(root: Path, meta_uri: str, **settings: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "bookie_port": 0,
        "ledger_directories": root / "data",
        "metastore_uri": meta_uri,
        "gc_wait_time": 0,
        "session_timeout": 2000,
    }
    base.update(settings)
    return base


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[EntryStorage]:
    """A fresh entry store (small map) closed after the test."""
    s = EntryStorage(tmp_path / "s", map_size=64 << 20)
    yield s
    await s.close()


@pytest.fixture
def metastore_uri(tmp_path: Path) -> str:
    return f"lmdb://{tmp_path / 'meta'}"


@pytest.fixture
def start_bookie(tmp_path: Path, metastore_uri: str) -> Iterator[StartBookie]:
    procs: list[BookieProcess] = []

    def start(name: str = "bookie", **settings: Any) -> BookieProcess:
        root = tmp_path / name
        root.mkdir(exist_ok=True)
        conf = BookieProcess.write_conf(root / "bk_server.conf",
                                        bookie_settings(root, metastore_uri, **settings))
        proc = BookieProcess(conf, root / "bookie.log")
        procs.append(proc)
        return proc.start()

    yield start
    for p in procs:
        p.kill()


@pytest.fixture(scope="module")
def shared_bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    root = tmp_path_factory.mktemp("shared-bookie")
    conf = BookieProcess.write_conf(root / "bk_server.conf",
                                    bookie_settings(root, f"lmdb://{root / 'meta'}", max_frame_size=65536))
    proc = BookieProcess(conf, root / "bookie.log").start()
    yield proc
    proc.kill()


@pytest.fixture
async def client(shared_bookie: BookieProcess) -> AsyncIterator[RawBookieClient]:
    c = await RawBookieClient.connect(shared_bookie.address)
    yield c
    await c.close()


def add_req(ledger_id: int, entry_id: int, body: bytes = b"data", *, key: bytes = KEY, lac: int = -1,
            recovery: bool = False) -> proto.Request:
    payload = encode_entry(ledger_id, entry_id, lac, len(body) * (entry_id + 1), body)
    return proto.add_request(0, ledger_id, entry_id, key, payload, recovery=recovery)
