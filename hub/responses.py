"""The hub's answers, built without I/O: response messages and frames, the status of a failure, and
where a request is addressed (its topic and subscriber id).

Shared by both sides of ``hub.protocol`` (which re-exports every name here) and by the hub's
connection handler; the hot-path frames assembled by hand are ``hub.frames``'.
"""

from __future__ import annotations

from bookie.errors import BKError
from bookie.wire.framing import encode_frame
from hub.errors import PubSubError
from hub.frames import published_batch_ok
from hub.proto import pubsub_pb2 as pb
from metastore.errors import MetastoreError

__all__ = [
    "encode",
    "expected_failure",
    "failure_response",
    "published_batch",
    "redirect_response",
    "request_topic",
    "response",
    "status_name",
    "status_of",
    "subscriber_of",
    "subscription_event",
]


def encode(message: pb.PubSubRequest | pb.PubSubResponse) -> bytes:
    """The length-prefixed frame of ``message``."""
    return encode_frame(message)


def status_name(status: int) -> str:
    try:
        return pb.StatusCode.Name(status)
    except ValueError:
        return f"STATUS_{status}"


def response(txn_id: int, status: int = pb.SUCCESS, message: str = "", *, topic: bytes = b"",
             redirect_to: str = "") -> pb.PubSubResponse:
    """A response with the protocol version set."""
    resp = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE, txnId=txn_id, statusMsg=message, topic=topic,
                             redirect_to=redirect_to)
    resp.statusCode = status  # type: ignore[assignment]
    return resp


def expected_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure the protocol has a status for (else: a bug, worth a traceback in the log)."""
    return isinstance(exc, PubSubError | BKError | MetastoreError)


def status_of(exc: BaseException) -> int:
    """The status answering a request that failed with ``exc``.

    A ``PubSubError`` answers with its own status (UNEXPECTED_CONDITION if
    the name is not a wire status); ledger and metastore trouble is
    SERVICE_DOWN (the client may retry); anything else UNEXPECTED_CONDITION.
    """
    if isinstance(exc, PubSubError):
        try:
            return pb.StatusCode.Value(exc.status)
        except ValueError:
            return pb.UNEXPECTED_CONDITION
    if isinstance(exc, BKError | MetastoreError):
        return pb.SERVICE_DOWN
    return pb.UNEXPECTED_CONDITION


def failure_response(request: pb.PubSubRequest, exc: BaseException) -> pb.PubSubResponse:
    """The answer to ``request`` that failed with ``exc`` (``status_of``; the message is ``str(exc)``)."""
    return response(request.txnId, status_of(exc), str(exc), topic=request_topic(request))


def redirect_response(request: pb.PubSubRequest, owner: str) -> pb.PubSubResponse:
    """NOT_RESPONSIBLE_FOR_TOPIC: ``owner`` (``host:port:sslport``) serves the request's topic."""
    return response(request.txnId, pb.NOT_RESPONSIBLE_FOR_TOPIC, owner, topic=request_topic(request),
                    redirect_to=owner)


def request_topic(request: pb.PubSubRequest) -> bytes:
    """The request's topic: the top-level field, else the one inside its body."""
    if request.topic:
        return request.topic
    which = request.WhichOneof("body")
    return getattr(getattr(request, which), "topic", b"") if which else b""


def subscriber_of(request: pb.PubSubRequest) -> bytes:
    """The subscriber id of a subscription request (``b""`` for a publish)."""
    which = request.WhichOneof("body")
    if which is None or which == "publishRequest":
        return b""
    return bytes(getattr(request, which).subscriberId)


def published_batch(txn_id: int, topic: bytes, first: int, stored: int, status: int = pb.SUCCESS,
                    message: str = "") -> bytes:
    """The answer to a batched publish: ``stored`` messages from seq id ``first`` on (all of them with SUCCESS;
    with an error ``status``, the ones before the failure)."""
    if status == pb.SUCCESS and not message:   # the common case, hand-framed (one per batched publish)
        return published_batch_ok(txn_id, topic, first, stored)
    resp = response(txn_id, status, message, topic=topic)
    if first:
        resp.publishResponse.publishedMsgId.localComponent = first
    resp.publishResponse.stored = stored
    return encode(resp)


def subscription_event(topic: bytes, subscriber: bytes, event: int, consumer_id: int = 0) -> bytes:
    resp = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE, statusCode=pb.SUCCESS, txnId=0, topic=topic)
    resp.subscriptionEvent.topic = topic
    resp.subscriptionEvent.subscriberId = subscriber
    resp.subscriptionEvent.event = event  # type: ignore[assignment]
    if consumer_id:
        resp.subscriptionEvent.consumerId = consumer_id
    return encode(resp)
