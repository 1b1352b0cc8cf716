"""metastore.lease.LeaseRegistry: a session whose record is gone is dead for good, and read once (issue 34)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from metastore import Value, Version
from metastore.api import Versioned
from metastore.errors import BadVersionError, NoKeyError
from metastore.lease import LeaseRegistry
from metastore.proto.metastore_pb2 import LeaseRecord


class Sessions:
    """The sessions table as the registry uses it (``get``, ``remove``), counting reads."""

    def __init__(self) -> None:
        self.records: dict[str, Versioned] = {}
        self.gets = 0
        self.refuse_removal = False

    def lease(self, session_id: str, expires: float) -> None:
        rec = LeaseRecord(expires_ms=int(expires * 1000), owner=session_id).SerializeToString()
        self.records[session_id] = Versioned(Value({"lease": rec}), Version(len(self.records) + 1))

    async def get(self, key: str) -> Versioned:
        self.gets += 1
        if key not in self.records:
            raise NoKeyError(key)
        return self.records[key]

    async def remove(self, key: str, version: Version) -> None:
        if self.refuse_removal:
            raise BadVersionError(key)
        del self.records[key]


def _registry(sessions: Sessions) -> LeaseRegistry:
    table: Any = sessions
    return LeaseRegistry(table)


def test_a_missing_session_record_is_read_once() -> None:
    sessions = Sessions()
    leases = _registry(sessions)
    assert asyncio.run(leases.expired("gone")) and asyncio.run(leases.expired("gone"))
    assert sessions.gets == 1


def test_an_expired_session_swept_is_read_once_but_one_whose_sweep_failed_is_read_again() -> None:
    sessions = Sessions()
    sessions.lease("swept", time.time() - 1)
    sessions.lease("renewed", time.time() - 1)
    leases = _registry(sessions)
    assert asyncio.run(leases.expired("swept")) and "swept" not in sessions.records
    assert asyncio.run(leases.expired("swept")) and sessions.gets == 1
    sessions.refuse_removal = True     # its holder renewed meanwhile: the record stays, and is read again
    assert asyncio.run(leases.expired("renewed"))
    sessions.lease("renewed", time.time() + 60)
    assert not asyncio.run(leases.expired("renewed")) and sessions.gets == 3


def test_a_live_session_is_not_expired() -> None:
    sessions = Sessions()
    sessions.lease("live", time.time() + 60)
    assert not asyncio.run(_registry(sessions).expired("live"))
