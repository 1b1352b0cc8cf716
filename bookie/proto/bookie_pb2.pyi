from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OperationType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OP_UNSPECIFIED: _ClassVar[OperationType]
    ADD_ENTRY: _ClassVar[OperationType]
    READ_ENTRY: _ClassVar[OperationType]
    READ_LAC: _ClassVar[OperationType]
    GET_BOOKIE_INFO: _ClassVar[OperationType]
    WRITE_LAC: _ClassVar[OperationType]
    ADD_ENTRIES: _ClassVar[OperationType]
    ADD_ENTRIES_MULTI: _ClassVar[OperationType]
    WRITE_LAC_MULTI: _ClassVar[OperationType]

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[StatusCode]
    NO_ENTRY: _ClassVar[StatusCode]
    NO_LEDGER: _ClassVar[StatusCode]
    FENCED: _ClassVar[StatusCode]
    UNAUTHORIZED: _ClassVar[StatusCode]
    BAD_REQUEST: _ClassVar[StatusCode]
    READ_ONLY: _ClassVar[StatusCode]
    TOO_LARGE: _ClassVar[StatusCode]
    UNKNOWN_OP: _ClassVar[StatusCode]
    ERROR: _ClassVar[StatusCode]
    TOO_MANY_REQUESTS: _ClassVar[StatusCode]
OP_UNSPECIFIED: OperationType
ADD_ENTRY: OperationType
READ_ENTRY: OperationType
READ_LAC: OperationType
GET_BOOKIE_INFO: OperationType
WRITE_LAC: OperationType
ADD_ENTRIES: OperationType
ADD_ENTRIES_MULTI: OperationType
WRITE_LAC_MULTI: OperationType
OK: StatusCode
NO_ENTRY: StatusCode
NO_LEDGER: StatusCode
FENCED: StatusCode
UNAUTHORIZED: StatusCode
BAD_REQUEST: StatusCode
READ_ONLY: StatusCode
TOO_LARGE: StatusCode
UNKNOWN_OP: StatusCode
ERROR: StatusCode
TOO_MANY_REQUESTS: StatusCode

class Request(_message.Message):
    __slots__ = ("txn_id", "op", "ledger_id", "entry_id", "master_key", "body", "fence", "recovery", "lac", "previous_lac", "timeout_ms", "entries", "trace", "lac_ledger_ids", "lacs")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    LAC_LEDGER_IDS_FIELD_NUMBER: _ClassVar[int]
    LACS_FIELD_NUMBER: _ClassVar[int]
    txn_id: int
    op: OperationType
    ledger_id: int
    entry_id: int
    master_key: bytes
    body: bytes
    fence: bool
    recovery: bool
    lac: int
    previous_lac: int
    timeout_ms: int
    entries: _containers.RepeatedScalarFieldContainer[bytes]
    trace: bool
    lac_ledger_ids: _containers.RepeatedScalarFieldContainer[int]
    lacs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, txn_id: _Optional[int] = ..., op: _Optional[_Union[OperationType, str]] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., body: _Optional[bytes] = ..., fence: _Optional[bool] = ..., recovery: _Optional[bool] = ..., lac: _Optional[int] = ..., previous_lac: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., entries: _Optional[_Iterable[bytes]] = ..., trace: _Optional[bool] = ..., lac_ledger_ids: _Optional[_Iterable[int]] = ..., lacs: _Optional[_Iterable[int]] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("txn_id", "op", "status", "ledger_id", "entry_id", "body", "lac", "free_disk", "total_disk", "read_only", "message", "adds", "trace_ns")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    FREE_DISK_FIELD_NUMBER: _ClassVar[int]
    TOTAL_DISK_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ADDS_FIELD_NUMBER: _ClassVar[int]
    TRACE_NS_FIELD_NUMBER: _ClassVar[int]
    txn_id: int
    op: OperationType
    status: StatusCode
    ledger_id: int
    entry_id: int
    body: bytes
    lac: int
    free_disk: int
    total_disk: int
    read_only: bool
    message: str
    adds: _containers.RepeatedCompositeFieldContainer[Response]
    trace_ns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, txn_id: _Optional[int] = ..., op: _Optional[_Union[OperationType, str]] = ..., status: _Optional[_Union[StatusCode, str]] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., body: _Optional[bytes] = ..., lac: _Optional[int] = ..., free_disk: _Optional[int] = ..., total_disk: _Optional[int] = ..., read_only: _Optional[bool] = ..., message: _Optional[str] = ..., adds: _Optional[_Iterable[_Union[Response, _Mapping]]] = ..., trace_ns: _Optional[_Iterable[int]] = ...) -> None: ...

class BookieRegistrationRecord(_message.Message):
    __slots__ = ("address", "network_location", "state", "free_disk", "total_disk", "registered_ms", "http_url")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        WRITABLE: _ClassVar[BookieRegistrationRecord.State]
        READ_ONLY: _ClassVar[BookieRegistrationRecord.State]
    WRITABLE: BookieRegistrationRecord.State
    READ_ONLY: BookieRegistrationRecord.State
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_LOCATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FREE_DISK_FIELD_NUMBER: _ClassVar[int]
    TOTAL_DISK_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_MS_FIELD_NUMBER: _ClassVar[int]
    HTTP_URL_FIELD_NUMBER: _ClassVar[int]
    address: str
    network_location: str
    state: BookieRegistrationRecord.State
    free_disk: int
    total_disk: int
    registered_ms: int
    http_url: str
    def __init__(self, address: _Optional[str] = ..., network_location: _Optional[str] = ..., state: _Optional[_Union[BookieRegistrationRecord.State, str]] = ..., free_disk: _Optional[int] = ..., total_disk: _Optional[int] = ..., registered_ms: _Optional[int] = ..., http_url: _Optional[str] = ...) -> None: ...

class LedgerIndexRecord(_message.Message):
    __slots__ = ("master_key", "fenced", "lac")
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    master_key: bytes
    fenced: bool
    lac: int
    def __init__(self, master_key: _Optional[bytes] = ..., fenced: _Optional[bool] = ..., lac: _Optional[int] = ...) -> None: ...
