"""The answers of a connection's multi-add frames: each frame's callback hands every add (or LAC) its answer.

``bookie.connection.BookieConnection`` frames the adds of one loop turn as
ADD_ENTRIES (``_AddRun``: one ledger's adds) or ADD_ENTRIES_MULTI
(``_LedgersRun``: several ledgers sharing a master key) and the explicit
LACs as WRITE_LAC_MULTI (``_LacsRun``); the frame's one answer is split
here. An OK answer without per-add results is one ``Response`` reused for
the adds of the frame (callbacks read it at once); an UNKNOWN_OP answer
(a bookie of an older version) goes back to the connection, which sends
the frame's items, and all later, the old way (``Refusals``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from bookie import protocol
from bookie.errors import BKError, ProtocolError

__all__ = ["AddAcks", "Frames", "Refusals", "ResponseCallback"]

_ADD_ENTRY = protocol.ADD_ENTRY
_OK = protocol.OK

ResponseCallback = Callable[[protocol.Response | BKError], None]
"""Gets the response to one request (any status), or the error that lost the connection."""


class AddAcks:
    """A ``ResponseCallback`` of adds that also takes an OK answer as the entry id alone (``ok``).

    A ledger writer's per-bookie callback is one: a frame's all-OK answer
    calls ``ok(entry_id)`` for each of its adds, with no ``Response`` to fill
    in and read back (protobuf field writes and reads per add: issue 34).
    """

    __slots__ = ()

    def ok(self, entry_id: int) -> None:
        raise NotImplementedError

    def __call__(self, result: protocol.Response | BKError) -> None:
        raise NotImplementedError


class Refusals(Protocol):
    """What a frame's answer needs of its connection (``BookieConnection``): where a refused frame goes."""

    address: str

    def _refused_ledgers(self, run: _LedgersRun) -> None: ...

    def _refused_batches(self, run: _AddRun) -> None: ...

    def _refused_lacs(self, run: _LacsRun) -> None: ...


Frames = tuple[list[bytes], list[protocol.AddBodies], list[int], list[ResponseCallback]]


def _by_ledger(payloads: list[bytes], ledgers: list[protocol.AddBodies], ids: list[int],
               callbacks: list[ResponseCallback]) -> Frames:
    """The adds reordered so that each ledger's are together, in their order (one ADD_ENTRIES run each)."""
    groups: dict[int, list[int]] = {}
    for i, ledger in enumerate(ledgers):
        groups.setdefault(id(ledger), []).append(i)
    order = [i for idx in groups.values() for i in idx]
    return ([payloads[i] for i in order], [ledgers[i] for i in order], [ids[i] for i in order],
            [callbacks[i] for i in order])


class _FrameAnswer:
    """The callback of one ADD_ENTRIES or ADD_ENTRIES_MULTI frame: hands each add its answer."""

    __slots__ = ("callbacks", "conn", "ids", "payloads")
    what = "ADD_ENTRIES"

    def __init__(self, conn: Refusals, payloads: list[bytes], ids: list[int],
                 callbacks: list[ResponseCallback]) -> None:
        self.conn = conn
        self.payloads = payloads
        self.ids = ids
        self.callbacks = callbacks

    def _all_ok(self) -> None:
        raise NotImplementedError

    def _refused(self) -> None:
        raise NotImplementedError

    def answered_ok(self) -> None:
        """The frame's OK answer without per-add answers, read by hand (``ClientTxns.answer``): every add is OK."""
        self._all_ok()

    def __call__(self, result: protocol.Response | BKError) -> None:
        callbacks = self.callbacks
        if isinstance(result, BKError):
            for callback in callbacks:
                callback(result)
            return
        adds = result.adds
        if result.status == _OK and not adds:
            self._all_ok()
            return
        if result.status == protocol.UNKNOWN_OP and not adds:
            self._refused()
            return
        if len(adds) != len(callbacks):   # a failure without every add's answer: each add failed with it
            err = protocol.error_for(result) or ProtocolError(
                f"bookie {self.conn.address}: {self.what} answer with {len(adds)} of {len(callbacks)} adds")
            for callback in callbacks:
                callback(err)
            return
        for answer, callback in zip(adds, callbacks, strict=True):
            callback(answer)


class _LedgersRun(_FrameAnswer):
    """The adds of one ADD_ENTRIES_MULTI frame (``BookieConnection._frame_ledgers``)."""

    __slots__ = ("ledgers",)
    what = "ADD_ENTRIES_MULTI"

    def __init__(self, conn: Refusals, payloads: list[bytes], ledgers: list[protocol.AddBodies],
                 ids: list[int], callbacks: list[ResponseCallback]) -> None:
        super().__init__(conn, payloads, ids, callbacks)
        self.ledgers = ledgers

    def _all_ok(self) -> None:
        ok = None   # one answer object for the frame's other callbacks, made if one needs it; they read it at once
        for ledger, entry_id, callback in zip(self.ledgers, self.ids, self.callbacks, strict=True):
            if isinstance(callback, AddAcks):
                callback.ok(entry_id)
                continue
            if ok is None:
                ok = protocol.Response(op=_ADD_ENTRY)
            ok.ledger_id = ledger.ledger_id
            ok.entry_id = entry_id
            callback(ok)

    answered_ok = _all_ok   # (``_FrameAnswer.answered_ok``, one call less per frame)

    def _refused(self) -> None:
        self.conn._refused_ledgers(self)


class _AddRun(_FrameAnswer):
    """The adds of one ADD_ENTRIES frame, all of one ledger (``BookieConnection._frame_runs``)."""

    __slots__ = ("ledger",)

    def __init__(self, conn: Refusals, ledger: protocol.AddBodies, payloads: list[bytes], ids: list[int],
                 callbacks: list[ResponseCallback]) -> None:
        super().__init__(conn, payloads, ids, callbacks)
        self.ledger = ledger

    def _all_ok(self) -> None:
        ok = None   # one answer object for the run's other callbacks, made if one needs it
        for entry_id, callback in zip(self.ids, self.callbacks, strict=True):
            if isinstance(callback, AddAcks):
                callback.ok(entry_id)
                continue
            if ok is None:
                ok = protocol.Response(op=_ADD_ENTRY, ledger_id=self.ledger.ledger_id)
            ok.entry_id = entry_id
            callback(ok)

    answered_ok = _all_ok

    def _refused(self) -> None:
        self.conn._refused_batches(self)


class _LacsRun:
    """The callback of one WRITE_LAC_MULTI frame (``BookieConnection._frame_lacs``): hands each LAC its answer."""

    __slots__ = ("conn", "items")

    def __init__(self, conn: Refusals, items: list[tuple[bytes, int, int, ResponseCallback]]) -> None:
        self.conn = conn
        self.items = items

    def __call__(self, result: protocol.Response | BKError) -> None:
        if isinstance(result, BKError) or (result.status != _OK and result.status != protocol.UNKNOWN_OP):
            for item in self.items:   # lost, or one of them failed: each hears it (a writer only logs it)
                item[3](result)
            return
        if result.status == protocol.UNKNOWN_OP:
            self.conn._refused_lacs(self)
            return
        self.answered_ok()

    def answered_ok(self) -> None:
        """The frame's OK answer (read by hand: ``ClientTxns.answer``): each LAC hears OK."""
        ok = protocol.Response(op=protocol.WRITE_LAC)   # one answer object for the frame: callbacks read it at once
        for _, ledger_id, lac, callback in self.items:
            ok.ledger_id = ledger_id
            ok.lac = lac
            callback(ok)

