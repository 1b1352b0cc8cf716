"""The `quire` console script: --help, --version, and bad usage."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import __version__


def quire(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True, timeout=60)


def test_version() -> None:
    out = quire("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"quire {__version__}"


def test_help_lists_the_roles() -> None:
    out = quire("--help")
    assert out.returncode == 0
    for sub in ("bookie", "standalone", "zookeeper", "bench"):
        assert sub in out.stdout


def test_unknown_subcommand_is_a_usage_error() -> None:
    out = quire("frobnicate")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_bench_lists_its_benchmarks() -> None:
    out = quire("bench", "--help")
    assert out.returncode == 0
    for name in ("metastore", "placement", "ledger"):
        assert name in out.stdout


def test_metastore_bench_prints_json_lines(tmp_path: object) -> None:
    import json

    out = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "metastore", "--count", "50"],
                         capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    cases = {(r["case"], r["client"].split()[0]) for r in rows}
    assert {("cas_put", "quire"), ("get", "quire"), ("cursor_scan", "quire"), ("get", "raw")} <= cases
    assert all(r["ops_per_sec"] > 0 for r in rows if "ops_per_sec" in r)


def _store_with_ledgers(path: Path, count: int) -> str:
    """An lmdb metastore holding ``count`` ledgers' metadata (no bookies needed to list them)."""
    from bookie.metadata import LedgerMetadata, LedgerMetadataManager
    from metastore import open_metastore

    async def fill() -> None:
        ms = await open_metastore(f"lmdb://{path}")
        manager = await LedgerMetadataManager.open(ms)
        await asyncio.gather(*(manager.create(i, LedgerMetadata(1, 1, 1, [(0, ["127.0.0.1:1"])]))
                               for i in range(1, count + 1)))
        await ms.close()

    asyncio.run(fill())
    return f"lmdb://{path}"


@pytest.fixture(scope="module")
def ledgers_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _store_with_ledgers(tmp_path_factory.mktemp("cli") / "meta", 3000)


@pytest.mark.parametrize("argv", [
    ["shell", "--metastore", "{uri}", "listledgers"],                    # "invalid choice" before
    ["shell", "listledgers", "--metastore", "{uri}"],
    ["shell", "--timeout", "5", "listledgers", "--metastore", "{uri}"],
])
def test_common_options_before_or_after_the_command(ledgers_uri: str, argv: list[str]) -> None:
    out = quire(*[a.format(uri=ledgers_uri) for a in argv])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:3] == ["1", "2", "3"] and len(out.stdout.split()) == 3000


def test_environment_names_the_metastore_and_an_option_wins(ledgers_uri: str, tmp_path: Path) -> None:
    env = {**os.environ, "QUIRE_METASTORE": ledgers_uri}
    out = subprocess.run([sys.executable, "-m", "tools.cli", "shell", "listledgers"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and len(out.stdout.split()) == 3000, out.stderr
    conf = tmp_path / "tool.conf"
    conf.write_text(f"metastore_uri {ledgers_uri}\n")   # Java's `key value` form
    out = subprocess.run([sys.executable, "-m", "tools.cli", "shell", "listledgers"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "QUIRE_CONF": str(conf)})
    assert out.returncode == 0 and len(out.stdout.split()) == 3000, out.stderr
    missing = f"lmdb://{tmp_path / 'typo'}"
    out = subprocess.run([sys.executable, "-m", "tools.cli", "shell", "listledgers", "--metastore", missing],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [f"quire shell listledgers: no lmdb metastore at {tmp_path / 'typo'} "
                                       f"(no such directory)"]
    assert not (tmp_path / "typo").exists()


def test_output_into_a_closed_pipe_ends_quietly(ledgers_uri: str) -> None:
    """`quire shell listledgers | head -1`: before, a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "shell", "listledgers", "--metastore", ledgers_uri],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"1\n"
    proc.stdout.close()                                    # what `head -1` does after one line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""


def test_log_level_is_validated_and_json_logs_are_json(tmp_path: Path) -> None:
    out = quire("--log-level", "BOGUS", "shell", "listbookies")
    assert out.returncode == 2 and "invalid choice: 'BOGUS'" in out.stderr
    out = subprocess.run([sys.executable, "-m", "tools.cli", "shell", "listbookies"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "QUIRE_LOG_LEVEL": "LOUD"})
    assert out.returncode == 2 and "QUIRE_LOG_LEVEL='LOUD' is not a log level" in out.stderr
    script = ("import logging, sys\nfrom tools.cli import setup_logging\nsetup_logging(sys.argv[1], 'json')\n"
              "logging.getLogger('quire.test').warning('hello %s', 'there')\n"
              "logging.getLogger('kazoo.client').info('library chatter')\n")
    out = subprocess.run([sys.executable, "-c", script, "INFO"], capture_output=True, text=True, timeout=60)
    records = [json.loads(line) for line in out.stderr.splitlines()]
    assert [(r["level"], r["logger"], r["message"]) for r in records] == [("WARNING", "quire.test", "hello there")]
    out = subprocess.run([sys.executable, "-c", script, "debug"], capture_output=True, text=True, timeout=60)
    assert "library chatter" in out.stderr   # asked for DEBUG: libraries too


@pytest.mark.parametrize("argv", [
    ["scan", "--metastore", "{missing}", "orphan-ledgers"],
    ["scan", "orphan-ledgers", "--metastore", "{missing}", "--timeout", "5"],
    ["console", "--metastore", "{missing}", "-c", "show topics"],
])
def test_scan_and_console_take_the_common_options_too(tmp_path: Path, argv: list[str]) -> None:
    missing = tmp_path / "typo"
    out = quire(*[a.format(missing=f"lmdb://{missing}") for a in argv])
    assert out.returncode == 1
    said = out.stdout + out.stderr   # the console reports a failed command on stdout, as Hedwig's
    assert f"no lmdb metastore at {missing}" in said and "invalid choice" not in said
    assert not missing.exists()


def test_make_run_installs_only_what_running_needs(tmp_path: Path) -> None:
    """`make run` used to install the test and Spark extras (pyspark alone is hundreds of MB)."""
    root = Path(__file__).resolve().parents[2]

    def plan(target: str) -> str:
        out = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}", "PYTHON=python3"], cwd=root,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    run = plan("run")
    assert "pip install -q -e .\n" in run and "[test" not in run and "scan" not in run
    assert "quire standalone --data data" in run
    setup = plan("setup")   # every extra, with uv: from its cache alone when it can, else from the index
    assert "uv pip install -q --python" in setup and "-e '.[test,scan,bench,plot]'" in setup
    assert "--offline -e '.[test,scan,bench,plot]'" in setup and "installing from the index" in setup


def test_bash_completion_completes_commands_and_options(tmp_path: Path) -> None:
    out = quire("--print-completion", "bash")
    assert out.returncode == 0, out.stderr
    script = tmp_path / "quire.bash"
    script.write_text(out.stdout)
    probe = (f"source {script}\n"
             "complete_words() { COMP_WORDS=(\"$@\"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _shtab_quire; "
             "echo \"${COMPREPLY[*]}\"; }\n"
             "complete_words quire sh\ncomplete_words quire shell rec\ncomplete_words quire shell recover --dry\n"
             "complete_words quire client pro\n")
    res = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["shell", "recover", "--dry-run", "produce"]


def test_console_finds_its_hub_in_quire_server() -> None:
    out = subprocess.run([sys.executable, "-m", "tools.cli", "console", "--timeout", "3", "-c", "pub t hello"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "QUIRE_SERVER": "127.0.0.1:1"})
    assert out.returncode == 1
    assert "cannot connect to hub server 127.0.0.1:1" in out.stdout + out.stderr
    assert (out.stdout + out.stderr).count("cannot connect") == 1


@pytest.mark.parametrize("argv", [["shell", "listbookies"], ["console", "-c", "show topics"],
                                  ["scan", "orphan-ledgers"]])
def test_no_metastore_names_the_standalone_clusters_when_it_is_here(tmp_path: Path, argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("QUIRE_METASTORE", "QUIRE_CONF",
                                                            "HEDWIG_CONSOLE_SERVER_CONF")}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root)

    def said() -> str:
        out = subprocess.run([sys.executable, "-m", "tools.cli", *argv], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode in (1, 2), out.stdout + out.stderr
        return out.stdout + out.stderr

    assert "no metastore given" in said() and "make run" not in said()
    (tmp_path / "data" / "metastore").mkdir(parents=True)
    (tmp_path / "data" / "metastore" / "data.mdb").touch()   # what `make run` leaves in ./data
    assert "the standalone cluster here (make run) has --metastore lmdb://data/metastore" in said()


def test_a_console_command_whose_bookies_are_down_fails_in_one_line_and_the_console_goes_on(tmp_path: Path) -> None:
    """readtopic of a topic whose ledger's bookies do not answer: a traceback ended the console before."""
    from tests.tools.scan_data import populate

    uri = f"lmdb://{tmp_path / 'meta'}"
    data = populate(uri, ledgers=10)     # its ledgers name bookies on 127.0.0.1:3181-3189, where nothing listens
    assert data.topics["topic-1"]
    out = quire("console", "--metastore", uri, "--timeout", "5", "-c", "readtopic topic-1", "-c", "show topics")
    said = out.stdout + out.stderr
    assert out.returncode == 1, said
    assert "Traceback" not in said
    failed = [line for line in out.stdout.splitlines() if line.startswith("readtopic failed: ")]
    assert len(failed) == 1 and "bookie" in failed[0].lower(), said
    assert "Topic List:" in out.stdout.split(failed[0], 1)[1], "the next command ran"


@pytest.mark.parametrize(("argv", "rc", "needle"), [
    (["--help"], 0, "scan"),
    (["scan", "ledgers-per-bookie", "--metastore", "lmdb://x"], 2,
     "quire scan: needs the 'scan' extra (pyspark is not installed)"),
    (["bench", "--help"], 0, "publish"),
])
def test_a_venv_without_the_scan_extra_still_runs_and_says_what_to_install(argv: list[str], rc: int,
                                                                            needle: str) -> None:
    """`make run` installs no extras: `quire --help` died with a traceback there (pyspark imported by `scan`)."""
    root = Path(__file__).resolve().parents[2]
    script = ("import sys; sys.modules['pyspark'] = sys.modules['pyarrow'] = None\n"   # as if not installed
              "from tools.cli import main\nsys.argv = ['quire', *sys.argv[1:]]\nsys.exit(main())")
    out = subprocess.run([sys.executable, "-c", script, *argv], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == rc, out.stderr
    assert "Traceback" not in out.stderr and needle in out.stdout + out.stderr


@pytest.mark.parametrize("argv", [["--print-completion", "bash"], ["--help"], ["shell", "--help"]])
def test_printing_while_parsing_into_a_closed_pipe_ends_quietly(argv: list[str]) -> None:
    """`quire --print-completion bash | head -3`: before, a BrokenPipeError traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)                                     # `head` has gone before anything is written
    try:
        proc = subprocess.run([sys.executable, "-m", "tools.cli", *argv], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode in (0, 141)   # argparse's own --help output swallows the error (0); the rest 141


@pytest.mark.parametrize("argv", [["scan", "--help"], ["scan", "orphan-ledgers", "--help"]])
def test_scan_help_without_the_scan_extra_shows_the_options_and_what_to_install(argv: list[str]) -> None:
    """Before: only `usage: quire scan [-h]`."""
    root = Path(__file__).resolve().parents[2]
    script = ("import sys; sys.modules['pyspark'] = sys.modules['pyarrow'] = None\n"   # as if not installed
              "from tools.cli import main\nsys.argv = ['quire', *sys.argv[1:]]\nsys.exit(main())")
    out = subprocess.run([sys.executable, "-c", script, *argv], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "--metastore" in out.stdout and "--timeout" in out.stdout
    assert ("orphan-ledgers" in out.stdout) if len(argv) == 2 else ("--min-age" in out.stdout)
    assert "needs the 'scan' extra (pyspark is not installed): run `pip install -e '.[scan]'`" in out.stdout


def test_the_conformance_kit_without_pytest_names_the_testing_extra() -> None:
    """`python -m metastore.testing` in `make run`'s venv (no pytest): before, a ModuleNotFoundError traceback."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    script = ("import runpy, sys; sys.modules['pytest'] = None\n"           # as if not installed
              "sys.argv = ['metastore.testing', '--uri', 'lmdb:///nonexistent']\n"
              "runpy.run_module('metastore.testing', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "python -m metastore.testing: the conformance kit runs on pytest, which is not installed: "
        "run `pip install -e '.[testing]'` in the source tree (or `pip install pytest`)"]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("pytest") for dep in extras["testing"])


def test_console_help_names_both_conf_variables_in_order() -> None:
    """Before: "default $HEDWIG_CONSOLE_SERVER_CONF, then; default $QUIRE_CONF"."""
    out = subprocess.run([sys.executable, "-m", "tools.cli", "console", "--help"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "COLUMNS": "300"})   # one line per option
    assert out.returncode == 0
    [conf] = [line for line in out.stdout.splitlines() if line.strip().startswith("--conf FILE")]
    assert conf.endswith("; default $HEDWIG_CONSOLE_SERVER_CONF, then $QUIRE_CONF"), conf


def test_the_readme_writes_keys_and_tokens_only_where_git_ignores_them() -> None:
    """Before: the token steps wrote conf/token.key and orders-app.token into the tree, which git did not ignore."""
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "README.md").read_text()
    paths = set(re.findall(r"(?:--output|--secret-key|--auth-token-file|> ?|token_secret_key=|"
                           r"region_auth_token_file=)\s*([\w./-]+\.(?:key|token))\b", text))
    assert {"data/auth/token.key", "data/auth/orders-app.token"} <= paths, paths
    for path in sorted(paths):
        if path.startswith("/"):
            continue
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=root, timeout=30)
        assert ignored.returncode == 0, f"{path} (named in the README) would be committed"
    assert subprocess.run(["git", "check-ignore", "-q", "--no-index", "conf/token.key"], cwd=root,
                          timeout=30).returncode == 0     # written elsewhere, still never committed
