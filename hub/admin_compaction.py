"""The admin API's compaction resource (``hub.compaction``), served with the rest of ``hub.admin``.

==================================================  ===================================================
``POST /admin/v1/topics/{topic}/compact``           compact the topic now on its owner and answer when
                                                    done: 200 with the compaction status (below); a run
                                                    already in progress is joined, not started twice
``POST /admin/v1/topics/{topic}/compact?wait=false``  start it and answer at once: 202 with the status
                                                    (``"status": "running"``); poll the next one
``GET /admin/v1/topics/{topic}/compaction``         the status
==================================================  ===================================================

The status (also the ``compaction`` object of the topic stats) is
``{"topic", "status": "running" | "idle" (null when no hub owns the topic),
"ledger_id", "compacted_up_to_seq_id", "last_run_ms", "messages",
"pending_ledger_id", "last_error"}``; while running also
``running_up_to_seq_id``, ``entries_written`` and ``paused``. ``ledger_id``
is null before the first compaction; ``last_error`` is the last run's
failure on this owner (null after a success). A topic with nothing new
since its compaction point answers 200 at once with the status unchanged.

Like every mutating verb, POST needs the admin token (``http_admin_token``).
A topic another hub owns is forwarded to it; one no hub owns is loaded by
the hub asked (the owner compacts). Failure: an unknown topic is 404, a
bad ``wait`` 400, a run that fails 503 ``{"error": ...}`` (its half-written
ledger is never used: ``hub.compaction``); the hub goes on serving.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from bookie.http import HttpError, json_response
from hub.compaction import state_json
from hub.proto import pubsub_pb2 as pb

if TYPE_CHECKING:
    from bookie.http import RequestHandler
    from hub.metadata import TopicPersistenceManager
    from hub.topic import Topic

__all__ = ["CompactionAdmin", "CompactionHost", "TopicAdmin", "stored_status"]

BASE = "/admin/v1/topics/{topic}"
_WAIT = {"": True, "1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def stored_status(ranges: pb.LedgerRanges) -> dict[str, Any]:
    """The status of a topic no hub here owns, from its record (``status`` null: only the owner knows)."""
    return {"status": None, **state_json(ranges.compaction), "last_error": None}


class CompactionHost(Protocol):
    """What ``CompactionAdmin`` uses of the hub (a ``hub.server.HubServer``, through ``hub.admin.AdminHost``)."""

    topics: dict[bytes, Topic]
    pm: TopicPersistenceManager

    def track(self, task: asyncio.Task[Any]) -> None: ...

    async def topic(self, topic: bytes, should_claim: bool) -> Topic: ...


class TopicAdmin(Protocol):
    """What ``CompactionAdmin`` uses of the topics' admin resource (a ``hub.admin.HubAdmin``): its hub, names
    and forwarding to the owner."""

    @property
    def server(self) -> CompactionHost: ...

    def _wrap(self, handler: RequestHandler) -> RequestHandler: ...

    def _topic(self, request: web.Request) -> bytes: ...

    async def _owner_elsewhere(self, topic: bytes) -> str | None: ...

    async def _forwarded(self, request: web.Request, topic: bytes) -> web.Response | None: ...

    async def _exists(self, topic: bytes) -> bool: ...


class CompactionAdmin:
    """See the module docstring; ``admin`` is the ``hub.admin.HubAdmin`` whose names and forwarding it uses."""

    def __init__(self, admin: TopicAdmin) -> None:
        self.admin = admin
        self.server = admin.server

    def routes(self) -> list[web.RouteDef]:
        return [web.post(BASE + "/compact", self.admin._wrap(self.compact)),
                web.get(BASE + "/compaction", self.admin._wrap(self.status))]

    async def _load(self, topic: bytes) -> Topic:
        """The owned topic, loading it here when no hub owns it; 404 / 409 otherwise."""
        server = self.server
        t = server.topics.get(topic)
        if t is not None:
            return t
        owner = await self.admin._owner_elsewhere(topic)
        if owner is not None:
            raise HttpError(409, f"topic {_name(topic)!r} is owned by hub {owner}, which cannot be reached")
        if not await self.admin._exists(topic):
            raise HttpError(404, f"no topic {_name(topic)!r}")
        return await server.topic(topic, True)

    async def compact(self, request: web.Request) -> web.Response:
        topic = self.admin._topic(request)
        raw = request.query.get("wait", "").strip().lower()
        if raw not in _WAIT:
            raise HttpError(400, f"wait must be true or false, not {request.query.get('wait')!r}")
        forwarded = await self.admin._forwarded(request, topic)
        if forwarded is not None:
            return forwarded
        t = await self._load(topic)
        task = t.compaction.start()
        self.server.track(task)       # cancelled if the hub stops first
        if not _WAIT[raw]:
            return json_response({"topic": _name(topic), **t.compaction.status()}, 202)
        error = await asyncio.shield(task)
        if error is not None:
            raise HttpError(503, f"compaction of topic {_name(topic)!r} failed: {error}")
        return json_response({"topic": _name(topic), **t.compaction.status()})

    async def status(self, request: web.Request) -> web.Response:
        topic = self.admin._topic(request)
        t = self.server.topics.get(topic)
        if t is not None:
            return json_response({"topic": _name(topic), **t.compaction.status()})
        forwarded = await self.admin._forwarded(request, topic)
        if forwarded is not None:
            return forwarded
        got = await self.server.pm.read_topic_persistence_info(topic)
        if got is None and not await self.admin._exists(topic):
            raise HttpError(404, f"no topic {_name(topic)!r}")
        return json_response({"topic": _name(topic), **stored_status(got[0] if got else pb.LedgerRanges())})


def _name(topic: bytes) -> str:
    return topic.decode("utf-8", "backslashreplace")
