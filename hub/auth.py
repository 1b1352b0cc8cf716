"""Authentication with signed tokens (Pulsar's token authentication), for hubs and hub clients.

    from hub.auth import create_secret_key, create_token, TokenAuthenticator
    create_secret_key("conf/token.key")                          # quire token create-secret-key --output FILE
    token = create_token("conf/token.key", "orders-app", expiry=3600.0)   # quire token create ...
    auth = TokenAuthenticator("conf/token.key")                  # the hub's token_secret_key
    role = auth.authenticate(token)                              # the token's subject

A token is a JWT signed with HS256 under a secret key of 32 random bytes,
kept base64-encoded in a file readable by its owner only. Its subject
(``sub``) is the role; ``exp``, when present, is enforced.

With ``authentication_enabled`` a hub answers every request on a connection
that has not authenticated (``AUTHENTICATE`` with a valid token, the first
request a client with ``auth_token``/``auth_token_file`` sends) with
``AUTHENTICATION_FAILED``. Roles in ``region_roles`` and ``superuser_roles``
are region hubs: only they may subscribe as a region's hub subscriber, or
publish with their own ``srcRegion``/version vector; anyone else doing so gets
``NOT_AUTHORIZED`` (a publish's fields are overwritten instead). Every role
but the superusers needs grants to produce or consume (``hub.permissions``).

Failure: ``create_token``/``TokenAuthenticator`` raise ``CertificateError``-like
``OSError`` (``hub.errors.CertificateError``) for a missing or unreadable key
file; ``authenticate`` raises ``AuthenticationError`` saying why (bad
signature, expired, no subject).
"""

from __future__ import annotations

import base64
import os
import secrets
import time
from pathlib import Path

import jwt

from hub.errors import AuthenticationError, CertificateError

__all__ = ["TokenAuthenticator", "create_secret_key", "create_token", "load_secret_key"]

_ALGORITHM = "HS256"


def create_secret_key(path: str | os.PathLike[str]) -> None:
    """Write a new secret key to ``path`` (mode 0600); ``FileExistsError`` rather than overwrite one."""
    data = base64.b64encode(secrets.token_bytes(32)) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def load_secret_key(path: str | os.PathLike[str]) -> bytes:
    """The secret key in ``path``; ``CertificateError`` naming the file when it is missing or malformed."""
    if not str(path):
        raise CertificateError("authentication needs token_secret_key (a file made by quire token "
                               "create-secret-key)")
    try:
        text = Path(path).read_bytes().strip()
    except OSError as exc:
        raise CertificateError(f"token_secret_key {path}: {exc.strerror or exc}") from None
    try:
        key = base64.b64decode(text, validate=True)
    except ValueError:
        raise CertificateError(f"token_secret_key {path}: not a base64 secret key") from None
    if len(key) < 32:
        raise CertificateError(f"token_secret_key {path}: a key of {len(key)} bytes is too short (32 needed)")
    return key


def create_token(secret_key: str | os.PathLike[str], subject: str, expiry: float | None = None) -> str:
    """A token for role ``subject``, valid for ``expiry`` seconds (None: no expiry)."""
    if not subject:
        raise ValueError("a token needs a subject (the role)")
    claims: dict[str, object] = {"sub": subject}
    if expiry is not None:
        claims["exp"] = int(time.time() + expiry)
    return jwt.encode(claims, load_secret_key(secret_key), algorithm=_ALGORITHM)


class TokenAuthenticator:
    """Checks tokens against the hub's ``token_secret_key``."""

    def __init__(self, secret_key: str | os.PathLike[str]) -> None:
        self._key = load_secret_key(secret_key)

    def authenticate(self, token: bytes | str) -> str:
        """The role of a valid ``token``; ``AuthenticationError`` saying why it is not."""
        if isinstance(token, bytes):
            token = token.decode("ascii", "replace")
        if not token:
            raise AuthenticationError("no token: this hub requires authentication (client conf auth_token or "
                                      "auth_token_file)")
        try:
            claims = jwt.decode(token, self._key, algorithms=[_ALGORITHM], options={"require": ["sub"]})
        except jwt.ExpiredSignatureError:
            raise AuthenticationError("token expired") from None
        except jwt.InvalidTokenError as exc:
            raise AuthenticationError(f"invalid token: {exc}") from None
        role = claims.get("sub")
        if not isinstance(role, str) or not role:
            raise AuthenticationError("invalid token: no subject")
        return role
