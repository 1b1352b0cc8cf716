"""Bookie configuration: a frozen dataclass on the one configuration layer (``metastore.conf``).

    conf = BookieConf.from_file("conf/bk_server.conf", overrides={"bookie_port": "0"})
    conf = load_conf(BookieConf, "conf/bk_server.conf", {"bookie_port": 0})   # the same
    conf.bookie_port, conf.metastore, conf.disk_check_interval_s

``conf/bk_server.conf`` lists every key with its default and a one-line
comment (a test checks it with ``check_conf_file``). An unknown key or a bad
value raises ``ConfError`` (``bookie.errors.ConfError``, a subclass of
``metastore.conf.ConfError``) whose message is one line naming the key;
``quire bookie`` prints it and exits non-zero.

Times are in milliseconds and sizes in bytes, as in BookKeeper's
``bk_server.conf``. ``metastore_uri`` names the metastore; without it,
``zk_host`` (+ ``zk_prefix``) means ``zk://<zk_host><zk_prefix>``, and without
either the bookie joins the standalone cluster's embedded metastore
(``lmdb://data/metastore``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bookie.errors import ConfError
from metastore import conf as _conf
from metastore.conf import EMBEDDED_METASTORE_URI, read_properties, setting
from placement import DEFAULT_RACK

__all__ = ["DEFAULT_RACK", "BookieConf", "read_properties"]

_MiB = 1024 * 1024


@dataclass(frozen=True)
class BookieConf:
    """Every bookie setting, with BookKeeper's names (snake_case) where one exists."""

    bookie_port: int = setting(3181, "Port the bookie listens on; 0 picks a free port (printed in the ready line).",
                               min=0, max=65535)
    bookie_host: str = setting("127.0.0.1", "Interface the bookie listens on.")
    advertised_address: str = setting("", "Host the bookie registers as (clients connect to it); "
                                          "empty = bookie_host.")
    ledger_directories: str = setting("data/bookie", "The one directory that holds the entry storage (LMDB).")
    metastore_uri: str = setting("", "Metastore URI (lmdb:///path, zk://host:port/prefix, hbase://host:port/prefix); "
                                     "empty: zk://<zk_host><zk_prefix> when zk_host is set, else "
                                     "lmdb://data/metastore (the standalone cluster's, relative to the working "
                                     "directory).")
    zk_host: str = setting("", "ZooKeeper servers (host:port[,host:port]), used as zk://<zk_host><zk_prefix> "
                               "when metastore_uri is empty.")
    zk_prefix: str = setting("/quire", "Path prefix under which Quire's tables live in ZooKeeper.")
    session_timeout: int = setting(2000, "Registration session timeout (ms): the registration vanishes this "
                                         "long after the bookie dies.", min=1)
    bookie_rack: str = setting(DEFAULT_RACK, "Network location published in the registration (/region/rack).")
    max_frame_size: int = setting(5242880, "Largest frame accepted, in bytes (BookKeeper's "
                                           "nettyMaxFrameSizeBytes).", min=1024)
    max_pending_requests: int = setting(10000, "Requests in flight per connection before the bookie stops "
                                               "reading from it.", min=1)
    max_pending_response_bytes: int = setting(
        8 * _MiB, "Bytes of responses queued on one connection (read by the client too slowly) before the "
                   "bookie stops reading its requests.", min=65536)
    max_long_poll_reads_per_connection: int = setting(
        1000, "Long-poll READ_LACs one connection may park at once (at most half of max_pending_requests); "
              "more are refused with TOO_MANY_REQUESTS.",
        min=1)
    max_long_poll_reads_per_ledger: int = setting(
        16, "Long-poll READ_LACs one connection may park on one ledger at once.", min=1)
    max_partial_frame_bytes: int = setting(
        128 * _MiB, "Bytes all connections together may hold in incomplete frames; over it the newest "
                    "offending connection is closed.", min=1024)
    ledger_storage_map_size: int = setting(64 * 1024**3, "LMDB map size in bytes: the most the entry storage "
                                                         "may grow to (sparse, 64 GiB).", min=_MiB)
    disk_usage_threshold: float = setting(0.95, "Used fraction of the ledger directory's filesystem (or of the "
                                                "LMDB map) at which the bookie turns read-only.")
    disk_usage_lwm_threshold: float = setting(0.90, "Used fraction below which a read-only bookie turns "
                                                    "writable again.")
    disk_check_interval: int = setting(10000, "How often disk usage is checked (ms); commits re-check it "
                                              "every disk_check_bytes written.", min=1)
    disk_check_bytes: int = setting(16 * _MiB, "Bytes committed between two free-space checks made by the "
                                               "commits themselves.", min=4096)
    disk_usage_override_file: str = setting("", "Test hook: a file holding a used fraction (e.g. 0.97) that "
                                                "replaces the measured one; empty = off.")
    gc_wait_time: int = setting(60000, "How often entries of ledgers deleted from the metastore are removed "
                                       "(ms); 0 disables.", min=0)
    journal_directory: str = setting("", "Directory of the journal (the durability point of every add); empty = "
                                         "journal/ under ledger_directories. A separate device is the point.")
    journal_max_size_mb: int = setting(2048, "A journal file is rolled once it would grow past this (MiB).", min=1)
    journal_preallocate_mb: int = setting(16, "Journal files are preallocated this much at a time (MiB).", min=1)
    journal_max_group_wait_ms: int = setting(0, "How long a group commit waits for more adds after its first "
                                                "(ms); 0 = commit as soon as the previous sync returns.", min=0)
    write_cache_max_size_mb: int = setting(64, "Memory for synced entries not yet in LMDB (MiB); adds wait "
                                               "while a checkpoint runs and half of it is used (a checkpoint "
                                               "starts once 1 MiB or half of it is used).", min=1)
    flush_interval: int = setting(1000, "Checkpoint interval (ms): the write cache goes into LMDB and older "
                                        "journal files are deleted.", min=1)
    write_cache_max_throttle_ms: int = setting(10000, "How long an add waits for room in a full write cache "
                                                      "before it fails (ms).", min=0)
    http_server_port: int = setting(0, "Port of the HTTP server (/metrics, /healthz, /readyz, /api/v1/...): "
                                       "0 = a free port (shown in the ready line), -1 = off.", min=-1, max=65535)
    http_server_host: str = setting("127.0.0.1", "Interface the HTTP server listens on.")
    http_admin_token: str = setting("", "Bearer token PUT/POST/DELETE requests need; empty: "
                                        "http_admin_token_file, else $QUIRE_HTTP_ADMIN_TOKEN, else none needed.")
    http_admin_token_file: str = setting("", "File whose first line is the admin token (used when "
                                             "http_admin_token is empty).")
    stats_http_port: int = setting(0, "Older name of http_server_port: a port > 0 is used when http_server_port "
                                      "is 0; 0 and -1 leave the port free.", min=-1, max=65535)
    stats_http_host: str = setting("127.0.0.1", "Older name of http_server_host (used when that one is left "
                                                "at its default).")
    autorecovery_enabled: bool = setting(False, "Run AutoRecovery (an auditor candidate and a replication worker) "
                                                "in this bookie process.")
    lost_bookie_recovery_delay: int = setting(30, "Seconds a bookie must stay gone before the auditor marks its "
                                                  "ledgers under-replicated (quire shell lostbookierecoverydelay "
                                                  "overrides it cluster-wide).", min=0)
    auditor_periodic_check_interval: int = setting(3600, "Seconds between the auditor's periodic checks: live "
                                                         "bookies hold the first and last entry of their "
                                                         "fragments, and every bookie ledgers name is "
                                                         "registered (else it counts as gone); 0 disables.",
                                                         min=0)
    rereplication_entries_per_second: int = setting(0, "Entries a replication worker copies per second at most; "
                                                       "0 = unlimited.", min=0)
    open_ledger_rereplication_grace_period: int = setting(30, "Seconds an open under-replicated ledger is left to "
                                                              "its writer before a worker recovery-closes it.",
                                                          min=0)
    bookie_recovery_password: str = setting("", "Ledger password replication workers use (the empty password is "
                                                "always tried too).")

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, why: str) -> None:
            _conf.require(ok, key, getattr(self, key), why)

        try:
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
            need(self.ledger_storage_map_size >= _MiB, "ledger_storage_map_size", "expected bytes >= 1 MiB")
            need(0.0 < self.disk_usage_threshold <= 1.0, "disk_usage_threshold",
                 "expected a fraction in (0, 1]")
            need(0.0 < self.disk_usage_lwm_threshold <= self.disk_usage_threshold, "disk_usage_lwm_threshold",
                 "expected a fraction in (0, disk_usage_threshold]")
            need(self.disk_check_interval > 0, "disk_check_interval", "expected milliseconds > 0")
            need(self.gc_wait_time >= 0, "gc_wait_time", "expected milliseconds >= 0; 0 disables")
            need(-1 <= self.stats_http_port <= 65535, "stats_http_port",
                 "expected a port, 0 or -1 (both: a free port)")
            need(-1 <= self.http_server_port <= 65535, "http_server_port",
                 "expected a port, 0 (a free port) or -1 (off)")
            need(bool(self.http_server_host), "http_server_host", "must not be empty")
            if self.metastore_uri:
                need("://" in self.metastore_uri, "metastore_uri", "expected SCHEME://..., e.g. lmdb:///path")
            if self.zk_host:
                need(not self.zk_prefix or self.zk_prefix.startswith("/"), "zk_prefix", "expected /path")
        except _conf.ConfError as exc:
            raise ConfError(str(exc)) from None

    # --- construction ---------------------------------------------------------------------------

    @classmethod
    def from_properties(cls, props: Mapping[str, Any], source: str = "configuration") -> BookieConf:
        """Build from string (or typed) values; ``ConfError`` for an unknown key or a bad value."""
        return _bookie_errors(lambda: _conf.parse_conf(cls, props, source=source))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None,
                  overrides: Mapping[str, Any] | None = None) -> BookieConf:
        """Read ``path`` (``None``: defaults only), then apply ``overrides``; ``ConfError`` on any bad key."""
        return _bookie_errors(lambda: _conf.load_conf(cls, path, overrides))

    def replace(self, **changes: Any) -> BookieConf:
        return dataclasses.replace(self, **changes)

    # --- derived values -------------------------------------------------------------------------

    @property
    def metastore(self) -> str:
        """The metastore URI to open: ``metastore_uri``, else ``zk://<zk_host><zk_prefix>``, else the
        standalone cluster's embedded one (``lmdb://data/metastore``)."""
        if self.metastore_uri:
            return self.metastore_uri
        if self.zk_host:
            return f"zk://{self.zk_host}{self.zk_prefix}"
        return EMBEDDED_METASTORE_URI

    @property
    def data_dir(self) -> Path:
        return Path(self.ledger_directories)

    @property
    def journal_dir(self) -> Path:
        return Path(self.journal_directory) if self.journal_directory else self.data_dir / "journal"

    @property
    def http_host(self) -> str:
        """Where the HTTP server listens: ``http_server_host``, else the older ``stats_http_host``."""
        if self.http_server_host == "127.0.0.1" and self.stats_http_host:
            return self.stats_http_host
        return self.http_server_host

    @property
    def session_timeout_s(self) -> float:
        return self.session_timeout / 1000.0

    @property
    def disk_check_interval_s(self) -> float:
        return self.disk_check_interval / 1000.0

    @property
    def gc_wait_time_s(self) -> float:
        return self.gc_wait_time / 1000.0


def _bookie_errors(build: Any) -> BookieConf:
    """Run ``build``; a ``metastore.conf.ConfError`` comes out as ``bookie.errors.ConfError`` (same text)."""
    try:
        conf: BookieConf = build()
    except ConfError:
        raise
    except _conf.ConfError as exc:
        raise ConfError(str(exc)) from None
    return conf
