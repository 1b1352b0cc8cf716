"""The server-side decisions of hub.protocol on plain values: error -> status, reading, incomplete frames."""

import struct

from bookie.errors import BookieUnavailableError
from hub import errors, protocol
from hub.proto import pubsub_pb2 as pb
from metastore.errors import ServiceDownError


def request(topic: bytes = b"t") -> pb.PubSubRequest:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.SUBSCRIBE, txnId=7)
    req.subscribeRequest.topic = topic
    req.subscribeRequest.subscriberId = b"s"
    return req


def test_failures_map_to_statuses() -> None:
    assert protocol.status_of(errors.ClientNotSubscribedError("x")) == pb.CLIENT_NOT_SUBSCRIBED
    assert protocol.status_of(BookieUnavailableError("x")) == pb.SERVICE_DOWN
    assert protocol.status_of(ServiceDownError("x")) == pb.SERVICE_DOWN
    assert protocol.status_of(RuntimeError("bug")) == pb.UNEXPECTED_CONDITION
    assert not protocol.expected_failure(RuntimeError("bug"))
    assert protocol.expected_failure(errors.ClientNotSubscribedError("x"))
    resp = protocol.failure_response(request(), errors.ClientNotSubscribedError("not here"))
    assert (resp.txnId, resp.statusCode, resp.statusMsg, resp.topic) == (7, pb.CLIENT_NOT_SUBSCRIBED, "not here", b"t")


def test_a_redirect_names_the_owner() -> None:
    resp = protocol.redirect_response(request(), "h:1:2")
    assert (resp.statusCode, resp.redirect_to, resp.statusMsg, resp.topic) == \
        (pb.NOT_RESPONSIBLE_FOR_TOPIC, "h:1:2", "h:1:2", b"t")


def test_reading_stops_while_the_client_does_not_read_or_requests_wait() -> None:
    conn = protocol.ServerConnection(1 << 20, 1 << 20, max_requests_per_turn=1)
    assert conn.should_read(True) and not conn.should_read(False)
    frame = protocol.encode(request())
    conn.receive_data(frame * 2)           # one served, one left for the next turn
    assert conn.backlogged and not conn.should_read(True)
    conn.next_events()
    conn.eof_received()
    assert not conn.should_read(True)


def test_the_incomplete_frame_clock_runs_only_while_a_frame_is_incomplete() -> None:
    conn = protocol.ServerConnection(1 << 20, 1 << 20)
    clock = iter([1.0, 2.0, 3.0])
    conn.receive_data(struct.pack(">I", 100) + b"x")
    conn.track_partial(False, lambda: next(clock))
    assert conn.partial_since == 1.0
    conn.receive_data(b"y")                # more of the same frame: the clock keeps running
    conn.track_partial(False, lambda: next(clock))
    assert conn.partial_since == 1.0
    conn.clear()
    assert conn.partial_since is None
    conn.track_partial(True, lambda: next(clock))
    assert conn.partial_since is None      # nothing held
