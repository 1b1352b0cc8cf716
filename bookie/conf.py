"""Bookie configuration: a frozen dataclass built from a ``key=value`` properties file.

    conf = BookieConf.from_file("conf/bk_server.conf", overrides={"bookie_port": "0"})
    conf.bookie_port, conf.metastore, conf.disk_check_interval_s

``conf/bk_server.conf`` lists every key with its default and a one-line
comment. An unknown key or a bad value raises ``ConfError`` whose message is
one line naming the key (``quire bookie`` prints it and exits non-zero).

Times are in milliseconds and sizes in bytes, as in BookKeeper's
``bk_server.conf``. ``metastore_uri`` names the metastore; without it,
``zk_host`` (+ ``zk_prefix``) means ``zk://<zk_host><zk_prefix>``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from bookie.errors import ConfError

DEFAULT_RACK = "/default-region/default-rack"


def read_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse a Java-style properties file into ``{key: value}`` (strings, stripped).

    ``#`` and ``!`` start comment lines; ``key=value``, ``key: value`` and
    ``key value`` are accepted; a repeated key keeps its last value. Raises
    ``ConfError`` when the file cannot be read or a line has no key.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfError(f"cannot read configuration file {path}: {exc.strerror or exc}") from None
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut < 0:
            key, _, value = line.partition(" ")
        else:
            key, value = line[:cut], line[cut + 1:]
        key, value = key.strip(), value.strip()
        if not key:
            raise ConfError(f"{path}:{lineno}: line has no key: {raw.strip()!r}")
        out[key] = value
    return out


@dataclass(frozen=True)
class BookieConf:
    """Every bookie setting, with BookKeeper's names (snake_case) where one exists."""

    bookie_port: int = 3181
    bookie_host: str = "127.0.0.1"
    advertised_address: str = ""
    ledger_directories: str = "data/bookie"
    metastore_uri: str = ""
    zk_host: str = ""
    zk_prefix: str = "/quire"
    session_timeout: int = 2000
    bookie_rack: str = DEFAULT_RACK
    max_frame_size: int = 5242880
    max_pending_requests: int = 10000
    ledger_storage_map_size: int = 64 * 1024**3
    disk_usage_threshold: float = 0.95
    disk_usage_lwm_threshold: float = 0.90
    disk_check_interval: int = 10000
    disk_usage_override_file: str = ""
    gc_wait_time: int = 60000
    stats_http_port: int = 0
    stats_http_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, why: str) -> None:
            if not ok:
                raise ConfError(f"bad value for {key}: {getattr(self, key)!r} ({why})")

        need(0 <= self.bookie_port <= 65535, "bookie_port", "expected 0..65535; 0 picks a free port")
        need(bool(self.bookie_host), "bookie_host", "must not be empty")
        need(bool(self.ledger_directories) and "," not in self.ledger_directories,
             "ledger_directories", "expected exactly one directory")
        need(self.session_timeout > 0, "session_timeout", "expected milliseconds > 0")
        parts = self.bookie_rack.split("/")
        need(self.bookie_rack.startswith("/") and all(parts[1:]), "bookie_rack",
             "expected a network location such as /region/rack")
        need(self.max_frame_size >= 1024, "max_frame_size", "expected bytes >= 1024")
        need(self.max_pending_requests > 0, "max_pending_requests", "expected > 0")
        need(self.ledger_storage_map_size >= 1024 * 1024, "ledger_storage_map_size", "expected bytes >= 1 MiB")
        need(0.0 < self.disk_usage_threshold <= 1.0, "disk_usage_threshold", "expected a fraction in (0, 1]")
        need(0.0 < self.disk_usage_lwm_threshold <= self.disk_usage_threshold, "disk_usage_lwm_threshold",
             "expected a fraction in (0, disk_usage_threshold]")
        need(self.disk_check_interval > 0, "disk_check_interval", "expected milliseconds > 0")
        need(self.gc_wait_time >= 0, "gc_wait_time", "expected milliseconds >= 0; 0 disables")
        need(-1 <= self.stats_http_port <= 65535, "stats_http_port",
             "expected 0 (off), -1 (a free port) or a port")
        if self.metastore_uri:
            need("://" in self.metastore_uri, "metastore_uri", "expected SCHEME://..., e.g. lmdb:///path")
        if self.zk_host:
            need(not self.zk_prefix or self.zk_prefix.startswith("/"), "zk_prefix", "expected /path")

    # --- construction ---------------------------------------------------------------------------

    @classmethod
    def from_properties(cls, props: Mapping[str, str], source: str = "configuration") -> BookieConf:
        """Build from string values; ``ConfError`` for an unknown key or an unparsable value."""
        types = {f.name: f.type for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in props.items():
            if key not in types:
                raise ConfError(f"unknown key {key!r} in {source}")
            kwargs[key] = _parse(key, str(raw).strip(), str(types[key]))
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None,
                  overrides: Mapping[str, str] | None = None) -> BookieConf:
        """Read ``path`` (``None``: defaults only), then apply ``overrides`` (string values)."""
        props = read_properties(path) if path is not None else {}
        props.update(overrides or {})
        return cls.from_properties(props, source=str(path) if path is not None else "overrides")

    def replace(self, **changes: Any) -> BookieConf:
        return dataclasses.replace(self, **changes)

    # --- derived values -------------------------------------------------------------------------

    @property
    def metastore(self) -> str:
        """The metastore URI to open; ``ConfError`` when none is configured."""
        if self.metastore_uri:
            return self.metastore_uri
        if self.zk_host:
            return f"zk://{self.zk_host}{self.zk_prefix}"
        raise ConfError("no metastore configured: set metastore_uri (or zk_host)")

    @property
    def data_dir(self) -> Path:
        return Path(self.ledger_directories)

    @property
    def session_timeout_s(self) -> float:
        return self.session_timeout / 1000.0

    @property
    def disk_check_interval_s(self) -> float:
        return self.disk_check_interval / 1000.0

    @property
    def gc_wait_time_s(self) -> float:
        return self.gc_wait_time / 1000.0


def _parse(key: str, raw: str, type_name: str) -> Any:
    try:
        if type_name == "int":
            return int(raw, 0) if raw.lower().startswith(("0x", "0o", "0b")) else int(raw)
        if type_name == "float":
            return float(raw)
    except ValueError:
        expected = "an integer" if type_name == "int" else "a number"
        raise ConfError(f"bad value for {key}: {raw!r} (expected {expected})") from None
    return raw
