"""hub.filters: loading server filters by dotted path, and every way a filter can fail."""

from __future__ import annotations

import importlib
import sys
import uuid
from pathlib import Path

import pytest

from hub.errors import InvalidMessageFilterError, PubSubError
from hub.filters import (
    ClientMessageFilter,
    HeaderMatchFilter,
    ServerMessageFilter,
    load_server_filter,
    safe_test,
    safe_uninitialize,
)
from hub.message import Message, MessageId, SubscriptionPreferences

HERE = __name__
BOOKS = SubscriptionPreferences(options={"filter.header": b"type", "filter.value": b"History"})


def book(kind: bytes, seq: int = 1) -> Message:
    return Message(body=b"a book", properties={"type": kind}, msg_id=MessageId(seq))


# -- filter classes the tests load by path -----------------------------------------------------

class Recording:
    """Records what the hub called, in order."""

    calls: list[str] = []

    def __init__(self) -> None:
        Recording.calls = ["init"]
        self.prefs: SubscriptionPreferences | None = None

    def initialize(self, conf: dict[str, str]) -> None:
        Recording.calls.append(f"initialize {sorted(conf.items())}")

    def set_subscription_preferences(self, topic: bytes, subscriber_id: bytes,
                                     preferences: SubscriptionPreferences) -> None:
        Recording.calls.append(f"prefs {topic!r} {subscriber_id!r}")
        self.prefs = preferences

    def test_message(self, message: Message) -> bool:
        return message.seq_id % 2 == 0

    def uninitialize(self) -> None:
        Recording.calls.append("uninitialize")


class Outer:
    class Inner(Recording):
        pass


class RaisingConstructor(Recording):
    def __init__(self) -> None:
        raise RuntimeError("no constructor for you")


class RaisingInitialize(Recording):
    def initialize(self, conf: dict[str, str]) -> None:
        raise KeyError("filter.missing")


class RaisingPreferences(Recording):
    def set_subscription_preferences(self, topic: bytes, subscriber_id: bytes,
                                     preferences: SubscriptionPreferences) -> None:
        raise ValueError("bad preferences")


class RaisingTest(Recording):
    def test_message(self, message: Message) -> bool:
        raise ZeroDivisionError("boom")


class NoTestMessage:
    def initialize(self, conf: dict[str, str]) -> None:
        return None


NOT_A_CLASS = 42


# what these tests allow-list (server_filter_allowlist): this module, and the names whose failures they test
ALLOW = (HERE, "no_such_module_xyz", "hub.no_such_module_xyz", "hub.message.Message")


def load(path: str, prefs: SubscriptionPreferences = BOOKS, conf: dict[str, str] | None = None,
         class_path: tuple[str, ...] = (), allow: tuple[str, ...] = ALLOW) -> ServerMessageFilter:
    return load_server_filter(path, conf or {}, b"BookStore", b"userA", prefs, filter_class_path=class_path,
                              allowlist=allow)


# -- tests ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [f"{HERE}.Recording", f"{HERE}:Recording", f" {HERE}:Recording ",
                                  f"{HERE}.Outer.Inner", f"{HERE}:Outer.Inner"])
def test_load_by_dotted_path_calls_the_lifecycle_in_order(path: str) -> None:
    flt = load(path, conf={"k": "v"})
    assert isinstance(flt, Recording)
    assert Recording.calls == ["init", "initialize [('k', 'v')]", "prefs b'BookStore' b'userA'"]
    assert flt.prefs == BOOKS
    assert safe_test(flt, book(b"x", 2)) is True and safe_test(flt, book(b"x", 3)) is False
    safe_uninitialize(flt)
    assert Recording.calls[-1] == "uninitialize"


def test_header_match_filter_book_store_example() -> None:
    flt = load("hub.filters:HeaderMatchFilter")
    assert isinstance(flt, HeaderMatchFilter)
    assert safe_test(flt, book(b"History")) is True
    assert safe_test(flt, book(b"Romance")) is False
    assert safe_test(flt, Message(body=b"no header")) is False
    # also usable as a client filter
    client = HeaderMatchFilter()
    assert isinstance(client, ClientMessageFilter)
    client.set_subscription_preferences(b"BookStore", b"userB",
                                        SubscriptionPreferences(options={"filter.header": b"type",
                                                                         "filter.value": b"Romance"}))
    assert client.test_message(book(b"Romance")) and not client.test_message(book(b"History"))


def test_header_match_filter_without_its_option_is_invalid_at_subscribe() -> None:
    with pytest.raises(InvalidMessageFilterError, match=r"set_subscription_preferences raised.*filter\.header"):
        load("hub.filters.HeaderMatchFilter", prefs=SubscriptionPreferences())


@pytest.mark.parametrize(("path", "reason"), [
    ("", "empty class path"),
    ("   ", "empty class path"),
    ("NoDots", "not a dotted path"),
    ("pkg..Class", "not a dotted path"),
    ("1pkg.Class", "not a dotted path"),
    ("no_such_module_xyz.Filter", "cannot import module 'no_such_module_xyz'"),
    ("hub.no_such_module_xyz.Filter", "cannot import module 'hub.no_such_module_xyz'"),
    ("no_such_module_xyz:Filter", "cannot import module 'no_such_module_xyz'"),
    (f"{HERE}.Missing", "has no class 'Missing'"),
    (f"{HERE}:Outer.Missing", "has no class 'Outer.Missing'"),
    (f"{HERE}.NOT_A_CLASS", "is not a class"),
    (f"{HERE}.RaisingConstructor", "constructor raised RuntimeError"),
    (f"{HERE}.RaisingInitialize", "initialize raised KeyError"),
    (f"{HERE}.RaisingPreferences", "set_subscription_preferences raised ValueError"),
    (f"{HERE}.NoTestMessage", "not a server message filter"),
    ("hub.message.Message", "constructor raised TypeError"),
])
def test_every_load_failure_is_invalid_message_filter(path: str, reason: str) -> None:
    with pytest.raises(InvalidMessageFilterError, match=reason) as info:
        load(path)
    assert info.value.status == "INVALID_MESSAGE_FILTER"
    assert repr(path) in str(info.value)                   # the error names the path
    # and loading keeps working afterwards
    assert isinstance(load("hub.filters:HeaderMatchFilter"), HeaderMatchFilter)


def test_failing_preferences_uninitializes_the_filter() -> None:
    with pytest.raises(InvalidMessageFilterError):
        load(f"{HERE}.RaisingPreferences")
    assert Recording.calls[-1] == "uninitialize"


def test_test_message_raising_is_reported_as_invalid_filter() -> None:
    flt = load(f"{HERE}.RaisingTest")
    with pytest.raises(InvalidMessageFilterError, match="raised on message 7: ZeroDivisionError") as info:
        safe_test(flt, book(b"x", 7))
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert not isinstance(info.value, ZeroDivisionError)


def test_uninitialize_raising_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    class Bad:
        def uninitialize(self) -> None:
            raise OSError("disk gone")

    safe_uninitialize(Bad())
    safe_uninitialize(object())          # nothing to call
    assert "raised in uninitialize" in caplog.text


@pytest.fixture
def isolated_sys_path(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    path = list(sys.path)
    monkeypatch.setattr(sys, "path", path)
    return path


def test_filter_class_path_entries_are_importable(tmp_path: Path, isolated_sys_path: list[str]) -> None:
    name = f"quire_test_filters_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        "class EvenOnly:\n"
        "    def initialize(self, conf):\n"
        "        self.conf = conf\n"
        "    def set_subscription_preferences(self, topic, subscriber_id, preferences):\n"
        "        pass\n"
        "    def test_message(self, message):\n"
        "        return message.seq_id % 2 == 0\n"
        "    def uninitialize(self):\n"
        "        pass\n")
    try:
        with pytest.raises(InvalidMessageFilterError, match="not an allowed filter class"):
            load(f"{name}.EvenOnly")                        # not in a filter_class_path directory
        flt = load(f"{name}.EvenOnly", class_path=(str(tmp_path),))
        assert str(tmp_path) in isolated_sys_path
        assert safe_test(flt, book(b"x", 4)) and not safe_test(flt, book(b"x", 5))
        load(f"{name}.EvenOnly", class_path=(str(tmp_path),))
        assert isolated_sys_path.count(str(tmp_path)) == 1  # added once
    finally:
        sys.modules.pop(name, None)


def test_module_raising_on_import_is_invalid(tmp_path: Path, isolated_sys_path: list[str]) -> None:
    name = f"quire_test_broken_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / f"{name}_dep.py").write_text("import quire_no_such_dependency_xyz\nclass F: pass\n")
    try:
        with pytest.raises(InvalidMessageFilterError, match="raised SystemExit"):
            load(f"{name}.Filter", class_path=(str(tmp_path),))
        with pytest.raises(InvalidMessageFilterError, match="quire_no_such_dependency_xyz"):
            load(f"{name}_dep.F", class_path=(str(tmp_path),))
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop(f"{name}_dep", None)


def test_invalid_filter_error_is_a_pubsub_error() -> None:
    assert issubclass(InvalidMessageFilterError, PubSubError)


# -- the allow-list (issue 20) ----------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def imports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The module names the loader imports (it imports with ``importlib.import_module``)."""
    seen: list[str] = []
    real = importlib.import_module

    def recording(name: str, package: str | None = None) -> object:
        seen.append(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", recording)
    return seen


@pytest.mark.parametrize("path", [
    "multiprocessing.pool.ThreadPool",      # started a thread pool in the hub
    "socket.socket",                        # opened a socket
    "socket:socket",
    "tabnanny.NannyNag",                    # a stdlib module nobody has imported
    "hub.server.HubServer",                 # the hub's own code, not a filter
    "hub.readahead:ReadAheadCache",
    "hub.filters.ServerMessageFilter",      # in hub.filters, but not one of its filters
    "tests.hub.sample_filter.HeaderFilter",  # importable, but not allow-listed
    "pytest.Class",                         # an installed package
])
def test_classes_not_allowed_are_refused_before_import(path: str, imports: list[str]) -> None:
    before = set(sys.modules)
    with pytest.raises(InvalidMessageFilterError, match="not an allowed filter class") as info:
        load(path, allow=())
    assert info.value.status == "INVALID_MESSAGE_FILTER" and repr(path) in str(info.value)
    assert imports == []                                       # nothing was imported
    assert set(sys.modules) == before
    assert "tabnanny" not in sys.modules


def test_the_hubs_own_code_is_refused_even_from_a_class_path_directory(imports: list[str]) -> None:
    for path in ("hub.server.HubServer", "bookie.client.BookKeeper", "tools.console.main"):
        with pytest.raises(InvalidMessageFilterError, match="not an allowed filter class"):
            load(path, allow=(), class_path=(str(ROOT),))      # the repository itself on the class path
    assert imports == []


def test_a_module_elsewhere_on_sys_path_never_runs(tmp_path: Path, isolated_sys_path: list[str],
                                                    imports: list[str]) -> None:
    name = f"quire_test_side_effect_{uuid.uuid4().hex}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass F: pass\n")
    isolated_sys_path.append(str(tmp_path))                    # importable, but not a filter_class_path directory
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    for class_path in ((), (str(elsewhere),)):
        with pytest.raises(InvalidMessageFilterError, match="not an allowed filter class"):
            load(f"{name}.F", allow=(), class_path=class_path)
    assert imports == [] and not marker.exists() and name not in sys.modules


def test_a_class_path_file_shadowing_the_stdlib_is_refused(tmp_path: Path, isolated_sys_path: list[str],
                                                           imports: list[str]) -> None:
    (tmp_path / "json.py").write_text("class JSONDecoder: pass\n")
    with pytest.raises(InvalidMessageFilterError, match="not an allowed filter class"):
        load("json.JSONDecoder", allow=(), class_path=(str(tmp_path),))
    assert imports == []


def test_allow_listed_prefixes_load_at_dot_boundaries_only(imports: list[str]) -> None:
    flt = load("tests.hub.sample_filter.HeaderFilter", allow=("tests.hub.sample_filter",),
               prefs=SubscriptionPreferences(options={"want": b"red"}))
    assert type(flt).__name__ == "HeaderFilter"
    assert safe_test(flt, Message(body=b"", properties={"type": b"red"}, msg_id=MessageId(1)))
    assert load("tests.hub.sample_filter:HeaderFilter", allow=("tests.hub",)) is not None   # a package prefix
    imports.clear()
    for allow in (("tests.hub.sample",), ("tests.hub.sample_filter.HeaderFilterX",), ("",)):
        with pytest.raises(InvalidMessageFilterError, match="not an allowed filter class"):
            load("tests.hub.sample_filter.HeaderFilter", allow=allow)
    assert imports == []
    assert isinstance(load("hub.filters.HeaderMatchFilter", allow=()), HeaderMatchFilter)   # the hub's own
    region = load("hub.regions:RegionFilter", allow=(), prefs=SubscriptionPreferences(options={"quire.region": b"r"}))
    assert type(region).__name__ == "RegionFilter"


def test_a_module_in_a_filter_class_path_package_loads(tmp_path: Path, isolated_sys_path: list[str]) -> None:
    pkg = f"quire_test_pkg_{uuid.uuid4().hex}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "filters.py").write_text(
        "class Odd:\n"
        "    def initialize(self, conf):\n"
        "        return None\n"
        "    def set_subscription_preferences(self, topic, subscriber_id, preferences):\n"
        "        pass\n"
        "    def test_message(self, message):\n"
        "        return message.seq_id % 2 == 1\n"
        "    def uninitialize(self):\n"
        "        pass\n")
    try:
        flt = load(f"{pkg}.filters:Odd", allow=(), class_path=(str(tmp_path),))
        assert safe_test(flt, book(b"x", 3)) and not safe_test(flt, book(b"x", 4))
    finally:
        sys.modules.pop(f"{pkg}.filters", None)
        sys.modules.pop(pkg, None)
