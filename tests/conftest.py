"""Shared fixtures.

Real components only: ``tests.fixtures.zookeeper`` starts the Debian
ZooKeeper jars on a free loopback port; ``tests.fixtures.hbase`` starts the
HBase Thrift1 gateway emulator (a test double) or uses a real gateway named by
``QUIRE_HBASE_THRIFT=host:port``.
"""

pytest_plugins = [
    "tests.fixtures.zookeeper",
    "tests.fixtures.hbase",
]
