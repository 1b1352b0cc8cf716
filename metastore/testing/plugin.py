"""pytest plugin (entry point ``pytest11``): the ``--metastore-uri`` option.

A plugin author's test module::

    from metastore.testing.conformance import *  # noqa: F403  (collects the suite)

then ``pytest --metastore-uri myscheme://...``. Without the option the
``conformance_uri`` fixture skips, unless the module overrides the fixture
(Quire's own tests parametrize it over lmdb, ZooKeeper and HBase).
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quire-metastore")
    group.addoption("--metastore-uri", action="append", default=[],
                    help="metastore URI to run the Quire conformance kit against (repeatable)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    uris = metafunc.config.getoption("--metastore-uri", default=[])
    if "conformance_uri" in metafunc.fixturenames and uris:
        fixturedefs = metafunc._arg2fixturedefs.get("conformance_uri", ())
        # only when the module did not define its own conformance_uri fixture
        if all(fd.baseid == "" for fd in fixturedefs):
            metafunc.parametrize("conformance_uri", uris, scope="function")


@pytest.fixture
def conformance_uri() -> str:
    pytest.skip("no --metastore-uri given")
