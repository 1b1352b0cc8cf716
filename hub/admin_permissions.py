"""The admin API's permissions resource (``hub.permissions``), served with the rest of ``hub.admin``.

=================================================  ====================================================
``GET /admin/v1/permissions[?role=ROLE]``          every grant (or one role's): a JSON list of
                                                   ``{role, prefix, actions}``, sorted
``PUT /admin/v1/permissions/{role}/{prefix}``      ``{"actions": ["produce", "consume"]}``: exactly these
                                                   actions for the role on the prefix; the grant
``DELETE /admin/v1/permissions/{role}/{prefix}``   revoke every action (``?action=produce``: that one);
                                                   what is left, ``{role, prefix, actions}``
=================================================  ====================================================

``prefix`` is the rest of the path, URL-encoded (it may hold ``/``; empty:
every topic, ``/admin/v1/permissions/ROLE/``). PUT and DELETE need the
admin token like every mutating verb (``http_admin_token``, else 401). The
hub answering re-reads the grants at once; the others within their
``permissions_refresh_interval``.

Failure: a bad body or action is 400 naming it; revoking a grant the role
does not hold is 404; a metastore failure 503.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from bookie.http import HttpError, RequestHandler, errors_as_statuses, json_body, json_response
from hub import errors
from hub.permissions import Authorizer, Grant, PermissionStore

if TYPE_CHECKING:
    from metastore.api import MetaStore

__all__ = ["PermissionsAdmin", "PermissionsHost"]


class PermissionsHost(Protocol):
    """What ``PermissionsAdmin`` uses of its hub (a started ``hub.server.HubServer``)."""

    @property
    def store(self) -> MetaStore: ...

    @property
    def authorizer(self) -> Authorizer | None: ...


class PermissionsAdmin:
    """See the module docstring. ``server`` is a started ``hub.server.HubServer`` (``PermissionsHost``)."""

    def __init__(self, server: PermissionsHost) -> None:
        self.server = server
        self._store: PermissionStore | None = None

    def routes(self) -> list[web.RouteDef]:
        path = "/admin/v1/permissions/{role}/{prefix:.*}"
        return [
            web.get("/admin/v1/permissions", self._wrap(self.list_grants)),
            web.put(path, self._wrap(self.put_grant)),
            web.delete(path, self._wrap(self.delete_grant)),
        ]

    @staticmethod
    def _wrap(handler: RequestHandler) -> RequestHandler:
        return errors_as_statuses(handler, ((ValueError, 400), (LookupError, 404), (errors.PubSubError, 503)))

    def store(self) -> PermissionStore:
        if self._store is None:
            self._store = PermissionStore(self.server.store)
        return self._store

    async def _changed(self) -> None:
        authorizer = self.server.authorizer
        if authorizer is not None:
            await authorizer.cache.refresh()

    async def list_grants(self, request: web.Request) -> web.Response:
        role = request.query.get("role")
        grants = [g for g in await self.store().grants() if role is None or g.role == role]
        return json_response([g.to_json() for g in grants])

    async def put_grant(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        actions = body.get("actions")
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise HttpError(400, 'expected {"actions": ["produce" and/or "consume"]}')
        grant = await self.store().set_grant(request.match_info["role"], request.match_info["prefix"], actions)
        await self._changed()
        return json_response(grant.to_json())

    async def delete_grant(self, request: web.Request) -> web.Response:
        role, prefix = request.match_info["role"], request.match_info["prefix"]
        action = request.query.get("action")
        left = await self.store().revoke(role, prefix, [action] if action is not None else None)
        await self._changed()
        return json_response((left or Grant(role, prefix, ())).to_json())
