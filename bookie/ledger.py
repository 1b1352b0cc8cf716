"""``LedgerHandle``: one ledger as the application sees it, a writer's or a reader's.

    lh = await bk.create_ledger(3, 2, 2)          # a writer's handle
    eid = await lh.add_entry(b"payload")
    ids = await lh.add_entries([b"a", b"b"])
    lh.async_add_entry(b"c", callback)            # callback(entry_id, error), no future (BookKeeper's asyncAddEntry)
    async for e in lh.read(0, lh.last_add_confirmed): e.entry_id, e.data
    await lh.close()

    rh = await bk.open_ledger_no_recovery(ledger_id)   # a reader's handle tailing an open ledger
    lac = await rh.read_last_add_confirmed()           # the larger of piggybacked and explicit LAC
    lac = await rh.wait_last_add_confirmed(after=lac, timeout=10.0)   # long poll: returns once it passes lac

The handle joins a ``LedgerWriter`` (``bookie.writer``: adds, ensemble
change, close) and a ``LedgerReader`` (``bookie.reader``: replica reads,
LAC reads) over the same metadata. A reader's handle (``open_ledger*``) has
no writer: adds raise ``LedgerClosedError``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence

from bookie.context import ClientContext
from bookie.errors import BKError, LedgerClosedError, NoSuchEntryError
from bookie.metadata import LedgerMetadata
from bookie.reader import LedgerEntry, LedgerReader
from bookie.writer import AddCallback, LedgerWriter
from metastore import Version

__all__ = ["LedgerEntry", "LedgerHandle"]


class LedgerHandle:
    """See the module docstring. Made by ``BookKeeper``; ``writable`` handles own a writer.

    The reader is built by the first read, and a writer's handle keeps no
    metadata of its own (the writer keeps it serialized): a hub keeps a
    writer's handle open per topic, most of them idle (issue 34). Slots for
    its own attributes, and a ``__dict__`` built only when someone sets
    another: tests and applications wrap a handle's methods on the instance.
    """

    __slots__ = ("__dict__", "_ctx", "_decoded", "_lac", "_lazy_reader", "_metadata", "_on_close", "_password",
                 "_recovered_last", "_writer", "ledger_id")

    def __init__(self, ctx: ClientContext, ledger_id: int, metadata: LedgerMetadata, version: Version,
                 password: bytes, *, writable: bool,
                 on_close: Callable[[LedgerHandle], None] | None = None, encoded: bytes | None = None) -> None:
        self.ledger_id = ledger_id
        self._ctx = ctx
        self._password = password
        self._metadata = None if writable else metadata   # a writer's handle asks its writer
        self._decoded: tuple[bytes, LedgerMetadata] | None = None   # the writer's, decoded for the reader
        self._on_close = on_close
        self._lac = -1
        self._writer = LedgerWriter(ctx, ledger_id, metadata, version, password,
                                    encoded=encoded) if writable else None
        self._lazy_reader: LedgerReader | None = None
        self._recovered_last: LedgerEntry | None = None
        """The last entry as recovery met it (``BookKeeper.open_ledger``): ``read_last_entry`` needs no read."""

    @property
    def _reader(self) -> LedgerReader:
        reader = self._lazy_reader
        if reader is None:
            reader = self._lazy_reader = LedgerReader(self._ctx, self.ledger_id, self._password,
                                                      self._current_metadata)
        return reader

    def _current_metadata(self) -> LedgerMetadata:
        """The metadata every read of the reader consults: a writer's decoded again only once it changed."""
        writer = self._writer
        if writer is None:
            return self.metadata
        wire = writer.metadata_wire
        got = self._decoded
        if got is None or got[0] is not wire:
            got = self._decoded = (wire, LedgerMetadata.decode(wire))
        return got[1]

    # --- state ------------------------------------------------------------------------------------
    @property
    def metadata(self) -> LedgerMetadata:
        """Ensembles, quorum sizes, state, last entry id and length, as last read or written (a writer's: a
        copy, decoded at each read)."""
        writer = self._writer
        if writer is not None:
            return writer.metadata
        assert self._metadata is not None   # a reader's handle keeps its own
        return self._metadata

    @property
    def last_add_confirmed(self) -> int:
        """The highest entry id below which every entry is acknowledged (-1: none)."""
        return self._writer.last_add_confirmed if self._writer is not None else self._lac

    @last_add_confirmed.setter
    def last_add_confirmed(self, value: int) -> None:
        if self._writer is not None:
            raise AttributeError("a writer's last_add_confirmed follows its acknowledgements")
        self._lac = value

    @property
    def length(self) -> int:
        """Bytes of data added (a writer's) or as recorded in the metadata (a reader's)."""
        return self._writer.length if self._writer is not None else self.metadata.length

    @property
    def is_closed(self) -> bool:
        writer = self._writer
        return writer.is_closed if writer is not None else self.metadata.is_closed

    def __repr__(self) -> str:
        return f"<LedgerHandle {self.ledger_id} {self.metadata.state.value} lac={self.last_add_confirmed}>"

    def _require_writer(self) -> LedgerWriter:
        if self._writer is None:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed for adds")
        return self._writer

    # --- writing ----------------------------------------------------------------------------------
    async def add_entry(self, data: bytes) -> int:
        """Append ``data``; returns its entry id once ``ack_quorum`` bookies made it durable.

        ``EntryTooLargeError`` (over ``max_entry_size``; the handle stays
        usable), ``LedgerClosedError``, ``LedgerFencedError``,
        ``NotEnoughBookiesError``, ``UnauthorizedError``.
        """
        return await self._require_writer().add(bytes(data))

    async def add_entries(self, items: Sequence[bytes]) -> list[int]:
        """Append many entries, pipelined; returns their ids (in order). Errors as ``add_entry``."""
        writer = self._require_writer()
        first = writer.next_entry_id
        last = await writer.add_many([bytes(d) for d in items])
        return list(range(first, last + 1)) if items else []

    @property
    def next_entry_id(self) -> int:
        """The entry id the next add will get (a writer's handle)."""
        return self._require_writer().next_entry_id

    def async_add_entry(self, data: bytes, callback: AddCallback) -> int:
        """Start an add without waiting; ``callback(entry_id, error)`` runs when it completes or fails.

        Returns the entry id. Raises at once as ``add_entry`` does when the
        add cannot start.
        """
        writer = self._writer or self._require_writer()  # no call on the add path while open
        return writer.submit(data if type(data) is bytes else bytes(data), callback)

    async def close(self) -> None:
        """Wait for pending adds, then mark the ledger CLOSED (last entry, length) in the metadata.

        A reader's handle just closes. ``LedgerFencedError`` when the ledger
        was recovered under this writer with a different end.
        """
        try:
            if self._writer is not None:
                await self._writer.close()
        finally:
            if self._on_close is not None and (self._writer is None or self.is_closed):
                self._on_close(self)

    def fail(self, exc: BKError) -> None:
        """Fail pending adds with ``exc`` (the client is closing)."""
        if self._writer is not None:
            self._writer.fail_all(exc)

    # --- reading ----------------------------------------------------------------------------------
    async def read_last_add_confirmed(self) -> int:
        """Ask the last ensemble's bookies for their LAC; update and return ``last_add_confirmed``.

        Each bookie serves the larger of the LAC piggybacked on the adds it
        stored and the one the writer sent explicitly; the highest wins.
        ``BookieUnavailableError`` when no bookie answers.
        """
        md = self._current_metadata()
        if md.is_closed:
            if self._writer is None:
                self._lac = md.last_entry_id
            return md.last_entry_id
        lac = await self._reader.read_lac()
        if self._writer is None:
            self._lac = max(self._lac, lac)
        return self.last_add_confirmed

    async def wait_last_add_confirmed(self, after: int, timeout: float) -> int:
        """Wait until the LAC passes ``after``; return it, or the LAC known when ``timeout`` seconds end.

        Returns at once when ``last_add_confirmed`` is already above
        ``after`` or the ledger is closed (its last entry). Otherwise
        long-polls the last ensemble's bookies (long-poll READ_LAC): the first
        answer above ``after`` wins, so a new add, or the writer's explicit
        LAC after ``explicit_lac_interval`` ms without one, ends the wait.
        Never raises for a timeout or unreachable bookies: the result is then
        the highest LAC known (``last_add_confirmed`` is updated with it).
        """
        known = self.last_add_confirmed
        md = self._current_metadata()
        if md.is_closed:
            return self._learn_lac(md.last_entry_id)
        if known > after:
            return known
        return self._learn_lac(await self._reader.wait_lac(after, timeout))

    def _learn_lac(self, lac: int) -> int:
        if self._writer is None:
            self._lac = max(self._lac, lac)
            return self._lac
        return max(lac, self._writer.last_add_confirmed)

    @property
    def last_entry_seen(self) -> int:
        """The highest entry id a bookie reported storing in this handle's LAC reads (-1: none).

        Entries after ``last_add_confirmed`` up to it were written but are not
        known to be confirmed (yet): a tailing reader may wait for them with
        ``wait_last_add_confirmed(after=last_entry_seen - 1, ...)``.
        """
        return self._lazy_reader.last_entry_seen if self._lazy_reader is not None else -1

    async def read(self, first: int, last: int) -> AsyncGenerator[LedgerEntry, None]:
        """Yield entries ``first..last`` in order (reads pipelined, each from the best replica).

        ``NoSuchEntryError`` when the range goes past the last confirmed entry.
        """
        limit = self._current_metadata().last_entry_id if self.is_closed else self.last_add_confirmed
        if first < 0 or last < first or last > limit:
            raise NoSuchEntryError(f"ledger {self.ledger_id}: cannot read {first}..{last} (last readable is {limit})")
        async with contextlib.aclosing(self._reader.read_range(first, last)) as entries:   # its reads end with us
            async for entry in entries:
                yield entry

    async def read_last_entry(self) -> LedgerEntry | None:
        """The last confirmed entry (None: there is none): recovery's copy after ``open_ledger``, else read."""
        last = self._current_metadata().last_entry_id if self.is_closed else self.last_add_confirmed
        if last < 0:
            return None
        got = self._recovered_last
        if got is not None and got.entry_id == last:
            return got
        return await self._reader.read_entry(last)

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        """Read one entry from its write set, speculatively asking the next replica after a delay."""
        return await self._reader.read_entry(entry_id)

    async def read_payload(self, entry_id: int) -> bytes:
        """The verified payload of ``entry_id`` (raises the most telling error if no replica has it)."""
        return await self._reader.read_payload(entry_id)

