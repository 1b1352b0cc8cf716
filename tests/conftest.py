"""Shared fixtures, and the ``processes`` marker that ``make test-fast`` leaves out.

Real components only: ``tests.fixtures.zookeeper`` starts the Debian
ZooKeeper jars on a free loopback port; ``tests.fixtures.hbase`` starts the
HBase Thrift1 gateway emulator (a test double) or uses a real gateway named by
``QUIRE_HBASE_THRIFT=host:port``.

*The ``processes`` marker* is set here, at collection, on every test that
starts OS processes (bookies, hubs, ZooKeeper, Spark, ``quire`` commands):
one whose code, the code of its fixtures, or the code of the test helpers
(anything defined under ``tests/``) they call names a process starter
(``PROCESS_STARTERS``), or that is parametrized onto ZooKeeper (the fixtures
asked for by name at run time). ``@pytest.mark.processes`` may also be set by
hand. ``make test-fast`` runs ``-m "not processes and not slow" --forbid-processes``: there
a test that starts a process without the marker fails, naming itself, so the
fast set cannot silently grow slow; in every other run such a test only gets a
warning.

Under ``pytest-xdist`` each worker is a session of its own: its own
ZooKeeper (``zk_server``), HBase emulator and ``tmp_path_factory`` base
directory; ports are picked free (``tools.zookeeper.free_port``) or bound to 0.
With ``--dist loadgroup`` (``make test``) the tests of one module-scoped
cluster form one group (one worker, one cluster), and so do the partition
tests (two groups: at most two network test beds at once); see ``pytest_collection_modifyitems``.
Hypothesis runs without per-example deadlines (the ``quire`` profile).
"""

from __future__ import annotations

import inspect
import json
import multiprocessing.util
import os
import subprocess
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

pytest_plugins = [
    "tests.fixtures.zookeeper",
    "tests.fixtures.hbase",
    "tests.fixtures.cputime",
]

# Names that start an OS process when called (or that are such a module), wherever they come from.
PROCESS_STARTERS = frozenset({
    "subprocess", "Popen", "create_subprocess_exec", "create_subprocess_shell", "fork", "posix_spawn",
    "multiprocessing", "LocalCluster", "BookieProcess", "ZooKeeperServer", "quire_standalone",
    "start_emulator_process", "SparkStandalone", "SparkSession", "spark_session", "RedisPeer", "NatsPeer",
    "FloorPeer", "NetBed", "netbed", "ScriptBasedMapping", "webdriver", "forkserver",
})
# Parameter values that make a test ask for ZooKeeper at run time (``request.getfixturevalue``).
PROCESS_PARAMS = frozenset({"zookeeper", "zk"})

# Each test's time in a recent run (seconds: setup, call and teardown), for ordering the xdist work units
# longest first; refresh it with ``make test PYTEST_ARGS=--store-durations``. Unlisted tests count as below.
DURATIONS_FILE = os.path.join(os.path.dirname(__file__), "durations.json")
STORED_MIN_S = 0.5
UNKNOWN_PROCESS_S = 2.0
UNKNOWN_S = 0.02


# An empty trust store for this process and every process the suite starts (bookies, hubs, ``quire`` commands and
# the xdist workers inherit this environment): aiohttp, which every bookie and hub imports, builds two default SSL
# contexts at import, and each parsed the system's bundle of ~140 CA certificates, about 0.13 s of CPU per process
# of the ~700 a run starts. No test trusts a public CA (the tests reach only loopback and their own network
# namespaces); a test of TLS names its own CA file (``hub.tls.client_context(ca_file=...)``), and a certificate no
# CA vouches for is refused with this store as with the system's.
os.environ["SSL_CERT_FILE"] = os.devnull

# Every LocalCluster of the suite (and of a ``quire standalone`` a test starts) forks its bookies and hubs from one
# fork server per process, which imported their modules once (``tools.forkserver``): each exec'd role spent ~0.9 s
# of CPU on imports, and the suite starts over a thousand. The roles are still real processes (own pid, memory,
# sockets; kill -9 works). tests/tools/test_forkserver.py covers the server, and the exec'd path keeps its tests
# there and in tests/tools/test_cluster.py.
os.environ.setdefault("QUIRE_FORK_SERVER", "1")

# No per-example deadline: it measures this machine's load (two cores shared by xdist workers and their
# processes), not the code; a test that needs one sets it with @settings.
settings.register_profile("quire", deadline=None)
settings.load_profile("quire")


class ProcessesForbidden(RuntimeError):
    """A test without the ``processes`` marker started a process under ``--forbid-processes``."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--forbid-processes", action="store_true", default=False,
                     help="fail a test that starts an OS process without the 'processes' marker (make test-fast)")
    parser.addoption("--store-durations", action="store_true", default=False,
                     help="write each test's time into tests/durations.json (the xdist order, longest first)")


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    yield from code.co_varnames     # fixture arguments of a helper (e.g. a test's ``netbed``)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _functions_of(obj: Any) -> list[types.FunctionType]:
    """The plain functions behind ``obj``: itself, a wrapped one, or a class's methods."""
    if isinstance(obj, type):
        return [f for v in vars(obj).values() for f in _functions_of(v)]
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        return [f for f in (obj.fget, obj.fset) if isinstance(f, types.FunctionType)]
    obj = inspect.unwrap(obj) if callable(obj) else obj
    return [obj] if isinstance(obj, types.FunctionType) else []


def _is_test_code(obj: Any) -> bool:
    """Defined under tests/ or in a testing kit (``metastore.testing``, ``bookie.testing``...)."""
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str):
        return False
    parts = module.split(".")
    return parts[0] == "tests" or "testing" in parts or module == "conftest"


def _cell_set(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


def _starts_processes(func: Any, cache: dict[Any, bool]) -> bool:
    """Whether ``func``, or a test helper it names (transitively), names a process starter."""
    todo = _functions_of(func)
    seen: set[types.FunctionType] = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        if cache.get(f):
            return True
        names = set(_code_names(f.__code__))
        if names & PROCESS_STARTERS:
            cache[f] = True
            return True
        targets = [f.__globals__.get(name) for name in names]
        targets += [cell.cell_contents for cell in f.__closure__ or () if _cell_set(cell)]  # a wrapped test
        todo.extend(g for t in targets if t is not None and _is_test_code(t) for g in _functions_of(t))
    return False


def _needs_processes(item: pytest.Item, cache: dict[Any, bool]) -> bool:
    if item.get_closest_marker("processes") or item.get_closest_marker("partition"):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(isinstance(v, str) and v in PROCESS_PARAMS for v in callspec.params.values()):
        return True
    if _starts_processes(getattr(item, "function", None), cache):
        return True
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is None:
        return False
    for name in item.fixturenames:  # type: ignore[attr-defined]
        if name == "_process_guard":
            continue
        if name in PROCESS_STARTERS:
            return True
        for fixturedef in fixtureinfo.name2fixturedefs.get(name, ()):
            if _is_test_code(fixturedef.func) and _starts_processes(fixturedef.func, cache):
                return True
    return False


def _shared_process_fixture(item: pytest.Item, cache: dict[Any, bool]) -> bool:
    """Whether the test uses a module- or class-scoped fixture that starts processes (a shared cluster)."""
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is None:
        return False
    for name in item.fixturenames:  # type: ignore[attr-defined]
        for fixturedef in fixtureinfo.name2fixturedefs.get(name, ())[-1:]:
            if fixturedef.scope in ("module", "class", "package") and _is_test_code(fixturedef.func) \
                    and _starts_processes(fixturedef.func, cache):
                return True
    return False


PARTITION_GROUPS = 2
"""The partition tests run in this many xdist groups, ``partition-0`` and ``partition-1`` (each
scenario's run 0 in one, its run 1 and the test bed's own tests in the other: about 230 and 210 s): at most
two network test beds at once. A partition test mostly waits (a nemesis hold, a session timeout: 6-10 s of
CPU in 20-45 s), so two at once leave its timing the CPU it needs, where one group made them a 7-minute
queue on one worker, longer than the rest of the suite."""


def _xdist_group(item: pytest.Item, cache: dict[Any, bool]) -> str | None:
    """The xdist group of a test: its ``xdist_group`` mark, ``partition-K`` for the partition tests (at most
    ``PARTITION_GROUPS`` netbeds at once), else its module when it uses a shared (module-scoped) cluster."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if item.get_closest_marker("partition"):
        callspec = getattr(item, "callspec", None)
        run = callspec.params.get("run") if callspec is not None else None
        return f"partition-{run % PARTITION_GROUPS if isinstance(run, int) else PARTITION_GROUPS - 1}"
    if _shared_process_fixture(item, cache):
        return item.nodeid.split("::", 1)[0]
    return None


def _set_group(item: pytest.Item, group: str) -> None:
    """What ``--dist loadgroup`` keys on: the nodeid suffix ``@group``. Set here because pytest-xdist 3.8
    sets ``item._nodeid``, which pytest 9.2 no longer reads (its nodeid is ``item._id``, a ``NodeId``)."""
    nodeid = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):
        item._id = type(item._id).parse(nodeid)
    else:
        item._nodeid = nodeid


def _plain_nodeid(nodeid: str) -> str:
    """A nodeid without the ``@group`` suffix ``--dist loadgroup`` adds (as xdist splits it)."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def _load_durations() -> dict[str, float]:
    try:
        with open(DURATIONS_FILE, encoding="utf-8") as f:
            loaded = json.load(f)
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


def _longest_first(items: list[pytest.Item]) -> None:
    """Order ``items`` by work unit (an xdist group, else one test), the longest unit first, the tests of a
    unit together in their collection order: the order ``--dist loadgroup`` hands the units out in (with
    ``loadscopereorder`` off, see ``pytest_configure``), so the longest start first and the workers end
    together. A unit's time is the sum of its tests' times in ``DURATIONS_FILE`` (setup, call and teardown
    of a recent run); a test not listed there counts ``UNKNOWN_PROCESS_S`` when it starts processes, else
    ``UNKNOWN_S``."""
    durations = _load_durations()
    units: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        unit = item.nodeid.rsplit("@", 1)[1] if _plain_nodeid(item.nodeid) != item.nodeid else item.nodeid
        units.setdefault(unit, []).append(i)

    def cost(i: int) -> float:
        known = durations.get(_plain_nodeid(items[i].nodeid))
        if known is not None:
            return known
        return UNKNOWN_PROCESS_S if items[i].get_closest_marker("processes") else UNKNOWN_S

    order = sorted(units.values(), key=lambda idx: (-sum(cost(i) for i in idx), idx[0]))
    items[:] = [items[i] for idx in order for i in idx]


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``processes``. On an xdist worker of ``--dist loadgroup`` (``make test``): keep the tests of one
    shared cluster on one worker, and order the work units longest first (``_longest_first``), so that the
    short unit tests fill the workers' idle time at the end (every worker sorts alike, so their collections
    stay equal)."""
    cache: dict[Any, bool] = {}
    for item in items:
        if _needs_processes(item, cache) and not item.get_closest_marker("processes"):
            item.add_marker(pytest.mark.processes)
    if hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False):
        for item in items:
            group = _xdist_group(item, cache)
            if group is not None and "@" not in item.nodeid:
                _set_group(item, group)
        _longest_first(items)


def pytest_configure(config: pytest.Config) -> None:
    """On the xdist controller of ``--dist loadgroup``: hand the work units out in the workers' collection
    order (longest first, ``_longest_first``) rather than by their number of tests."""
    if getattr(config.option, "loadgroup", False) or getattr(config.option, "dist", "") == "loadgroup":
        config.option.loadscopereorder = False


_run_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up each test's setup, call and teardown time (for ``--store-durations``)."""
    nodeid = _plain_nodeid(report.nodeid)
    _run_durations[nodeid] = _run_durations.get(nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """``--store-durations``: write this run's times into ``DURATIONS_FILE`` (on the xdist controller, or a
    run without xdist), keeping the entries of tests this run did not time; tests under
    ``STORED_MIN_S`` are left out (they count ``UNKNOWN_S``)."""
    config = session.config
    if not config.getoption("--store-durations") or hasattr(config, "workerinput"):
        return
    durations = _load_durations()
    durations.update(_run_durations)
    kept = {k: round(v, 1) for k, v in sorted(durations.items()) if v >= STORED_MIN_S}
    with open(DURATIONS_FILE, "w", encoding="utf-8") as f:
        json.dump(kept, f, indent=0, sort_keys=True)
        f.write("\n")


# Where a process starts: every ``subprocess`` and ``asyncio`` child, ``multiprocessing`` (spawn, fork).
_SPAWN_POINTS: list[tuple[Any, str]] = [(subprocess.Popen, "_execute_child"), (multiprocessing.util, "spawnv_passfds"),
                                        (os, "fork")]


@pytest.fixture(autouse=True)
def _process_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test not marked ``processes`` that starts one: fails under ``--forbid-processes``, else a warning."""
    if request.node.get_closest_marker("processes"):
        yield
        return
    forbid = request.config.getoption("--forbid-processes")
    started: list[str] = []

    def guard(original: Any) -> Any:
        def guarded(*args: Any, **kw: Any) -> Any:
            what = next((a for a in args if isinstance(a, (list, tuple, str, bytes))), original.__name__)
            started.append(str(what if isinstance(what, (str, bytes)) else " ".join(map(str, what)))[:200])
            if forbid:
                raise ProcessesForbidden(
                    f"{request.node.nodeid} started a process ({started[-1]}) but is not marked 'processes': "
                    "mark it with @pytest.mark.processes, or add its process starter to PROCESS_STARTERS "
                    "in tests/conftest.py")
            return original(*args, **kw)
        return guarded

    saved = [(owner, name, getattr(owner, name)) for owner, name in _SPAWN_POINTS]
    for owner, name, original in saved:
        setattr(owner, name, guard(original))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
    if started and not forbid:
        warnings.warn(f"{request.node.nodeid} started a process ({started[0]}) but is not marked 'processes' "
                      "(make test-fast would fail it): see tests/conftest.py", stacklevel=1)
