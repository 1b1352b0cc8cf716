"""hub.conf: every seed key with its default, the shipped conf files agree, bad keys stop `quire hub`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hub.conf import ClientConf, HubConf, client_conf, load_hub_conf
from metastore.conf import ConfError, check_conf_file, conf_keys

ROOT = Path(__file__).resolve().parents[2]

SEED_SERVER_KEYS = {
    "region", "regions", "server_port", "ssl_enabled", "ssl_server_port", "cert_path", "password",
    "readahead_enabled", "readahead_count", "readahead_size", "cache_size", "cache_entry_ttl", "scan_backoff_ms",
    "max_message_size", "default_message_window_size", "consume_interval", "retention_secs",
    "messages_consumed_thread_run_interval", "bk_ensemble_size", "bk_write_quorum_size", "bk_ack_quorum_size",
    "max_entries_per_ledger", "zk_host", "zk_timeout", "zk_prefix", "metadata_manager_based_topic_manager_enabled",
    "metastore_uri", "stats_http_port", "max_batch_bytes", "max_batch_messages", "filter_class_path",
    "retry_remote_subscribe_thread_run_interval", "server_filter_allowlist",
}


def test_every_seed_key_with_its_seed_default() -> None:
    assert SEED_SERVER_KEYS <= set(conf_keys(HubConf))
    c = HubConf()
    assert (c.region, c.server_port, c.ssl_server_port, c.readahead_count) == ("standalone", 4080, 9876, 10)
    assert c.readahead_size == 4 * 1024 * 1024 and c.scan_backoff_ms == 1000 and c.cache_entry_ttl == 0
    assert (c.consume_interval, c.messages_consumed_thread_run_interval, c.retention_secs) == (50, 60000, 0)
    assert (c.bk_ensemble_size, c.bk_write_quorum_size, c.bk_ack_quorum_size) == (3, 2, 2)
    assert (c.zk_timeout, c.zk_prefix, c.max_message_size) == (2000, "/hedwig", 1258291)
    assert c.default_message_window_size == 0 and c.max_entries_per_ledger == 0
    assert not c.metadata_manager_based_topic_manager_enabled and c.readahead_enabled


def test_client_defaults_from_seed() -> None:
    c = ClientConf()
    assert (c.max_message_size, c.max_server_redirects, c.consumed_messages_buffer_size) == (2097152, 2, 5)
    assert (c.max_outstanding_messages, c.server_ack_response_timeout) == (10, 30000)
    assert c.auto_send_consume_message_enabled and c.enable_resubscribe and not c.ssl_enabled
    assert client_conf({"enable_resubscribe": "false", "max_server_redirects": 4}).max_server_redirects == 4
    with pytest.raises(ConfError, match="max_server_redirectz"):
        client_conf({"max_server_redirectz": "1"})


@pytest.mark.parametrize(("cls", "name"), [(HubConf, "hw_server.conf"), (ClientConf, "hw_client.conf")])
def test_shipped_conf_files_agree(cls: type, name: str) -> None:
    assert check_conf_file(cls, ROOT / "conf" / name) == []


def test_bad_values_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfError, match="bk_ack_quorum_size"):
        load_hub_conf(None, {"bk_ack_quorum_size": "3"})
    with pytest.raises(ConfError, match="server_port"):
        load_hub_conf(None, {"server_port": "http"})
    assert load_hub_conf(None, {"metastore_uri": ""}).metastore == "lmdb://data/metastore"   # the standalone's
    assert load_hub_conf(None, {"zk_host": "localhost:2181"}).metastore == "zk://localhost:2181/hedwig"


@pytest.mark.parametrize(("line", "key"), [("no_such_key=1", "no_such_key"), ("consume_interval=often",
                                                                                  "consume_interval")])
def test_quire_hub_exits_with_one_line(tmp_path: Path, line: str, key: str) -> None:
    conf = tmp_path / "hw_server.conf"
    conf.write_text(line + "\n")
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "hub", "--conf", str(conf)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], proc.stderr


def test_filter_keys_parse_and_the_filter_conf_leaves_secrets_out() -> None:
    c = load_hub_conf(None, {"server_filter_allowlist": "acme.filters, other.pkg:Cls", "filter_class_path": "/a /b",
                             "password": "pkcs12-secret", "http_admin_token": "admin-secret"})
    assert c.server_filter_allowlist == ("acme.filters", "other.pkg:Cls") and c.filter_class_path == ("/a", "/b")
    assert HubConf().server_filter_allowlist == ()                       # nothing but the hub's own by default
    given = c.filter_conf()
    assert given["server_filter_allowlist"] == "acme.filters other.pkg:Cls" and given["consume_interval"] == "50"
    assert "password" not in given
    assert set(given) == set(conf_keys(HubConf)) - {"password", "http_admin_token", "token_secret_key",
                                                    "region_auth_token"}
    assert "admin-secret" not in given.values()


@pytest.mark.parametrize(("key", "value", "says"), [
    ("cert_name", "server.p12", "cert_path"),
    ("num_readahead_cache_threads", "8", "readahead_count"),
    ("metadata_manager_factory_class", "org.apache.hedwig.server.meta.ZkMetadataManagerFactory", "metastore_uri"),
])
def test_hedwig_keys_without_meaning_refuse_a_non_default_value(key: str, value: str, says: str) -> None:
    with pytest.raises(ConfError, match=f"{key}.*{says}"):
        load_hub_conf(None, {key: value})
    load_hub_conf(None, {key: str(getattr(HubConf(), key))})   # the default stays accepted


def test_inter_region_ssl_enabled_makes_region_clients_use_tls() -> None:
    from types import SimpleNamespace

    from hub.regions import RegionManager

    def region_client_ssl(**overrides: str) -> bool:
        conf = load_hub_conf(None, {"region": "r1", "regions": "r2=127.0.0.1:1", **overrides})
        return bool(RegionManager(SimpleNamespace(conf=conf)).client_conf.ssl_enabled)

    assert not region_client_ssl()
    assert region_client_ssl(inter_region_ssl_enabled="true")
