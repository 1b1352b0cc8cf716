"""One configuration layer for every Quire process, backend and client.

A configuration is a frozen dataclass whose fields carry the seed's key
names, their types and defaults, and a one-line comment::

    from dataclasses import dataclass
    from metastore.conf import setting, parse_conf, load_conf, ConfError

    @dataclass(frozen=True)
    class HubConf:
        server_port: int = setting(4080, "port for plaintext client connections", min=0, max=65535)
        ssl_enabled: bool = setting(False, "also serve TLS on ssl_server_port")
        regions: tuple[str, ...] = setting((), "other regions, space or comma separated")

    conf = load_conf(HubConf, "conf/hw_server.conf", overrides={"server_port": "0"})
    conf = parse_conf(HubConf, {"server_port": 4081})        # dicts: strings or typed values
    conf = parse_conf(HubConf, parse_qsl(uri.query), source="metastore URI")

Values may arrive as strings (``.conf`` files, URI query strings) or already
typed (keyword arguments, dicts built in code). Strings are converted by the
field's type: ``int`` (also ``0x..``), ``float``, ``bool`` (``true/false``,
``yes/no``, ``on/off``, ``1/0``), ``str``, ``bytes`` (UTF-8) and
``tuple[str, ...]`` (split on spaces and commas).

Failure: an unknown key, a value that does not convert, or one outside the
field's ``min``/``max``/``choices`` raises ``ConfError`` with one line that
names the source and the key (``hw_server.conf: bad value for
server_port: 'x' (expected an integer)``). A dataclass may check relations
between fields in ``__post_init__`` by calling ``require``.

``conf/*.conf`` files list every key with its default and a comment;
``render_conf(cls)`` writes that text and ``check_conf_file(cls, path)``
lists where a file and a dataclass disagree (the tests call it for every
shipped file).

Metastore backends (built-in and plugins) declare one such dataclass for
their options and read the URI's query string and ``open_metastore``'s
keyword arguments with ``store_options`` (an ``IllegalOpError`` carrying the
same one-line message)::

    opts = store_options(LmdbOptions, urlsplit(uri).query, kwargs, source="lmdb metastore")

Leaf packages that must not import ``metastore`` (``placement``) declare
their dataclass with plain ``dataclasses.field(default=...,
metadata={"doc": ...})``, the same metadata ``setting`` writes, and their
callers parse it here.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from metastore.errors import IllegalOpError

__all__ = [
    "EMBEDDED_METASTORE_URI",
    "ConfError",
    "check_conf_file",
    "conf_keys",
    "describe_keys",
    "load_conf",
    "parse_conf",
    "read_properties",
    "render_conf",
    "require",
    "setting",
    "store_options",
]

T = TypeVar("T")

EMBEDDED_METASTORE_URI = "lmdb://data/metastore"
"""The standalone cluster's metastore (``quire standalone --data data``), relative to the working
directory: the default ``metastore_uri`` of the shipped bookie and hub confs, so they join it."""

_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


class ConfError(ValueError):
    """A configuration key or value is wrong; the message is one line naming it."""


def setting(default: Any, doc: str, *, min: float | None = None, max: float | None = None,
            choices: Iterable[Any] | None = None) -> Any:
    """A dataclass field for a configuration key: its default, a one-line comment and its bounds."""
    meta: dict[str, Any] = {"doc": doc}
    if min is not None:
        meta["min"] = min
    if max is not None:
        meta["max"] = max
    if choices is not None:
        meta["choices"] = tuple(choices)
    if isinstance(default, list | dict | set):
        raise TypeError("configuration defaults must be immutable (use a tuple)")
    return dataclasses.field(default=default, metadata=meta)


def require(ok: bool, key: str, value: object, why: str) -> None:
    """Raise ``ConfError`` for ``key`` unless ``ok`` (for ``__post_init__`` cross-field checks)."""
    if not ok:
        raise ConfError(f"bad value for {key}: {value!r} ({why})")


def conf_keys(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The configuration keys of a conf dataclass, by name."""
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is bool:
        return "true or false"
    if tp is bytes or tp is str:
        return "a string"
    return "a list of names"


def _convert(key: str, raw: Any, tp: Any) -> Any:
    """Convert ``raw`` (a string or an already typed value) to ``tp``; ``ValueError`` if it cannot."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # Optional[X]: None stays None
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if raw is None or (isinstance(raw, str) and raw.strip() == ""):
            return None
        return _convert(key, raw, args[0])
    if tp is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError
    if tp is int:
        if isinstance(raw, bool):
            raise ValueError
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float):
            if raw.is_integer():
                return int(raw)
            raise ValueError
        text = str(raw).strip().replace("_", "")
        return int(text, 0) if text.lower().startswith(("0x", "0o", "0b")) else int(text)
    if tp is float:
        if isinstance(raw, bool):
            raise ValueError
        value = float(raw.strip() if isinstance(raw, str) else raw)
        if value != value:  # NaN
            raise ValueError
        return value
    if tp is str:
        if isinstance(raw, bytes):
            return raw.decode()
        if isinstance(raw, Path):
            return str(raw)
        if not isinstance(raw, str):
            raise ValueError
        return raw.strip()
    if tp is bytes:
        return raw if isinstance(raw, bytes) else str(raw).strip().encode()
    if origin is tuple:
        if isinstance(raw, str):
            return tuple(p for p in raw.replace(",", " ").split() if p)
        if isinstance(raw, list | tuple | set | frozenset):
            return tuple(str(p) for p in raw)
        raise ValueError
    raise TypeError(f"configuration key {key}: unsupported type {tp!r}")


def _check_bounds(key: str, value: Any, meta: Mapping[str, Any]) -> str | None:
    if "choices" in meta and value not in meta["choices"]:
        return "expected one of " + ", ".join(str(c) for c in meta["choices"])
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and value < lo:
        return f"expected >= {lo}" + (f" and <= {hi}" if hi is not None else "")
    if hi is not None and value > hi:
        return f"expected <= {hi}" + (f" and >= {lo}" if lo is not None else "")
    return None


def parse_conf(cls: type[T], values: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None, *,
               source: str = "configuration", base: T | None = None) -> T:
    """Build ``cls`` from ``values`` (a mapping or key/value pairs), starting from ``base`` or the defaults.

    Raises ``ConfError`` naming ``source`` and the key for an unknown key or a bad value.
    """
    items = values.items() if isinstance(values, Mapping) else (values or ())
    known = conf_keys(cls)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for key, raw in items:
        f = known.get(key)
        if f is None:
            raise _unknown_key(source, key, known)
        tp = hints[key]
        try:
            value = _convert(key, raw, tp)
        except (ValueError, TypeError, UnicodeDecodeError):
            raise ConfError(f"{source}: bad value for {key}: {raw!r} (expected {_type_name(tp)})") from None
        why = _check_bounds(key, value, f.metadata)
        if why is not None:
            raise ConfError(f"{source}: bad value for {key}: {raw!r} ({why})")
        kwargs[key] = value
    try:
        if base is not None:
            return dataclasses.replace(base, **kwargs)  # type: ignore[type-var]
        return cls(**kwargs)
    except ConfError as exc:
        raise ConfError(f"{source}: {exc}") from None


def read_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse a Java properties file into ``{key: value}`` (strings, stripped), by Java's rules (jproperties).

    ``#`` and ``!`` start comment lines; the key ends at the first unescaped
    ``=``, ``:`` or whitespace (``key=value``, ``key: value`` and ``key value``
    alike, so ``metastore_uri lmdb:///x`` is the key ``metastore_uri``); a
    line ending in an odd number of backslashes continues on the next line;
    ``\\t``, ``\\n``, ``\\uXXXX``, ``\\=``, ``\\:``, ``\\ `` and ``\\\\`` are
    escapes. A repeated key keeps its last value. Raises ``ConfError`` when
    the file cannot be read or parsed, or a line has no key.
    """
    from jproperties import Properties

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfError(f"cannot read configuration file {path}: {exc.strerror or exc}") from None
    props = Properties()
    try:
        props.load(data, "utf-8")
    except Exception as exc:  # jproperties raises its ParseError, UnicodeDecodeError, ValueError
        raise ConfError(f"cannot parse configuration file {path}: {exc}") from None
    out = {str(k).strip(): str(v).strip() for k, v in props.properties.items()}
    if "" in out:
        text = data.decode("utf-8", errors="replace").splitlines()
        lineno, raw = next(((i, line) for i, line in enumerate(text, 1) if line.strip()[:1] in ("=", ":")),
                           (0, ""))
        raise ConfError(f"{path}:{lineno}: line has no key: {raw.strip()!r}")
    return out


def _unknown_key(source: str, key: str, known: Iterable[str]) -> ConfError:
    """``unknown key 'x'``, with the closest known key when one is close (``did you mean 'y'?``)."""
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfError(f"{source}: unknown key {key!r}{hint}")


def load_conf(cls: type[T], path: str | os.PathLike[str] | None = None,
              overrides: Mapping[str, Any] | None = None) -> T:
    """Read ``path`` (``None``: defaults only), then apply ``overrides``; ``ConfError`` on any bad key."""
    props: dict[str, Any] = dict(read_properties(path)) if path is not None else {}
    source = Path(path).name if path is not None else "configuration"
    conf = parse_conf(cls, props, source=source)
    if overrides:
        conf = parse_conf(cls, overrides, source="overrides", base=conf)
    return conf


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)
    if isinstance(value, bytes):
        return value.decode()
    if value is None:
        return ""
    return str(value)


def render_conf(cls: type, header: str = "") -> str:
    """The text of a ``.conf`` file listing every key of ``cls`` with its default and comment."""
    lines = [f"# {line}".rstrip() for line in header.strip().splitlines()] if header else []
    for name, f in conf_keys(cls).items():
        if lines:
            lines.append("")
        lines.append(f"# {f.metadata.get('doc', '')}".rstrip())
        lines.append(f"{name}={_format(f.default)}")
    return "\n".join(lines) + "\n"


def check_conf_file(cls: type, path: str | os.PathLike[str], *,
                    allow_changed: Iterable[str] = ()) -> list[str]:
    """Where the file at ``path`` and the dataclass ``cls`` disagree (empty when they agree).

    Every field must appear in the file with a comment line above it, with
    its default as the value (unless listed in ``allow_changed``); every key
    in the file must be a field.
    """
    problems: list[str] = []
    text = Path(path).read_text(encoding="utf-8").splitlines()
    values = read_properties(path)
    known = conf_keys(cls)
    hints = _hints(cls)
    changed = set(allow_changed)
    for key in values:
        if key not in known:
            problems.append(f"{path}: {key} is not a key of {cls.__name__}")
    for name, f in known.items():
        if name not in values:
            problems.append(f"{path}: {name} is missing")
            continue
        if not f.metadata.get("doc"):
            problems.append(f"{cls.__name__}.{name} has no comment")
        idx = next(i for i, line in enumerate(text) if line.strip().startswith(f"{name}=")
                   or line.strip().startswith(f"{name} ="))
        if idx == 0 or not text[idx - 1].lstrip().startswith("#"):
            problems.append(f"{path}: {name} has no comment line above it")
        if name in changed:
            continue
        try:
            value = _convert(name, values[name], hints[name])
        except (ValueError, TypeError):
            problems.append(f"{path}: {name}={values[name]!r} does not parse")
            continue
        if value != f.default:
            problems.append(f"{path}: {name}={values[name]!r} but the default is {_format(f.default)!r}")
    return problems


def conf_values(conf: Any) -> dict[str, str]:
    """Every key of the configuration dataclass instance ``conf`` with its value as a ``.conf`` file writes it."""
    return {name: _format(getattr(conf, name)) for name in conf_keys(type(conf))}


def describe_keys(cls: type) -> list[tuple[str, str, str]]:
    """``(key, default as written in a .conf file, comment)`` for every key (for docs and ``--help``)."""
    return [(n, _format(f.default), str(f.metadata.get("doc", ""))) for n, f in conf_keys(cls).items()]



def store_options(cls: type[T], query: str | Mapping[str, Any] | Iterable[tuple[str, Any]] | None,
                  kwargs: Mapping[str, Any] | None = None, *, source: str = "metastore options") -> T:
    """A metastore backend's options: its URI's query string, then ``open_metastore`` keyword arguments.

    ``query`` is the raw query string (``"map_size=1048576&write_mode=inline"``)
    or already split pairs; keyword arguments win over the query. Raises
    ``IllegalOpError`` with the one-line ``ConfError`` message (naming
    ``source`` and the key) for a malformed query string, an unknown key or a
    bad value.
    """
    pairs: list[tuple[str, Any]]
    if isinstance(query, str):
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
        except ValueError:
            raise IllegalOpError(f"{source}: malformed query string {query!r}") from None
    elif isinstance(query, Mapping):
        pairs = list(query.items())
    else:
        pairs = list(query or ())
    merged: dict[str, Any] = dict(pairs)
    merged.update(kwargs or {})
    try:
        return parse_conf(cls, merged, source=source)
    except ConfError as exc:
        raise IllegalOpError(str(exc)) from None
