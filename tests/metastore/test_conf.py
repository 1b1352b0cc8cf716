"""The configuration layer: types, bounds, unknown keys, files and their agreement with dataclasses."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path

import pytest

from metastore.conf import (
    ConfError,
    check_conf_file,
    describe_keys,
    load_conf,
    parse_conf,
    read_properties,
    render_conf,
    require,
    setting,
)


@dataclass(frozen=True)
class Sample:
    port: int = setting(4080, "port to listen on", min=0, max=65535)
    ratio: float = setting(0.5, "a fraction", min=0.0, max=1.0)
    enabled: bool = setting(True, "switch")
    name: str = setting("standalone", "region name")
    password: bytes = setting(b"", "secret")
    regions: tuple[str, ...] = setting((), "other regions")
    mode: str = setting("thread", "write mode", choices=("thread", "inline"))
    low: int = setting(1, "low mark")
    high: int = setting(2, "high mark")

    def __post_init__(self) -> None:
        require(self.low <= self.high, "low", self.low, "expected <= high")


def test_defaults_and_frozen() -> None:
    conf = parse_conf(Sample, {})
    assert conf.port == 4080 and conf.regions == () and conf.enabled is True
    with pytest.raises(FrozenInstanceError):
        conf.port = 1  # type: ignore[misc]


def test_strings_convert_by_type() -> None:
    conf = parse_conf(Sample, {"port": "0x10", "ratio": " 0.25", "enabled": "off", "name": " r1 ",
                               "password": "pw", "regions": "r2, r3 r4", "mode": "inline"})
    assert (conf.port, conf.ratio, conf.enabled, conf.name) == (16, 0.25, False, "r1")
    assert conf.password == b"pw" and conf.regions == ("r2", "r3", "r4") and conf.mode == "inline"


def test_typed_values_pass_through() -> None:
    conf = parse_conf(Sample, {"port": 5, "ratio": 1, "enabled": False, "regions": ["a", "b"]})
    assert (conf.port, conf.ratio, conf.enabled, conf.regions) == (5, 1.0, False, ("a", "b"))


def test_pairs_from_a_uri_query() -> None:
    from urllib.parse import parse_qsl
    conf = parse_conf(Sample, parse_qsl("port=81&enabled=yes"), source="uri")
    assert conf.port == 81 and conf.enabled is True


@pytest.mark.parametrize(("values", "fragment"), [
    ({"nope": "1"}, "src: unknown key 'nope'"),
    ({"port": "eighty"}, "src: bad value for port: 'eighty' (expected an integer)"),
    ({"port": "70000"}, "src: bad value for port: '70000' (expected <= 65535"),
    ({"ratio": "-1"}, "src: bad value for ratio: '-1' (expected >= 0.0"),
    ({"ratio": "nan"}, "bad value for ratio"),
    ({"enabled": "maybe"}, "src: bad value for enabled: 'maybe' (expected true or false)"),
    ({"port": True}, "bad value for port"),
    ({"mode": "fast"}, "src: bad value for mode: 'fast' (expected one of thread, inline)"),
    ({"low": "5"}, "src: bad value for low: 5 (expected <= high)"),
])
def test_bad_input_is_one_line_naming_the_key(values: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfError) as err:
        parse_conf(Sample, values, source="src")
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_load_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "x.conf"
    path.write_text("# comment\n! also a comment\nport = 81\nname: r9\nregions a b\n")
    conf = load_conf(Sample, path, overrides={"port": "82"})
    assert (conf.port, conf.name, conf.regions) == (82, "r9", ("a", "b"))
    with pytest.raises(ConfError, match=r"x\.conf: unknown key 'bogus'"):
        path.write_text("bogus=1\n")
        load_conf(Sample, path)
    with pytest.raises(ConfError, match="cannot read configuration file"):
        load_conf(Sample, tmp_path / "missing.conf")


def test_render_and_check_agree(tmp_path: Path) -> None:
    path = tmp_path / "s.conf"
    path.write_text(render_conf(Sample, header="Sample settings"))
    assert check_conf_file(Sample, path) == []
    assert load_conf(Sample, path) == parse_conf(Sample, {})
    assert ("regions", "", "other regions") in describe_keys(Sample)


def test_check_reports_each_disagreement(tmp_path: Path) -> None:
    path = tmp_path / "s.conf"
    text = render_conf(Sample).replace("port=4080", "port=1").replace("# switch\n", "")
    path.write_text(text.replace("mode=thread\n", "") + "# extra\nextra=1\n")
    problems = "\n".join(check_conf_file(Sample, path))
    assert "port='1' but the default is '4080'" in problems
    assert "enabled has no comment line above it" in problems
    assert "mode is missing" in problems
    assert "extra is not a key of Sample" in problems
    assert check_conf_file(Sample, path, allow_changed={"port"}) != []
    assert not any("port=" in p for p in check_conf_file(Sample, path, allow_changed={"port"}))


def test_mutable_default_is_refused() -> None:
    with pytest.raises(TypeError):
        setting([], "no")


def test_properties_follow_java_rules(tmp_path: Path) -> None:
    """Before: `metastore_uri lmdb:///x` was cut at the ':' (key 'metastore_uri lmdb'); no continuations, escapes."""
    path = tmp_path / "java.conf"
    path.write_text("# comment\n! also a comment\nmetastore_uri lmdb:///x\nzk_host: a:2181,\\\n"
                    "          b:2181\nkey\\ with\\ space = v\nregions=west=10.0.0.2:4080\nu=caf\\u00e9\n"
                    "tab\tv\ndup=1\ndup=2\n")
    assert read_properties(path) == {"metastore_uri": "lmdb:///x", "zk_host": "a:2181,b:2181",
                                     "key with space": "v", "regions": "west=10.0.0.2:4080", "u": "café",
                                     "tab": "v", "dup": "2"}
    path.write_text("a=1\n= orphan\n")
    with pytest.raises(ConfError, match=r"java.conf:2: line has no key"):
        read_properties(path)


def test_unknown_key_suggests_the_closest_one() -> None:
    with pytest.raises(ConfError, match=r"unknown key 'prot' \(did you mean 'port'\?\)"):
        parse_conf(Sample, {"prot": "1"})
    with pytest.raises(ConfError) as err:
        parse_conf(Sample, {"zzzzzz": "1"})
    assert "did you mean" not in str(err.value)
