"""Backend registry: URI scheme -> MetaStore class, through entry points.

Backends (built-in and third-party alike) register under the entry-point
group ``quire.metastore``::

    [project.entry-points."quire.metastore"]
    myscheme = "mypkg.store:MyMetaStore"

``open_metastore("myscheme://...")`` then loads ``MyMetaStore`` and awaits
``MyMetaStore.open(uri, **conf)``.

Servers (bookies, hubs, ``quire standalone``) open with ``open_metastore``,
which creates an embedded store that is missing; clients and tools open with
``open_existing_metastore``, so ``lmdb:///typo`` fails naming the path instead
of creating an empty store. A backend that would create a missing store sets
the class attribute ``creates_missing_store = True`` and accepts the option
``create=False``.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import urlsplit

from metastore.api import MetaStore
from metastore.errors import IllegalOpError

log = logging.getLogger(__name__)

GROUP = "quire.metastore"


def scheme_of(uri: str) -> str:
    """The scheme of a metastore URI; ``IllegalOpError`` if there is none."""
    if not isinstance(uri, str) or "://" not in uri:
        raise IllegalOpError(f"malformed metastore URI {uri!r}: expected SCHEME://...")
    scheme = urlsplit(uri).scheme
    if not scheme:
        raise IllegalOpError(f"malformed metastore URI {uri!r}: no scheme")
    return scheme.lower()


def available_schemes() -> list[str]:
    return sorted({ep.name for ep in entry_points(group=GROUP)})


def backend_class(scheme: str) -> type[MetaStore]:
    """Load the MetaStore class registered for ``scheme``."""
    matches = [ep for ep in entry_points(group=GROUP) if ep.name == scheme]
    if not matches:
        known = ", ".join(available_schemes()) or "none"
        raise IllegalOpError(f"unknown metastore scheme {scheme!r} (registered: {known})")
    cls = matches[0].load()
    if not (isinstance(cls, type) and issubclass(cls, MetaStore)):
        raise IllegalOpError(f"entry point {scheme!r} does not name a MetaStore subclass")
    return cls


async def open_metastore(uri: str, **conf: Any) -> MetaStore:
    """Open the metastore named by ``uri`` (``lmdb:///path``, ``zk://h:p/prefix``, ``hbase://h:p/prefix``).

    Raises ``IllegalOpError`` for a malformed URI or an unknown scheme and
    ``ServiceDownError`` when the backend cannot be reached.
    """
    cls = backend_class(scheme_of(uri))
    store = await cls.open(uri, **conf)
    log.debug("opened metastore %s (%s v%s)", uri, store.name, store.version)
    return store


async def open_existing_metastore(uri: str, **conf: Any) -> MetaStore:
    """``open_metastore`` for clients and tools: never creates a store that does not exist yet.

    Raises ``StoreNotFoundError`` (a ``ServiceDownError``) naming the path when
    the backend would have created one (an lmdb directory without a store),
    else as ``open_metastore``.
    """
    cls = backend_class(scheme_of(uri))
    if getattr(cls, "creates_missing_store", False):
        conf.setdefault("create", False)
    return await open_metastore(uri, **conf)
