from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProtocolVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERSION_UNSPECIFIED: _ClassVar[ProtocolVersion]
    VERSION_ONE: _ClassVar[ProtocolVersion]

class OperationType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OP_UNSPECIFIED: _ClassVar[OperationType]
    PUBLISH: _ClassVar[OperationType]
    SUBSCRIBE: _ClassVar[OperationType]
    CONSUME: _ClassVar[OperationType]
    UNSUBSCRIBE: _ClassVar[OperationType]
    START_DELIVERY: _ClassVar[OperationType]
    STOP_DELIVERY: _ClassVar[OperationType]
    CLOSESUBSCRIPTION: _ClassVar[OperationType]
    AUTHENTICATE: _ClassVar[OperationType]
    PING: _ClassVar[OperationType]
    SEEK: _ClassVar[OperationType]
    PUBLISH_MULTI: _ClassVar[OperationType]

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUCCESS: _ClassVar[StatusCode]
    MALFORMED_REQUEST: _ClassVar[StatusCode]
    NO_SUCH_TOPIC: _ClassVar[StatusCode]
    CLIENT_ALREADY_SUBSCRIBED: _ClassVar[StatusCode]
    CLIENT_NOT_SUBSCRIBED: _ClassVar[StatusCode]
    COULD_NOT_CONNECT: _ClassVar[StatusCode]
    TOPIC_BUSY: _ClassVar[StatusCode]
    NOT_RESPONSIBLE_FOR_TOPIC: _ClassVar[StatusCode]
    SERVICE_DOWN: _ClassVar[StatusCode]
    UNCERTAIN_STATE: _ClassVar[StatusCode]
    INVALID_MESSAGE_FILTER: _ClassVar[StatusCode]
    MESSAGE_TOO_LARGE: _ClassVar[StatusCode]
    UNKNOWN_OPERATION: _ClassVar[StatusCode]
    DUPLICATE_PUBLISH: _ClassVar[StatusCode]
    AUTHENTICATION_FAILED: _ClassVar[StatusCode]
    NOT_AUTHORIZED: _ClassVar[StatusCode]
    SUBSCRIPTION_TYPE_MISMATCH: _ClassVar[StatusCode]
    BACKLOG_QUOTA_EXCEEDED: _ClassVar[StatusCode]
    DELIVERY_DELAY_TOO_LONG: _ClassVar[StatusCode]
    BAD_VERSION: _ClassVar[StatusCode]
    NO_TOPIC_PERSISTENCE_INFO: _ClassVar[StatusCode]
    TOPIC_PERSISTENCE_INFO_EXISTS: _ClassVar[StatusCode]
    NO_SUBSCRIPTION_STATE: _ClassVar[StatusCode]
    SUBSCRIPTION_STATE_EXISTS: _ClassVar[StatusCode]
    NO_TOPIC_OWNER_INFO: _ClassVar[StatusCode]
    TOPIC_OWNER_INFO_EXISTS: _ClassVar[StatusCode]
    SUBSCRIPTION_FORCED_CLOSED: _ClassVar[StatusCode]
    UNEXPECTED_CONDITION: _ClassVar[StatusCode]
    COMPOSITE: _ClassVar[StatusCode]

class SubscriptionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXCLUSIVE: _ClassVar[SubscriptionType]
    SHARED: _ClassVar[SubscriptionType]
    FAILOVER: _ClassVar[SubscriptionType]
    KEY_SHARED: _ClassVar[SubscriptionType]
VERSION_UNSPECIFIED: ProtocolVersion
VERSION_ONE: ProtocolVersion
OP_UNSPECIFIED: OperationType
PUBLISH: OperationType
SUBSCRIBE: OperationType
CONSUME: OperationType
UNSUBSCRIBE: OperationType
START_DELIVERY: OperationType
STOP_DELIVERY: OperationType
CLOSESUBSCRIPTION: OperationType
AUTHENTICATE: OperationType
PING: OperationType
SEEK: OperationType
PUBLISH_MULTI: OperationType
SUCCESS: StatusCode
MALFORMED_REQUEST: StatusCode
NO_SUCH_TOPIC: StatusCode
CLIENT_ALREADY_SUBSCRIBED: StatusCode
CLIENT_NOT_SUBSCRIBED: StatusCode
COULD_NOT_CONNECT: StatusCode
TOPIC_BUSY: StatusCode
NOT_RESPONSIBLE_FOR_TOPIC: StatusCode
SERVICE_DOWN: StatusCode
UNCERTAIN_STATE: StatusCode
INVALID_MESSAGE_FILTER: StatusCode
MESSAGE_TOO_LARGE: StatusCode
UNKNOWN_OPERATION: StatusCode
DUPLICATE_PUBLISH: StatusCode
AUTHENTICATION_FAILED: StatusCode
NOT_AUTHORIZED: StatusCode
SUBSCRIPTION_TYPE_MISMATCH: StatusCode
BACKLOG_QUOTA_EXCEEDED: StatusCode
DELIVERY_DELAY_TOO_LONG: StatusCode
BAD_VERSION: StatusCode
NO_TOPIC_PERSISTENCE_INFO: StatusCode
TOPIC_PERSISTENCE_INFO_EXISTS: StatusCode
NO_SUBSCRIPTION_STATE: StatusCode
SUBSCRIPTION_STATE_EXISTS: StatusCode
NO_TOPIC_OWNER_INFO: StatusCode
TOPIC_OWNER_INFO_EXISTS: StatusCode
SUBSCRIPTION_FORCED_CLOSED: StatusCode
UNEXPECTED_CONDITION: StatusCode
COMPOSITE: StatusCode
EXCLUSIVE: SubscriptionType
SHARED: SubscriptionType
FAILOVER: SubscriptionType
KEY_SHARED: SubscriptionType

class RegionSpecificSeqId(_message.Message):
    __slots__ = ("region", "seqId")
    REGION_FIELD_NUMBER: _ClassVar[int]
    SEQID_FIELD_NUMBER: _ClassVar[int]
    region: bytes
    seqId: int
    def __init__(self, region: _Optional[bytes] = ..., seqId: _Optional[int] = ...) -> None: ...

class MessageSeqId(_message.Message):
    __slots__ = ("localComponent", "remoteComponents")
    LOCALCOMPONENT_FIELD_NUMBER: _ClassVar[int]
    REMOTECOMPONENTS_FIELD_NUMBER: _ClassVar[int]
    localComponent: int
    remoteComponents: _containers.RepeatedCompositeFieldContainer[RegionSpecificSeqId]
    def __init__(self, localComponent: _Optional[int] = ..., remoteComponents: _Optional[_Iterable[_Union[RegionSpecificSeqId, _Mapping]]] = ...) -> None: ...

class Map(_message.Message):
    __slots__ = ("entries",)
    class Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Map.Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[Map.Entry, _Mapping]]] = ...) -> None: ...

class MessageHeader(_message.Message):
    __slots__ = ("properties", "messageType")
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    MESSAGETYPE_FIELD_NUMBER: _ClassVar[int]
    properties: Map
    messageType: str
    def __init__(self, properties: _Optional[_Union[Map, _Mapping]] = ..., messageType: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("body", "srcRegion", "msgId", "header", "producer", "sequenceId", "key", "publishTimeMs", "redeliveryCount", "deliverAtMs", "deliverAfterMs")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SRCREGION_FIELD_NUMBER: _ClassVar[int]
    MSGID_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    SEQUENCEID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PUBLISHTIMEMS_FIELD_NUMBER: _ClassVar[int]
    REDELIVERYCOUNT_FIELD_NUMBER: _ClassVar[int]
    DELIVERATMS_FIELD_NUMBER: _ClassVar[int]
    DELIVERAFTERMS_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    srcRegion: bytes
    msgId: MessageSeqId
    header: MessageHeader
    producer: bytes
    sequenceId: int
    key: bytes
    publishTimeMs: int
    redeliveryCount: int
    deliverAtMs: int
    deliverAfterMs: int
    def __init__(self, body: _Optional[bytes] = ..., srcRegion: _Optional[bytes] = ..., msgId: _Optional[_Union[MessageSeqId, _Mapping]] = ..., header: _Optional[_Union[MessageHeader, _Mapping]] = ..., producer: _Optional[bytes] = ..., sequenceId: _Optional[int] = ..., key: _Optional[bytes] = ..., publishTimeMs: _Optional[int] = ..., redeliveryCount: _Optional[int] = ..., deliverAtMs: _Optional[int] = ..., deliverAfterMs: _Optional[int] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("first_local_seq_id", "messages")
    FIRST_LOCAL_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    first_local_seq_id: int
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, first_local_seq_id: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class SubscriptionPreferences(_message.Message):
    __slots__ = ("options", "messageBound", "messageFilter", "messageWindowSize", "subscriptionType", "temporary")
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MESSAGEBOUND_FIELD_NUMBER: _ClassVar[int]
    MESSAGEFILTER_FIELD_NUMBER: _ClassVar[int]
    MESSAGEWINDOWSIZE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONTYPE_FIELD_NUMBER: _ClassVar[int]
    TEMPORARY_FIELD_NUMBER: _ClassVar[int]
    options: Map
    messageBound: int
    messageFilter: str
    messageWindowSize: int
    subscriptionType: SubscriptionType
    temporary: bool
    def __init__(self, options: _Optional[_Union[Map, _Mapping]] = ..., messageBound: _Optional[int] = ..., messageFilter: _Optional[str] = ..., messageWindowSize: _Optional[int] = ..., subscriptionType: _Optional[_Union[SubscriptionType, str]] = ..., temporary: _Optional[bool] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("topic", "msg", "msgs", "trace")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MSG_FIELD_NUMBER: _ClassVar[int]
    MSGS_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    msg: Message
    msgs: _containers.RepeatedCompositeFieldContainer[Message]
    trace: bool
    def __init__(self, topic: _Optional[bytes] = ..., msg: _Optional[_Union[Message, _Mapping]] = ..., msgs: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., trace: _Optional[bool] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("topic", "subscriberId", "createOrAttach", "synchronous", "forceAttach", "preferences", "hubSubscriber", "consumerId", "receiverQueueSize", "startSeqId")
    class CreateOrAttach(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CREATE: _ClassVar[SubscribeRequest.CreateOrAttach]
        ATTACH: _ClassVar[SubscribeRequest.CreateOrAttach]
        CREATE_OR_ATTACH: _ClassVar[SubscribeRequest.CreateOrAttach]
    CREATE: SubscribeRequest.CreateOrAttach
    ATTACH: SubscribeRequest.CreateOrAttach
    CREATE_OR_ATTACH: SubscribeRequest.CreateOrAttach
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERID_FIELD_NUMBER: _ClassVar[int]
    CREATEORATTACH_FIELD_NUMBER: _ClassVar[int]
    SYNCHRONOUS_FIELD_NUMBER: _ClassVar[int]
    FORCEATTACH_FIELD_NUMBER: _ClassVar[int]
    PREFERENCES_FIELD_NUMBER: _ClassVar[int]
    HUBSUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    CONSUMERID_FIELD_NUMBER: _ClassVar[int]
    RECEIVERQUEUESIZE_FIELD_NUMBER: _ClassVar[int]
    STARTSEQID_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    subscriberId: bytes
    createOrAttach: SubscribeRequest.CreateOrAttach
    synchronous: bool
    forceAttach: bool
    preferences: SubscriptionPreferences
    hubSubscriber: bool
    consumerId: int
    receiverQueueSize: int
    startSeqId: int
    def __init__(self, topic: _Optional[bytes] = ..., subscriberId: _Optional[bytes] = ..., createOrAttach: _Optional[_Union[SubscribeRequest.CreateOrAttach, str]] = ..., synchronous: _Optional[bool] = ..., forceAttach: _Optional[bool] = ..., preferences: _Optional[_Union[SubscriptionPreferences, _Mapping]] = ..., hubSubscriber: _Optional[bool] = ..., consumerId: _Optional[int] = ..., receiverQueueSize: _Optional[int] = ..., startSeqId: _Optional[int] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("topic", "subscriberId", "msgId", "consumerId", "ackType", "seqIds", "permits")
    class AckType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CUMULATIVE: _ClassVar[ConsumeRequest.AckType]
        INDIVIDUAL: _ClassVar[ConsumeRequest.AckType]
        REDELIVER: _ClassVar[ConsumeRequest.AckType]
        FLOW: _ClassVar[ConsumeRequest.AckType]
    CUMULATIVE: ConsumeRequest.AckType
    INDIVIDUAL: ConsumeRequest.AckType
    REDELIVER: ConsumeRequest.AckType
    FLOW: ConsumeRequest.AckType
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERID_FIELD_NUMBER: _ClassVar[int]
    MSGID_FIELD_NUMBER: _ClassVar[int]
    CONSUMERID_FIELD_NUMBER: _ClassVar[int]
    ACKTYPE_FIELD_NUMBER: _ClassVar[int]
    SEQIDS_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    subscriberId: bytes
    msgId: MessageSeqId
    consumerId: int
    ackType: ConsumeRequest.AckType
    seqIds: _containers.RepeatedScalarFieldContainer[int]
    permits: int
    def __init__(self, topic: _Optional[bytes] = ..., subscriberId: _Optional[bytes] = ..., msgId: _Optional[_Union[MessageSeqId, _Mapping]] = ..., consumerId: _Optional[int] = ..., ackType: _Optional[_Union[ConsumeRequest.AckType, str]] = ..., seqIds: _Optional[_Iterable[int]] = ..., permits: _Optional[int] = ...) -> None: ...

class UnsubscribeRequest(_message.Message):
    __slots__ = ("topic", "subscriberId")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERID_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    subscriberId: bytes
    def __init__(self, topic: _Optional[bytes] = ..., subscriberId: _Optional[bytes] = ...) -> None: ...

class StartDeliveryRequest(_message.Message):
    __slots__ = ("topic", "subscriberId", "maxBatchMessages", "consumerId")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERID_FIELD_NUMBER: _ClassVar[int]
    MAXBATCHMESSAGES_FIELD_NUMBER: _ClassVar[int]
    CONSUMERID_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    subscriberId: bytes
    maxBatchMessages: int
    consumerId: int
    def __init__(self, topic: _Optional[bytes] = ..., subscriberId: _Optional[bytes] = ..., maxBatchMessages: _Optional[int] = ..., consumerId: _Optional[int] = ...) -> None: ...

class StopDeliveryRequest(_message.Message):
    __slots__ = ("topic", "subscriberId", "consumerId")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERID_FIELD_NUMBER: _ClassVar[int]
    CONSUMERID_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    subscriberId: bytes
    consumerId: int
    def __init__(self, topic: _Optional[bytes] = ..., subscriberId: _Optional[bytes] = ..., consumerId: _Optional[int] = ...) -> None: ...

class CloseSubscriptionRequest(_message.Message):
    __slots__ = ("topic", "subscriberId", "consumerId")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERID_FIELD_NUMBER: _ClassVar[int]
    CONSUMERID_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    subscriberId: bytes
    consumerId: int
    def __init__(self, topic: _Optional[bytes] = ..., subscriberId: _Optional[bytes] = ..., consumerId: _Optional[int] = ...) -> None: ...

class PubSubRequest(_message.Message):
    __slots__ = ("protocolVersion", "type", "txnId", "shouldClaim", "topic", "publishRequest", "subscribeRequest", "consumeRequest", "unsubscribeRequest", "startDeliveryRequest", "stopDeliveryRequest", "closeSubscriptionRequest", "authenticateRequest", "pingRequest", "seekRequest", "multiPublishRequest")
    PROTOCOLVERSION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TXNID_FIELD_NUMBER: _ClassVar[int]
    SHOULDCLAIM_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PUBLISHREQUEST_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBEREQUEST_FIELD_NUMBER: _ClassVar[int]
    CONSUMEREQUEST_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBEREQUEST_FIELD_NUMBER: _ClassVar[int]
    STARTDELIVERYREQUEST_FIELD_NUMBER: _ClassVar[int]
    STOPDELIVERYREQUEST_FIELD_NUMBER: _ClassVar[int]
    CLOSESUBSCRIPTIONREQUEST_FIELD_NUMBER: _ClassVar[int]
    AUTHENTICATEREQUEST_FIELD_NUMBER: _ClassVar[int]
    PINGREQUEST_FIELD_NUMBER: _ClassVar[int]
    SEEKREQUEST_FIELD_NUMBER: _ClassVar[int]
    MULTIPUBLISHREQUEST_FIELD_NUMBER: _ClassVar[int]
    protocolVersion: ProtocolVersion
    type: OperationType
    txnId: int
    shouldClaim: bool
    topic: bytes
    publishRequest: PublishRequest
    subscribeRequest: SubscribeRequest
    consumeRequest: ConsumeRequest
    unsubscribeRequest: UnsubscribeRequest
    startDeliveryRequest: StartDeliveryRequest
    stopDeliveryRequest: StopDeliveryRequest
    closeSubscriptionRequest: CloseSubscriptionRequest
    authenticateRequest: AuthenticateRequest
    pingRequest: PingRequest
    seekRequest: SeekRequest
    multiPublishRequest: MultiPublishRequest
    def __init__(self, protocolVersion: _Optional[_Union[ProtocolVersion, str]] = ..., type: _Optional[_Union[OperationType, str]] = ..., txnId: _Optional[int] = ..., shouldClaim: _Optional[bool] = ..., topic: _Optional[bytes] = ..., publishRequest: _Optional[_Union[PublishRequest, _Mapping]] = ..., subscribeRequest: _Optional[_Union[SubscribeRequest, _Mapping]] = ..., consumeRequest: _Optional[_Union[ConsumeRequest, _Mapping]] = ..., unsubscribeRequest: _Optional[_Union[UnsubscribeRequest, _Mapping]] = ..., startDeliveryRequest: _Optional[_Union[StartDeliveryRequest, _Mapping]] = ..., stopDeliveryRequest: _Optional[_Union[StopDeliveryRequest, _Mapping]] = ..., closeSubscriptionRequest: _Optional[_Union[CloseSubscriptionRequest, _Mapping]] = ..., authenticateRequest: _Optional[_Union[AuthenticateRequest, _Mapping]] = ..., pingRequest: _Optional[_Union[PingRequest, _Mapping]] = ..., seekRequest: _Optional[_Union[SeekRequest, _Mapping]] = ..., multiPublishRequest: _Optional[_Union[MultiPublishRequest, _Mapping]] = ...) -> None: ...

class MultiPublishRequest(_message.Message):
    __slots__ = ("publishes",)
    PUBLISHES_FIELD_NUMBER: _ClassVar[int]
    publishes: _containers.RepeatedCompositeFieldContainer[PublishRequest]
    def __init__(self, publishes: _Optional[_Iterable[_Union[PublishRequest, _Mapping]]] = ...) -> None: ...

class MultiPublishResponse(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[PubSubResponse]
    def __init__(self, answers: _Optional[_Iterable[_Union[PubSubResponse, _Mapping]]] = ...) -> None: ...

class SeekRequest(_message.Message):
    __slots__ = ("topic", "subscriberId", "seqId", "publishTimeMs", "byTime", "resolveOnly", "readCompacted", "maxMessages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERID_FIELD_NUMBER: _ClassVar[int]
    SEQID_FIELD_NUMBER: _ClassVar[int]
    PUBLISHTIMEMS_FIELD_NUMBER: _ClassVar[int]
    BYTIME_FIELD_NUMBER: _ClassVar[int]
    RESOLVEONLY_FIELD_NUMBER: _ClassVar[int]
    READCOMPACTED_FIELD_NUMBER: _ClassVar[int]
    MAXMESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    subscriberId: bytes
    seqId: int
    publishTimeMs: int
    byTime: bool
    resolveOnly: bool
    readCompacted: bool
    maxMessages: int
    def __init__(self, topic: _Optional[bytes] = ..., subscriberId: _Optional[bytes] = ..., seqId: _Optional[int] = ..., publishTimeMs: _Optional[int] = ..., byTime: _Optional[bool] = ..., resolveOnly: _Optional[bool] = ..., readCompacted: _Optional[bool] = ..., maxMessages: _Optional[int] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AuthenticateRequest(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    def __init__(self, token: _Optional[bytes] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("publishedMsgId", "stored", "trace")
    PUBLISHEDMSGID_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    publishedMsgId: MessageSeqId
    stored: int
    trace: PublishTrace
    def __init__(self, publishedMsgId: _Optional[_Union[MessageSeqId, _Mapping]] = ..., stored: _Optional[int] = ..., trace: _Optional[_Union[PublishTrace, _Mapping]] = ...) -> None: ...

class PublishTrace(_message.Message):
    __slots__ = ("hub_read_ns", "add_sent_ns", "hub_ack_read_ns", "answer_sent_ns", "bookies")
    HUB_READ_NS_FIELD_NUMBER: _ClassVar[int]
    ADD_SENT_NS_FIELD_NUMBER: _ClassVar[int]
    HUB_ACK_READ_NS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_SENT_NS_FIELD_NUMBER: _ClassVar[int]
    BOOKIES_FIELD_NUMBER: _ClassVar[int]
    hub_read_ns: int
    add_sent_ns: int
    hub_ack_read_ns: int
    answer_sent_ns: int
    bookies: _containers.RepeatedCompositeFieldContainer[BookieStages]
    def __init__(self, hub_read_ns: _Optional[int] = ..., add_sent_ns: _Optional[int] = ..., hub_ack_read_ns: _Optional[int] = ..., answer_sent_ns: _Optional[int] = ..., bookies: _Optional[_Iterable[_Union[BookieStages, _Mapping]]] = ...) -> None: ...

class BookieStages(_message.Message):
    __slots__ = ("bookie", "add_sent_ns", "read_ns", "journal_written_ns", "ack_sent_ns", "ack_read_ns")
    BOOKIE_FIELD_NUMBER: _ClassVar[int]
    ADD_SENT_NS_FIELD_NUMBER: _ClassVar[int]
    READ_NS_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_WRITTEN_NS_FIELD_NUMBER: _ClassVar[int]
    ACK_SENT_NS_FIELD_NUMBER: _ClassVar[int]
    ACK_READ_NS_FIELD_NUMBER: _ClassVar[int]
    bookie: str
    add_sent_ns: int
    read_ns: int
    journal_written_ns: int
    ack_sent_ns: int
    ack_read_ns: int
    def __init__(self, bookie: _Optional[str] = ..., add_sent_ns: _Optional[int] = ..., read_ns: _Optional[int] = ..., journal_written_ns: _Optional[int] = ..., ack_sent_ns: _Optional[int] = ..., ack_read_ns: _Optional[int] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("preferences",)
    PREFERENCES_FIELD_NUMBER: _ClassVar[int]
    preferences: SubscriptionPreferences
    def __init__(self, preferences: _Optional[_Union[SubscriptionPreferences, _Mapping]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("topic", "subscriberId", "message", "messages", "consumerId")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CONSUMERID_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    subscriberId: bytes
    message: Message
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    consumerId: int
    def __init__(self, topic: _Optional[bytes] = ..., subscriberId: _Optional[bytes] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., consumerId: _Optional[int] = ...) -> None: ...

class SubscriptionEvent(_message.Message):
    __slots__ = ("topic", "subscriberId", "event", "consumerId")
    class Event(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        EVENT_UNSPECIFIED: _ClassVar[SubscriptionEvent.Event]
        TOPIC_MOVED: _ClassVar[SubscriptionEvent.Event]
        SUBSCRIPTION_FORCED_CLOSED: _ClassVar[SubscriptionEvent.Event]
        SUBSCRIPTION_RESET: _ClassVar[SubscriptionEvent.Event]
    EVENT_UNSPECIFIED: SubscriptionEvent.Event
    TOPIC_MOVED: SubscriptionEvent.Event
    SUBSCRIPTION_FORCED_CLOSED: SubscriptionEvent.Event
    SUBSCRIPTION_RESET: SubscriptionEvent.Event
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CONSUMERID_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    subscriberId: bytes
    event: SubscriptionEvent.Event
    consumerId: int
    def __init__(self, topic: _Optional[bytes] = ..., subscriberId: _Optional[bytes] = ..., event: _Optional[_Union[SubscriptionEvent.Event, str]] = ..., consumerId: _Optional[int] = ...) -> None: ...

class PubSubResponse(_message.Message):
    __slots__ = ("protocolVersion", "statusCode", "txnId", "statusMsg", "topic", "redirect_to", "publishResponse", "subscribeResponse", "delivery", "subscriptionEvent", "seekResponse", "multiPublishResponse")
    PROTOCOLVERSION_FIELD_NUMBER: _ClassVar[int]
    STATUSCODE_FIELD_NUMBER: _ClassVar[int]
    TXNID_FIELD_NUMBER: _ClassVar[int]
    STATUSMSG_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_TO_FIELD_NUMBER: _ClassVar[int]
    PUBLISHRESPONSE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERESPONSE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONEVENT_FIELD_NUMBER: _ClassVar[int]
    SEEKRESPONSE_FIELD_NUMBER: _ClassVar[int]
    MULTIPUBLISHRESPONSE_FIELD_NUMBER: _ClassVar[int]
    protocolVersion: ProtocolVersion
    statusCode: StatusCode
    txnId: int
    statusMsg: str
    topic: bytes
    redirect_to: str
    publishResponse: PublishResponse
    subscribeResponse: SubscribeResponse
    delivery: Delivery
    subscriptionEvent: SubscriptionEvent
    seekResponse: SeekResponse
    multiPublishResponse: MultiPublishResponse
    def __init__(self, protocolVersion: _Optional[_Union[ProtocolVersion, str]] = ..., statusCode: _Optional[_Union[StatusCode, str]] = ..., txnId: _Optional[int] = ..., statusMsg: _Optional[str] = ..., topic: _Optional[bytes] = ..., redirect_to: _Optional[str] = ..., publishResponse: _Optional[_Union[PublishResponse, _Mapping]] = ..., subscribeResponse: _Optional[_Union[SubscribeResponse, _Mapping]] = ..., delivery: _Optional[_Union[Delivery, _Mapping]] = ..., subscriptionEvent: _Optional[_Union[SubscriptionEvent, _Mapping]] = ..., seekResponse: _Optional[_Union[SeekResponse, _Mapping]] = ..., multiPublishResponse: _Optional[_Union[MultiPublishResponse, _Mapping]] = ...) -> None: ...

class SeekResponse(_message.Message):
    __slots__ = ("seqId", "messages", "compactedUpToSeqId")
    SEQID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COMPACTEDUPTOSEQID_FIELD_NUMBER: _ClassVar[int]
    seqId: int
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    compactedUpToSeqId: int
    def __init__(self, seqId: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., compactedUpToSeqId: _Optional[int] = ...) -> None: ...

class HubInfo(_message.Message):
    __slots__ = ("hostname", "port", "sslPort", "czxid")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    SSLPORT_FIELD_NUMBER: _ClassVar[int]
    CZXID_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    port: int
    sslPort: int
    czxid: int
    def __init__(self, hostname: _Optional[str] = ..., port: _Optional[int] = ..., sslPort: _Optional[int] = ..., czxid: _Optional[int] = ...) -> None: ...

class HubLoad(_message.Message):
    __slots__ = ("numTopics",)
    NUMTOPICS_FIELD_NUMBER: _ClassVar[int]
    numTopics: int
    def __init__(self, numTopics: _Optional[int] = ...) -> None: ...

class LedgerRange(_message.Message):
    __slots__ = ("ledgerId", "endSeqIdIncluded", "startSeqIdIncluded", "firstPublishTimeMs")
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENDSEQIDINCLUDED_FIELD_NUMBER: _ClassVar[int]
    STARTSEQIDINCLUDED_FIELD_NUMBER: _ClassVar[int]
    FIRSTPUBLISHTIMEMS_FIELD_NUMBER: _ClassVar[int]
    ledgerId: int
    endSeqIdIncluded: MessageSeqId
    startSeqIdIncluded: int
    firstPublishTimeMs: int
    def __init__(self, ledgerId: _Optional[int] = ..., endSeqIdIncluded: _Optional[_Union[MessageSeqId, _Mapping]] = ..., startSeqIdIncluded: _Optional[int] = ..., firstPublishTimeMs: _Optional[int] = ...) -> None: ...

class LedgerRanges(_message.Message):
    __slots__ = ("ranges", "compaction")
    RANGES_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[LedgerRange]
    compaction: CompactionState
    def __init__(self, ranges: _Optional[_Iterable[_Union[LedgerRange, _Mapping]]] = ..., compaction: _Optional[_Union[CompactionState, _Mapping]] = ...) -> None: ...

class CompactionState(_message.Message):
    __slots__ = ("ledgerId", "compactedUpToSeqId", "lastRunMs", "messages", "pendingLedgerId")
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    COMPACTEDUPTOSEQID_FIELD_NUMBER: _ClassVar[int]
    LASTRUNMS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PENDINGLEDGERID_FIELD_NUMBER: _ClassVar[int]
    ledgerId: int
    compactedUpToSeqId: int
    lastRunMs: int
    messages: int
    pendingLedgerId: int
    def __init__(self, ledgerId: _Optional[int] = ..., compactedUpToSeqId: _Optional[int] = ..., lastRunMs: _Optional[int] = ..., messages: _Optional[int] = ..., pendingLedgerId: _Optional[int] = ...) -> None: ...

class ProducerWindow(_message.Message):
    __slots__ = ("producer", "floor", "sequenceIds", "localSeqIds")
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    SEQUENCEIDS_FIELD_NUMBER: _ClassVar[int]
    LOCALSEQIDS_FIELD_NUMBER: _ClassVar[int]
    producer: bytes
    floor: int
    sequenceIds: _containers.RepeatedScalarFieldContainer[int]
    localSeqIds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, producer: _Optional[bytes] = ..., floor: _Optional[int] = ..., sequenceIds: _Optional[_Iterable[int]] = ..., localSeqIds: _Optional[_Iterable[int]] = ...) -> None: ...

class DedupSnapshot(_message.Message):
    __slots__ = ("atSeqId", "producers")
    ATSEQID_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    atSeqId: int
    producers: _containers.RepeatedCompositeFieldContainer[ProducerWindow]
    def __init__(self, atSeqId: _Optional[int] = ..., producers: _Optional[_Iterable[_Union[ProducerWindow, _Mapping]]] = ...) -> None: ...

class AckRange(_message.Message):
    __slots__ = ("first", "last")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class SubscriptionState(_message.Message):
    __slots__ = ("msgId", "messageBound", "ackedRanges")
    MSGID_FIELD_NUMBER: _ClassVar[int]
    MESSAGEBOUND_FIELD_NUMBER: _ClassVar[int]
    ACKEDRANGES_FIELD_NUMBER: _ClassVar[int]
    msgId: MessageSeqId
    messageBound: int
    ackedRanges: _containers.RepeatedCompositeFieldContainer[AckRange]
    def __init__(self, msgId: _Optional[_Union[MessageSeqId, _Mapping]] = ..., messageBound: _Optional[int] = ..., ackedRanges: _Optional[_Iterable[_Union[AckRange, _Mapping]]] = ...) -> None: ...

class SubscriptionData(_message.Message):
    __slots__ = ("state", "preferences")
    STATE_FIELD_NUMBER: _ClassVar[int]
    PREFERENCES_FIELD_NUMBER: _ClassVar[int]
    state: SubscriptionState
    preferences: SubscriptionPreferences
    def __init__(self, state: _Optional[_Union[SubscriptionState, _Mapping]] = ..., preferences: _Optional[_Union[SubscriptionPreferences, _Mapping]] = ...) -> None: ...
