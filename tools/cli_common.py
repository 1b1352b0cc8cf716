"""What every ``quire`` tool does with ``--metastore URI`` / ``--conf FILE`` / ``--timeout SECONDS``.

    add_common_options(tool_parser, timeout=10.0)                 # before the command: quire shell --metastore U ls
    add_common_options(command_parser, timeout=10.0, in_command=True)  # and after it: quire shell ls --metastore U
    uri, props = metastore_from_args(args.metastore, args.conf)   # props: the --conf file's keys
    if uri is None: ...                                           # each tool words its own usage error
    store = await open_tool_metastore(uri, timeout=10.0)          # or probe_metastore(uri) without a loop
    quiet_logging(args, "kazoo")                                  # a tool that prints: warnings only

The URI is ``--metastore``, else the conf file's ``metastore_uri``, else
``zk://<zk_host><zk_prefix>`` when the file sets ``zk_host`` (``zk_prefix``
defaulting as the reading role's conf does: ``/quire`` for bookies and their
tools, ``/hedwig`` for hub confs), else — a conf file that names no metastore,
as the shipped ones — the store a bookie or hub would run on with it, the
standalone cluster's ``lmdb://data/metastore``. Without either option, the environment
variables ``QUIRE_METASTORE`` and ``QUIRE_CONF`` stand in for them (an
option given on the command line always wins over both).

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
import os
from collections.abc import Callable, Mapping

from metastore import MetaStore, open_existing_metastore
from metastore.conf import EMBEDDED_METASTORE_URI, read_properties
from metastore.errors import IllegalOpError, MetastoreError, StoreNotFoundError

__all__ = [
    "AUTH_TOKEN_ENV",
    "CONF_ENV",
    "METASTORE_ENV",
    "BadMetastoreURIError",
    "MetastoreOpenError",
    "MetastoreUnreachableError",
    "add_auth_token_options",
    "add_common_options",
    "auth_token_conf",
    "count_at_least",
    "metastore_from_args",
    "metastore_uri_of",
    "needs_extra_message",
    "number_at_least",
    "open_tool_metastore",
    "probe_metastore",
    "quiet_logging",
    "seconds",
]


METASTORE_ENV = "QUIRE_METASTORE"
CONF_ENV = "QUIRE_CONF"
STANDALONE_METASTORE = "lmdb://data/metastore"
"""The metastore of ``quire standalone`` (``make run``) run from this directory with its default ``--data``."""
AUTH_TOKEN_ENV = "QUIRE_AUTH_TOKEN"
"""Environment variable holding the hub client's token when neither --auth-token nor --auth-token-file is given."""


def needs_extra_message(command: str, missing: str, extra: str) -> str:
    """The one line a command says when an optional extra it needs is not installed."""
    return (f"quire {command}: needs the '{extra}' extra ({missing} is not installed): run "
            f"`pip install -e '.[{extra}]'` in the source tree (`make setup` installs every extra)")


def no_metastore_message(conf_file: str | None = None) -> str:
    """Why a tool has no metastore URI and how to give one; names the standalone cluster's when it is here."""
    if conf_file:
        return f"{conf_file} has no metastore_uri (nor zk_host): set one, or give --metastore URI"
    hint = f"no metastore given: pass --metastore URI or --conf FILE with metastore_uri (or set {METASTORE_ENV})"
    if os.path.isfile(os.path.join("data", "metastore", "data.mdb")):
        hint += f"; the standalone cluster here (make run) has --metastore {STANDALONE_METASTORE}"
    return hint


def connect_failure(server: str, exc: BaseException, label: str = "hub") -> str:
    """``cannot connect to LABEL SERVER: REASON`` for a failed hub connection, without the client's own
    "cannot connect to hub SERVER: " repeated inside the reason."""
    reason = str(exc) or "timed out"
    inner = f"cannot connect to hub {server}: "
    if reason.startswith(inner):
        reason = reason[len(inner):]
    return f"cannot connect to {label} {server}: {reason}"


def number_at_least(least: float, *, what: str = "a number", integer: bool = False) -> Callable[[str], float]:
    """An argparse type: a number >= ``least`` (an ``int`` with ``integer``), else a one-line error."""

    def parse(text: str) -> float:
        try:
            value: float = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}") from None
        if not value >= least:
            raise argparse.ArgumentTypeError(f"expected {what} >= {least:g}, not {text!r}")
        return value

    return parse


def count_at_least(least: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``least`` ("expected a number >= N, not '0'")."""
    return number_at_least(least, integer=True)  # type: ignore[return-value]


seconds = number_at_least(0, what="a number of seconds")
"""An argparse type: a number of seconds >= 0."""


def iso_time_ms(text: str) -> int:
    """An argparse type: an ISO 8601 time (no zone: UTC) as epoch milliseconds, else a one-line error."""
    import datetime
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time (e.g. 2026-11-28T01:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is before 1970")
    return ms


def add_common_options(parser: argparse.ArgumentParser, *, timeout: float, in_command: bool = False,
                       conf_help: str = "properties file with metastore_uri (or zk_host/zk_prefix)",
                       conf_default: str = f"${CONF_ENV}") -> None:
    """``--metastore``, ``--conf``, ``--timeout`` on a tool's parser, or (``in_command``) on one command's.

    Add them to both so they are accepted before and after the command: the
    command's copies default to "not given" (``argparse.SUPPRESS``), so a value
    given before the command is kept. ``--metastore``/``--conf`` default to
    ``None``: ``metastore_from_args`` then reads ``QUIRE_METASTORE``/``QUIRE_CONF``.
    ``conf_default`` is what ``--conf``'s help names as its default.
    """
    group = parser.add_argument_group("metastore")
    unset: object = argparse.SUPPRESS
    group.add_argument("--metastore", metavar="URI", default=unset if in_command else None,
                       help=f"metastore URI (lmdb://data/metastore, zk://host:port/prefix, ...); "
                            f"default ${METASTORE_ENV}")
    group.add_argument("--conf", metavar="FILE", default=unset if in_command else None,
                       help=f"{conf_help}; default {conf_default}")
    group.add_argument("--timeout", metavar="SECONDS", type=seconds, default=unset if in_command else timeout,
                       help=f"bound for opening the metastore and each request (default {timeout:g})")


def add_auth_token_options(parser: argparse.ArgumentParser) -> None:
    """``--auth-token TOKEN`` / ``--auth-token-file FILE``: the token a hub client presents (``auth_token_conf``)."""
    group = parser.add_argument_group("authentication")
    group.add_argument("--auth-token", metavar="TOKEN",
                       help=f"token for hubs with authentication_enabled (quire token create); default "
                            f"${AUTH_TOKEN_ENV}")
    group.add_argument("--auth-token-file", metavar="FILE",
                       help="file holding the token (read at connect; used when --auth-token is not given)")


def auth_token_conf(args: argparse.Namespace) -> dict[str, str]:
    """The client conf keys ``auth_token``/``auth_token_file`` from ``--auth-token``, else ``--auth-token-file``,
    else ``$QUIRE_AUTH_TOKEN``; empty when none is given."""
    token = getattr(args, "auth_token", None)
    if token:
        return {"auth_token": token}
    token_file = getattr(args, "auth_token_file", None)
    if token_file:
        return {"auth_token_file": token_file}
    token = os.environ.get(AUTH_TOKEN_ENV, "")
    return {"auth_token": token} if token else {}


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


def metastore_from_args(metastore: str | None, conf: str | None, default_zk_prefix: str = "/quire",
                        env: Mapping[str, str] | None = None) -> tuple[str | None, dict[str, str]]:
    """The metastore URI (``None`` when nothing names one) and the keys of the conf file (``{}`` without one).

    ``--metastore``, else ``--conf``'s, else ``$QUIRE_METASTORE``, else
    ``$QUIRE_CONF``'s; the conf file is ``--conf``, else ``$QUIRE_CONF``. A
    conf file that names no metastore means what the roles make of it, the
    embedded ``lmdb://data/metastore``. Raises ``metastore.conf.ConfError``
    when the conf file cannot be read.
    """
    env = os.environ if env is None else env
    conf_file = conf or env.get(CONF_ENV) or None
    props = read_properties(conf_file) if conf_file is not None else {}
    of_conf = (metastore_uri_of(props, default_zk_prefix) or EMBEDDED_METASTORE_URI) if conf_file else None
    if metastore:
        return metastore, props
    if conf:
        return of_conf, props
    return env.get(METASTORE_ENV) or of_conf, props


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
