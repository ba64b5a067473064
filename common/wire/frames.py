"""Frames of the fedhop wire protocol (``proto/fedhop/v1/fedhop.proto``): scalars, bundles as frames, and a
zero-copy path for chunk frames.

Two equivalent ways to put a bundle on a ``stream Frame`` RPC:

* plain protobuf: ``bundle_frames(call_id, bundle, raw=False)`` yields ``pb.Frame`` messages, which the
  generated stubs serialize. Simple, but protobuf copies each chunk's bytes several times (the raw path
  is about 1.3x faster end to end; see tests/bench/bench_codec.py).
* raw chunks (default): chunk frames are yielded already serialized (``bytes``), built with one copy
  straight from the tensors' storage; on receipt :func:`parse_frame` returns a :class:`ChunkFrame` whose
  ``data`` is a memoryview of the received message (no copy) and everything else as ``pb.Frame``. The
  bytes are identical to protobuf's own serialization (tests/unit/test_codec_frames.py checks this), so
  the peer may use either path. To use it, register the RPC with these functions instead of the stubs'
  defaults, e.g. ``channel.stream_stream("/fedhop.v1.Parent/Session", request_serializer=serialize_frame,
  response_deserializer=parse_frame)`` and ``grpc.stream_stream_rpc_method_handler(fn,
  request_deserializer=parse_frame, response_serializer=serialize_frame)``.

Message bytes for the byte meter: :func:`frame_size` (``len`` of a raw frame, ``ByteSize()`` otherwise).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from google.protobuf.message import DecodeError

from fedhop.common.wire.codec import (
    DEFAULT_CHECKSUM,
    DEFAULT_CHUNK_BYTES,
    DTYPES,
    BundleDecoder,
    CodecError,
    RawChunk,
    encode_views,
)
from fedhop.v1 import fedhop_pb2 as pb

PROTOCOL_VERSION = 1

Scalar = float | int | str | bool
_INT64 = (-(1 << 63), (1 << 63) - 1)
_U64 = (1 << 64) - 1


# -- scalars -----------------------------------------------------------------------------------------------


def to_scalar(value: object) -> pb.Scalar:
    """A Python/numpy bool, int (int64 range), float or str as a ``pb.Scalar``."""
    if isinstance(value, bool | np.bool_):
        return pb.Scalar(bool_value=bool(value))
    if isinstance(value, numbers.Integral):
        v = int(value)
        if not _INT64[0] <= v <= _INT64[1]:
            raise CodecError(f"integer scalar {v} does not fit in int64")
        return pb.Scalar(int_value=v)
    if isinstance(value, numbers.Real):
        return pb.Scalar(double_value=float(value))
    if isinstance(value, str):
        return pb.Scalar(string_value=value)
    raise CodecError(f"a scalar is a bool, int, float or str, got {type(value).__name__}: {value!r}")


def from_scalar(s: pb.Scalar) -> Scalar:
    kind = s.WhichOneof("value")
    if kind is None:
        raise CodecError("empty Scalar (no value set)")
    return getattr(s, kind)


def put_scalars(target: object, values: Mapping[str, object]) -> None:
    """Fill a ``map<string, Scalar>`` field (e.g. ``task.args``) from a dict."""
    for k, v in values.items():
        target[k].CopyFrom(to_scalar(v))  # type: ignore[index]


def get_scalars(source: Mapping[str, pb.Scalar]) -> dict[str, Scalar]:
    """A ``map<string, Scalar>`` field as a dict, keys sorted (protobuf maps have no order)."""
    return {k: from_scalar(source[k]) for k in sorted(source)}


# -- raw chunk frames --------------------------------------------------------------------------------------


class ChunkFrame(NamedTuple):
    """A received chunk frame, not copied: ``data`` is a view of the message bytes (``size`` long)."""

    call_id: int
    offset: int
    data: memoryview
    size: int  # serialized frame bytes, for the byte meter


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & _U64, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint too long")


# Field tags of Frame.call_id (1, varint), Frame.chunk (7, length-delimited), Chunk.offset (1, varint) and
# Chunk.data (2, length-delimited).
_TAG_CALL_ID, _TAG_CHUNK, _TAG_OFFSET, _TAG_DATA = 0x08, 0x3A, 0x08, 0x12


def chunk_frame_bytes(call_id: int, offset: int, data: bytes | memoryview) -> bytes:
    """``pb.Frame(call_id=call_id, chunk=pb.Chunk(offset=offset, data=data)).SerializeToString()``, with
    one copy of ``data`` instead of protobuf's several."""
    n = memoryview(data).nbytes
    inner = (bytes([_TAG_OFFSET]) + _varint(offset) if offset else b"") + (
        bytes([_TAG_DATA]) + _varint(n) if n else b""
    )
    head = (bytes([_TAG_CALL_ID]) + _varint(call_id) if call_id else b"") + (
        bytes([_TAG_CHUNK]) + _varint(len(inner) + n) + inner
    )
    return b"".join((head, data))


def _parse_chunk_frame(buf: bytes) -> ChunkFrame | None:
    """The canonical encoding of a Frame whose body is a Chunk, or None for anything else."""
    n, pos, call_id, offset = len(buf), 0, 0, 0
    if n and buf[0] == _TAG_CALL_ID:
        call_id, pos = _read_varint(buf, 1)
    if pos >= n or buf[pos] != _TAG_CHUNK:
        return None
    length, pos = _read_varint(buf, pos + 1)
    if pos + length != n:
        return None
    if pos < n and buf[pos] == _TAG_OFFSET:
        offset, pos = _read_varint(buf, pos + 1)
    if pos == n:
        return ChunkFrame(call_id, offset, memoryview(b""), n)
    if buf[pos] != _TAG_DATA:
        return None
    length, pos = _read_varint(buf, pos + 1)
    if pos + length != n:
        return None
    return ChunkFrame(call_id, offset, memoryview(buf)[pos:], n)


def parse_frame(buf: bytes) -> pb.Frame | ChunkFrame:
    """Deserializer for ``stream Frame`` RPCs: chunk frames as :class:`ChunkFrame`, others as ``pb.Frame``."""
    try:
        chunk = _parse_chunk_frame(buf)
    except (IndexError, ValueError):
        chunk = None
    if chunk is not None:
        return chunk
    frame = pb.Frame()
    try:
        frame.ParseFromString(buf)
    except DecodeError as e:
        raise CodecError(f"malformed Frame ({len(buf)} bytes): {e}") from e
    return frame


def serialize_frame(frame: pb.Frame | bytes) -> bytes:
    """Serializer for ``stream Frame`` RPCs: passes raw frames (``bytes``) through."""
    return frame if isinstance(frame, bytes) else frame.SerializeToString()


def frame_size(frame: pb.Frame | ChunkFrame | bytes) -> int:
    """Serialized size of a frame in bytes: the byte meter's *message* level."""
    if isinstance(frame, bytes):
        return len(frame)
    if isinstance(frame, ChunkFrame):
        return frame.size
    return frame.ByteSize()


def frame_kind(frame: pb.Frame | ChunkFrame | bytes) -> str:
    """``"chunk"``, ``"task"``, ... (the body's field name), or ``"keepalive"`` for an empty frame."""
    if isinstance(frame, bytes):
        frame = parse_frame(frame)
    if isinstance(frame, ChunkFrame):
        return "chunk"
    return frame.WhichOneof("body") or "keepalive"


# -- bundles as frames -------------------------------------------------------------------------------------


def bundle_frames(
    call_id: int,
    bundle: Mapping[str, torch.Tensor],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    raw: bool = True,
    checksum: str = DEFAULT_CHECKSUM,
) -> Iterator[pb.Frame | bytes]:
    """The frames of one bundle: a ``header`` frame, then its chunk frames (serialized ``bytes`` when
    ``raw``, else ``pb.Frame``). The header is computed now (so a bundle that cannot travel raises
    :class:`CodecError` here); each chunk frame is built when the iterator reaches it."""
    header, chunks = encode_views(bundle, chunk_bytes, checksum=checksum)
    return _frames(call_id, header, chunks, raw)


def _frames(
    call_id: int, header: pb.BundleHeader, chunks: Iterator[RawChunk], raw: bool
) -> Iterator[pb.Frame | bytes]:
    yield pb.Frame(call_id=call_id, header=header)
    for c in chunks:
        if raw:
            yield chunk_frame_bytes(call_id, c.offset, c.data)
        else:
            frame = pb.Frame(call_id=call_id)
            frame.chunk.offset = c.offset
            frame.chunk.data = bytes(c.data)
            yield frame


# -- messages: Task / Result + bundle, as the engines send them --------------------------------------------
#
# A *message* is one Task or Result frame followed, when it has a bundle, by the bundle's frames, all under
# one call id. Its *message bytes* (the byte meter's second level) are the serialized sizes of those frames.
# Two choices make that size a function of (kind, phase, bundle, scalars, chunk_bytes) alone, so that the
# in-process engine can count exactly what the networked one sends (``message_bytes``):
# * call ids are drawn from [CALL_ID_BASE, 2**63), whose varints are all 9 bytes long;
# * the round travels as args[ROUND_ARG], a double (a oneof member is serialized even when 0.0), and every
#   Task carries a non-zero deadline_s (a double, 8 bytes).
# Session frames (Hello, Welcome, Ready, Bye, keep-alives) are set-up and tear-down, not messages.

CALL_ID_BASE = 1 << 56
ROUND_ARG = "_round"
HANDOFF = "handoff"
DESCRIBE = "describe"
_CALL_ID_BYTES = 10  # tag + 9-byte varint


_DTYPE_NAME = {v: k for k, v in DTYPES.items()}


def _dtype_name(t: torch.Tensor) -> str:
    if t.dtype not in _DTYPE_NAME:
        raise CodecError(f"unsupported dtype {t.dtype} (supported: {', '.join(DTYPES)})")
    return _DTYPE_NAME[t.dtype]


def _varint_len(n: int) -> int:
    k = 1
    while n > 0x7F:
        n >>= 7
        k += 1
    return k


def task_frame(call_id: int, name: str, args: Mapping[str, object], *, deadline_s: float,
               has_bundle: bool, round_idx: int | None = None) -> pb.Frame:
    """The Task frame of a request; ``round_idx`` (the sender's round) travels as ``args[ROUND_ARG]``."""
    f = pb.Frame(call_id=call_id)
    f.task.name = name
    put_scalars(f.task.args, args)
    if round_idx is not None:
        f.task.args[ROUND_ARG].CopyFrom(pb.Scalar(double_value=float(round_idx)))
    f.task.has_bundle = has_bundle
    f.task.deadline_s = float(deadline_s)
    return f


def result_frame(call_id: int, scalars: Mapping[str, object], *, has_bundle: bool) -> pb.Frame:
    f = pb.Frame(call_id=call_id)
    f.result.ok = True
    put_scalars(f.result.scalars, scalars)
    f.result.has_bundle = has_bundle
    return f


def error_result_frame(call_id: int, code: int, message: str) -> pb.Frame:
    """A Result with ok = false: the call failed (bad bundle, unknown task, handler raised, ...)."""
    f = pb.Frame(call_id=call_id)
    f.result.ok = False
    f.result.error.code = code
    f.result.error.message = message
    return f


def error_frame(call_id: int, code: int, message: str) -> pb.Frame:
    f = pb.Frame(call_id=call_id)
    f.error.code = code
    f.error.message = message
    return f


def message_frames(head: pb.Frame, bundle: Mapping[str, torch.Tensor], chunk_bytes: int,
                   ) -> list[pb.Frame] | Iterator[pb.Frame | bytes]:
    """``head`` (a Task or Result frame) then, when ``bundle`` is not empty, its frames (lazily)."""
    if not bundle:
        return [head]
    tail = bundle_frames(head.call_id, bundle, chunk_bytes)  # header computed now: CodecError surfaces here

    def gen() -> Iterator[pb.Frame | bytes]:
        yield head
        yield from tail

    return gen()


def _bundle_frames_bytes(bundle: Mapping[str, torch.Tensor], chunk_bytes: int) -> int:
    """Serialized size of a bundle's header frame and chunk frames, without encoding the payload."""
    header = pb.BundleHeader(chunk_bytes=chunk_bytes, checksum_algorithm=DEFAULT_CHECKSUM, checksum=1)
    total = 0
    for name, t in bundle.items():
        n = t.numel() * t.element_size()
        header.tensors.add(name=name, dtype=_dtype_name(t), shape=tuple(t.shape), nbytes=n)
        total += n
    header.total_bytes = total
    size = pb.Frame(call_id=CALL_ID_BASE, header=header).ByteSize()
    offset = 0
    while offset < total:
        n = min(chunk_bytes, total - offset)
        inner = (1 + _varint_len(offset) if offset else 0) + 1 + _varint_len(n)
        size += _CALL_ID_BYTES + 1 + _varint_len(inner + n) + inner + n
        offset += n
    return size


def message_bytes(kind: str, phase: str, bundle: Mapping[str, torch.Tensor], scalars: Mapping[str, object],
                  chunk_bytes: int) -> int:
    """Exact serialized bytes of one message as the networked engine sends it (DESIGN.md section 4).

    * a task (any other ``kind``): request = Task frame (args = ``scalars`` + the round) + bundle frames;
      reply = Result frame (``scalars``) + bundle frames;
    * ``handoff``: request = Task frame (name "handoff", args = ``scalars``) + bundle frames; reply = Ack;
    * ``describe``: request = DescribeRequest (the asker travels in metadata); reply = DescribeReply.
    """
    if kind == DESCRIBE:
        if phase == "request":
            return pb.DescribeRequest().ByteSize()
        r = pb.DescribeReply()
        put_scalars(r.info, scalars)
        return r.ByteSize()
    if kind == HANDOFF and phase == "reply":
        return pb.Ack(ok=True).ByteSize()
    has = bool(bundle)
    if phase == "request":
        head = task_frame(CALL_ID_BASE, kind, scalars, deadline_s=1.0, has_bundle=has,
                          round_idx=None if kind == HANDOFF else 0)
    elif phase == "reply":
        head = result_frame(CALL_ID_BASE, scalars, has_bundle=has)
    else:
        raise ValueError(f"phase must be 'request' or 'reply', got {phase!r}")
    return head.ByteSize() + (_bundle_frames_bytes(bundle, chunk_bytes) if has else 0)


# -- reading messages --------------------------------------------------------------------------------------


class BadFrame(NamedTuple):
    """What :func:`parse_frame_lenient` returns for bytes that are not a Frame (the stream stays open)."""

    error: str
    size: int


def parse_frame_lenient(buf: bytes) -> pb.Frame | ChunkFrame | BadFrame:
    """Like :func:`parse_frame`, but a malformed frame becomes a :class:`BadFrame` instead of an
    exception, so that gRPC does not tear the whole stream down for one bad frame."""
    try:
        return parse_frame(buf)
    except CodecError as e:
        return BadFrame(str(e), len(buf))


@dataclass
class Message:
    """A complete inbound message: its Task/Result frame, its bundle, and what it cost on the wire."""

    call_id: int
    head: pb.Frame
    bundle: dict[str, torch.Tensor]
    payload_bytes: int
    message_bytes: int
    error: str | None = None  # the bundle could not be decoded: why

    @property
    def kind(self) -> str:
        return self.head.WhichOneof("body") or ""


class FrameError(ValueError):
    """A frame that belongs to no message (e.g. a chunk of an unknown call); the message names it."""

    def __init__(self, message: str, call_id: int = 0) -> None:
        super().__init__(message)
        self.call_id = call_id


class MessageAssembler:
    """Groups inbound frames into :class:`Message` s: a Task or Result frame, then (if it says has_bundle)
    a BundleHeader frame and the chunks, decoded into one preallocated buffer by the codec.

    ``feed`` returns a complete message, None while one is still arriving, or raises :class:`FrameError`
    for a frame that fits nowhere. A bundle that fails to decode completes its message with ``error`` set
    (so the receiver can answer that call with an error); the rest of that call's frames are dropped.
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self._open: dict[int, tuple[pb.Frame, int, BundleDecoder | None]] = {}
        self._dropped: set[int] = set()

    def feed(self, frame: pb.Frame | ChunkFrame | BadFrame) -> Message | None:
        if isinstance(frame, BadFrame):
            raise FrameError(f"malformed frame: {frame.error}")
        size = frame_size(frame)
        if isinstance(frame, ChunkFrame):
            return self._chunk(frame.call_id, frame, size)
        body = frame.WhichOneof("body")
        cid = frame.call_id
        if body in ("task", "result"):
            if cid == 0:
                raise FrameError(f"{body} frame without a call id")
            if cid in self._open:
                raise FrameError(f"second {body} frame for call {cid} while its bundle arrives", cid)
            self._dropped.discard(cid)
            has = frame.task.has_bundle if body == "task" else frame.result.has_bundle
            if not has:
                return Message(cid, frame, {}, 0, size)
            self._open[cid] = (frame, size, None)
            return None
        if body == "header":
            if cid in self._dropped:
                return None
            if cid not in self._open or self._open[cid][2] is not None:
                raise FrameError(f"bundle header for call {cid}, which announced no bundle", cid)
            head, n, _ = self._open[cid]
            try:
                dec = BundleDecoder(frame.header, max_bytes=self.max_bytes)
            except CodecError as e:
                return self._fail(cid, f"bad bundle header: {e}")
            self._open[cid] = (head, n + size, dec)
            return self._maybe_done(cid) if dec.total_bytes == 0 else None
        if body == "chunk":
            return self._chunk(cid, frame.chunk, size)
        raise FrameError(f"unexpected {body or 'empty'} frame", cid)

    def _chunk(self, cid: int, chunk: object, size: int) -> Message | None:
        if cid in self._dropped:
            return None
        if cid not in self._open or self._open[cid][2] is None:
            raise FrameError(f"chunk for call {cid}, which has no open bundle", cid)
        head, n, dec = self._open[cid]
        assert dec is not None
        self._open[cid] = (head, n + size, dec)
        try:
            dec.feed(chunk)  # type: ignore[arg-type]
        except CodecError as e:
            return self._fail(cid, f"bad bundle: {e}")
        return self._maybe_done(cid) if dec.complete else None

    def _maybe_done(self, cid: int) -> Message:
        head, n, dec = self._open.pop(cid)
        assert dec is not None
        try:
            bundle = dec.finish()
        except CodecError as e:
            self._dropped.add(cid)
            return Message(cid, head, {}, dec.total_bytes, n, f"bad bundle: {e}")
        return Message(cid, head, bundle, dec.total_bytes, n)

    def _fail(self, cid: int, why: str) -> Message:
        head, n, _ = self._open.pop(cid)
        self._dropped.add(cid)
        return Message(cid, head, {}, 0, n, why)

    def abandon(self, cid: int) -> None:
        """Forget a call whose frames no longer matter (e.g. a late reply)."""
        self._open.pop(cid, None)
        self._dropped.add(cid)


# -- meter rows and missing logs in Bye --------------------------------------------------------------------


def meter_rows_to_pb(rows: list[dict], target: object) -> None:
    for r in rows:
        target.add(src=r["src"], dst=r["dst"], kind=r["kind"], phase=r["phase"],  # type: ignore[attr-defined]
                   messages=r["messages"], payload_bytes=r["payload_bytes"],
                   message_bytes=r["message_bytes"], round=r["round"])


def meter_rows_from_pb(rows: object) -> list[dict]:
    return [{"src": r.src, "dst": r.dst, "kind": r.kind, "phase": r.phase, "round": int(r.round),
             "messages": int(r.messages), "payload_bytes": int(r.payload_bytes),
             "message_bytes": int(r.message_bytes)} for r in rows]  # type: ignore[attr-defined]


def missing_to_pb(entries: list[dict], target: object) -> None:
    for e in entries:
        target.add(round=int(e["round"]), by=e["by"], node=e["node"], task=e["task"],  # type: ignore[attr-defined]
                   reason=e["reason"])


def missing_from_pb(entries: object) -> list[dict]:
    return [{"round": int(e.round), "by": e.by, "node": e.node, "task": e.task, "reason": e.reason}
            for e in entries]  # type: ignore[attr-defined]


# -- bundles at the edges of the wire ---------------------------------------------------------------------

MAX_MESSAGE = 80 << 20  # gRPC message limit: > the largest chunk frame (64 MiB chunks) plus headers


def on_host(bundle: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``bundle`` on the CPU, without a copy for tensors already there.

    The codec streams chunks lazily from the tensors' storage, so a bundle must not be mutated in place
    until its message is sent. The engines guarantee it: a scatter returns once every reply arrived (so
    every request it still waits for was fully received) or its deadline passed (the streams still in
    flight then belong to calls already given up: a torn bundle fails its checksum there and is refused);
    a hand-off returns on its acknowledgement. A handler's reply is sent before the next task arrives.
    """
    return {k: v.detach() if v.device.type == "cpu" else v.detach().to("cpu") for k, v in bundle.items()}


def to_device(bundle: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A received (CPU) bundle on this node's device."""
    return bundle if device.type == "cpu" else {k: v.to(device) for k, v in bundle.items()}
