"""What every ``quire`` tool does with ``--metastore URI`` / ``--conf FILE``.

    uri, props = metastore_from_args(args.metastore, args.conf)   # props: the --conf file's keys
    if uri is None: ...                                           # each tool words its own usage error
    store = await open_tool_metastore(uri, timeout=10.0)          # or probe_metastore(uri) without a loop
    quiet_logging(args, "kazoo")                                  # a tool that prints: warnings only

The URI is ``--metastore``, else the conf file's ``metastore_uri``, else
``zk://<zk_host><zk_prefix>`` when the file sets ``zk_host`` (``zk_prefix``
defaulting as the reading role's conf does: ``/quire`` for bookies and their
tools, ``/hedwig`` for hub confs).

Failure: a conf file that cannot be read raises ``metastore.conf.ConfError``;
a metastore that cannot be opened raises a ``MetastoreOpenError`` whose
message is the one line the tool prints: ``BadMetastoreURIError`` when the
URI itself is wrong (unknown scheme, bad option), ``MetastoreUnreachableError``
when the store does not answer (in time) or fails. Each tool maps them to
its own error classes, prefixes and exit statuses.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Mapping

from metastore import MetaStore, open_existing_metastore
from metastore.conf import read_properties
from metastore.errors import IllegalOpError, MetastoreError, StoreNotFoundError

__all__ = [
    "BadMetastoreURIError",
    "MetastoreOpenError",
    "MetastoreUnreachableError",
    "metastore_from_args",
    "metastore_uri_of",
    "open_tool_metastore",
    "probe_metastore",
    "quiet_logging",
]


class MetastoreOpenError(Exception):
    """A tool cannot open its metastore; ``str(exc)`` is one line."""


class BadMetastoreURIError(MetastoreOpenError):
    """The URI cannot work (unknown scheme, malformed, bad option): a usage error."""


class MetastoreUnreachableError(MetastoreOpenError):
    """The metastore did not answer, not in time, or failed while opening."""


def metastore_uri_of(props: Mapping[str, str], default_zk_prefix: str = "/quire") -> str | None:
    """``metastore_uri`` of a conf file's keys, else ``zk://<zk_host><zk_prefix>``, else ``None``."""
    if props.get("metastore_uri"):
        return props["metastore_uri"]
    if props.get("zk_host"):
        return f"zk://{props['zk_host']}{props.get('zk_prefix', default_zk_prefix)}"
    return None


def metastore_from_args(metastore: str | None, conf: str | None,
                        default_zk_prefix: str = "/quire") -> tuple[str | None, dict[str, str]]:
    """The metastore URI (``None`` when neither names one) and the keys of the ``conf`` file (``{}`` without one).

    Raises ``metastore.conf.ConfError`` when ``conf`` cannot be read.
    """
    props = read_properties(conf) if conf is not None else {}
    return metastore or metastore_uri_of(props, default_zk_prefix), props


async def open_tool_metastore(uri: str, timeout: float | None = None) -> MetaStore:
    """Open the existing store ``uri`` within ``timeout`` seconds (``None`` or 0: no bound); never creates one.

    Raises ``BadMetastoreURIError`` or ``MetastoreUnreachableError`` (see the module docstring);
    a missing lmdb store is ``no lmdb metastore at PATH (...)``.
    """
    try:
        return await asyncio.wait_for(open_existing_metastore(uri), timeout or None)
    except StoreNotFoundError as exc:
        raise MetastoreUnreachableError(str(exc)) from None
    except TimeoutError:
        raise MetastoreUnreachableError(f"metastore {uri} did not answer within {timeout:g} s") from None
    except IllegalOpError as exc:
        raise BadMetastoreURIError(f"cannot open metastore {uri}: {exc}") from None
    except (MetastoreError, OSError) as exc:
        raise MetastoreUnreachableError(f"cannot open metastore {uri}: {exc}") from None


def probe_metastore(uri: str, timeout: float | None = None) -> None:
    """Open and close ``uri`` from code that runs no event loop; the errors of ``open_tool_metastore``."""

    async def probe() -> None:
        store = await open_tool_metastore(uri, timeout)
        try:
            await store.close()
        except MetastoreError as exc:
            raise MetastoreUnreachableError(f"cannot open metastore {uri}: {exc}") from None

    asyncio.run(probe())


def quiet_logging(args: argparse.Namespace, *errors_only: str) -> None:
    """At the default ``--log-level`` (INFO) a tool that prints logs warnings only, and ``errors_only`` loggers errors.

    An explicit ``--log-level`` other than INFO is left as given.
    """
    if str(getattr(args, "log_level", "INFO")).upper() == "INFO":
        logging.getLogger().setLevel(logging.WARNING)
        for name in errors_only:
            logging.getLogger(name).setLevel(logging.ERROR)
