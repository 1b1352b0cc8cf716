"""BookieConf on the one configuration layer: the shipped file, bounds, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from bookie.conf import BookieConf
from bookie.errors import BKError, ConfError
from metastore import conf as msconf

SHIPPED = Path(__file__).resolve().parents[2] / "conf" / "bk_server.conf"


def test_shipped_conf_agrees_with_the_dataclass() -> None:
    assert msconf.check_conf_file(BookieConf, SHIPPED) == []
    assert msconf.load_conf(BookieConf, SHIPPED) == BookieConf()


def test_conf_error_is_both_a_bookie_and_a_metastore_conf_error(tmp_path: Path) -> None:
    path = tmp_path / "bk.conf"
    path.write_text("max_frame_size=12\n")
    with pytest.raises(ConfError) as err:
        BookieConf.from_file(path)
    assert isinstance(err.value, BKError) and isinstance(err.value, msconf.ConfError)
    assert str(err.value).splitlines() == [str(err.value)]
    assert "max_frame_size" in str(err.value) and "bk.conf" in str(err.value)


@pytest.mark.parametrize(("key", "value"), [
    ("bookie_port", "70000"), ("stats_http_port", "-2"), ("disk_usage_threshold", "0"),
    ("gc_wait_time", "-1"), ("session_timeout", "0"), ("max_partial_frame_bytes", "10"),
])
def test_out_of_range_values_name_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfError, match=key):
        BookieConf.from_properties({key: value})


def test_typed_values_and_derived_properties() -> None:
    conf = msconf.parse_conf(BookieConf, {"gc_wait_time": 1500, "disk_check_interval": "250"})
    assert (conf.gc_wait_time_s, conf.disk_check_interval_s) == (1.5, 0.25)
    assert conf.metastore == "lmdb://data/metastore"  # the standalone cluster's, so stock confs join it
    assert msconf.parse_conf(BookieConf, {"zk_host": "zk1:2181"}).metastore == "zk://zk1:2181/quire"
    assert msconf.parse_conf(BookieConf, {"zk_host": "zk1:2181", "metastore_uri": "lmdb:///m"}).metastore == \
        "lmdb:///m"
