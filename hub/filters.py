"""Message filters: server-side classes named by dotted path, and client-side filter objects.

Seeds ``message-filter-design.txt`` and ``hedwig-docs-and-metastore.txt``
("Message Filter"). A subscriber names a server filter class in its
preferences (``message_filter``); the owner hub loads it for the
subscription and delivers only the messages it passes::

    flt = load_server_filter("hub.filters:HeaderMatchFilter", conf=conf.filter_conf(),
                             topic=b"BookStore", subscriber_id=b"userA",
                             preferences=SubscriptionPreferences(
                                 options={"filter.header": b"type", "filter.value": b"History"}),
                             filter_class_path=conf.filter_class_path,
                             allowlist=conf.server_filter_allowlist)
    if safe_test(flt, message):      # InvalidMessageFilterError if the filter raised
        deliver(message)
    safe_uninitialize(flt)           # when the subscription ends

Only classes the operator allowed are loaded (``filter_allowed``, checked
before anything is imported): the hub's own filters (``BUILTIN_FILTERS``),
modules that live in a ``filter_class_path`` directory, and names under a
dotted prefix of ``server_filter_allowlist`` (``allowlist=``). Anything else
(the standard library, installed packages, the hub's own code, whatever
else is on ``sys.path``) is refused. Loading is ``importlib`` by
``"pkg.mod.Class"`` or ``"pkg.mod:Class"`` (the entries of
``filter_class_path`` are appended to ``sys.path`` first), then the
class is constructed with no arguments, ``initialize(conf)`` (the hub's
configuration, ``HubConf.filter_conf()``; it may return the filter to use,
or ``None`` for itself), then
``set_subscription_preferences(topic, subscriber_id, preferences)``.

A client filter has only ``set_subscription_preferences`` and
``test_message`` and is handed to ``HedwigClient.start_delivery``; it gets
the stored preferences from the subscribe response.

Failure: anything going wrong while loading (bad path, a class not
allowed, no such module or class, a constructor, ``initialize`` or
``set_subscription_preferences`` that raises) gives ``InvalidMessageFilterError`` naming the path and the
reason, never anything else; a filter whose ``test_message`` raises makes
``safe_test`` log it and raise ``InvalidMessageFilterError`` (hub-core then
closes that subscription with ``INVALID_MESSAGE_FILTER``). The hub keeps
serving either way.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from hub.errors import InvalidMessageFilterError
from hub.message import Message, SubscriptionPreferences

__all__ = [
    "ClientMessageFilter",
    "HeaderMatchFilter",
    "ServerMessageFilter",
    "filter_allowed",
    "load_server_filter",
    "safe_test",
    "safe_uninitialize",
]

log = logging.getLogger(__name__)


@runtime_checkable
class ClientMessageFilter(Protocol):
    """A filter run by the client (``start_delivery(..., message_filter=flt)``)."""

    def set_subscription_preferences(self, topic: bytes, subscriber_id: bytes,
                                     preferences: SubscriptionPreferences) -> object:
        """Receive the subscription's stored preferences before the first message."""

    def test_message(self, message: Message) -> bool:
        """True to deliver ``message``, False to skip it."""


@runtime_checkable
class ServerMessageFilter(ClientMessageFilter, Protocol):
    """A filter run by the hub, loaded by dotted path from ``SubscriptionPreferences.message_filter``."""

    def initialize(self, conf: dict[str, str]) -> ServerMessageFilter | None:
        """Prepare with the hub's configuration; return the filter to use (``None``: this one)."""

    def uninitialize(self) -> None:
        """Release what ``initialize`` acquired (the subscription ended)."""


def _add_class_path(filter_class_path: Sequence[str]) -> None:
    added = False
    for entry in filter_class_path:
        if entry and entry not in sys.path:
            sys.path.append(entry)
            added = True
    if added:
        importlib.invalidate_caches()


#: The hub's own server filters, always allowed (dotted form): the book-store example and the filter
#: of the hub subscribers that carry messages between regions (``hub.regions``).
BUILTIN_FILTERS: frozenset[str] = frozenset({"hub.filters.HeaderMatchFilter", "hub.regions.RegionFilter"})

#: Quire's own packages: never loaded as filters from ``filter_class_path`` (only by ``server_filter_allowlist``).
_OWN_PACKAGES = frozenset({"hub", "bookie", "metastore", "placement", "tools"})

NOT_ALLOWED = ("not an allowed filter class (allowed: the hub's own filters, modules in a filter_class_path "
               "directory, dotted prefixes in server_filter_allowlist)")


def _candidates(path: str) -> list[tuple[str, str]]:
    """``(module, qualname)`` splits of ``"pkg.mod.Class"`` / ``"pkg.mod:Outer.Inner"``; raises ``ValueError``."""
    if ":" in path:
        module_name, _, qualname = path.partition(":")
        candidates = [(module_name, qualname)]
    else:
        parts = path.split(".")
        candidates = [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(len(parts) - 1, 0, -1)]
    names = [n for m, q in candidates for n in (*m.split("."), *q.split("."))]
    if not candidates or not all(n.isidentifier() for n in names):
        raise ValueError("not a dotted path of the form pkg.mod.Class or pkg.mod:Class")
    return candidates


def _in_class_path(top: str, filter_class_path: Sequence[str]) -> bool:
    """Whether importing module ``top`` would load it from a ``filter_class_path`` directory.

    Found with ``importlib.util.find_spec`` (no module code runs). The
    standard library, built-in modules and Quire's own packages never
    count, even when a directory holds a file of that name.
    """
    if top in sys.stdlib_module_names or top in sys.builtin_module_names or top in _OWN_PACKAGES:
        return False
    roots = [Path(d).resolve() for d in filter_class_path if d]
    if not roots:
        return False
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [spec.origin] if spec.has_location and spec.origin else []
    places += list(spec.submodule_search_locations or [])
    if not places:
        return False
    resolved = [Path(p).resolve() for p in places]
    return all(any(p.is_relative_to(root) for root in roots) for p in resolved)


def filter_allowed(path: str, filter_class_path: Sequence[str] = (), allowlist: Sequence[str] = ()) -> bool:
    """Whether the operator allowed the filter class ``path`` (checked before anything is imported).

    Allowed: ``BUILTIN_FILTERS``; a path equal to, or under (at a dot), a
    dotted prefix of ``allowlist`` (``server_filter_allowlist``); a module
    whose top-level package lives in a ``filter_class_path`` directory
    (those directories must already be on ``sys.path``). ``path`` must be
    well formed (see ``load_server_filter``).
    """
    dotted = path.strip().replace(":", ".")
    if dotted in BUILTIN_FILTERS:
        return True
    for entry in allowlist:
        prefix = entry.strip().replace(":", ".").strip(".")
        if prefix and (dotted == prefix or dotted.startswith(prefix + ".")):
            return True
    return _in_class_path(dotted.split(".", 1)[0], filter_class_path)


def _import_class(path: str) -> type:
    """The class named by ``"pkg.mod.Class"`` / ``"pkg.mod:Outer.Inner"``; raises ``ValueError``."""
    candidates = _candidates(path)
    missing: ModuleNotFoundError | None = None
    for module_name, qualname in candidates:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                missing = missing or exc
                continue   # that prefix is not a module: try a shorter one
            raise ValueError(f"importing module {module_name!r} raised {exc!r}") from exc
        except (Exception, SystemExit) as exc:
            raise ValueError(f"importing module {module_name!r} raised {exc!r}") from exc
        obj: object = module
        for attr in qualname.split("."):
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                if missing is not None:   # "pkg.nosuchmod.Class": report the missing module
                    raise ValueError(f"cannot import module {missing.name!r}: {missing}") from None
                raise ValueError(f"module {module_name!r} has no class {qualname!r}") from None
        if not isinstance(obj, type):
            raise ValueError(f"{qualname!r} in module {module_name!r} is not a class")
        return obj
    assert missing is not None
    raise ValueError(f"cannot import module {missing.name!r}: {missing}")


def load_server_filter(path: str, conf: Mapping[str, str], topic: bytes, subscriber_id: bytes,
                       preferences: SubscriptionPreferences,
                       filter_class_path: Sequence[str] = (), allowlist: Sequence[str] = ()) -> ServerMessageFilter:
    """Load, construct, initialize and attach the server filter class named by ``path``.

    Only a class ``filter_allowed`` accepts is imported: the hub's own
    filters, modules in a ``filter_class_path`` directory, and dotted
    prefixes in ``allowlist`` (the hub passes ``server_filter_allowlist``).
    Raises ``InvalidMessageFilterError`` naming ``path`` and the reason for any
    failure, a refused class included (a filter whose
    ``set_subscription_preferences`` raises is uninitialized again first).
    """
    def invalid(reason: str) -> InvalidMessageFilterError:
        log.warning("message filter %r for %r/%r: %s", path, topic, subscriber_id, reason)
        return InvalidMessageFilterError(f"message filter {path!r}: {reason}")

    if not isinstance(path, str) or not path.strip():
        raise invalid("empty class path")
    _add_class_path(filter_class_path)
    try:
        _candidates(path.strip())
    except ValueError as exc:
        raise invalid(str(exc)) from exc
    if not filter_allowed(path, filter_class_path, allowlist):
        raise invalid(NOT_ALLOWED)
    try:
        cls = _import_class(path.strip())
    except ValueError as exc:
        raise invalid(str(exc)) from exc
    try:
        instance = cls()
    except Exception as exc:
        raise invalid(f"constructor raised {exc!r}") from exc
    try:
        initialized = instance.initialize(dict(conf))
    except Exception as exc:
        raise invalid(f"initialize raised {exc!r}") from exc
    flt = instance if initialized is None else initialized
    if not isinstance(flt, ServerMessageFilter):
        safe_uninitialize(flt)
        raise invalid("not a server message filter (needs initialize, set_subscription_preferences, "
                      "test_message and uninitialize)")
    try:
        flt.set_subscription_preferences(topic, subscriber_id, preferences)
    except Exception as exc:
        safe_uninitialize(flt)
        raise invalid(f"set_subscription_preferences raised {exc!r}") from exc
    return flt


def safe_test(flt: ClientMessageFilter, message: Message) -> bool:
    """``flt.test_message(message)`` as a bool; ``InvalidMessageFilterError`` if the filter raised."""
    try:
        return bool(flt.test_message(message))
    except Exception as exc:
        log.warning("message filter %s raised on message %d: %r", type(flt).__name__, message.seq_id, exc)
        raise InvalidMessageFilterError(
            f"message filter {type(flt).__name__} raised on message {message.seq_id}: {exc!r}") from exc


def safe_uninitialize(flt: object) -> None:
    """Call ``flt.uninitialize()`` if it has one; an error there is logged, never raised."""
    uninitialize = getattr(flt, "uninitialize", None)
    if callable(uninitialize):
        try:
            uninitialize()
        except Exception:
            log.exception("message filter %s raised in uninitialize", type(flt).__name__)


class HeaderMatchFilter:
    """Pass the messages whose property ``options["filter.header"]`` equals ``options["filter.value"]``.

    A server filter (``message_filter="hub.filters:HeaderMatchFilter"``) and a
    client filter alike. The book-store example of the seed::

        options={"filter.header": b"type", "filter.value": b"History"}

    ``set_subscription_preferences`` raises ``ValueError`` when
    ``filter.header`` is missing (so the subscribe fails with
    ``INVALID_MESSAGE_FILTER``); a missing ``filter.value`` matches the empty value.
    """

    HEADER_OPTION = "filter.header"
    VALUE_OPTION = "filter.value"

    def __init__(self) -> None:
        self.header: str | None = None
        self.value = b""

    def initialize(self, conf: dict[str, str]) -> HeaderMatchFilter:
        return self

    def uninitialize(self) -> None:
        self.header = None

    def set_subscription_preferences(self, topic: bytes, subscriber_id: bytes,
                                     preferences: SubscriptionPreferences) -> HeaderMatchFilter:
        header = preferences.options.get(self.HEADER_OPTION)
        if not header:
            raise ValueError(f"HeaderMatchFilter needs the subscription option {self.HEADER_OPTION!r}")
        self.header = header.decode("utf-8")
        self.value = preferences.options.get(self.VALUE_OPTION, b"")
        return self

    def test_message(self, message: Message) -> bool:
        if self.header is None:
            raise RuntimeError("HeaderMatchFilter used before set_subscription_preferences")
        return message.properties.get(self.header) == self.value
