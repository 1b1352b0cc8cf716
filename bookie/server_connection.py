"""One client connection of a bookie: an ``asyncio.Protocol`` around ``protocol.ServerConnection``.

    conn = BookieServerProtocol(host, requests, key)    # host: the server (``ConnectionHost``)

The connection reads frames, hands each decoded request to ``requests``
(``RequestSink``: ``bookie.request_handlers``), writes the answers through
its ``Outbox`` and applies the flow control of ``bookie.server``'s module
docstring; what it needs of its server is ``ConnectionHost``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol, cast

from bookie import protocol as proto
from bookie.conf import BookieConf
from bookie.outbox import Outbox
from bookie.stats import BookieStats

log = logging.getLogger(__name__)

ADD_ENTRY = proto.ADD_ENTRY
ADD_ENTRIES = proto.ADD_ENTRIES
ADD_ENTRIES_MULTI = proto.ADD_ENTRIES_MULTI
OK = proto.OK
ADD_OK = (ADD_ENTRY, OK)
ok_frame = proto.ok_frame
JOIN_BYTES = 16 * 1024
"""A flush of answers totalling at most this is written as one joined buffer (``Outbox`` join_bytes): a read's
few small answers leave by one ``write``, as the python floor's sink writes its acks, not a ``writev`` of one
part per answer (issue 32)."""

__all__ = ["BookieServerProtocol", "ConnectionHost", "ReadGroup", "RequestSink"]


class ReadGroup(Protocol):
    """What a connection's read uses of the journal hand-off (``bookie.group_commit.GroupCommit``)."""

    reading: bool
    """Set while a read is served: a group it opens waits for ``end_read``."""
    held: bool
    """A group opened during this read waits for ``end_read``."""

    def end_read(self, commit: bool) -> None:
        """The read is served: commit a group it opened now (``commit``), else in a later loop turn."""
        ...


class RequestSink(Protocol):
    """Who serves a connection's decoded requests (``bookie.request_handlers.RequestHandlers``)."""

    def handle(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        """Serve one decoded request; the answer goes to ``conn`` now or on completion."""
        ...

    def add_entry(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        """Serve an ADD_ENTRY (``handle``'s hot path)."""
        ...

    def add_entries(self, req: proto.Request, conn: BookieServerProtocol) -> None:
        """Serve an ADD_ENTRIES or ADD_ENTRIES_MULTI (``handle``'s other hot path)."""
        ...

    def frame_failed(self, req: proto.Request, exc: BaseException, conn: BookieServerProtocol) -> None:
        """Answer every add of an ADD_ENTRIES frame admitted whole with ``exc`` (its group failed); finishes it."""
        ...

    @property
    def group(self) -> ReadGroup:
        """The storage's journal hand-off (the storage is open before the first connection)."""
        ...


class ConnectionHost(Protocol):
    """What a connection uses of its server (``bookie.server.BookieServer``)."""

    conf: BookieConf
    connections: set[BookieServerProtocol]
    adders: int
    """Open connections that have sent adds (or other journal writes): one alone commits at its reads' end."""
    draining: bool
    budget: proto.FrameBudget
    stats: BookieStats

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def charge(self, conn: BookieServerProtocol, held: int) -> None:
        """Record what ``conn`` holds unserved (the global partial-frame budget)."""
        ...

    def drop_long_polls(self, conn: BookieServerProtocol) -> None:
        """Forget the long-poll reads ``conn`` parked (it is gone)."""
        ...


class BookieServerProtocol(asyncio.Protocol):
    """One client connection; see the module docstring."""

    def __init__(self, server: ConnectionHost, requests: RequestSink, key: int) -> None:
        conf = server.conf
        self._server = server
        self._requests = requests
        self.key = key
        self.state = proto.ServerConnection(conf.max_frame_size, conf.max_pending_requests,
                                            conf.max_pending_response_bytes)
        self.outbox = Outbox(on_flush=self.state.flushed, join_bytes=JOIN_BYTES)
        self.started = self.state.request_started  # a request is answered later (``finished``)
        self.acked = self._acked  # the storage's sink for this connection's adds: one object, so runs form
        self.acks = proto.AddAcks()  # frames the OK answers to its adds
        self._reading = True
        self._group = requests.group
        self._in_read = False  # answers queued now leave with the read's flush: none is scheduled
        self._charged = False  # holds bytes of a partial frame in ``server.budget``
        self.adder = False     # counted in ``server.adders``
        self.transport: asyncio.Transport | None = None
        self.peer = "?"

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.outbox.attach(self.transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._server.connections.add(self)
        if self._server.draining:
            self.state.drain()
            self._update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        if self.adder:
            self.adder = False
            self._server.adders -= 1
        self._server.budget.release(self.key)
        self.state.decoder.clear()
        self.outbox.detach()
        self.transport = None
        self._server.drop_long_polls(self)  # after: nothing is resumed or written for them

    def pause_writing(self) -> None:
        self.state.writing_paused()
        self._update_reading()

    def resume_writing(self) -> None:
        self.state.writing_resumed()
        self._serve()
        self.outbox.flush()

    def data_received(self, data: bytes) -> None:
        """Serve what the read completes; a group of journal writes it opened is committed at its end when no
        other connection writes (its answers then leave with this read's flush, as the python floor's sink
        does), else in a later loop turn with the other connections' writes of this turn (one group)."""
        state = self.state
        state.receive_data(data)
        group = self._group
        group.reading = True
        self._in_read = True
        try:
            self._serve()
        finally:
            if group.held:
                server = self._server
                if not self.adder:
                    self.adder = True
                    server.adders += 1
                if server.adders == 1:
                    if self.outbox.queued_bytes:
                        self.outbox.flush()  # answers ready now (reads...) do not wait for the journal write
                    group.end_read(True)
                else:
                    group.end_read(False)
            else:
                group.reading = False
            self._in_read = False
            self.outbox.flush()
        if self.transport is not None:
            held = state.decoder.buffered
            if held or self._charged:   # else the budget has nothing to change
                self._charged = held > 0
                self._server.charge(self, held)

    # --- serving --------------------------------------------------------------------------------

    def _serve(self) -> None:
        """Serve buffered requests until the rules say stop or more data is needed."""
        state = self.state
        handle = self._requests.handle
        add = self._requests.add_entry
        add_entries = self._requests.add_entries
        next_event = state.next_event
        request_type = proto.Request
        while self.transport is not None:
            event = next_event()
            if type(event) is request_type:
                op = event.op
                if op == ADD_ENTRY:
                    add(event, self)  # ``handle``'s hot paths, without its dispatch
                elif op == ADD_ENTRIES_MULTI or op == ADD_ENTRIES:
                    add_entries(event, self)
                else:
                    handle(event, self)
            elif event is proto.NEED_DATA:
                break
            elif event is proto.PAUSED:
                if not state.held_by_output:
                    break
                self.outbox.flush()  # only queued responses held it: write them (the transport may
                if state.paused:     # then pause writing), go on if it did not
                    break
            else:
                self._answer_bad_frame(cast(proto.Response, event))
        if state.broken and state.close_now:
            self._close_if_idle()
        if state.paused == self._reading:   # ``_update_reading`` would change the transport's reading
            self._update_reading()

    def _answer_bad_frame(self, response: proto.Response) -> None:
        if response.status == proto.TOO_LARGE:
            log.warning("closing connection from %s: %s", self.peer, response.message)
        else:
            log.info("bad frame from %s: %s", self.peer, response.message)
        self.send(response)

    # --- output --------------------------------------------------------------------------------

    def send(self, response: proto.Response) -> None:
        """Queue a response; it is written at the end of this loop turn."""
        self._server.stats.count(response.op, response.status)
        frame = proto.encode_frame(response)
        self.outbox.put(frame)
        if self.state.response_queued(len(frame)):
            self.outbox.flush()

    def send_later(self, response: proto.Response) -> None:
        """Queue a response from a completion callback; the flush is scheduled."""
        if self.transport is not None:
            self.send_frame_later(response.op, response.status, proto.encode_frame(response))

    def send_frame_later(self, op: int, status: int, frame: bytes) -> None:
        """``send_later`` of a response framed already (``op`` and ``status`` are counted)."""
        if self.transport is None:
            return
        self._server.stats.count(op, status)
        self._queue_answer(frame)

    def _queue_answer(self, frame: bytes) -> None:
        """A framed answer from a completion: put for the read's flush while reading, else sent; flushed once the
        queued responses reach their bound."""
        if self._in_read:
            self.outbox.put(frame)  # the read's flush writes it
        else:
            self.outbox.send(frame)
        if self.state.response_queued(len(frame)):
            self.outbox.flush()

    def frame_answered(self, op: int, frame: bytes, adds: int) -> None:
        """An add frame's framed OK answer, once its ``adds`` are durable: counted (the frame as ``op``, each add
        as an ADD_ENTRY), queued as ``send_frame_later`` does, and the request finished (``finished``): one
        call per group on the hot path."""
        requests = self._server.stats.requests
        requests[ADD_OK] = requests.get(ADD_OK, 0) + adds
        if self.transport is not None:
            key = (op, OK)
            requests[key] = requests.get(key, 0) + 1
            self._queue_answer(frame)
        if self.state.requests_finished(1):
            self._act_on_finished()

    def _acked(self, acks: list[Any], exc: BaseException | None) -> None:
        """The storage's sink for this connection's adds: answer a run of them, one call per group.

        An ack is the framed OK answer of an ADD_ENTRY (``conn.acks``,
        ``submit_acked_add``) or the ``Request`` of an ADD_ENTRIES frame whose
        adds were admitted whole (``GroupCommit.admit_frame``), answered by
        its hand-framed OK (``ok_frame``); all are queued together once the
        group is durable. After a failed commit each add is answered with the
        error instead (a frame's by ``RequestSink.frame_failed``).
        """
        n = len(acks)
        if exc is None:
            if self.transport is not None:
                requests = self._server.stats.requests
                adds = n
                for ack in acks:
                    if type(ack) is not bytes:   # a frame in the run: frame its answer, count it
                        frames: list[bytes] = []
                        adds = 0
                        for item in acks:
                            if type(item) is bytes:
                                frames.append(item)
                                adds += 1
                            else:
                                op = item.op
                                frames.append(ok_frame(item.txn_id, op))
                                adds += len(item.entries)
                                key = (op, OK)
                                requests[key] = requests.get(key, 0) + 1
                        acks = frames
                        break
                requests[ADD_OK] = requests.get(ADD_OK, 0) + adds   # each add counts as an ADD_ENTRY
                nbytes = sum(map(len, acks))
                if self._in_read:
                    self.outbox.put_all(acks, nbytes)  # the read's flush writes them
                else:
                    self.outbox.send_all(acks, nbytes)
                if self.state.response_queued(nbytes):
                    self.outbox.flush()
        else:
            for ack in acks:
                if type(ack) is not bytes:
                    n -= 1   # finished by its answer
                    self._requests.frame_failed(ack, exc, self)
                elif self.transport is not None:
                    ok = proto.parse_response(ack[proto.PREFIX_SIZE:])
                    self.send_later(proto.add_response(ok.txn_id, ok.ledger_id, ok.entry_id, exc))
        if self.state.requests_finished(n):
            self._act_on_finished()

    def flush(self) -> None:
        self.outbox.flush()

    # --- flow control ---------------------------------------------------------------------------

    def finished(self, n: int = 1) -> None:
        """``n`` requests counted by ``started`` (``state.request_started``) were answered."""
        if self.state.requests_finished(n):
            self._act_on_finished()

    def _act_on_finished(self) -> None:
        """Finished requests lifted a hold (``requests_finished`` said so): close, or serve again."""
        if self.state.close_now:
            self._close_if_idle()
        elif not self.state.paused and self.transport is not None:
            self._server.loop.call_soon(self._resume)

    def _resume(self) -> None:
        self._serve()
        self.outbox.flush()

    def drain(self) -> None:
        self.state.drain()
        self._update_reading()

    def _close_if_idle(self) -> None:
        """After a framing error: close once every request read before it was answered."""
        if self.transport is not None:
            self.outbox.flush()
            self.transport.close()

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None:
            return
        want = self.state.reading
        if want != self._reading:
            self._reading = want
            if want:
                transport.resume_reading()
            else:
                transport.pause_reading()
