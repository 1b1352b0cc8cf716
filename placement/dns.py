"""Resolving bookie names to network locations (``/region/rack``).

``DNSToSwitchMapping`` is the pluggable resolver interface of the seed::

    dns = StaticMapping({"10.0.0.1:3181": "/region-a/rack-1", "10.0.0.2": "/region-a/rack-2"})
    dns.resolve(["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.9:3181"])
    # ["/region-a/rack-1", "/region-a/rack-2", "/default-region/default-rack"]

    dns = ScriptBasedMapping("/etc/quire/topology.sh")   # prints one location per line
    dns.resolve(["10.0.0.1:3181"])                       # runs the script once, then cached
    dns.reload_cached_mappings()                         # forget; next resolve runs it again

Resolvers never raise for a name they cannot resolve: the answer for it is
``DEFAULT_RACK``.
"""

from __future__ import annotations

import abc
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from placement.config import SCRIPT_FILE_KEY, get_str
from placement.topology import DEFAULT_RACK, normalize_location

log = logging.getLogger(__name__)


class DNSToSwitchMapping(abc.ABC):
    """Resolves bookie names (``"host:port"``) to ``/region/rack`` locations."""

    @abc.abstractmethod
    def resolve(self, names: Sequence[str]) -> list[str]:
        """Return one location per name, in order (``[]`` for ``[]``).

        A name that cannot be resolved maps to ``DEFAULT_RACK``; implementations
        log the reason instead of raising.
        """

    @abc.abstractmethod
    def reload_cached_mappings(self) -> None:
        """Forget cached answers so later calls see fresh data."""

    @classmethod
    def from_conf(cls, conf: Mapping[str, str]) -> Self:
        """Build the resolver named by ``dns_resolver_class``; default: no arguments.

        Subclasses that need settings override this and read them from
        ``conf``; they raise ``ValueError`` for settings that cannot work.
        """
        return cls()


def _lookup_keys(name: str) -> tuple[str, ...]:
    host, sep, port = name.rpartition(":")
    if sep and host and port.isdigit():
        return (name, host)
    return (name,)


class StaticMapping(DNSToSwitchMapping):
    """A fixed table of ``name -> location``.

    ``mapping`` is a dict or the path of a file of ``host:port = /region/rack``
    (or ``host = /region/rack``) lines, ``#`` comments and blank lines
    allowed. A name is looked up as the full ``host:port`` first, then by the
    host alone; unknown names resolve to ``DEFAULT_RACK``.

    Raises ``ValueError`` for a malformed line or location and ``OSError``
    when the file cannot be read, at construction and on
    ``reload_cached_mappings`` (which re-reads the file; for a dict it keeps
    the current table).
    """

    def __init__(self, mapping: Mapping[str, str] | str | os.PathLike[str] | None = None) -> None:
        self._path: Path | None = None
        self._lock = threading.Lock()
        if mapping is None:
            table: dict[str, str] = {}
        elif isinstance(mapping, (str, os.PathLike)):
            self._path = Path(mapping)
            table = self._read_file(self._path)
        else:
            table = {str(k).strip(): normalize_location(v) for k, v in mapping.items()}
        self._table = table

    @staticmethod
    def _read_file(path: Path) -> dict[str, str]:
        table: dict[str, str] = {}
        with path.open(encoding="utf-8") as f:
            for lineno, raw in enumerate(f, start=1):
                line = raw.split("#", 1)[0].strip()
                if not line:
                    continue
                name, sep, location = line.partition("=")
                if not sep or not name.strip():
                    raise ValueError(f"{path}:{lineno}: expected 'host:port = /region/rack', got {raw.strip()!r}")
                try:
                    table[name.strip()] = normalize_location(location)
                except ValueError as exc:
                    raise ValueError(f"{path}:{lineno}: {exc}") from None
        return table

    def resolve(self, names: Sequence[str]) -> list[str]:
        table = self._table
        out: list[str] = []
        for name in names:
            for key in _lookup_keys(name):
                location = table.get(key)
                if location is not None:
                    out.append(location)
                    break
            else:
                out.append(DEFAULT_RACK)
        return out

    def reload_cached_mappings(self) -> None:
        if self._path is not None:
            table = self._read_file(self._path)
            with self._lock:
                self._table = table

    def set_location(self, name: str, location: str) -> None:
        """Map ``name`` to ``location``; ``ValueError`` for a bad location."""
        loc = normalize_location(location)
        with self._lock:
            self._table = {**self._table, name: loc}

    def remove(self, name: str) -> None:
        """Forget ``name`` (no error when absent)."""
        with self._lock:
            if name in self._table:
                table = dict(self._table)
                del table[name]
                self._table = table

    def mappings(self) -> dict[str, str]:
        """A copy of the current table."""
        return dict(self._table)


class ScriptBasedMapping(DNSToSwitchMapping):
    """Runs an executable to resolve names, caching answers until reload.

    The script gets up to ``max_args`` names as arguments per run and must
    print one location per line, in the same order. A script that cannot be
    started, exits non-zero, runs longer than ``timeout_seconds``, prints the
    wrong number of lines or prints something that is not a location makes
    the affected names resolve to ``DEFAULT_RACK`` with a logged warning;
    such answers are not cached, so the next resolve tries again. With no
    script (``path=None``) every name resolves to ``DEFAULT_RACK``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        timeout_seconds: float = 10.0,
        max_args: int = 100,
    ) -> None:
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        if max_args < 1:
            raise ValueError("max_args must be at least 1")
        self.path = None if path is None else os.fspath(path)
        self.timeout_seconds = timeout_seconds
        self.max_args = max_args
        self._cache: dict[str, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_conf(cls, conf: Mapping[str, str]) -> Self:
        """Use the script named by ``network_topology_script_file`` (none: all default rack)."""
        return cls(get_str(conf, SCRIPT_FILE_KEY))

    def resolve(self, names: Sequence[str]) -> list[str]:
        if not names:
            return []
        if self.path is None:
            return [DEFAULT_RACK] * len(names)
        cache = self._cache
        missing = [n for n in dict.fromkeys(names) if n not in cache]
        fresh: dict[str, str] = {}
        for start in range(0, len(missing), self.max_args):
            batch = missing[start : start + self.max_args]
            fresh.update(self._run(batch))
        if fresh:
            with self._lock:
                self._cache.update(fresh)
        return [cache.get(n) or fresh.get(n) or DEFAULT_RACK for n in names]

    def reload_cached_mappings(self) -> None:
        with self._lock:
            self._cache = {}

    def _run(self, names: list[str]) -> dict[str, str]:
        """Resolve one batch; ``{}`` (after a warning) when the script fails."""
        assert self.path is not None
        try:
            proc = subprocess.Popen(
                [self.path, *names],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                start_new_session=True,
            )
        except OSError as exc:
            log.warning(
                "topology script %s cannot run (%s); using %s for %d names", self.path, exc, DEFAULT_RACK, len(names)
            )
            return {}
        try:
            out, err = proc.communicate(timeout=self.timeout_seconds)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            log.warning(
                "topology script %s timed out after %.3gs; using %s for %d names",
                self.path,
                self.timeout_seconds,
                DEFAULT_RACK,
                len(names),
            )
            return {}
        if proc.returncode != 0:
            log.warning(
                "topology script %s exited with status %s (%s); using %s for %d names",
                self.path,
                proc.returncode,
                err.strip()[:200],
                DEFAULT_RACK,
                len(names),
            )
            return {}
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        if len(lines) != len(names):
            log.warning(
                "topology script %s printed %d locations for %d names; using %s for all of them",
                self.path,
                len(lines),
                len(names),
                DEFAULT_RACK,
            )
            return {}
        result: dict[str, str] = {}
        for name, line in zip(names, lines, strict=True):
            try:
                result[name] = normalize_location(line)
            except ValueError as exc:
                log.warning("topology script %s: %s; using %s for %s", self.path, exc, DEFAULT_RACK, name)
        return result

    @staticmethod
    def _kill(proc: subprocess.Popen[str]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.communicate()
