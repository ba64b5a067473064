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

Message bytes for the byte meter: :func:`frame_size` (``len`` of a raw frame, ``ByteSize()`` otherwise);
:func:`chunk_frame_head` is the one encoder of a chunk frame's head, shared with the byte counting of the
in-process engine (``messages.message_bytes``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
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


def parse_frame_lenient(buf: bytes) -> pb.Frame | ChunkFrame | BadFrame:
    """Like :func:`parse_frame`, but a malformed frame becomes a :class:`BadFrame` instead of an
    exception, so that gRPC does not tear the whole stream down for one bad frame."""
    try:
        return parse_frame(buf)
    except CodecError as e:
        return BadFrame(str(e), len(buf))


def serialize_frame(frame: pb.Frame | bytes) -> bytes:
    """Serializer for ``stream Frame`` RPCs: passes raw frames (``bytes``) through."""
    return frame if isinstance(frame, bytes) else frame.SerializeToString()


def frame_size(frame: pb.Frame | ChunkFrame | BadFrame | bytes) -> int:
    """Serialized size of a frame in bytes: the byte meter's *message* level (a :class:`BadFrame`: the bytes
    received that were not a Frame)."""
    if isinstance(frame, bytes):
        return len(frame)
    if isinstance(frame, ChunkFrame | BadFrame):
        return frame.size
    return frame.ByteSize()


def frame_kind(frame: pb.Frame | ChunkFrame | bytes) -> str:
    """``"chunk"``, ``"task"``, ... (the body's field name), or ``"keepalive"`` for an empty frame."""
    if isinstance(frame, bytes):
        frame = parse_frame(frame)
    if isinstance(frame, ChunkFrame):
        return "chunk"
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
