"""The bookie's rules for one client connection, without I/O: framing, limits, flow control (``bookie.protocol``).

    conn = ServerConnection(max_frame_size, max_pending_requests, max_response_bytes)
    conn.receive_data(data)
    while (event := conn.next_event()) not in (NEED_DATA, PAUSED):
        ...                                     # a Request to serve, or a Response to send as is

Importers use ``bookie.protocol``, which hands these names on.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from bookie import errors
from bookie.messages import (
    BAD_REQUEST,
    TOO_LARGE,
    Request,
    Response,
    error_response,
)
from bookie.wire.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameDecoder,
)


class _Signal:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Signal("NEED_DATA")
"""``ServerConnection.next_event``: no complete request is buffered; read more."""
PAUSED = _Signal("PAUSED")
"""``ServerConnection.next_event``: serve nothing more now (see ``ServerConnection.paused``)."""

_request_from = Request.FromString
_response_from = Response.FromString

Event = Request | Response | _Signal
"""What ``ServerConnection.next_event`` returns: a request to serve, a response to send as is, a signal."""

DEFAULT_MAX_PENDING_REQUESTS = 10000
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024


class ServerConnection:
    """The bookie's rules for one client connection, without I/O (h11 style).

    Bytes go in with ``receive_data``; ``next_event()`` returns, in order,
    each ``Request`` to serve, each ``Response`` to send as it is (a
    ``BAD_REQUEST`` for an undecodable frame, txn id 0; a ``TOO_LARGE`` for
    an oversized frame, after which the connection closes once idle),
    ``NEED_DATA`` or ``PAUSED``. The shell reports what happens to the
    requests and the output: ``request_started``/``request_finished`` for
    requests answered later (an add awaiting its commit),
    ``response_queued``/``flushed`` for the response bytes queued between two
    writes, ``writing_paused``/``writing_resumed`` from the transport's
    ``pause_writing``/``resume_writing``, ``drain`` on shutdown.

    Decisions: ``paused`` (serve no more requests, stop reading) while the
    transport's write buffer is over its high-water mark, while
    ``max_pending_requests`` requests are in flight (until half of them
    finished), while ``max_response_bytes`` of responses wait for a flush
    (``response_queued`` returns True: flush now), once draining or broken;
    ``reading`` says whether the transport should read; ``close_now`` says
    a broken connection has answered everything it read.
    """

    __slots__ = ("_held", "broken", "decoder", "draining", "in_flight", "max_pending_requests",
                 "max_response_bytes", "paused", "queued_bytes", "write_paused")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.decoder = FrameDecoder(max_frame_size)
        self.max_pending_requests = max_pending_requests
        self.max_response_bytes = max_response_bytes
        self.in_flight = 0
        self.queued_bytes = 0
        self.write_paused = False
        self.draining = False
        self.broken = False
        self._held = False  # paused for requests in flight: hold until half of them finished
        self.paused = False
        """No more requests are to be served now (they stay buffered); kept up to date by every report."""

    # --- input ----------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer bytes read from the client (ignored once the stream broke)."""
        if not self.broken:
            self.decoder.receive(data)

    @property
    def buffered(self) -> int:
        """Bytes read but not yet served (an incomplete frame, and frames held while paused)."""
        return self.decoder.buffered

    def next_event(self) -> Event:
        """The next thing to do; see the class docstring."""
        if self.paused:
            return PAUSED
        try:
            frame = self.decoder.next_frame()
        except errors.FrameTooLargeError as exc:
            self.broken = True
            self._update()
            return error_response(TOO_LARGE, str(exc))
        if frame is None:
            return NEED_DATA
        try:
            return _request_from(frame)
        except (DecodeError, ValueError, RuntimeError) as exc:
            return error_response(BAD_REQUEST, f"malformed request frame of {len(frame)} bytes: {exc}")

    # --- what the shell reports -----------------------------------------------------------------

    def request_started(self) -> None:
        self.in_flight += 1
        if self.in_flight >= self.max_pending_requests:
            self._held = True
            self.paused = True

    def request_finished(self) -> bool:
        """Count a request answered; True when the shell must act (serve again, or ``close_now``)."""
        self.in_flight -= 1
        if self._held and self.in_flight <= self.max_pending_requests // 2:
            self._held = False
            self._update()
            return True
        return self.broken and self.in_flight == 0

    def requests_finished(self, n: int) -> bool:
        """``request_finished`` for ``n`` requests answered together (a run of adds)."""
        self.in_flight -= n
        if self._held and self.in_flight <= self.max_pending_requests // 2:
            self._held = False
            self._update()
            return True
        return self.broken and self.in_flight == 0

    def response_queued(self, nbytes: int) -> bool:
        """Count a queued response; True when the shell should flush now (too much is queued)."""
        self.queued_bytes += nbytes
        if self.queued_bytes >= self.max_response_bytes:
            self.paused = True
            return True
        return False

    def flushed(self) -> None:
        self.queued_bytes = 0
        if self.paused:
            self._update()

    def writing_paused(self) -> None:
        self.write_paused = True
        self.paused = True

    def writing_resumed(self) -> None:
        self.write_paused = False
        self._update()

    def drain(self) -> None:
        """Shutting down: serve nothing more that is read."""
        self.draining = True
        self.paused = True

    # --- decisions ------------------------------------------------------------------------------

    def _update(self) -> None:
        self.paused = (self.write_paused or self.draining or self.broken or self._held
                      or self.queued_bytes >= self.max_response_bytes)

    @property
    def held_by_output(self) -> bool:
        """Paused only because responses wait for a flush (``flushed`` lifts it)."""
        return self.paused and not (self.write_paused or self.draining or self.broken or self._held)

    @property
    def reading(self) -> bool:
        """Whether the transport should read: not while paused (what is read would pile up)."""
        return not self.paused

    @property
    def close_now(self) -> bool:
        """A broken connection has answered every request read before the bad frame."""
        return self.broken and self.in_flight == 0
