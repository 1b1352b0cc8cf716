"""Errors of the bookie package (server, wire protocol, storage, ledger client).

Every error is a ``BKError`` whose ``code`` names the condition with
BookKeeper's ``BKException.Code`` name, so callers can map them without
``isinstance`` chains::

    try:
        entry = decode_entry(payload, digest_type="crc32c")
    except DigestMismatchError:
        ...  # corrupted on disk or on the wire: read another replica

``NotEnoughBookiesError`` is the placement package's error, re-exported as a
``BKError``; ``ConfError`` is the configuration layer's (``metastore.conf``),
likewise. Both leaf packages are imported when this module loads.
"""

from __future__ import annotations

import builtins

from metastore.conf import ConfError as MetastoreConfError
from placement import NotEnoughBookiesError as PlacementNotEnoughBookiesError


class BKError(Exception):
    """Base of all bookie and ledger-client errors; ``code`` names the condition."""

    code = "BKException"

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message or self.code)
        if code is not None:
            self.code = code


class NoSuchLedgerError(BKError):
    """The ledger does not exist (in the metastore, or on the bookie asked)."""

    code = "NoSuchLedgerExistsException"


class NoSuchEntryError(BKError):
    """The entry does not exist on the bookie asked."""

    code = "NoSuchEntryException"


class LedgerFencedError(BKError):
    """The ledger was fenced (recovery-opened by another client); adds are refused."""

    code = "LedgerFencedException"


class LedgerClosedError(BKError):
    """The ledger is closed; it takes no more adds."""

    code = "LedgerClosedException"


class UnauthorizedError(BKError):
    """Wrong ledger password (the master key does not match the ledger's)."""

    code = "UnauthorizedAccessException"


class DigestMismatchError(BKError):
    """An entry payload failed digest verification, or is truncated, or names another entry."""

    code = "DigestMatchException"


class BookieUnavailableError(BKError):
    """A bookie cannot be reached (connection refused, closed or lost)."""

    code = "BookieHandleNotAvailableException"


class BKTimeoutError(BKError, builtins.TimeoutError):
    """An operation did not complete in time (also a ``builtins.TimeoutError``).

    DESIGN.md promises it as ``bookie.errors.TimeoutError`` (the alias below);
    code inside the project says ``BKTimeoutError`` so the builtin is never shadowed.
    """

    code = "TimeoutException"


TimeoutError = BKTimeoutError  # the promised public name (DESIGN.md section 5)


class BookieReadOnlyError(BKError):
    """An add reached a read-only bookie (disk usage over its threshold)."""

    code = "WriteOnReadOnlyBookieException"


class BadRequestError(BKError):
    """The bookie rejected a request as malformed."""

    code = "IncorrectParameterException"


class TooLargeError(BKError):
    """A frame exceeds the peer's ``max_frame_size``."""

    code = "TooLongFrameException"


class EntryTooLargeError(TooLargeError):
    """An add's entry is larger than the client's ``max_entry_size`` (refused before anything is sent).

    The message names the limit; the ledger handle stays usable.
    """

    code = "TooLongFrameException"


class UnknownOpError(BKError):
    """The bookie does not serve the requested operation."""

    code = "ProtocolVersionException"


class TooManyRequestsError(BKError):
    """The bookie refused a long-poll READ_LAC: the connection already parks as many as it may."""

    code = "TooManyRequestsException"


class BookieServerError(BKError):
    """The bookie answered with an internal error (storage failure, shutting down)."""

    code = "BookieException"


class ProtocolError(BKError):
    """A malformed or oversized frame, or a response that matches no request.

    After a framing error (``FrameTooLargeError``) the byte stream is out of
    step and the connection must be closed; a ``MalformedFrameError`` concerns
    one frame only.
    """

    code = "ProtocolException"


class FrameTooLargeError(ProtocolError):
    """A frame header announces more than ``max_frame_size`` bytes.

    ``frames`` holds the complete frames that preceded it in the data fed,
    so a server can still answer them before closing the connection.
    """

    code = "TooLongFrameException"

    def __init__(self, message: str = "", *, frames: list[bytes] | None = None) -> None:
        super().__init__(message)
        self.frames: list[bytes] = frames if frames is not None else []


class MalformedFrameError(ProtocolError):
    """A complete frame does not hold a valid protobuf message."""


class ConfError(BKError, MetastoreConfError):
    """A configuration file or value is invalid; the message is one line naming the key.

    Also a ``metastore.conf.ConfError`` (and so a ``ValueError``).
    """

    code = "ConfigurationException"


class NotEnoughBookiesError(BKError, PlacementNotEnoughBookiesError):
    """Not enough bookies are available to form the ensemble or replace one.

    The placement package's error re-exported as a ``BKError``: it subclasses
    both, so ``except placement.NotEnoughBookiesError`` catches it too. The
    ledger client raises this class.
    """

    code = "NotEnoughBookiesException"


__all__ = [
    "BKError",
    "BKTimeoutError",
    "BadRequestError",
    "BookieReadOnlyError",
    "BookieServerError",
    "BookieUnavailableError",
    "ConfError",
    "DigestMismatchError",
    "EntryTooLargeError",
    "FrameTooLargeError",
    "LedgerClosedError",
    "LedgerFencedError",
    "MalformedFrameError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "ProtocolError",
    "TimeoutError",
    "TooLargeError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "UnknownOpError",
]
