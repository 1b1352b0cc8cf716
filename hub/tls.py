"""TLS for hubs and hub clients: a server context from ``cert_path``, a client context.

    from hub.tls import server_context, client_context
    ctx = server_context("conf/hub.p12", password="secret")   # PKCS#12 (as Hedwig's server.p12)
    ctx = server_context("conf/hub.pem")                      # PEM: certificate and private key
    await loop.create_server(factory, host, ssl_port, ssl=ctx, ssl_handshake_timeout=10.0)
    await loop.create_connection(factory, host, port, ssl=client_context())

A PEM file holds the certificate chain and the private key (``password``
decrypts an encrypted key); anything else is read as PKCS#12 with
``password``, through the ``cryptography`` package, and handed to ``ssl``
through a private temporary file that is removed at once.

The client context encrypts but does not verify the hub's certificate, as
Hedwig's client did (hubs usually carry self-signed certificates); it is
meant for a trusted network between clients and hubs.

Failure: a missing, unreadable or malformed file, a wrong password, or a
certificate without its key raises ``hub.errors.CertificateError`` (an
``OSError``) with one line naming ``cert_path`` and the reason.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from pathlib import Path

from hub.errors import CertificateError

__all__ = ["client_context", "server_context"]


def server_context(cert_path: str | os.PathLike[str], password: str = "") -> ssl.SSLContext:
    """A TLS server context with the certificate and key of ``cert_path``; ``CertificateError`` if unusable."""
    path = Path(cert_path)
    if not str(cert_path):
        raise CertificateError("ssl_enabled needs cert_path (a PEM or PKCS#12 certificate file)")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CertificateError(f"cert_path {path}: {exc.strerror or exc}") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if b"-----BEGIN" in data:
        _load_pem(ctx, path, password)
    else:
        _load_pkcs12(ctx, path, data, password)
    return ctx


def _load_pem(ctx: ssl.SSLContext, path: Path, password: str) -> None:
    try:
        ctx.load_cert_chain(str(path), password=password or None)
    except (ssl.SSLError, ValueError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CertificateError(f"cert_path {path}: not a usable PEM certificate and key ({reason})") from None


def _load_pkcs12(ctx: ssl.SSLContext, path: Path, data: bytes, password: str) -> None:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, pkcs12

    try:
        key, cert, extra = pkcs12.load_key_and_certificates(data, password.encode() if password else None)
    except (ValueError, TypeError):
        raise CertificateError(f"cert_path {path}: not a PEM file, and not a PKCS#12 file that opens with the "
                               "given password") from None
    if key is None or cert is None:
        raise CertificateError(f"cert_path {path}: the PKCS#12 file lacks a certificate or its private key")
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()) + cert.public_bytes(Encoding.PEM)
    for c in extra or ():
        pem += c.public_bytes(Encoding.PEM)
    fd, tmp = tempfile.mkstemp(prefix="quire-cert-", suffix=".pem")   # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        ctx.load_cert_chain(tmp)
    except (ssl.SSLError, OSError) as exc:
        raise CertificateError(f"cert_path {path}: unusable certificate ({exc})") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def client_context() -> ssl.SSLContext:
    """A TLS client context that encrypts without verifying the hub's certificate (see the module docstring)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
