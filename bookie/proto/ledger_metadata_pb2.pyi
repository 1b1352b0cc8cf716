from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LedgerMetadataFormat(_message.Message):
    __slots__ = ("ensemble_size", "write_quorum_size", "ack_quorum_size", "state", "last_entry_id", "length", "segments", "digest_type", "password_digest", "ctime_ms", "properties")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OPEN: _ClassVar[LedgerMetadataFormat.State]
        IN_RECOVERY: _ClassVar[LedgerMetadataFormat.State]
        CLOSED: _ClassVar[LedgerMetadataFormat.State]
    OPEN: LedgerMetadataFormat.State
    IN_RECOVERY: LedgerMetadataFormat.State
    CLOSED: LedgerMetadataFormat.State
    class Segment(_message.Message):
        __slots__ = ("first_entry_id", "ensemble")
        FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
        ENSEMBLE_FIELD_NUMBER: _ClassVar[int]
        first_entry_id: int
        ensemble: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, first_entry_id: _Optional[int] = ..., ensemble: _Optional[_Iterable[str]] = ...) -> None: ...
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ENSEMBLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUORUM_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACK_QUORUM_SIZE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_TYPE_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    state: LedgerMetadataFormat.State
    last_entry_id: int
    length: int
    segments: _containers.RepeatedCompositeFieldContainer[LedgerMetadataFormat.Segment]
    digest_type: str
    password_digest: bytes
    ctime_ms: int
    properties: _containers.ScalarMap[str, bytes]
    def __init__(self, ensemble_size: _Optional[int] = ..., write_quorum_size: _Optional[int] = ..., ack_quorum_size: _Optional[int] = ..., state: _Optional[_Union[LedgerMetadataFormat.State, str]] = ..., last_entry_id: _Optional[int] = ..., length: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[LedgerMetadataFormat.Segment, _Mapping]]] = ..., digest_type: _Optional[str] = ..., password_digest: _Optional[bytes] = ..., ctime_ms: _Optional[int] = ..., properties: _Optional[_Mapping[str, bytes]] = ...) -> None: ...
