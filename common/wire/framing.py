"""Frames as bytes on a ``stream Frame`` RPC: serializing, parsing, sizing, and a zero-copy path for chunks.

Two equivalent ways to put a bundle on the stream:

* plain protobuf: ``bundle_frames(call_id, bundle, raw=False)`` yields ``pb.Frame`` messages, which the
  generated stubs serialize. Simple, but protobuf copies each chunk's bytes several times (the raw path
  is about 1.3x faster end to end; see tests/bench/bench_codec.py).
* raw chunks (default): chunk frames are yielded already serialized (``bytes``), built with one copy
  straight from the tensors' storage; on receipt :func:`parse_frame` returns a :class:`ChunkFrame` whose
  ``data`` is a memoryview of the received message (no copy) and everything else as ``pb.Frame``. The
  bytes are identical to protobuf's own serialization (tests/unit/test_codec_frames.py checks this), so
  the peer may use either path. Register RPCs with :func:`serialize_frame` / :func:`parse_frame_lenient`.

Batches (protocol version 2): a message whose bundle is small travels as ONE ``Batch`` frame holding its frames
(:func:`batch_frame_bytes`, hand-encoded with one copy of the payload; sent as a :class:`BatchBytes`), one gRPC
message instead of three. :func:`parse_frame` returns a received batch as a :class:`FrameBatch` of its inner frames,
each parsed as a frame of its own would be (chunks zero-copy, a malformed one a :class:`BadFrame`); every reader
flattens it with :func:`unbatched`. A batch with a nested batch, a Hello, a Welcome or a keep-alive in it, an empty
one and one with a call id are malformed. The byte meter counts the inner frames, not the batch around them
(:func:`frame_size`): the envelope is framing, as gRPC's own 5-byte message prefix is.

Message bytes for the byte meter: :func:`frame_size` (``len`` of a raw frame, ``ByteSize()`` otherwise);
:func:`chunk_frame_head` is the one encoder of a chunk frame's head, shared with the byte counting of the
in-process engine (``messages.message_bytes``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import torch
from google.protobuf.message import DecodeError

from fedhop.common import timing
from fedhop.common.wire.codec import DEFAULT_CHECKSUM, DEFAULT_CHUNK_BYTES, CodecError, RawChunk, encode_views
from fedhop.v1 import fedhop_pb2 as pb

MAX_MESSAGE = 80 << 20  # gRPC message limit: > the largest chunk frame (64 MiB chunks) plus headers
_U64 = (1 << 64) - 1


class ChunkFrame(NamedTuple):
    """A received chunk frame, not copied: ``data`` is a view of the message bytes (``size`` long)."""

    call_id: int
    offset: int
    data: memoryview
    size: int  # serialized frame bytes, for the byte meter


class BadFrame(NamedTuple):
    """What :func:`parse_frame_lenient` returns for bytes that are not a Frame (the stream stays open)."""

    error: str
    size: int


class BatchBytes(NamedTuple):
    """An outbound Batch frame, serialized (``data``, what :func:`serialize_frame` hands gRPC), and ``size``: its
    inner frames' serialized bytes, which is what the byte meter counts (:func:`frame_size`)."""

    data: bytes
    size: int


class FrameBatch(NamedTuple):
    """A received Batch frame: its inner frames in order, each parsed by :func:`parse_frame_lenient`'s rules (a
    chunk frame a zero-copy :class:`ChunkFrame` viewing the received message, a malformed one a :class:`BadFrame`),
    and ``size``, the inner frames' serialized bytes (the byte meter's message bytes). Readers flatten it
    (:func:`unbatched`) and handle the inner frames as if they had come one by one."""

    frames: tuple[pb.Frame | ChunkFrame | BadFrame, ...]
    size: int


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
# Chunk.data (2, length-delimited); Frame.batch (13, length-delimited) and Batch.frames (1, length-delimited).
_TAG_CALL_ID, _TAG_CHUNK, _TAG_OFFSET, _TAG_DATA = 0x08, 0x3A, 0x08, 0x12
_TAG_BATCH, _TAG_ENTRY = 0x6A, 0x0A
NEVER_BATCHED = ("batch", "hello", "welcome", None)  # bodies a batch never holds (None: a keep-alive)


def chunk_frame_head(call_id: int, offset: int, n: int) -> bytes:
    """The bytes of a chunk frame that precede its ``n`` data bytes (protobuf's canonical encoding)."""
    inner = (bytes([_TAG_OFFSET]) + _varint(offset) if offset else b"") + (
        bytes([_TAG_DATA]) + _varint(n) if n else b""
    )
    return (bytes([_TAG_CALL_ID]) + _varint(call_id) if call_id else b"") + (
        bytes([_TAG_CHUNK]) + _varint(len(inner) + n) + inner
    )


def chunk_frame_bytes(call_id: int, offset: int, data: bytes | memoryview) -> bytes:
    """``pb.Frame(call_id=call_id, chunk=pb.Chunk(offset=offset, data=data)).SerializeToString()``, with
    one copy of ``data`` instead of protobuf's several."""
    return b"".join((chunk_frame_head(call_id, offset, memoryview(data).nbytes), data))


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


def batch_frame_bytes(frames: Sequence[Sequence[bytes | memoryview]]) -> BatchBytes:
    """``pb.Frame(batch=pb.Batch(frames=[...])).SerializeToString()`` with one copy of every buffer: each entry of
    ``frames`` is one serialized inner frame given as its buffers (e.g. a chunk frame's head and views of the
    tensors' memory, :meth:`~fedhop.common.wire.messages.BundleMessage.lane_buffers`), in order. The sender's
    rules (never a batch, Hello, Welcome or keep-alive inside; never empty) are the caller's to keep; an empty
    list or an empty inner frame (a keep-alive) raises ValueError."""
    if not frames:
        raise ValueError("an empty batch is malformed: a batch holds at least one frame")
    pieces: list[bytes | memoryview] = []
    inner = body = 0
    for parts in frames:
        n = sum(memoryview(p).nbytes for p in parts)
        if n == 0:
            raise ValueError("a keep-alive (an empty frame) never goes in a batch")
        prefix = bytes([_TAG_ENTRY]) + _varint(n)
        pieces.append(prefix)
        pieces.extend(parts)
        inner += n
        body += len(prefix) + n
    return BatchBytes(b"".join([bytes([_TAG_BATCH]) + _varint(body), *pieces]), inner)


def _parse_one(buf: bytes | memoryview, where: str = "") -> pb.Frame | ChunkFrame:
    """A frame that is not a batch of :func:`batch_frame_bytes`' encoding: a chunk frame as a zero-copy
    :class:`ChunkFrame`, anything else through protobuf; CodecError for bytes that are not a Frame (``where``: words
    for the message, e.g. " in a batch")."""
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
        raise CodecError(f"malformed Frame{where} ({len(buf)} bytes): {e}") from e
    return frame


def _parse_inner(buf: bytes | memoryview) -> pb.Frame | ChunkFrame | BadFrame:
    """One inner frame of a batch (a view of the received message): parsed as a frame of its own would be."""
    try:
        return _parse_one(buf, " in a batch")
    except CodecError as e:
        return BadFrame(str(e), len(buf))


def _batch_of(entries: Iterator[bytes | memoryview], total: int) -> FrameBatch:
    """The :class:`FrameBatch` of a received batch's entries; CodecError for a batch that is malformed as a whole
    (``total``: the batch frame's bytes, for the message)."""
    frames: list[pb.Frame | ChunkFrame | BadFrame] = []
    size = 0
    for entry in entries:
        inner = _parse_inner(entry)
        if isinstance(inner, pb.Frame) and inner.WhichOneof("body") in NEVER_BATCHED:
            what = inner.WhichOneof("body") or "keep-alive"
            raise CodecError(f"malformed Frame ({total} bytes): a batch holding a {what} frame "
                             f"(a batch never holds a batch, a hello, a welcome or a keep-alive)")
        frames.append(inner)
        size += len(entry)
    if not frames:
        raise CodecError(f"malformed Frame ({total} bytes): an empty batch")
    return FrameBatch(tuple(frames), size)


def _batch_entries(buf: bytes, pos: int) -> Iterator[memoryview]:
    """The entries of a canonically encoded batch whose Batch message starts at ``pos`` and ends with ``buf``:
    views of ``buf`` (no copy); CodecError for bytes that are not a Batch."""
    view, n = memoryview(buf), len(buf)
    while pos < n:
        if buf[pos] != _TAG_ENTRY:
            raise CodecError(f"malformed Frame ({n} bytes): a batch with a field other than its frames")
        try:
            length, pos = _read_varint(buf, pos + 1)
        except (IndexError, ValueError):
            raise CodecError(f"malformed Frame ({n} bytes): a batch entry's length is cut off") from None
        if pos + length > n:
            raise CodecError(f"malformed Frame ({n} bytes): a batch entry of {length} bytes runs past the frame")
        yield view[pos:pos + length]
        pos += length


def _parse_batch(buf: bytes) -> FrameBatch | None:
    """A batch as :func:`batch_frame_bytes` encodes it (no call id, the Batch field alone), or None for anything
    else (other encodings of a batch go through protobuf)."""
    if not buf or buf[0] != _TAG_BATCH:
        return None
    try:
        length, pos = _read_varint(buf, 1)
    except (IndexError, ValueError):
        return None
    if pos + length != len(buf):
        return None
    return _batch_of(_batch_entries(buf, pos), len(buf))


def parse_frame(buf: bytes) -> pb.Frame | ChunkFrame | FrameBatch:
    """Deserializer for ``stream Frame`` RPCs: chunk frames as :class:`ChunkFrame`, batches as
    :class:`FrameBatch`, others as ``pb.Frame``; CodecError for bytes that are not a Frame (or a malformed batch)."""
    batch = _parse_batch(buf)  # its first byte, Frame.batch's tag, is never a chunk frame's (call id or chunk)
    if batch is not None:
        return batch
    frame = _parse_one(buf)
    # a batch encoded otherwise than batch_frame_bytes does (e.g. by protobuf)
    if isinstance(frame, pb.Frame) and frame.WhichOneof("body") == "batch":
        if frame.call_id:
            raise CodecError(f"malformed Frame ({len(buf)} bytes): a batch with a call id ({frame.call_id})")
        return _batch_of(iter(frame.batch.frames), len(buf))
    return frame


def unbatched(frame: pb.Frame | ChunkFrame | BadFrame | FrameBatch) -> tuple[pb.Frame | ChunkFrame | BadFrame, ...]:
    """What a reader handles for one received frame: a batch's inner frames, in order, or the frame itself."""
    return frame.frames if isinstance(frame, FrameBatch) else (frame,)


def parse_frame_lenient(buf: bytes) -> pb.Frame | ChunkFrame | FrameBatch | BadFrame:
    """Like :func:`parse_frame`, but a malformed frame becomes a :class:`BadFrame` instead of an
    exception, so that gRPC does not tear the whole stream down for one bad frame."""
    try:
        return parse_frame(buf)
    except CodecError as e:
        return BadFrame(str(e), len(buf))


def serialize_frame(frame: pb.Frame | bytes | BatchBytes) -> bytes:
    """Serializer for ``stream Frame`` RPCs: passes raw frames (``bytes``, a :class:`BatchBytes`' data) through."""
    if isinstance(frame, bytes):
        return frame
    if isinstance(frame, BatchBytes):
        return frame.data
    return frame.SerializeToString()


def frame_size(frame: pb.Frame | ChunkFrame | BadFrame | FrameBatch | BatchBytes | bytes) -> int:
    """Serialized size of a frame in bytes: the byte meter's *message* level (a :class:`BadFrame`: the bytes
    received that were not a Frame; a batch, either way: its inner frames' bytes, without the batch around them)."""
    if isinstance(frame, bytes):
        return len(frame)
    if isinstance(frame, ChunkFrame | BadFrame | FrameBatch | BatchBytes):
        return frame.size
    return frame.ByteSize()


def frame_kind(frame: pb.Frame | ChunkFrame | FrameBatch | BatchBytes | bytes) -> str:
    """``"chunk"``, ``"task"``, ``"batch"``, ... (the body's field name), or ``"keepalive"`` for an empty frame."""
    if isinstance(frame, BatchBytes):
        return "batch"
    if isinstance(frame, bytes):
        frame = parse_frame(frame)
    if isinstance(frame, ChunkFrame):
        return "chunk"
    if isinstance(frame, FrameBatch):
        return "batch"
    return frame.WhichOneof("body") or "keepalive"


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
        if raw and timing.ENABLED:
            started = time.perf_counter()
            frame = chunk_frame_bytes(call_id, c.offset, c.data)
            timing.add("encode_s", time.perf_counter() - started)
            yield frame
        elif raw:
            yield chunk_frame_bytes(call_id, c.offset, c.data)
        else:
            frame = pb.Frame(call_id=call_id)
            frame.chunk.offset = c.offset
            frame.chunk.data = bytes(c.data)
            yield frame
