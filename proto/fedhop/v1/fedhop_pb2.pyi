from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_CLIENT: _ClassVar[Role]
    ROLE_EDGE: _ClassVar[Role]
    ROLE_SERVER: _ClassVar[Role]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_BAD_REQUEST: _ClassVar[ErrorCode]
    ERROR_CODE_BAD_BUNDLE: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_TASK: _ClassVar[ErrorCode]
    ERROR_CODE_DEADLINE_EXCEEDED: _ClassVar[ErrorCode]
    ERROR_CODE_CANCELLED: _ClassVar[ErrorCode]
    ERROR_CODE_UNAUTHENTICATED: _ClassVar[ErrorCode]
    ERROR_CODE_PROTOCOL_MISMATCH: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL: _ClassVar[ErrorCode]
    ERROR_CODE_LATE_JOIN_REFUSED: _ClassVar[ErrorCode]
    ERROR_CODE_RUN_MISMATCH: _ClassVar[ErrorCode]
    ERROR_CODE_ALREADY_CONNECTED: _ClassVar[ErrorCode]
ROLE_UNSPECIFIED: Role
ROLE_CLIENT: Role
ROLE_EDGE: Role
ROLE_SERVER: Role
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_BAD_REQUEST: ErrorCode
ERROR_CODE_BAD_BUNDLE: ErrorCode
ERROR_CODE_UNKNOWN_TASK: ErrorCode
ERROR_CODE_DEADLINE_EXCEEDED: ErrorCode
ERROR_CODE_CANCELLED: ErrorCode
ERROR_CODE_UNAUTHENTICATED: ErrorCode
ERROR_CODE_PROTOCOL_MISMATCH: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_LATE_JOIN_REFUSED: ErrorCode
ERROR_CODE_RUN_MISMATCH: ErrorCode
ERROR_CODE_ALREADY_CONNECTED: ErrorCode

class Frame(_message.Message):
    __slots__ = ("call_id", "hello", "welcome", "task", "result", "header", "chunk", "error", "bye", "ready", "report", "post", "batch")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BYE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    POST_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    hello: Hello
    welcome: Welcome
    task: Task
    result: Result
    header: BundleHeader
    chunk: Chunk
    error: Error
    bye: Bye
    ready: Ready
    report: Report
    post: Post
    batch: Batch
    def __init__(self, call_id: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., header: _Optional[_Union[BundleHeader, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., bye: _Optional[_Union[Bye, _Mapping]] = ..., ready: _Optional[_Union[Ready, _Mapping]] = ..., report: _Optional[_Union[Report, _Mapping]] = ..., post: _Optional[_Union[Post, _Mapping]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, frames: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Ready(_message.Message):
    __slots__ = ("data_sizes", "peers")
    class DataSizesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class PeersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DATA_SIZES_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    data_sizes: _containers.ScalarMap[str, int]
    peers: _containers.ScalarMap[str, str]
    def __init__(self, data_sizes: _Optional[_Mapping[str, int]] = ..., peers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Scalar(_message.Message):
    __slots__ = ("double_value", "int_value", "string_value", "bool_value")
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    double_value: float
    int_value: int
    string_value: str
    bool_value: bool
    def __init__(self, double_value: _Optional[float] = ..., int_value: _Optional[int] = ..., string_value: _Optional[str] = ..., bool_value: _Optional[bool] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol", "node_id", "role", "address", "info", "run_id")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    node_id: str
    role: Role
    address: str
    info: _containers.MessageMap[str, Scalar]
    run_id: str
    def __init__(self, protocol: _Optional[int] = ..., node_id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., address: _Optional[str] = ..., info: _Optional[_Mapping[str, Scalar]] = ..., run_id: _Optional[str] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("node_id", "role", "parent_id", "run_id", "spec", "spec_format", "peers", "info")
    class PeersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SPEC_FORMAT_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    role: Role
    parent_id: str
    run_id: str
    spec: str
    spec_format: str
    peers: _containers.ScalarMap[str, str]
    info: _containers.MessageMap[str, Scalar]
    def __init__(self, node_id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., parent_id: _Optional[str] = ..., run_id: _Optional[str] = ..., spec: _Optional[str] = ..., spec_format: _Optional[str] = ..., peers: _Optional[_Mapping[str, str]] = ..., info: _Optional[_Mapping[str, Scalar]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("name", "args", "has_bundle", "deadline_s")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    HAS_BUNDLE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    args: _containers.MessageMap[str, Scalar]
    has_bundle: bool
    deadline_s: float
    def __init__(self, name: _Optional[str] = ..., args: _Optional[_Mapping[str, Scalar]] = ..., has_bundle: _Optional[bool] = ..., deadline_s: _Optional[float] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("ok", "error", "scalars", "has_bundle")
    class ScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SCALARS_FIELD_NUMBER: _ClassVar[int]
    HAS_BUNDLE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: Error
    scalars: _containers.MessageMap[str, Scalar]
    has_bundle: bool
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., scalars: _Optional[_Mapping[str, Scalar]] = ..., has_bundle: _Optional[bool] = ...) -> None: ...

class Post(_message.Message):
    __slots__ = ("name", "args", "has_bundle", "round")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    HAS_BUNDLE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    name: str
    args: _containers.MessageMap[str, Scalar]
    has_bundle: bool
    round: int
    def __init__(self, name: _Optional[str] = ..., args: _Optional[_Mapping[str, Scalar]] = ..., has_bundle: _Optional[bool] = ..., round: _Optional[int] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ...) -> None: ...

class BundleHeader(_message.Message):
    __slots__ = ("tensors", "total_bytes", "chunk_bytes", "checksum_algorithm", "checksum")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    total_bytes: int
    chunk_bytes: int
    checksum_algorithm: str
    checksum: int
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., checksum_algorithm: _Optional[str] = ..., checksum: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class MeterRow(_message.Message):
    __slots__ = ("src", "dst", "kind", "phase", "messages", "payload_bytes", "message_bytes", "round", "wire_bytes", "wire_segments", "wire_retrans")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WIRE_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    WIRE_RETRANS_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    kind: str
    phase: str
    messages: int
    payload_bytes: int
    message_bytes: int
    round: int
    wire_bytes: int
    wire_segments: int
    wire_retrans: int
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., kind: _Optional[str] = ..., phase: _Optional[str] = ..., messages: _Optional[int] = ..., payload_bytes: _Optional[int] = ..., message_bytes: _Optional[int] = ..., round: _Optional[int] = ..., wire_bytes: _Optional[int] = ..., wire_segments: _Optional[int] = ..., wire_retrans: _Optional[int] = ...) -> None: ...

class MissingEntry(_message.Message):
    __slots__ = ("round", "by", "node", "task", "reason")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    round: int
    by: str
    node: str
    task: str
    reason: str
    def __init__(self, round: _Optional[int] = ..., by: _Optional[str] = ..., node: _Optional[str] = ..., task: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("meter", "missing", "round", "timeline")
    METER_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIMELINE_FIELD_NUMBER: _ClassVar[int]
    meter: _containers.RepeatedCompositeFieldContainer[MeterRow]
    missing: _containers.RepeatedCompositeFieldContainer[MissingEntry]
    round: int
    timeline: _containers.RepeatedCompositeFieldContainer[TimelineRow]
    def __init__(self, meter: _Optional[_Iterable[_Union[MeterRow, _Mapping]]] = ..., missing: _Optional[_Iterable[_Union[MissingEntry, _Mapping]]] = ..., round: _Optional[int] = ..., timeline: _Optional[_Iterable[_Union[TimelineRow, _Mapping]]] = ...) -> None: ...

class TimelineRow(_message.Message):
    __slots__ = ("round", "node", "peer", "phase", "seconds")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    round: int
    node: str
    peer: str
    phase: str
    seconds: float
    def __init__(self, round: _Optional[int] = ..., node: _Optional[str] = ..., peer: _Optional[str] = ..., phase: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class Bye(_message.Message):
    __slots__ = ("reason", "meter", "missing", "finished", "timeline")
    REASON_FIELD_NUMBER: _ClassVar[int]
    METER_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    TIMELINE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    meter: _containers.RepeatedCompositeFieldContainer[MeterRow]
    missing: _containers.RepeatedCompositeFieldContainer[MissingEntry]
    finished: bool
    timeline: _containers.RepeatedCompositeFieldContainer[TimelineRow]
    def __init__(self, reason: _Optional[str] = ..., meter: _Optional[_Iterable[_Union[MeterRow, _Mapping]]] = ..., missing: _Optional[_Iterable[_Union[MissingEntry, _Mapping]]] = ..., finished: _Optional[bool] = ..., timeline: _Optional[_Iterable[_Union[TimelineRow, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("ok", "error", "payload_bytes", "message_bytes")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: Error
    payload_bytes: int
    message_bytes: int
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., payload_bytes: _Optional[int] = ..., message_bytes: _Optional[int] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class DescribeReply(_message.Message):
    __slots__ = ("node_id", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    info: _containers.MessageMap[str, Scalar]
    def __init__(self, node_id: _Optional[str] = ..., info: _Optional[_Mapping[str, Scalar]] = ...) -> None: ...
