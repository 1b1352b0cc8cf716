"""Hub and hub-client configuration: every key of the seed's tables, with its default.

    from hub.conf import HubConf, HubClientConf, load_hub_conf, client_conf
    conf = load_hub_conf("conf/hw_server.conf", overrides={"server_port": "0"})
    conf.server_port, conf.metastore, conf.max_message_size
    cconf = client_conf({"max_server_redirects": "3", "enable_resubscribe": "false"})

Built on ``metastore.conf`` (the one configuration layer): values may be
strings (``.conf`` files) or typed. An unknown key or a bad value raises
``metastore.conf.ConfError`` with one line naming the key; ``quire hub``
prints it and exits with status 2.

Times are milliseconds and sizes bytes, as in Hedwig's ``hw_server.conf``,
except where the key says ``_secs``. Quire-only keys: ``metastore_uri``,
``http_server_port``, ``http_server_host``, ``http_admin_token``,
``http_admin_token_file``, ``stats_http_port``, ``http_ui_base_path``, ``max_batch_bytes``, ``max_batch_messages``,
``batch_flush_bytes``, ``batch_hold_after_adds``, ``batch_flush_delay_ms``,
``filter_class_path``, ``server_filter_allowlist``, ``server_host``,
``max_outbound_buffer``, ``max_outstanding_adds``, ``max_requests_per_turn``, ``max_pending_requests``,
``max_partial_frame_bytes``, ``incomplete_frame_timeout``, ``client_liveness_timeout``, ``ssl_only``,
``bk_client_conf``,
``ledger_create_backoff_ms``, ``ledger_create_backoff_max_ms``, ``dedup_window``, ``dedup_max_producers``,
``dedup_snapshot_interval``, ``authentication_enabled``, ``token_secret_key``, ``superuser_roles``,
``region_roles``, ``permissions_refresh_interval``, ``region_auth_token``, ``region_auth_token_file``,
``message_ttl_seconds``, ``retention_time_minutes``, ``retention_size_mb``, ``backlog_quota_limit_bytes``,
``backlog_quota_policy``, ``backlog_quota_hold_timeout``, ``policies_refresh_interval``,
``max_delivery_delay_ms``, ``max_tracked_delayed_messages``;
client: ``ssl_ca_file``, ``ssl_verify``, ``producer_name``, ``auth_token``, ``auth_token_file``.
``cache_size`` is a fixed 256 MiB by default (Hedwig's "smallest of 2G or
half the heap" has no Python equivalent).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metastore.conf import EMBEDDED_METASTORE_URI, ConfError, conf_values, load_conf, parse_conf, require, setting

__all__ = ["ClientConf", "ConfError", "HubClientConf", "HubConf", "client_conf", "load_hub_conf"]

MIB = 1024 * 1024
SECRET_KEYS = frozenset({"password", "http_admin_token", "token_secret_key", "region_auth_token"})


@dataclass(frozen=True)
class HubConf:
    """Every hub setting (seed "Hedwig server configuration parameters" plus Quire's own)."""

    # --- regions ---
    region: str = setting("standalone", "region identifier of this hub's cluster")
    regions: tuple[str, ...] = setting((), "other regions, space separated NAME or NAME=HOST:PORT[,HOST:PORT] "
                                       "(empty: none)")
    inter_region_ssl_enabled: bool = setting(False, "deprecated: true makes the hub talk to other regions over "
                                             "TLS, as ssl_enabled=true in hw_region_client.conf does")
    region_client_conf: str = setting("", "path of hw_region_client.conf: client keys and hubs of the other "
                                      "regions (empty: defaults)")
    retry_remote_subscribe_thread_run_interval: int = setting(
        120000, "ms between retries of failed asynchronous remote subscriptions", min=1)
    # --- hub server ---
    standalone: bool = setting(False, "run in standalone mode (no regions)")
    server_host: str = setting("127.0.0.1", "address to listen on and to advertise to clients and other hubs")
    server_port: int = setting(4080, "port for client connections (0 picks a free port)", min=0, max=65535)
    ssl_enabled: bool = setting(False, "also serve TLS on ssl_server_port")
    ssl_server_port: int = setting(9876, "port for TLS client connections", min=0, max=65535)
    ssl_only: bool = setting(False, "with ssl_enabled: serve TLS only, no plaintext port (the hub is named by its "
                             "TLS port)")
    password: str = setting("", "password of the pkcs12 certificate")
    cert_name: str = setting("", "unsupported, must stay empty: Hedwig's certificate as a Java classpath "
                                 "resource (use cert_path)")
    cert_path: str = setting("", "path of the SSL certificate file (empty: none)")
    ssl_handshake_timeout: int = setting(10000, "ms a TLS handshake may take before the connection is dropped",
                                         min=1)
    authentication_enabled: bool = setting(False, "require a signed token (AUTHENTICATE) on every client "
                                           "connection")
    token_secret_key: str = setting("", "path of the token secret key file (quire token create-secret-key)")
    superuser_roles: tuple[str, ...] = setting((), "token roles of region hubs and operators, space or comma "
                                               "separated: they may do anything, and act as region hubs")
    region_roles: tuple[str, ...] = setting((), "token roles of other regions' hubs, space or comma separated: "
                                            "they may subscribe as region hubs and keep srcRegion")
    permissions_refresh_interval: int = setting(1000, "ms between re-reads of the permissions table: a grant or "
                                                "revoke is in force on every hub within this", min=1)
    region_auth_token: str = setting("", "token this hub's region clients present to other regions' hubs "
                                     "(empty: region_auth_token_file, else the region client conf's auth_token)")
    region_auth_token_file: str = setting("", "file holding the region token (used when region_auth_token is "
                                          "empty)")
    # --- read-ahead cache ---
    readahead_enabled: bool = setting(True, "read messages ahead of the subscribers")
    readahead_count: int = setting(10, "number of messages to read ahead", min=1)
    readahead_size: int = setting(4 * MIB, "byte hint at which a read-ahead scan stops", min=1)
    cache_size: int = setting(256 * MIB, "bytes the read-ahead cache may hold (Quire default: 256 MiB)", min=0)
    cache_entry_ttl: int = setting(0, "ms a cache entry lives; <= 0 keeps it until pruned")
    scan_backoff_ms: int = setting(1000, "ms to wait before retrying a failed scan", min=0)
    num_readahead_cache_threads: int = setting(0, "unsupported, must stay 0: the hub reads ahead on its event "
                                               "loop, with no threads", min=0)
    # --- publish and subscription ---
    max_message_size: int = setting(1258291, "largest message body in bytes (1.2 MB)", min=1)
    default_message_window_size: int = setting(0, "delivered-but-unconsumed messages per subscriber (0: unlimited)",
                                               min=0)
    consume_interval: int = setting(50, "consumes between persisted consume pointers", min=1)
    ack_persist_interval_ms: int = setting(1000, "ms within which individual acks (consumer subscriptions) are "
                                                 "persisted", min=1)
    max_delivery_delay_ms: int = setting(0, "longest delivery delay a publish may ask for (deliver_after_ms, "
                                         "deliver_at_ms); longer ones fail with DELIVERY_DELAY_TOO_LONG "
                                         "(0: no limit)", min=0)
    max_tracked_delayed_messages: int = setting(100000, "delayed messages a SHARED or KEY_SHARED subscription "
                                                "holds in memory (about 130 bytes each); past it the log "
                                                "keeps them and they may come late, never early", min=1)
    retention_secs: int = setting(0, "release a topic idle this long (0: never)", min=0)
    rebalance_interval_sec: int = setting(60, "how often a hub compares its topic count with the cluster mean and "
                                              "sheds topics above it (0: never)", min=0)
    rebalance_tolerance_percentage: float = setting(10.0, "how far above the mean topic count a hub may be before "
                                                          "it sheds topics (percent)", min=0)
    rebalance_max_shed: int = setting(50, "most topics one rebalance releases", min=1)
    max_concurrent_topic_loads: int = setting(
        512, "topics a hub acquires at once (claim, ranges and subscriptions read, recovery of the last ledger) "
            "and, separately, first ledgers it starts at once; more wait their turn, none fails (Pulsar's "
            "maxConcurrentTopicLoadRequest)", min=1)
    messages_consumed_thread_run_interval: int = setting(
        60000, "ms between runs of the consumed-ledger deletion task", min=1)
    # --- lifecycle policies (hub.policies): the defaults of every topic; per prefix in topic_policies ---
    message_ttl_seconds: int = setting(0, "unconsumed messages older than this are acknowledged for every "
                                       "subscription (0: never)", min=0)
    retention_time_minutes: int = setting(0, "minutes consumed ledgers are kept for readers and seeks (0: deleted "
                                          "once consumed; -1: for ever)", min=-1)
    retention_size_mb: int = setting(0, "MB of consumed ledgers kept for readers and seeks (0: deleted once "
                                     "consumed; -1: for ever)", min=-1)
    backlog_quota_limit_bytes: int = setting(0, "most bytes of unconsumed messages a topic may hold (0: no "
                                             "quota)", min=0)
    backlog_quota_policy: str = setting("producer_request_hold", "what a publish past the backlog quota gets: "
                                        "producer_request_hold, producer_exception or consumer_backlog_eviction",
                                        choices=("producer_request_hold", "producer_exception",
                                                 "consumer_backlog_eviction"))
    compaction_threshold_bytes: int = setting(0, "compact a topic (hub.compaction) once the bytes stored after its "
                                              "last compaction point exceed this (0: only when asked)", min=0)
    backlog_quota_hold_timeout: int = setting(25000, "ms producer_request_hold holds a publish before it fails "
                                              "with BACKLOG_QUOTA_EXCEEDED (keep it below the clients' "
                                              "server_ack_response_timeout)", min=1)
    policies_refresh_interval: int = setting(1000, "ms between re-reads of the topic_policies table: a policy "
                                             "change is in force on every hub within this", min=1)
    max_batch_bytes: int = setting(MIB, "bytes of messages one ledger entry may batch", min=1)
    max_batch_messages: int = setting(1000, "messages one ledger entry may batch", min=1)
    max_outstanding_adds: int = setting(16, "ledger entries in flight per topic", min=1)
    batch_hold_after_adds: int = setting(3, "adds in flight from which publishes queue for a batch instead "
                                         "of going out as an entry at once (1: queue behind any add; above 1, only "
                                         "behind light entries of at most 2 messages)", min=1)
    batch_flush_delay_ms: float = setting(0.0, "with adds in flight, queued publishes go out as another entry "
                                          "at most this long after the first queued (0: no time bound)", min=0)
    batch_flush_bytes: int = setting(8192, "with adds in flight, queued publishes go out as another entry once "
                                     "they hold this many bytes (0: at once)", min=0)
    dedup_window: int = setting(10000, "publishes per producer whose duplicates are answered with the original's "
                                "seq id (older ones: DUPLICATE_PUBLISH)", min=1)
    dedup_max_producers: int = setting(1000, "producers a topic remembers for deduplication; a new one past it "
                                       "forgets the least recently active", min=1)
    dedup_snapshot_interval: int = setting(1000, "messages of a topic with producers between snapshots of its "
                                           "deduplication state (a new owner reads the log after the last)", min=1)
    max_outbound_buffer: int = setting(4 * MIB, "bytes buffered for a slow client before delivery pauses",
                                       min=1024)
    max_partial_frame_bytes: int = setting(64 * MIB, "bytes all client connections together may hold in "
                                           "incomplete request frames; over it the newest offender is closed",
                                           min=1024)
    incomplete_frame_timeout: int = setting(30000, "ms a request frame may stay incomplete before its connection "
                                            "is closed (0: never)", min=0)
    client_liveness_timeout: int = setting(30000, "ms after which a client connection whose peer went silent "
                                           "(cut off, its host gone) is closed and its consumers' messages go to "
                                           "the others: TCP keepalive probes after half of it idle, "
                                           "TCP_USER_TIMEOUT for sent data unacknowledged this long (0: off)", min=0)
    max_pending_requests: int = setting(10000, "requests of one connection read and not yet answered (publishes "
                                        "waiting for their ledger entry) before the hub stops reading it until "
                                        "half are answered", min=1)
    max_requests_per_turn: int = setting(256, "requests of one connection served per event-loop turn before "
                                         "other connections get theirs", min=1)
    filter_class_path: tuple[str, ...] = setting((), "directories added to sys.path whose modules may be loaded "
                                                 "as server message filters")
    server_filter_allowlist: tuple[str, ...] = setting((), "dotted prefixes of other server message filter classes "
                                                       "hubs may load, space or comma separated (empty: none)")
    # --- ZooKeeper ---
    zk_host: str = setting("", "ZooKeeper servers, e.g. localhost:2181 (used when metastore_uri is empty; "
                               "empty: no ZooKeeper)")
    zk_timeout: int = setting(2000, "ms of the metastore session (ownership and liveness leases)", min=100)
    # --- BookKeeper ---
    bk_ensemble_size: int = setting(3, "bookies per topic ledger", min=1)
    bk_write_quorum_size: int = setting(2, "copies of each entry", min=1)
    bk_ack_quorum_size: int = setting(2, "acknowledgements before a publish succeeds", min=1)
    max_entries_per_ledger: int = setting(0, "entries before a topic rolls to a new ledger (0: unlimited)", min=0)
    bk_client_conf: str = setting("", "path of a bk_client.conf for the hub's ledger client, e.g. with "
                                  "delay_ensemble_change=true (empty: defaults)")
    ledger_create_backoff_ms: int = setting(100, "ms a topic waits before trying again to start a ledger after a "
                                            "failed start (doubling per failure)", min=1)
    ledger_create_backoff_max_ms: int = setting(2000, "most ms a topic waits between attempts to start a ledger",
                                                min=1)
    # --- metadata ---
    zk_prefix: str = setting("/hedwig", "ZooKeeper path prefix (used when metastore_uri is empty)")
    metadata_manager_based_topic_manager_enabled: bool = setting(
        False, "claim topics by CAS + hub lease instead of ephemeral keys")
    metadata_manager_factory_class: str = setting("", "unsupported, must stay empty: metadata lives in the "
                                                  "MetaStore named by metastore_uri")
    metastore_uri: str = setting("", "metastore URI (lmdb:///path, zk://host:port/prefix, hbase://...); empty: "
                                     "zk://<zk_host><zk_prefix> when zk_host is set, else lmdb://data/metastore "
                                     "(the standalone cluster's)")
    http_server_port: int = setting(0, "port of the HTTP server (/metrics, /healthz, /readyz, /admin/v1/...): "
                                       "0 = a free port (shown in the ready line), -1 = off", min=-1, max=65535)
    http_server_host: str = setting("127.0.0.1", "interface the HTTP server listens on")
    http_admin_token: str = setting("", "bearer token PUT/POST/DELETE requests need; empty: http_admin_token_file, "
                                        "else $QUIRE_HTTP_ADMIN_TOKEN, else none needed")
    http_admin_token_file: str = setting("", "file whose first line is the admin token (used when "
                                             "http_admin_token is empty)")
    stats_http_port: int = setting(0, "older name of http_server_port: a port > 0 is used when http_server_port "
                                      "is 0; 0 and -1 leave the port free", min=-1, max=65535)
    http_ui_base_path: str = setting("", "path prefix a reverse proxy serves this hub's HTTP server under (it "
                                         "strips it), e.g. /quire: the web console's links carry it; empty: none")

    def __post_init__(self) -> None:
        # Hedwig keys that have no meaning here: a non-default value is refused rather than ignored
        require(not self.cert_name, "cert_name", self.cert_name,
                "a Java classpath resource; Quire has none: give the certificate file in cert_path")
        require(self.num_readahead_cache_threads == 0, "num_readahead_cache_threads",
                self.num_readahead_cache_threads, "the hub reads ahead on its event loop and has no such "
                "threads: leave it 0; readahead_count and readahead_size tune read-ahead")
        require(not self.metadata_manager_factory_class, "metadata_manager_factory_class",
                self.metadata_manager_factory_class, "Quire keeps its metadata in the MetaStore: choose the "
                "backend with metastore_uri (lmdb://, zk://, hbase://)")
        require(self.max_partial_frame_bytes >= self.max_frame_size, "max_partial_frame_bytes",
                self.max_partial_frame_bytes, f"must hold one whole request frame ({self.max_frame_size} bytes "
                "for this max_message_size)")
        require(self.bk_write_quorum_size <= self.bk_ensemble_size, "bk_write_quorum_size",
                self.bk_write_quorum_size, "must be <= bk_ensemble_size")
        require(bool(self.token_secret_key) or not self.authentication_enabled, "token_secret_key",
                self.token_secret_key, "is needed with authentication_enabled=true")
        require(self.ssl_enabled or not self.ssl_only, "ssl_only", self.ssl_only, "needs ssl_enabled=true")
        require(self.bk_ack_quorum_size <= self.bk_write_quorum_size, "bk_ack_quorum_size",
                self.bk_ack_quorum_size, "must be <= bk_write_quorum_size")

    @property
    def metastore(self) -> str:
        """The metastore URI: ``metastore_uri``, else ``zk://<zk_host><zk_prefix>`` when ``zk_host`` is set,
        else the standalone cluster's embedded one (``lmdb://data/metastore``)."""
        if self.metastore_uri:
            return self.metastore_uri
        if self.zk_host:
            return f"zk://{self.zk_host}{self.zk_prefix}"
        return EMBEDDED_METASTORE_URI

    def filter_conf(self) -> dict[str, str]:
        """What a server filter's ``initialize(conf)`` gets: every key as a ``.conf`` file writes it.

        Secrets (``password``, of the TLS certificate, ``http_admin_token``, ``token_secret_key`` and
        ``region_auth_token``) are left out.
        """
        values = conf_values(self)
        for key in SECRET_KEYS:
            values.pop(key, None)
        return values

    @property
    def max_frame_size(self) -> int:
        """Largest request frame accepted: room for a message over the limit to get MESSAGE_TOO_LARGE."""
        return 2 * self.max_message_size + 64 * 1024


@dataclass(frozen=True)
class HubClientConf:
    """The client keys of the seed's region-client table, plus ``enable_resubscribe``."""

    default_server_host: str = setting("localhost:4080", "hub(s) to try first, host:port, comma separated")
    ssl_enabled: bool = setting(False, "talk to hubs over TLS")
    ssl_ca_file: str = setting("", "PEM file of the CAs that sign hub certificates (empty: the system's CAs)")
    ssl_verify: bool = setting(True, "verify the hub's certificate and host name (false: encrypt only, "
                               "with a warning in the log)")
    max_message_size: int = setting(2097152, "largest message body the client sends (2 MB)", min=1)
    max_server_redirects: int = setting(2, "redirects permitted for one request", min=0)
    auto_send_consume_message_enabled: bool = setting(True, "send consumes for handled messages by itself")
    consumed_messages_buffer_size: int = setting(5, "handled messages per consume sent", min=1)
    max_outstanding_messages: int = setting(10, "delivered messages queued for handlers before reading pauses; "
                                            "also the most messages the hub puts in one delivery", min=1)
    server_ack_response_timeout: int = setting(30000, "ms before a request without a response fails", min=1)
    keep_alive_interval: int = setting(30000, "ms of silence from a hub before the client pings it; a ping "
                                       "unanswered for server_ack_response_timeout drops the connection, and its "
                                       "subscriptions attach elsewhere (Pulsar's keepAliveInterval; 0: no pings)",
                                       min=0)
    enable_resubscribe: bool = setting(True, "subscribe again by itself after a hub failure")
    subscribe_reconnect_retry_wait_time: int = setting(200, "ms between resubscribe attempts", min=1)
    producer_name: str = setting("", "number publishes as this producer, so the owner stores each at most once "
                                 "(empty: off)")
    batching_enabled: bool = setting(True, "send the publishes a topic gets in one event-loop turn as one "
                                     "request (Pulsar's producer batching; each message keeps its seq id)")
    batching_max_messages: int = setting(1000, "messages one batched publish may carry", min=1)
    batching_max_bytes: int = setting(131072, "bytes of message bodies one batched publish may carry (a "
                                      "larger message goes alone)", min=1)
    batching_max_publish_delay_ms: int = setting(0, "ms a batch waits for more publishes (0: until the end "
                                                 "of the event-loop turn, which adds no latency)", min=0)
    batching_multi_topic: bool = setting(True, "send the batches of one event-loop turn to many topics one hub "
                                         "owns as one request (PUBLISH_MULTI; a hub that predates it gets a "
                                         "request per topic)")
    auth_token: str = setting("", "signed token sent to hubs that require authentication (empty: none)")
    auth_token_file: str = setting("", "file holding the token, read at connect (used when auth_token is empty)")


def load_hub_conf(path: str | os.PathLike[str] | None = None, overrides: Mapping[str, Any] | None = None) -> HubConf:
    """Read ``path`` (None: defaults) and apply ``overrides``; ``ConfError`` (one line) when invalid."""
    return load_conf(HubConf, path, overrides)


ClientConf = HubClientConf
"""The name ``hub.conf`` has exported; ``HubClientConf`` says what it configures (a ``HedwigClient``)."""


def client_conf(values: Mapping[str, Any] | HubClientConf | None = None) -> HubClientConf:
    """A ``HubClientConf`` from a dict of client keys (strings or typed); ``ConfError`` when invalid."""
    if isinstance(values, HubClientConf):
        return values
    return parse_conf(HubClientConf, values or {}, source="client conf")
