"""The partition tests' fixtures: ``netbed`` (tests/fixtures/netbed.py)."""

from tests.fixtures.netbed import netbed  # noqa: F401  (a fixture)
