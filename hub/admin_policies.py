"""The admin API's lifecycle-policies resource (``hub.policies``), served with the rest of ``hub.admin``.

===========================================  ==========================================================
``GET /admin/v1/policies``                   every stored policy: a JSON object ``{prefix: {key: value}}``,
                                             sorted by prefix
``GET /admin/v1/policies/{prefix}``          the keys stored for exactly that prefix (404: none)
``PUT /admin/v1/policies/{prefix}``          a JSON object of policy keys: exactly these keys for the prefix
                                             (``{}`` removes them); answers what is stored
``DELETE /admin/v1/policies/{prefix}``       remove the prefix's policy; answers what it was (404: none)
===========================================  ==========================================================

``prefix`` is the rest of the path, URL-encoded UTF-8 (it may hold ``/``;
empty: every topic, ``/admin/v1/policies/``). A topic takes each key from
the longest matching prefix that sets it, else from the hub conf (the topic
stats show the result as ``policy``). PUT and DELETE need the admin token
like every mutating verb (``http_admin_token``, else 401). The hub answering
re-reads the policies at once; the others within their
``policies_refresh_interval``.

Failure: a bad body, an unknown key or ``backlog_quota_policy``, a value
out of range (a negative size) or a prefix that is not valid UTF-8 is 400
``{"error": ..., "key": the key at fault}``; nothing is stored and the hub
goes on serving. A metastore failure is 503.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from bookie.http import RequestHandler, errors_as_statuses, json_response
from hub import errors
from hub.policies import PolicyError, check_prefix
from hub.policy_store import PolicyStore

if TYPE_CHECKING:
    from metastore.api import MetaStore

__all__ = ["PoliciesAdmin", "PoliciesHost"]

BASE = "/admin/v1/policies"


class PoliciesHost(Protocol):
    """What ``PoliciesAdmin`` uses of its hub (a started ``hub.server.HubServer``; its ``policies``, a
    ``hub.policy_store.PolicyCache``, are re-read after a change when it has them)."""

    @property
    def store(self) -> MetaStore: ...


class PoliciesAdmin:
    """See the module docstring. ``server`` is a started ``hub.server.HubServer`` (``PoliciesHost``)."""

    def __init__(self, server: PoliciesHost) -> None:
        self.server = server
        self._store: PolicyStore | None = None

    def routes(self) -> list[web.RouteDef]:
        path = BASE + "/{prefix:.*}"
        return [
            web.get(BASE, self._wrap(self.list_policies)),
            web.get(path, self._wrap(self.get_policy)),
            web.put(path, self._wrap(self.put_policy)),
            web.delete(path, self._wrap(self.delete_policy)),
        ]

    @staticmethod
    def _wrap(handler: RequestHandler) -> RequestHandler:
        async def run(request: web.Request) -> web.Response:
            try:
                return await handler(request)
            except PolicyError as exc:
                return json_response({"error": str(exc), "key": exc.key}, 400)

        return errors_as_statuses(run, ((LookupError, 404), (errors.PubSubError, 503)))

    def store(self) -> PolicyStore:
        if self._store is None:
            self._store = PolicyStore(self.server.store)
        return self._store

    @staticmethod
    def _prefix(request: web.Request) -> str:
        """The prefix from the raw path (so a %-escape that is not UTF-8 is caught, not replaced)."""
        raw = request.raw_path.split("?", 1)[0]
        return check_prefix(urllib.parse.unquote_to_bytes(raw[len(BASE) + 1:]))

    async def _changed(self) -> None:
        policies = getattr(self.server, "policies", None)
        if policies is not None:
            await policies.refresh()

    async def list_policies(self, request: web.Request) -> web.Response:
        return json_response(await self.store().policies())

    async def get_policy(self, request: web.Request) -> web.Response:
        prefix = self._prefix(request)
        got = await self.store().get(prefix)
        if got is None:
            raise LookupError(f"no policy on prefix {prefix!r}")
        return json_response(got)

    async def put_policy(self, request: web.Request) -> web.Response:
        prefix = self._prefix(request)
        try:
            body = json.loads(await request.read() or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise PolicyError("body", f"bad JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise PolicyError("body", "expected a JSON object of policy keys")
        stored = await self.store().put(prefix, body)
        await self._changed()
        return json_response(stored)

    async def delete_policy(self, request: web.Request) -> web.Response:
        removed = await self.store().delete(self._prefix(request))
        await self._changed()
        return json_response(removed)
