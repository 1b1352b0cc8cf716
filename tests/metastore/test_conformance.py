"""The conformance kit against every built-in backend: lmdb (both write modes), real ZooKeeper, the HBase emulator."""

from __future__ import annotations

import uuid

import pytest

from metastore.testing.conformance import *  # noqa: F403  (collects the suite)


@pytest.fixture(params=["lmdb", "lmdb-inline", "zookeeper", "hbase"])
def conformance_uri(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "lmdb":
        return f"lmdb://{tmp_path_factory.mktemp('lmdb')}"
    if request.param == "lmdb-inline":
        return f"lmdb://{tmp_path_factory.mktemp('lmdb')}?write_mode=inline"
    if request.param == "zookeeper":
        server = request.getfixturevalue("zk_server")
        return f"zk://{server.connect_string}/conformance-{uuid.uuid4().hex[:8]}"
    gateway = request.getfixturevalue("hbase_gateway")
    return f"hbase://{gateway}/cf{uuid.uuid4().hex[:8]}"
