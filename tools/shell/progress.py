"""The recovery progress bar (tqdm): ledgers done of total and entries copied, on stderr.

    with RecoveryProgress(total=25, enabled=wants_progress(args.progress)) as progress:
        progress.entries_copied(14)
        progress.ledger_done("ledger 7: entries 0-19 (14 copied) a -> b")   # the line goes to stdout

Lines go to stdout through ``tqdm.write`` so they never tear the bar. When
disabled (``--no-progress``, or stderr is not a terminal) only the lines are
written.
"""

from __future__ import annotations

import io
import os
import sys
import time
from types import TracebackType
from typing import TextIO

from tqdm import tqdm


def wants_progress(choice: bool | None, stream: TextIO | None = None) -> bool:
    """``--progress``/``--no-progress`` when given, else on when ``stream`` (stderr) is a terminal."""
    if choice is not None:
        return choice
    stream = stream if stream is not None else sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


REFRESH_SECONDS = 0.1
"""The entry count on the bar is redrawn at most this often (a ledger done always redraws it)."""


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return 0


class RecoveryProgress:
    """Counts ledgers done and entries copied; see the module docstring."""

    def __init__(self, total: int, enabled: bool, out: TextIO | None = None, err: TextIO | None = None,
                 desc: str = "recover") -> None:
        self.total = total
        self.ledgers = 0
        self.entries = 0
        self._out = out if out is not None else sys.stdout
        self._bar: tqdm | None = None
        self._shown = 0.0
        if enabled:
            err = err if err is not None else sys.stderr
            sized = _columns(err) > 0  # a terminal reporting no size (some ptys) gets 80x24
            self._bar = tqdm(total=total, desc=desc, unit="ledger", file=err, dynamic_ncols=sized,
                             ncols=None if sized else 80, nrows=None if sized else 24, leave=True)
            self._bar.set_postfix(entries=0, refresh=False)

    def entries_copied(self, n: int) -> None:
        self.entries += n
        if self._bar is not None:
            self._bar.set_postfix(entries=self.entries, refresh=False)
            now = time.monotonic()
            if now - self._shown >= REFRESH_SECONDS:
                self._shown = now
                self._bar.refresh()

    def ledger_done(self, line: str | None = None) -> None:
        """One more ledger finished (recovered, skipped or failed); ``line`` says how."""
        self.ledgers += 1
        if line is not None:
            self.write(line)
        if self._bar is not None:
            self._bar.update(1)

    def write(self, line: str) -> None:
        if self._bar is not None:
            tqdm.write(line, file=self._out)
        else:
            self._out.write(line + "\n")
        self._out.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> RecoveryProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
