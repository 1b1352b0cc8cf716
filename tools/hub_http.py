"""Calling a hub's admin HTTP API (``hub.admin``) from the tools, with the admin token.

    url = await hub_http_url(store, "127.0.0.1:4080")      # that hub's, else any live hub's
    status, doc = await admin_call(url, "POST", "/admin/v1/topics/t/release", token="...", timeout=10)

Every hub registers the base URL of its HTTP server in the ``hubs`` table;
any hub answers for any topic (it forwards to the owner), so the hub the
console talks to (``--server``) is asked first and, when it serves no HTTP,
any live hub that does. The token is the hub conf's ``http_admin_token``,
else the first line of ``http_admin_token_file``, else
``$QUIRE_HTTP_ADMIN_TOKEN`` (``bookie.http.admin_token``).

Failure: ``HubHttpError`` with a one-line message when no live hub serves
HTTP or the hub cannot be reached; an HTTP error status is returned, not
raised (the caller words it).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["HubHttpError", "admin_call", "hub_http_url"]


class HubHttpError(Exception):
    """No hub HTTP server to call, or the call could not be made."""


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        return None


async def hub_http_url(store: Any, server: str) -> str:
    """The HTTP base URL of hub ``server`` (``HOST:PORT``), else of the first live hub that has one."""
    from hub.metadata import HubRegistry, hub_address
    registry = HubRegistry(store)
    await registry.start()
    hubs = [info for info, _ in await registry.live_hubs()]
    wanted = _host_port(server)
    hubs.sort(key=lambda info: (info.hostname, info.port) != wanted)   # the --server hub first
    for info in hubs:
        url = await registry.http_url(hub_address(info))
        if url:
            return url
    raise HubHttpError("no live hub serves the admin HTTP API (http_server_port)")


async def admin_call(base_url: str, method: str, path: str, *, token: str, timeout: float) -> tuple[int, Any]:
    """``method path`` on the hub at ``base_url``; (status, the JSON answer or its text)."""
    import aiohttp
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.request(method, base_url + path, headers=headers) as resp:
                text = await resp.text()
                try:
                    return resp.status, json.loads(text)
                except ValueError:
                    return resp.status, text
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise HubHttpError(f"cannot reach hub {base_url}: {exc or 'timed out'}") from None
