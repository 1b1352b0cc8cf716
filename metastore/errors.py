"""Errors raised by every MetaStore backend.

Each error carries a ``code`` (the BookKeeper ``MSException.Code`` name) so
callers and plugins can map them without isinstance chains::

    try:
        await table.put(key, value, version)
    except BadVersionError:
        ...  # somebody else won the compare-and-set
"""

from __future__ import annotations


class MetastoreError(Exception):
    """Base of all metastore errors; ``code`` names the condition."""

    code = "MetastoreException"

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message or self.code)
        if code is not None:
            self.code = code


class NoKeyError(MetastoreError):
    """The key does not exist (get, CAS put, remove)."""

    code = "NoKey"


class KeyExistsError(MetastoreError):
    """A create (``Version.NEW``) found the key already present."""

    code = "KeyExists"


class BadVersionError(MetastoreError):
    """The version given to a CAS put or remove is not the current one."""

    code = "BadVersion"


class ServiceDownError(MetastoreError):
    """The backing service cannot be reached (or did not answer in time)."""

    code = "ServiceDown"


class StoreNotFoundError(ServiceDownError):
    """The store the URI names does not exist (an lmdb directory without a store), and the caller
    asked not to create one (``open_existing_metastore``: clients and tools)."""


class IllegalOpError(MetastoreError):
    """The call is not valid: bad argument, closed store, unsupported operation,
    unknown URI scheme, a value over the backend's size limit."""

    code = "IllegalOp"
