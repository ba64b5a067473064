"""The fedhop wire protocol's frames (``proto/fedhop/v1/fedhop.proto``), one import for all of it.

The implementation is split by concern:

* ``scalars.py``: typed control values (``pb.Scalar`` maps);
* ``framing.py``: frames as bytes (serialize, parse, size; the zero-copy chunk path; batches of a small message's
  frames);
* ``messages.py``: Task / Result messages with their bundles, the :class:`MessageAssembler`, and
  :func:`message_bytes`, which the in-process engine counts with the same frame builders the networked
  engine sends;
* ``control.py``: Report and Bye frames (byte-meter rows, missing logs).
"""

from fedhop.common.wire.control import (
    CONTROL_KINDS,
    REPORT,
    ReportCursor,
    bye_frame,
    meter_rows_from_pb,
    meter_rows_to_pb,
    missing_from_pb,
    missing_to_pb,
    report_frame,
)
from fedhop.common.wire.framing import (
    MAX_MESSAGE,
    BadFrame,
    BatchBytes,
    ChunkFrame,
    FrameBatch,
    batch_frame_bytes,
    bundle_frames,
    chunk_frame_bytes,
    chunk_frame_head,
    frame_kind,
    frame_size,
    parse_frame,
    parse_frame_lenient,
    serialize_frame,
    unbatched,
)
from fedhop.common.wire.messages import (
    BATCH_ENV,
    BATCH_MAX_BYTES,
    CALL_ID_BASE,
    DESCRIBE,
    HANDOFF,
    MIN_DEADLINE_S,
    PROTOCOL_VERSION,
    ROUND_ARG,
    FrameError,
    Message,
    MessageAssembler,
    bundle_frames_bytes,
    describe_reply,
    error_frame,
    error_result_frame,
    message_bytes,
    message_frames,
    on_host,
    result_frame,
    task_frame,
    to_device,
)
from fedhop.common.wire.scalars import Scalar, from_scalar, get_scalars, put_scalars, to_scalar

__all__ = [
    "CALL_ID_BASE", "CONTROL_KINDS", "DESCRIBE", "HANDOFF", "MAX_MESSAGE", "MIN_DEADLINE_S", "PROTOCOL_VERSION",
    "REPORT", "ROUND_ARG", "BadFrame", "ChunkFrame", "FrameError", "Message", "MessageAssembler", "ReportCursor",
    "BATCH_ENV", "BATCH_MAX_BYTES", "BatchBytes", "FrameBatch", "batch_frame_bytes", "unbatched",
    "Scalar", "bundle_frames", "bundle_frames_bytes", "bye_frame", "chunk_frame_bytes", "chunk_frame_head",
    "describe_reply", "error_frame", "error_result_frame", "frame_kind", "frame_size", "from_scalar",
    "get_scalars", "message_bytes", "message_frames", "meter_rows_from_pb", "meter_rows_to_pb",
    "missing_from_pb", "missing_to_pb", "on_host", "parse_frame", "parse_frame_lenient", "put_scalars",
    "report_frame", "result_frame", "serialize_frame", "task_frame", "to_device", "to_scalar",
]
