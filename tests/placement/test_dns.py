"""StaticMapping and ScriptBasedMapping (with real executable scripts)."""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

import pytest

from placement import DEFAULT_RACK, DNSToSwitchMapping, ScriptBasedMapping, StaticMapping


def make_script(tmp_path: Path, body: str, name: str = "topology.sh") -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# -- StaticMapping -----------------------------------------------------------


def test_static_mapping_full_name_then_host_then_default() -> None:
    dns = StaticMapping(
        {
            "10.0.0.1:3181": "/region-a/rack-1",
            "10.0.0.1": "/region-a/rack-9",
            "10.0.0.2": "/region-b/rack-2",
        }
    )
    assert dns.resolve(["10.0.0.1:3181", "10.0.0.1:4000", "10.0.0.2:3181", "10.0.0.3:3181"]) == [
        "/region-a/rack-1",
        "/region-a/rack-9",
        "/region-b/rack-2",
        DEFAULT_RACK,
    ]
    assert dns.resolve([]) == []


def test_static_mapping_is_a_resolver() -> None:
    assert isinstance(StaticMapping(), DNSToSwitchMapping)
    assert StaticMapping().resolve(["a:1"]) == [DEFAULT_RACK]


def test_static_mapping_rejects_bad_locations() -> None:
    with pytest.raises(ValueError):
        StaticMapping({"a:1": "rack-without-slash"})


def test_static_mapping_from_file_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "racks.conf"
    path.write_text("# bookie racks\n10.0.0.1:3181 = /region-a/rack-1\n\n10.0.0.2 = /region-b/rack-2  # host only\n")
    dns = StaticMapping(path)
    assert dns.resolve(["10.0.0.1:3181", "10.0.0.2:3181"]) == ["/region-a/rack-1", "/region-b/rack-2"]
    path.write_text("10.0.0.1:3181 = /region-c/rack-5\n")
    assert dns.resolve(["10.0.0.1:3181"]) == ["/region-a/rack-1"]  # cached until reload
    dns.reload_cached_mappings()
    assert dns.resolve(["10.0.0.1:3181", "10.0.0.2:3181"]) == ["/region-c/rack-5", DEFAULT_RACK]


def test_static_mapping_accepts_str_path(tmp_path: Path) -> None:
    path = tmp_path / "racks.conf"
    path.write_text("h:1=/r/k\n")
    assert StaticMapping(str(path)).resolve(["h:1"]) == ["/r/k"]


@pytest.mark.parametrize("line", ["no-equals-sign /r/k", "h:1 = not-a-location", " = /r/k"])
def test_static_mapping_bad_file_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "racks.conf"
    path.write_text(f"ok:1 = /r/k\n{line}\n")
    with pytest.raises(ValueError, match=r"racks.conf:2"):
        StaticMapping(path)


def test_static_mapping_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        StaticMapping(tmp_path / "nope.conf")


def test_static_mapping_updates() -> None:
    dns = StaticMapping()
    dns.set_location("h:1", "/r/k")
    assert dns.resolve(["h:1"]) == ["/r/k"]
    assert dns.mappings() == {"h:1": "/r/k"}
    dns.remove("h:1")
    dns.remove("h:1")
    assert dns.resolve(["h:1"]) == [DEFAULT_RACK]
    dns.reload_cached_mappings()  # dict-backed: keeps the table
    with pytest.raises(ValueError):
        dns.set_location("h:2", "bad")


# -- ScriptBasedMapping ------------------------------------------------------


ECHO_RACKS = """
log="$(dirname "$0")/calls.log"
echo "$@" >> "$log"
for name in "$@"; do
  case "$name" in
    a*) echo "/region-a/rack-1" ;;
    b*) echo "/region-b/rack-2" ;;
    *)  echo "/rack-3" ;;
  esac
done
"""


def calls(tmp_path: Path) -> list[str]:
    log_file = tmp_path / "calls.log"
    return log_file.read_text().splitlines() if log_file.exists() else []


def test_script_resolves_one_location_per_line(tmp_path: Path) -> None:
    dns = ScriptBasedMapping(make_script(tmp_path, ECHO_RACKS))
    assert dns.resolve(["a1:3181", "b1:3181", "c1:3181"]) == [
        "/region-a/rack-1",
        "/region-b/rack-2",
        "/default-region/rack-3",
    ]
    assert calls(tmp_path) == ["a1:3181 b1:3181 c1:3181"]


def test_script_results_are_cached_until_reload(tmp_path: Path) -> None:
    dns = ScriptBasedMapping(make_script(tmp_path, ECHO_RACKS))
    dns.resolve(["a1:3181", "b1:3181"])
    assert dns.resolve(["b1:3181", "a1:3181", "a2:3181"]) == [
        "/region-b/rack-2",
        "/region-a/rack-1",
        "/region-a/rack-1",
    ]
    assert calls(tmp_path) == ["a1:3181 b1:3181", "a2:3181"]
    dns.reload_cached_mappings()
    dns.resolve(["a1:3181"])
    assert calls(tmp_path)[-1] == "a1:3181"
    assert len(calls(tmp_path)) == 3


def test_script_batches_arguments(tmp_path: Path) -> None:
    dns = ScriptBasedMapping(make_script(tmp_path, ECHO_RACKS), max_args=2)
    names = [f"a{i}:1" for i in range(5)]
    assert dns.resolve(names) == ["/region-a/rack-1"] * 5
    assert [len(c.split()) for c in calls(tmp_path)] == [2, 2, 1]


def test_script_duplicate_names_run_once(tmp_path: Path) -> None:
    dns = ScriptBasedMapping(make_script(tmp_path, ECHO_RACKS))
    assert dns.resolve(["a:1", "a:1"]) == ["/region-a/rack-1"] * 2
    assert calls(tmp_path) == ["a:1"]


def test_script_failing_exit_code(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    script = make_script(tmp_path, 'echo "/region-a/rack-1"\necho boom >&2\nexit 3\n')
    dns = ScriptBasedMapping(script)
    with caplog.at_level(logging.WARNING, logger="placement.dns"):
        assert dns.resolve(["a:1"]) == [DEFAULT_RACK]
    assert "exited with status 3" in caplog.text
    assert "boom" in caplog.text


def test_script_failure_is_not_cached(tmp_path: Path) -> None:
    flag = tmp_path / "healthy"
    script = make_script(tmp_path, f'[ -e "{flag}" ] || exit 1\necho /r/k\n')
    dns = ScriptBasedMapping(script)
    assert dns.resolve(["a:1"]) == [DEFAULT_RACK]
    flag.touch()
    assert dns.resolve(["a:1"]) == ["/r/k"]


def test_script_timeout(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    script = make_script(tmp_path, "sleep 30\necho /r/k\n")
    dns = ScriptBasedMapping(script, timeout_seconds=0.2)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="placement.dns"):
        assert dns.resolve(["a:1", "b:1"]) == [DEFAULT_RACK, DEFAULT_RACK]
    assert time.monotonic() - started < 10  # the sleeping child was killed, not waited for
    assert "timed out" in caplog.text


def test_script_wrong_line_count(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    script = make_script(tmp_path, "echo /r/k\n")
    with caplog.at_level(logging.WARNING, logger="placement.dns"):
        assert ScriptBasedMapping(script).resolve(["a:1", "b:1"]) == [DEFAULT_RACK, DEFAULT_RACK]
    assert "printed 1 locations for 2 names" in caplog.text


def test_script_invalid_location_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    script = make_script(tmp_path, "echo /r/k\necho garbage\n")
    with caplog.at_level(logging.WARNING, logger="placement.dns"):
        assert ScriptBasedMapping(script).resolve(["a:1", "b:1"]) == ["/r/k", DEFAULT_RACK]
    assert "garbage" in caplog.text


def test_script_missing_or_not_executable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\necho /r/k\n")
    os.chmod(plain, 0o644)
    with caplog.at_level(logging.WARNING, logger="placement.dns"):
        assert ScriptBasedMapping(tmp_path / "missing.sh").resolve(["a:1"]) == [DEFAULT_RACK]
        assert ScriptBasedMapping(plain).resolve(["a:1"]) == [DEFAULT_RACK]
    assert caplog.text.count("cannot run") == 2


def test_no_script_means_default_rack(tmp_path: Path) -> None:
    dns = ScriptBasedMapping(None)
    assert dns.resolve(["a:1", "b:2"]) == [DEFAULT_RACK, DEFAULT_RACK]
    assert dns.resolve([]) == []


def test_script_from_conf(tmp_path: Path) -> None:
    script = make_script(tmp_path, ECHO_RACKS)
    dns = ScriptBasedMapping.from_conf({"network_topology_script_file": str(script)})
    assert dns.resolve(["b:1"]) == ["/region-b/rack-2"]
    assert ScriptBasedMapping.from_conf({}).path is None


@pytest.mark.parametrize("kwargs", [{"timeout_seconds": 0}, {"max_args": 0}])
def test_script_bad_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ScriptBasedMapping("/bin/true", **kwargs)  # type: ignore[arg-type]
