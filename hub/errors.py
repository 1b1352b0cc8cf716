"""Errors of the hub package: one ``PubSubError`` per status code of the wire protocol.

Every error carries ``.status``, the ``StatusCode`` name from
``hub/proto/pubsub.proto`` (``"CLIENT_NOT_SUBSCRIBED"``, ...), so callers and the
console can report it without ``isinstance`` chains::

    try:
        await client.subscribe(b"topic", b"sub", create_or_attach="CREATE")
    except ClientAlreadySubscribedError as err:
        print(err.status)             # CLIENT_ALREADY_SUBSCRIBED

``error_for_status(name, message)`` builds the right subclass for a status
received on the wire; unknown names give a plain ``PubSubError``.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BacklogQuotaExceededError",
    "BadVersionError",
    "CertificateError",
    "ClientAlreadySubscribedError",
    "ClientNotSubscribedError",
    "ConsumerClosedError",
    "CouldNotConnectError",
    "DeliveryDelayTooLongError",
    "DuplicatePublishError",
    "InvalidMessageFilterError",
    "MalformedRequestError",
    "MessageTooLargeError",
    "NoSubscriptionStateError",
    "NoSuchTopicError",
    "NoTopicOwnerInfoError",
    "NoTopicPersistenceInfoError",
    "NotAuthorizedError",
    "NotResponsibleForTopicError",
    "PubSubError",
    "ResponseTimeoutError",
    "ServiceDownError",
    "SubscriptionForcedClosedError",
    "SubscriptionStateExistsError",
    "SubscriptionTypeMismatchError",
    "TooManyRedirectsError",
    "TopicOwnerInfoExistsError",
    "TopicPersistenceInfoExistsError",
    "UncertainStateError",
    "UnknownOperationError",
    "UntrustedCertificateError",
    "error_for_status",
]


class PubSubError(Exception):
    """Base of every hub and hub-client error; ``status`` is the StatusCode name."""

    status = "UNEXPECTED_CONDITION"

    def __init__(self, message: str = "", *, status: str | None = None) -> None:
        if status is not None:
            self.status = status
        super().__init__(message or self.status)


# --- client-side statuses (4xx in Hedwig) ---------------------------------------------------------

class MalformedRequestError(PubSubError):
    """The request could not be parsed or misses a required field."""

    status = "MALFORMED_REQUEST"


class ClientAlreadySubscribedError(PubSubError):
    """CREATE on a subscription that exists."""

    status = "CLIENT_ALREADY_SUBSCRIBED"


class NoSuchTopicError(PubSubError):
    """A reader on a topic that was never created (no ledger ranges in the metastore)."""

    status = "NO_SUCH_TOPIC"


class ClientNotSubscribedError(PubSubError):
    """ATTACH, start_delivery, consume or unsubscribe on a subscription that does not exist."""

    status = "CLIENT_NOT_SUBSCRIBED"


class SubscriptionTypeMismatchError(PubSubError):
    """Attaching to a subscription with another subscription type than the one stored with it."""

    status = "SUBSCRIPTION_TYPE_MISMATCH"


class ConsumerClosedError(PubSubError):
    """``receive``/``ack``/``nack`` on a consumer that was closed (client-side; ``hub.consumer``)."""

    status = "CONSUMER_CLOSED"


class CouldNotConnectError(PubSubError):
    """No connection to the hub could be made.

    ``permanent`` is True when trying again cannot help (a bad address, a hub
    serving no TLS to a TLS client, a failed TLS handshake): the client
    raises it at once instead of retrying until its timeout.
    """

    status = "COULD_NOT_CONNECT"

    def __init__(self, message: str = "", *, status: str | None = None, permanent: bool = False) -> None:
        super().__init__(message, status=status)
        self.permanent = permanent


class UntrustedCertificateError(CouldNotConnectError):
    """A hub's TLS certificate failed verification (``ssl_ca_file``, host name); not retried."""


class NotResponsibleForTopicError(PubSubError):
    """This hub does not own the topic; ``owner`` names the hub that does (``""`` if unknown)."""

    status = "NOT_RESPONSIBLE_FOR_TOPIC"

    def __init__(self, message: str = "", *, owner: str = "", status: str | None = None) -> None:
        super().__init__(message, status=status)
        self.owner = owner


class ServiceDownError(PubSubError):
    """The hub cannot serve the request now (no durable storage, metastore down, shutting down)."""

    status = "SERVICE_DOWN"


class UncertainStateError(PubSubError):
    """The outcome is unknown (the connection dropped with the request in flight)."""

    status = "UNCERTAIN_STATE"


class InvalidMessageFilterError(PubSubError):
    """A server-side message filter could not be loaded, or raised."""

    status = "INVALID_MESSAGE_FILTER"


class MessageTooLargeError(PubSubError):
    """A message over ``max_message_size``."""

    status = "MESSAGE_TOO_LARGE"


class UnknownOperationError(PubSubError):
    """An operation this hub does not serve."""

    status = "UNKNOWN_OPERATION"


class DuplicatePublishError(PubSubError):
    """A producer's sequence id older than its last ``dedup_window`` publishes: it may have been stored,
    the original's seq id is no longer known; nothing was stored now."""

    status = "DUPLICATE_PUBLISH"


class AuthenticationError(PubSubError):
    """The hub requires a valid token (``authentication_enabled``) and got none, or a bad one."""

    status = "AUTHENTICATION_FAILED"


class NotAuthorizedError(PubSubError):
    """The authenticated role may not do this."""

    status = "NOT_AUTHORIZED"


class BacklogQuotaExceededError(PubSubError):
    """The topic's backlog is over its ``backlog_quota_limit_bytes`` (``hub.policies``): the publish was
    refused (``producer_exception``) or held until ``backlog_quota_hold_timeout`` (``producer_request_hold``);
    nothing was stored."""

    status = "BACKLOG_QUOTA_EXCEEDED"


class DeliveryDelayTooLongError(PubSubError):
    """A delayed publish whose due time is more than the hub's ``max_delivery_delay_ms`` away (``hub.delayed``);
    nothing was stored."""

    status = "DELIVERY_DELAY_TOO_LONG"


# --- metadata statuses (5xx in Hedwig): raised by hub.metadata ---------------------------------

class BadVersionError(PubSubError):
    """A metadata write or delete named a version that is not the current one."""

    status = "BAD_VERSION"


class NoTopicPersistenceInfoError(PubSubError):
    status = "NO_TOPIC_PERSISTENCE_INFO"


class TopicPersistenceInfoExistsError(PubSubError):
    status = "TOPIC_PERSISTENCE_INFO_EXISTS"


class NoSubscriptionStateError(PubSubError):
    status = "NO_SUBSCRIPTION_STATE"


class SubscriptionStateExistsError(PubSubError):
    status = "SUBSCRIPTION_STATE_EXISTS"


class NoTopicOwnerInfoError(PubSubError):
    status = "NO_TOPIC_OWNER_INFO"


class TopicOwnerInfoExistsError(PubSubError):
    status = "TOPIC_OWNER_INFO_EXISTS"


class SubscriptionForcedClosedError(PubSubError):
    """Another attach of the same subscriber took the subscription over."""

    status = "SUBSCRIPTION_FORCED_CLOSED"


# --- client library only --------------------------------------------------------------------------

class TooManyRedirectsError(PubSubError):
    """More than ``max_server_redirects`` redirects for one request."""

    status = "TOO_MANY_REDIRECTS"


class ResponseTimeoutError(PubSubError):
    """No response within ``server_ack_response_timeout``.

    ``channel_dropped`` is True when the connection it was sent on heard nothing at all from its hub
    since the request was sent: the client dropped that connection as silent (see ``hub.channel``).
    """

    status = "RESPONSE_TIMEOUT"

    def __init__(self, message: str = "", *, status: str | None = None, channel_dropped: bool = False) -> None:
        super().__init__(message, status=status)
        self.channel_dropped = channel_dropped


_BY_STATUS: dict[str, type[PubSubError]] = {
    cls.status: cls
    for cls in (MalformedRequestError, ClientAlreadySubscribedError, ClientNotSubscribedError,
                CouldNotConnectError, NotResponsibleForTopicError, ServiceDownError, UncertainStateError,
                InvalidMessageFilterError, MessageTooLargeError, UnknownOperationError, BadVersionError,
                NoTopicPersistenceInfoError, TopicPersistenceInfoExistsError, NoSubscriptionStateError,
                SubscriptionStateExistsError, NoTopicOwnerInfoError, TopicOwnerInfoExistsError,
                SubscriptionForcedClosedError, TooManyRedirectsError, ResponseTimeoutError, DuplicatePublishError,
                AuthenticationError, NotAuthorizedError, BacklogQuotaExceededError, SubscriptionTypeMismatchError,
                NoSuchTopicError, DeliveryDelayTooLongError)
}


def error_for_status(status: str, message: str = "") -> PubSubError:
    """The ``PubSubError`` subclass for a StatusCode name (a plain ``PubSubError`` if unknown)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        return PubSubError(message, status=status)
    return cls(message)


class CertificateError(OSError):
    """The hub's TLS certificate (``cert_path``/``password``) is missing or unusable; one line says why."""
