"""Chunked tensor codec: a named bundle <-> one ``BundleHeader`` + a stream of ``Chunk`` messages.

docs/design.md section 6: tensors travel as a header (names, dtypes, shapes, sizes, checksum) and a stream of
chunks of at most a few MiB, so no gRPC message limit applies and a multi-GB model streams in bounded
memory; the receiver decodes into one preallocated buffer; nothing is pickled.

Payload stream
    The concatenation of every tensor's raw bytes (C order, little-endian, no padding) in bundle order.
    Chunk ``i`` carries bytes ``[i * chunk_bytes, min((i + 1) * chunk_bytes, total))`` and says so in
    its ``offset``; chunks may span tensor boundaries. The header's checksum covers the whole stream.

Memory
    :func:`encode` hashes the tensors in place (one read pass, no copy) and then yields chunks lazily from
    memoryview slices of the tensors' own storage, so the sender holds one chunk at a time beyond the
    bundle itself (a non-contiguous or non-CPU tensor is first made a contiguous CPU copy; CUDA tensors go through
    a pinned staging buffer kept across bundles, ``staging.py``). Do not mutate
    the bundle until the chunk iterator is exhausted: the receiver would see a checksum mismatch.
    :class:`BundleDecoder` allocates one uint8 buffer (pinned where the process receives for a CUDA device,
    ``staging.py``) for the whole bundle when it reads the header and
    copies each chunk into place; the decoded tensors are views of that buffer. Inside the buffer each
    tensor starts at a multiple of its element size (of 64 bytes when it holds at least 4 KiB), so the
    buffer is at most a few bytes per tensor larger than the payload. A freed buffer of at least 32 MiB is kept
    for the next bundle of its size (:data:`POOL_KEEP`, two at most): a node receives the same model every
    round, and fresh memory costs a page fault and a zeroing per page.

Checksums
    ``xxh3_64`` (default; about 14 GB/s on one core here, against about 2 GB/s for ``zlib.crc32``, see
    tests/bench/bench_codec.py), ``crc32`` (stdlib) or ``none``.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import sys
import threading
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import torch
import xxhash

from fedhop.common import timing
from fedhop.common.wire import staging
from fedhop.common.wire.bundle import Bundle
from fedhop.v1 import fedhop_pb2 as pb

DEFAULT_CHUNK_BYTES = 1 << 20
MAX_CHUNK_BYTES = 64 << 20
DEFAULT_CHECKSUM = "xxh3_64"
_BIG_TENSOR_BYTES = 4096  # tensors at least this large start 64-byte aligned in the decode buffer
_HUGE_BUFFER_BYTES = 32 << 20  # decode buffers at least this large are mapped with transparent huge pages
_PIECE_BYTES = 1 << 20  # feed copies and hashes at most this much at a time (stays in the core's L2 cache)
_MADV_HUGEPAGE: int | None = getattr(mmap, "MADV_HUGEPAGE", None)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
_ITEMSIZE: dict[str, int] = {k: torch.empty(0, dtype=v).element_size() for k, v in DTYPES.items()}


class CodecError(ValueError):
    """A bundle cannot be encoded, or a header/chunk stream is invalid. The message names the problem."""


class RawChunk(NamedTuple):
    """A chunk that is not (yet) a protobuf message: ``data`` may be a view of a tensor's storage."""

    offset: int
    data: bytes | memoryview


class ChunkLike(Protocol):
    """What :meth:`BundleDecoder.feed` reads: ``pb.Chunk``, :class:`RawChunk` or ``frames.ChunkFrame``."""

    @property
    def offset(self) -> int: ...

    @property
    def data(self) -> bytes | memoryview: ...


class PayloadSink(Protocol):
    """Where a :class:`BundleDecoder` given a ``sink`` puts the payload instead of its own buffer (a fold that
    adds each piece into an aggregate as it arrives, ``fold.py``). The decoder still checks every chunk against
    the header and the checksum over the whole stream; the sink sees each piece once, in stream order.

    ``write(index, pos, data)``: ``data`` are the bytes ``[pos, pos + len(data))`` of tensor ``index`` (the
    header's order); only valid during the call. Optional ``target(index, pos, nbytes)``: where
    :meth:`BundleDecoder.fill` may receive those bytes in place (a writable view of ``nbytes``, or None: a scratch
    buffer); ``write`` then follows with that whole view, unless the stream ended first.
    ``finish()``: every byte came and the checksum matched; the decoded bundle (what the sink made of it).
    ``abort()``: the stream failed or was given up; undo what ``write`` did (called at most once, never after
    ``finish``)."""

    def write(self, index: int, pos: int, data: memoryview) -> None: ...

    def finish(self) -> Bundle: ...

    def abort(self) -> None: ...


# -- checksums ---------------------------------------------------------------------------------------------


class _Xxh3:
    def __init__(self) -> None:
        self._h = xxhash.xxh3_64()

    def update(self, data: memoryview) -> None:
        self._h.update(data)

    def value(self) -> int:
        return self._h.intdigest()


class _Crc32:
    def __init__(self) -> None:
        self._v = 0

    def update(self, data: memoryview) -> None:
        self._v = zlib.crc32(data, self._v)

    def value(self) -> int:
        return self._v


class _NoChecksum:
    def update(self, data: memoryview) -> None:
        pass

    def value(self) -> int:
        return 0


CHECKSUMS: dict[str, type[_Xxh3] | type[_Crc32] | type[_NoChecksum]] = {
    "xxh3_64": _Xxh3,
    "crc32": _Crc32,
    "none": _NoChecksum,
}


# -- encoding ----------------------------------------------------------------------------------------------


def _check_chunk_bytes(chunk_bytes: int) -> None:
    ok = isinstance(chunk_bytes, int) and not isinstance(chunk_bytes, bool)
    if not ok or not 1 <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise CodecError(f"chunk_bytes must be an int in [1, {MAX_CHUNK_BYTES}], got {chunk_bytes!r}")


def _raw_bytes(name: str, t: object) -> tuple[str, tuple[int, ...], memoryview]:
    """(dtype name, shape, a flat byte view of the tensor's contiguous CPU storage).

    The memoryview keeps the numpy array, and so the tensor's storage, alive while a chunk refers to it.
    """
    if not isinstance(t, torch.Tensor):
        raise CodecError(f"tensor {name!r}: expected a torch.Tensor, got {type(t).__name__}")
    dtype = _DTYPE_NAMES.get(t.dtype)
    if dtype is not None and dtype != "bfloat16":
        # Fast path: numpy() refuses whatever is not a plain dense CPU tensor, and the cast refuses a
        # non-contiguous one; both fall through to the general path below.
        try:
            arr = (t.detach() if t.requires_grad else t).numpy()
            return dtype, tuple(t.shape), memoryview(arr).cast("B")
        except (RuntimeError, TypeError, ValueError):
            pass
    if t.layout != torch.strided:
        raise CodecError(f"tensor {name!r}: only dense (strided) tensors can be sent, got layout {t.layout}")
    if dtype is None:
        raise CodecError(f"tensor {name!r}: unsupported dtype {t.dtype} (supported: {', '.join(DTYPES)})")
    shape = tuple(t.shape)
    t = t.detach()
    if t.device.type != "cpu":
        try:
            t = t.cpu()
        except (RuntimeError, NotImplementedError) as e:
            raise CodecError(f"tensor {name!r}: cannot read it on the host ({t.device}): {e}") from e
    t = t.resolve_neg().contiguous()
    if t.numel() == 0:
        return dtype, shape, memoryview(b"")
    # numpy has no bfloat16: its bytes travel through an int16 view.
    arr = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
    return dtype, shape, memoryview(arr).cast("B")


def encode_views(
    bundle: Mapping[str, torch.Tensor],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    checksum: str = DEFAULT_CHECKSUM,
) -> tuple[pb.BundleHeader, Iterator[RawChunk]]:
    """Like :func:`encode`, but the chunks are :class:`RawChunk` s whose data are views of the tensors.

    A chunk that lies inside one tensor is a memoryview of that tensor's storage (no copy); one that spans
    a tensor boundary is the joined bytes of its pieces (a copy of at most ``chunk_bytes``).
    ``frames.chunk_frame_bytes`` serializes such a chunk with a single copy.
    """
    header, views = encode_parts(bundle, chunk_bytes, checksum=checksum)
    return header, _chunks(views, chunk_bytes)


def encode_parts(
    bundle: Mapping[str, torch.Tensor],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    checksum: str = DEFAULT_CHECKSUM,
) -> tuple[pb.BundleHeader, list[memoryview]]:
    """The header of :func:`encode_views` and the payload as flat byte views of the tensors' storage, in payload
    order (empty tensors left out), uncut: what a byte-stream transport (the bulk lane) writes as it is."""
    _check_chunk_bytes(chunk_bytes)
    if checksum not in CHECKSUMS:
        raise CodecError(f"unknown checksum algorithm {checksum!r} (known: {', '.join(CHECKSUMS)})")
    if sys.byteorder != "little":
        raise CodecError("the wire format is little-endian; big-endian hosts are not supported")
    if not isinstance(bundle, Mapping):
        raise CodecError(f"a bundle is a mapping of names to tensors, got {type(bundle).__name__}")
    started = time.perf_counter() if timing.ENABLED else 0.0
    staged = staging.to_host(bundle)  # CUDA tensors: copied into one pinned staging buffer (staging.py)
    if staged is not None:
        bundle = staged
    hasher = CHECKSUMS[checksum]()
    views: list[memoryview] = []
    layout: list[tuple[str, str, tuple[int, ...]]] = []
    total = 0
    for name, tensor in bundle.items():
        if not isinstance(name, str) or not name:
            raise CodecError(f"tensor names must be non-empty strings, got {name!r}")
        if not name.isascii():  # protobuf strings must be UTF-8: a lone surrogate ('\ud800') is not
            try:
                name.encode("utf-8")
            except UnicodeEncodeError as e:
                raise CodecError(f"tensor name {name!r} is not valid UTF-8 ({e.reason})") from None
        dtype, shape, view = _raw_bytes(name, tensor)
        layout.append((name, dtype, shape))
        if view.nbytes:
            hasher.update(view)
            views.append(view)
            total += view.nbytes
    header = pb.BundleHeader()
    header.CopyFrom(_header_template(tuple(layout)))
    header.chunk_bytes = chunk_bytes
    header.checksum_algorithm = checksum
    header.total_bytes = total
    header.checksum = hasher.value()
    if timing.ENABLED:
        timing.add("encode_s", time.perf_counter() - started)
    return header, views


def bundle_header(specs: Iterable[tuple[str, str, tuple[int, ...], int]], chunk_bytes: int, checksum: str,
                  checksum_value: int) -> pb.BundleHeader:
    """The BundleHeader of tensors given as (name, dtype name, shape, nbytes), in payload order.

    The one place a header is built: the encoder calls it, and so does the byte counting of the in-process
    engine (``messages.message_bytes``, with a stand-in checksum value of the same encoded size)."""
    header = pb.BundleHeader(chunk_bytes=chunk_bytes, checksum_algorithm=checksum)
    for name, dtype, shape, nbytes in specs:
        header.tensors.add(name=name, dtype=dtype, shape=shape, nbytes=nbytes)
    header.total_bytes = sum(s[3] for s in specs)
    header.checksum = checksum_value
    return header


def chunk_spans(total_bytes: int, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of each chunk of a payload stream of ``total_bytes`` (what :func:`_chunks` yields)."""
    for offset in range(0, total_bytes, chunk_bytes):
        yield offset, min(chunk_bytes, total_bytes - offset)


_HEADER_CACHE_SIZE = 64
_header_cache: OrderedDict[tuple[tuple[str, str, tuple[int, ...]], ...], pb.BundleHeader] = OrderedDict()
_header_lock = threading.Lock()


def _header_template(layout: tuple[tuple[str, str, tuple[int, ...]], ...]) -> pb.BundleHeader:
    """The tensors part of a header, cached by (name, dtype, shape) of every tensor: a node sends bundles of
    the same few layouts again and again, and building the specs costs a few microseconds per tensor."""
    with _header_lock:
        template = _header_cache.get(layout)
        if template is not None:
            _header_cache.move_to_end(layout)
            return template
    template = pb.BundleHeader()
    for name, dtype, shape in layout:
        template.tensors.add(name=name, dtype=dtype, shape=shape, nbytes=math.prod(shape) * _ITEMSIZE[dtype])
    with _header_lock:
        _header_cache[layout] = template
        if len(_header_cache) > _HEADER_CACHE_SIZE:
            _header_cache.popitem(last=False)
    return template


def chunk_parts(views: list[memoryview], chunk_bytes: int) -> Iterator[tuple[int, list[memoryview]]]:
    """The payload stream of ``views`` cut at ``chunk_bytes``: (offset, the slices of the views that make the
    chunk), never joined (a bulk lane writes them as they are; :func:`_chunks` joins them)."""
    offset = 0
    parts: list[memoryview] = []
    room = chunk_bytes
    for view in views:
        pos, n = 0, view.nbytes
        while pos < n:
            take = min(room, n - pos)
            parts.append(view[pos:pos + take])
            pos += take
            room -= take
            if room == 0:
                yield offset, parts
                offset += chunk_bytes
                parts, room = [], chunk_bytes
    if parts:
        yield offset, parts


def _chunks(views: list[memoryview], chunk_bytes: int) -> Iterator[RawChunk]:
    for offset, parts in chunk_parts(views, chunk_bytes):
        yield RawChunk(offset, parts[0] if len(parts) == 1 else b"".join(parts))


def encode(
    bundle: Bundle,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    checksum: str = DEFAULT_CHECKSUM,
) -> tuple[pb.BundleHeader, Iterator[pb.Chunk]]:
    """Encode ``bundle`` as a header and a lazy iterator of ``pb.Chunk`` messages.

    The header (with the checksum of the whole payload) is computed now; each chunk is built only when the
    iterator reaches it. Raises :class:`CodecError` for a tensor that cannot travel (unsupported dtype,
    sparse layout, not a tensor) or a bad ``chunk_bytes``.
    """
    header, views = encode_views(bundle, chunk_bytes, checksum=checksum)
    return header, (pb.Chunk(offset=c.offset, data=bytes(c.data)) for c in views)


def header_payload_bytes(header: pb.BundleHeader) -> int:
    """The payload (raw tensor bytes) a header announces: what the papers count."""
    return int(header.total_bytes)


# -- decoding ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Slot:
    name: str
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # C-order strides in elements
    start: int  # offset in the payload stream
    nbytes: int
    at: int  # offset in the decode buffer

    @property
    def end(self) -> int:
        return self.start + self.nbytes


ALIGN_SLACK = 64  # the decode buffer may exceed the payload by this much per tensor (alignment), and no more


@dataclass(frozen=True)
class _Layout:
    """A validated header's tensors: where each lies in the payload stream and in the decode buffer."""

    slots: tuple[_Slot, ...]
    total: int  # payload bytes
    size: int  # decode buffer bytes


def _fmt_bytes(n: int) -> str:
    return f"{n} bytes" if n < 1 << 20 else f"{n} bytes ({n / (1 << 20):.1f} MiB)"


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


_LAYOUT_CACHE_SIZE = 64
_layout_cache: OrderedDict[bytes, _Layout] = OrderedDict()
_layout_lock = threading.Lock()


def _layout(header: pb.BundleHeader, max_bytes: int | None) -> _Layout:
    """Validate a header (cached by its bytes, checksum aside: a node receives the same few layouts again and
    again) and check it against ``max_bytes``."""
    if not isinstance(header, pb.BundleHeader):
        raise CodecError(f"expected a BundleHeader, got {type(header).__name__}")
    probe = pb.BundleHeader()
    probe.CopyFrom(header)
    probe.checksum = 0
    key = probe.SerializeToString(deterministic=True)
    with _layout_lock:
        layout = _layout_cache.get(key)
        if layout is not None:
            _layout_cache.move_to_end(key)
    if layout is None:
        layout = _check_header(header)
        with _layout_lock:
            _layout_cache[key] = layout
            if len(_layout_cache) > _LAYOUT_CACHE_SIZE:
                _layout_cache.popitem(last=False)
    # max_bytes bounds the payload; the decode buffer adds at most ALIGN_SLACK bytes per tensor of alignment
    if max_bytes is not None and layout.total > max_bytes:
        raise CodecError(
            f"bundle of {_fmt_bytes(layout.total)} exceeds the limit max_bytes={_fmt_bytes(max_bytes)}"
        )
    return layout


Slot = _Slot
Layout = _Layout


def bundle_layout(header: pb.BundleHeader) -> Layout:
    """A header's tensors, validated: where each lies in the payload stream and in a decode buffer
    (:class:`CodecError` for a header the decoder would refuse)."""
    return _layout(header, None)


def _check_header(header: pb.BundleHeader) -> _Layout:
    if header.checksum_algorithm not in CHECKSUMS:
        raise CodecError(
            f"unknown checksum algorithm {header.checksum_algorithm!r} (known: {', '.join(CHECKSUMS)})"
        )
    slots: list[_Slot] = []
    index: dict[str, int] = {}
    stream = at = 0
    for i, spec in enumerate(header.tensors):
        if not spec.name:
            raise CodecError(f"tensor #{i} has an empty name")
        if spec.name in index:
            raise CodecError(f"duplicate tensor name {spec.name!r} (tensors #{index[spec.name]} and #{i})")
        index[spec.name] = i
        where = f"tensor {spec.name!r} (#{i})"
        if spec.dtype not in DTYPES:
            raise CodecError(f"{where}: unknown dtype {spec.dtype!r} (supported: {', '.join(DTYPES)})")
        shape = tuple(int(d) for d in spec.shape)
        if any(d < 0 for d in shape):
            raise CodecError(f"{where}: negative dimension in shape {list(shape)}")
        itemsize = _ITEMSIZE[spec.dtype]
        nbytes = math.prod(shape) * itemsize
        if spec.nbytes != nbytes:
            raise CodecError(
                f"{where}: header says nbytes={spec.nbytes}, but shape {list(shape)} of {spec.dtype} "
                f"({itemsize} bytes each) is {nbytes} bytes"
            )
        align = 64 if nbytes >= _BIG_TENSOR_BYTES else itemsize
        at = -(-at // align) * align
        slots.append(_Slot(spec.name, spec.dtype, shape, _c_strides(shape), stream, nbytes, at))
        stream += nbytes
        at += nbytes
    if header.total_bytes != stream:
        raise CodecError(f"header says total_bytes={header.total_bytes}, but its tensors add up to {stream}")
    if stream and not 1 <= header.chunk_bytes <= MAX_CHUNK_BYTES:
        raise CodecError(f"header chunk_bytes={header.chunk_bytes} is outside [1, {MAX_CHUNK_BYTES}]")
    return _Layout(tuple(slots), stream, -(-at // 64) * 64)


class BufferStats:
    """Decode buffers alive in this process (bytes) and the most alive at once since :meth:`reset`: what a
    node holds of bundles being received, for tests of memory bounds that are not wall-clock or RSS asserts
    (a buffer counts from its allocation until the last tensor viewing it is freed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.live = 0
        self.peak = 0
        self.allocated = 0  # buffers allocated since reset

    def reset(self) -> None:
        with self._lock:
            self.peak = self.live
            self.allocated = 0

    def _add(self, n: int) -> None:
        with self._lock:
            self.live += n
            self.allocated += 1
            self.peak = max(self.peak, self.live)

    def _sub(self, n: int) -> None:
        with self._lock:
            self.live -= n


BUFFERS = BufferStats()


def allocate(size: int, *, pinned: bool = False) -> np.ndarray:
    """A decode buffer of ``size`` bytes (see :func:`_allocate`), counted in :data:`BUFFERS` while alive; with
    ``pinned``, page-locked where this process moves what it receives to a CUDA device (``staging.decode_buffer``)."""
    buf = staging.decode_buffer(size) if pinned else None
    if buf is None:
        buf = _allocate(size)
    BUFFERS._add(size)
    weakref.finalize(buf, BUFFERS._sub, size)  # torch.from_numpy(buf) keeps buf alive
    return buf


POOL_KEEP = 2  # freed huge decode buffers a process keeps for its next bundles of the same size (0: none)
_pool: list[mmap.mmap] = []  # their mappings, oldest first
_pool_lock = threading.Lock()


def _pooled(size: int) -> mmap.mmap | None:
    """A kept mapping of exactly ``size`` bytes, taken out of the pool, or None."""
    with _pool_lock:
        for i, m in enumerate(_pool):
            if len(m) == size:
                return _pool.pop(i)
    return None


def _keep(m: mmap.mmap) -> None:
    """A huge decode buffer was freed (its last tensor is gone): keep its mapping for the next bundle of its size,
    the newest :data:`POOL_KEEP` at most (an older one is dropped, i.e. unmapped)."""
    with _pool_lock:
        if POOL_KEEP <= 0:
            return
        _pool.append(m)
        del _pool[:-POOL_KEEP]


def release_pool() -> int:
    """Unmap the kept (pageable) decode buffers now; how many bytes they held. The pinned buffers of a GPU node are
    not these (``staging.release`` drops them): the spill calls this at every drop (``engine/spill.py``), and
    re-pinning a buffer each reply would cost what keeping it saves."""
    with _pool_lock:
        held = sum(len(m) for m in _pool)
        _pool.clear()
    return held


def _allocate(size: int) -> np.ndarray:
    """A writable uint8 buffer of ``size`` bytes (a multiple of 64).

    Buffers of at least ``_HUGE_BUFFER_BYTES`` are private anonymous mappings advised to use transparent huge
    pages: the allocator would map fresh 4 KiB pages for them anyway, and the first write to each page
    faults; with 2 MiB pages there are 512 times fewer faults, which is most of the cost of receiving a big
    bundle. The array (and the tensors made from it) keep the mapping alive. When the last decoded tensor is
    freed the mapping is kept for the next buffer of the same size (:data:`POOL_KEEP` at most): a node receives
    the same model every round, and memory mapped afresh costs a page fault and the kernel's zeroing of every
    page (~0.03 CPU s per 100 MB here, more where the host took freed pages back); its contents are overwritten
    by the next bundle before any tensor reads them. A kept buffer is memory the process holds between rounds,
    never more than it held at once while the buffer was in use. Smaller buffers come from numpy's allocator:
    a numpy call costs a fraction of a torch call, which matters for small bundles.
    """
    if size >= 1 << 63:
        raise OverflowError("larger than any address space")
    if size >= _HUGE_BUFFER_BYTES and _MADV_HUGEPAGE is not None:
        m = _pooled(size)
        if m is None:
            m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            with contextlib.suppress(OSError):  # a kernel without THP: plain pages, same contents
                m.madvise(_MADV_HUGEPAGE)
        buf = np.frombuffer(m, dtype=np.uint8)
        weakref.finalize(buf, _keep, m)
        return buf
    raw = np.empty(size + 64, dtype=np.uint8)  # numpy aligns to 16 bytes; big tensors start at 64
    start = -raw.ctypes.data % 64
    return raw[start:start + size]


def _byte_view(data: object) -> memoryview:
    try:
        view = memoryview(data)  # type: ignore[arg-type]
        if not view.c_contiguous:
            raise ValueError("not contiguous")
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except (TypeError, ValueError) as e:
        what = type(data).__name__
        raise CodecError(f"chunk data must be a contiguous bytes-like object, got {what}") from e


class BundleDecoder:
    """Incremental decoder: validate the header, preallocate one buffer, copy each chunk into place.

    Every problem raises :class:`CodecError` and leaves the decoder failed (its buffer released); later
    calls raise too. ``feed`` checks each chunk against the header before copying a byte, so a malformed
    stream can neither write out of bounds nor make the decoder wait for more than was announced.

    With a ``sink`` (:class:`PayloadSink`) the decoder allocates no buffer: each piece goes to
    ``sink.write`` after the same checks, ``finish`` returns ``sink.finish()`` once length and checksum are
    right, and a failure (or :meth:`abandon`) calls ``sink.abort()``.
    """

    def __init__(self, header: pb.BundleHeader, *, max_bytes: int | None = None,
                 sink: PayloadSink | None = None) -> None:
        layout = _layout(header, max_bytes)
        self._slots = layout.slots
        self._total = layout.total
        self._chunk_bytes = int(header.chunk_bytes)
        self._algorithm = header.checksum_algorithm
        self._expected = int(header.checksum)
        self._hasher = CHECKSUMS[self._algorithm]()
        self._sink = sink
        self._buf: np.ndarray | None = None
        self._view: memoryview | None = None
        if sink is None:
            try:
                self._buf = allocate(layout.size, pinned=True)
            except (ValueError, MemoryError, OverflowError, OSError) as e:
                raise CodecError(f"cannot allocate {_fmt_bytes(layout.size)} to decode the bundle: {e}") from e
            self._view = memoryview(self._buf)
        self._received = 0
        self._slot = 0  # first slot not yet complete
        self._state = "open"

    @staticmethod
    def check_header(header: pb.BundleHeader, *, max_bytes: int | None = None) -> None:
        """Raise the :class:`CodecError` the constructor would raise for this header, allocating nothing."""
        _layout(header, max_bytes)

    @property
    def total_bytes(self) -> int:
        return self._total

    @property
    def received_bytes(self) -> int:
        return self._received

    @property
    def complete(self) -> bool:
        """All announced payload bytes have arrived (``finish`` still verifies the checksum)."""
        return self._state == "open" and self._received == self._total

    def _fail(self, message: str) -> CodecError:
        self._state = "failed"
        self._release()
        if self._sink is not None:
            sink, self._sink = self._sink, None
            sink.abort()
        return CodecError(message)

    def _release(self) -> None:
        if self._view is not None:
            self._view.release()
        self._buf = self._view = None

    def abandon(self) -> None:
        """Give the bundle up (its stream ended or no longer matters): release the buffer, abort the sink."""
        if self._state == "open":
            self._fail("abandoned")
            self._state = "abandoned"

    def _check_open(self) -> None:
        if self._state != "open":
            raise CodecError(f"the decoder has {self._state}; it accepts nothing more")

    def feed(self, chunk: ChunkLike) -> None:
        """Copy one chunk into place. Chunks must arrive in order, each of the size the header implies."""
        if timing.ENABLED:
            started = time.perf_counter()
            try:
                return self._feed(chunk)
            finally:
                timing.add("decode_s", time.perf_counter() - started)
        return self._feed(chunk)

    def _feed(self, chunk: ChunkLike) -> None:
        self._check_open()
        try:
            offset, data = int(chunk.offset), _byte_view(chunk.data)
        except CodecError as e:  # before ValueError: CodecError is one
            raise self._fail(str(e)) from e
        except (AttributeError, TypeError, ValueError) as e:
            what = type(chunk).__name__
            raise self._fail(f"expected a chunk with an int offset and data, got {what}") from e
        n, got = data.nbytes, self._received
        if offset != got:
            what = "a gap" if offset > got else "a repeated or overlapping chunk"
            what += "; chunks must come in order"
            raise self._fail(f"chunk at offset {offset}, expected offset {got} ({what})")
        if offset + n > self._total:
            raise self._fail(
                f"chunk past the end: {n} bytes at offset {offset} run past the bundle's {self._total} bytes"
            )
        want = min(self._chunk_bytes, self._total - offset)
        if n != want:
            raise self._fail(
                f"chunk at offset {offset} carries {n} bytes, expected {want} (header chunk_bytes="
                f"{self._chunk_bytes}, total_bytes={self._total})"
            )
        dst, sink = self._view, self._sink
        update = self._hasher.update
        # Copy and hash piece by piece, each piece hashed right after its copy while it is still in cache.
        pos, i, slots = 0, self._slot, self._slots
        while pos < n:
            slot = slots[i]
            at = got + pos  # stream position
            if at >= slot.start + slot.nbytes:
                i += 1
                continue
            k = min(slot.start + slot.nbytes - at, n - pos, _PIECE_BYTES)
            piece = data[pos:pos + k] if k != n else data
            update(piece)
            if sink is not None:
                sink.write(i, at - slot.start, piece)
            else:
                assert dst is not None
                b = slot.at + (at - slot.start)
                dst[b:b + k] = piece
            pos += k
        self._slot = i
        self._received = got + n

    def fill(self, recv_into: Callable[[memoryview], int]) -> None:
        """Receive the rest of the payload straight into the decode buffer, for a transport that carries it as
        a plain byte stream rather than chunk frames (e.g. ``fill(sock.recv_into)``): no copy besides the
        receive itself, each piece hashed right after it lands.

        ``recv_into(view)`` writes at most ``len(view)`` bytes at the start of ``view`` and returns how many;
        0 means the stream ended, which fails the decoder with the truncation message of :meth:`finish`.

        Each piece (at most ``_PIECE_BYTES``, inside one tensor) is filled whole before it is hashed and handed
        on, however short the reads (a lane's reads end at its chunk frames): one checksum update and one
        ``sink.write`` per piece. With a sink, a piece lands where the sink's ``target`` says (the fresh buffer
        of a fold's first reply: no copy), else in a scratch buffer the sink reads it from.
        """
        self._check_open()
        sink = self._sink
        target = getattr(sink, "target", None) if sink is not None else None
        scratch = None if sink is None else memoryview(bytearray(min(_PIECE_BYTES, self._total) or 1))
        dst = self._view
        update = self._hasher.update
        slots, i = self._slots, self._slot
        while self._received < self._total:
            slot = slots[i]
            got = self._received
            if got >= slot.start + slot.nbytes:
                i += 1
                continue
            k = min(slot.start + slot.nbytes - got, _PIECE_BYTES)
            if sink is None:
                assert dst is not None
                b = slot.at + (got - slot.start)
                piece = dst[b:b + k]
            else:
                assert scratch is not None
                into = target(i, got - slot.start, k) if target is not None else None
                piece = into if into is not None else scratch[:k]
            n = 0
            while n < k:
                try:
                    r = recv_into(piece[n:] if n else piece)
                except OSError as e:
                    raise self._fail(f"receiving the payload at offset {got + n} failed: {e}") from e
                if not isinstance(r, int) or not 0 <= r <= k - n:
                    raise self._fail(f"recv_into returned {r!r} for a {k - n}-byte view at offset {got + n}")
                if r == 0:
                    break
                n += r
            if n < k:  # the stream ended inside the piece: not handed to the sink (it would only be undone)
                self._received = got + n
                self._slot = i
                self.finish()  # raises the truncation error and fails the decoder
            update(piece)
            if sink is not None:
                sink.write(i, got - slot.start, piece)
            self._received = got + n
        self._slot = i

    def finish(self) -> Bundle:
        """The decoded bundle (tensors are views of the one buffer), after checking length and checksum."""
        self._check_open()
        if self._received < self._total:
            short = [s for s in self._slots if s.end > self._received and s.nbytes]
            detail = ", ".join(
                f"{s.name!r} has {max(0, self._received - s.start)} of {s.nbytes} bytes" for s in short[:3]
            )
            more = f" and {len(short) - 3} more" if len(short) > 3 else ""
            raise self._fail(
                f"truncated bundle: received {self._received} of {self._total} bytes; incomplete tensors: "
                f"{detail}{more}"
            )
        if self._algorithm != "none":
            value = self._hasher.value()
            if value != self._expected:
                raise self._fail(
                    f"checksum mismatch ({self._algorithm}): header says {self._expected:#018x}, "
                    f"payload hashes to {value:#018x}"
                )
        if self._sink is not None:
            sink, self._sink = self._sink, None
            self._state = "finished"
            return sink.finish()
        assert self._buf is not None
        buf = torch.from_numpy(self._buf)
        out: Bundle = {}
        typed: dict[str, torch.Tensor] = {}  # the whole buffer viewed as each dtype (its size is a multiple of 64)
        for s in self._slots:
            if s.nbytes == 0:
                out[s.name] = torch.empty(s.shape, dtype=DTYPES[s.dtype])
                continue
            base = typed.get(s.dtype)
            if base is None:
                base = typed[s.dtype] = buf.view(DTYPES[s.dtype])
            out[s.name] = base.as_strided(s.shape, s.strides, s.at // _ITEMSIZE[s.dtype])
        self._state = "finished"
        self._release()
        return out


def decode(header: pb.BundleHeader, chunks: Iterable[ChunkLike], *, max_bytes: int | None = None) -> Bundle:
    """Decode a whole chunk stream; :class:`CodecError` on any problem (see :class:`BundleDecoder`)."""
    decoder = BundleDecoder(header, max_bytes=max_bytes)
    for chunk in chunks:
        decoder.feed(chunk)
    return decoder.finish()
