"""The one HTTP server of a bookie or hub process: metrics, health, readiness and an admin API.

    server = HttpServer(registry, ready=check_ready, token=admin_token(conf.http_admin_token,
                                                                  conf.http_admin_token_file),
                        routes=[web.get("/api/v1/bookie/info", info)])
    url = await server.start("127.0.0.1", 0)      # "http://127.0.0.1:PORT" (aiohttp on the running loop)
    await server.stop()

Every server answers ``GET /metrics`` (Prometheus text of ``registry``),
``GET /heartbeat`` and ``GET /healthz`` (200 while serving) and
``GET /readyz`` (200 when ``ready()`` returns ``None``, else 503 with
``{"ready": false, "reason": ...}``); the role adds its own routes
(``bookie.admin``, ``hub.admin``). It runs on the process's own event loop
(aiohttp ``AppRunner`` + ``TCPSite``): handlers read the server's state
directly, no thread in between.

Errors are JSON, never a traceback: a handler raises ``HttpError(status,
message)`` and the client gets ``{"error": message}`` with that status; an
unknown path gets 404, a known path with another method 405, an unexpected
exception 500 (logged here). With an admin token, every PUT, POST and
DELETE needs ``Authorization: Bearer TOKEN`` (else 401).

Protected mode (Redis's): without an admin token, a server listening on an
address that is not loopback (``http_server_host``, e.g. ``0.0.0.0``)
refuses every PUT, POST and DELETE with 403 naming ``http_admin_token``
(the key to set); on loopback (the default, 127.0.0.1) they are open, as
Pulsar standalone's admin API is. And without an admin token, a request
that presents one (an ``Authorization`` header) on any path but the
monitoring ones (``/metrics``, ``/heartbeat``, ``/healthz``, ``/readyz``)
gets 401 rather than being served as if its token had been checked.

Ports (``resolve_http_port``): ``http_server_port`` 0 is a free port (the
default), N is port N, -1 turns the server off; ``stats_http_port`` is the
older name: when ``http_server_port`` is 0 a positive ``stats_http_port``
chooses the port (-1 and 0 both leave it free).

Failure: ``start`` raises ``OSError`` when the address cannot be bound.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["MONITORING", "TOKEN_ENV", "HttpError", "HttpServer", "RequestHandler", "admin_token", "errors_as_statuses",
           "is_loopback", "json_body", "json_response", "resolve_http_port"]

log = logging.getLogger(__name__)

TOKEN_ENV = "QUIRE_HTTP_ADMIN_TOKEN"
"""Environment variable holding the admin token when neither conf key gives one."""

MUTATING = frozenset({"PUT", "POST", "DELETE", "PATCH"})
MONITORING = frozenset({"/metrics", "/heartbeat", "/healthz", "/readyz"})
"""Paths scrapers and probes read: a token they present (for a proxy in front) is not questioned."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address; a name or ``0.0.0.0`` is not."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False

Ready = Callable[[], Awaitable[str | None]]
"""``None`` when the process is ready; else the reason it is not."""


class HttpError(Exception):
    """Raised by a handler: the client gets ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


ErrorStatuses = Sequence[tuple[type[Exception] | tuple[type[Exception], ...], int]]
RequestHandler = Callable[[web.Request], Awaitable[web.Response]]
"""An aiohttp request handler, as the admin resources' routes take them."""


def errors_as_statuses(handler: RequestHandler, statuses: ErrorStatuses) -> RequestHandler:
    """``handler`` with its exceptions answered as HTTP errors: the first ``(types, status)`` that matches.

    A 4xx answer carries the exception's message, a 5xx one its type too;
    ``HttpError`` and unmatched exceptions pass through (the server answers
    those with their own status, or 500).
    """
    async def run(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except HttpError:
            raise
        except Exception as exc:
            for types, status in statuses:
                if isinstance(exc, types):
                    message = str(exc) if status < 500 else f"{type(exc).__name__}: {exc}"
                    raise HttpError(status, message) from None
            raise
    return run


def resolve_http_port(http_server_port: int, stats_http_port: int) -> int | None:
    """The port to listen on (0: a free one) or ``None`` for off; see the module docstring."""
    if http_server_port < 0:
        return None
    if http_server_port > 0:
        return http_server_port
    return max(stats_http_port, 0)


def admin_token(token: str, token_file: str) -> str:
    """The admin token: ``token``, else the first line of ``token_file``, else ``$QUIRE_HTTP_ADMIN_TOKEN``.

    An empty result means no token (the admin verbs are open). Raises
    ``OSError`` when ``token_file`` is set but cannot be read.
    """
    if token:
        return token
    if token_file:
        return Path(token_file).read_text().strip()
    return os.environ.get(TOKEN_ENV, "").strip()


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return json_response({"error": message}, status)


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; ``HttpError`` 400 when it is not one."""
    try:
        data = json.loads(await request.read() or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"bad JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise HttpError(400, "expected a JSON object as the body")
    return data


def _middlewares(token: str, protected: Callable[[], str | None]) -> list[Any]:
    """``protected()``: the host a token-less server listens on when it is not loopback (protected mode)."""
    @web.middleware
    async def errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        try:
            return await handler(request)
        except HttpError as exc:
            return _error(exc.status, exc.message)
        except web.HTTPException as exc:     # the router's 404/405, aiohttp's own 4xx
            if exc.status < 400:
                raise
            if exc.status == 404:
                return _error(404, f"no such path: {request.path}")
            if exc.status == 405:
                return _error(405, f"{request.method} is not allowed on {request.path}")
            return _error(exc.status, exc.reason)
        except Exception as exc:
            log.exception("HTTP %s %s failed", request.method, request.path)
            return _error(500, f"{type(exc).__name__}: {exc}")

    @web.middleware
    async def auth(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                   ) -> web.StreamResponse:
        if token:
            if request.method in MUTATING:
                given = request.headers.get("Authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                    return _error(401, "missing or wrong Authorization: Bearer token")
        elif "Authorization" in request.headers and request.path not in MONITORING:
            return _error(401, "this server has no admin token (http_admin_token is not set), so the "
                               "Authorization token given cannot be checked: set http_admin_token on the server, "
                               "or send no token")
        elif request.method in MUTATING and (host := protected()) is not None:
            return _error(403, f"protected mode: the HTTP server listens on {host}, not a loopback address, and "
                               f"no admin token is set: set http_admin_token (or http_admin_token_file, or "
                               f"${TOKEN_ENV}) to allow {request.method}, or listen on 127.0.0.1 "
                               f"(http_server_host)")
        return await handler(request)

    return [errors, auth]


class HttpServer:
    """See the module docstring."""

    def __init__(self, registry: CollectorRegistry, *, ready: Ready, token: str = "",
                 routes: Iterable[web.RouteDef] = ()) -> None:
        self.registry = registry
        self.ready = ready
        self.token = token
        self.protected_host: str | None = None   # set by start: the non-loopback host of a token-less server
        self.app = web.Application(middlewares=_middlewares(token, lambda: self.protected_host))
        self.app.add_routes([web.get("/metrics", self._metrics), web.get("/heartbeat", self._alive),
                             web.get("/healthz", self._alive), web.get("/readyz", self._readyz), *routes])
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str, port: int) -> str:
        """Listen on ``host:port`` (0: a free port); returns ``http://HOST:PORT``. ``OSError`` if taken."""
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if not self.token and not is_loopback(host):
            self.protected_host = host
            log.warning("HTTP server on %s (not loopback) without an admin token: protected mode, PUT/POST/DELETE "
                        "are refused (set http_admin_token)", host)
        bound = runner.addresses[0][1]
        self.url = f"http://{host}:{bound}"
        log.info("HTTP server at %s", self.url)
        return self.url

    async def stop(self) -> None:
        """Stop listening and close open connections; idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _alive(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        try:
            reason = await self.ready()
        except Exception as exc:     # a metastore that cannot be asked: not ready, and why
            reason = f"readiness check failed: {exc}"
        if reason is None:
            return json_response({"ready": True})
        return json_response({"ready": False, "reason": reason}, 503)
