"""Messages of the fedhop wire protocol: a Task or Result frame plus its bundle, built and counted by ONE
implementation for both engines.

A *message* is one Task or Result frame followed, when it has a bundle, by the bundle's frames, all under
one call id. Its *message bytes* (the byte meter's second level) are the serialized sizes of those frames.
The networked engine sends what :func:`task_frame` / :func:`result_frame` / :func:`message_frames` build;
the in-process engine counts :func:`message_bytes`, which builds the same head frames with the same
functions and sizes the bundle frames with the codec's own header builder (``codec.bundle_header``) and the
framing's own chunk-head encoder (``framing.chunk_frame_head``), without encoding the payload. Two choices
make the size a function of (kind, phase, bundle, scalars, chunk_bytes) alone:

* call ids are drawn from [CALL_ID_BASE, 2**63), whose varints are all 9 bytes long;
* the round travels as args[ROUND_ARG], a double (a oneof member is serialized even when 0.0), and every
  Task carries a non-zero deadline_s (a double, 8 bytes).

Session frames (Hello, Welcome, Ready, Bye, keep-alives) are set-up and tear-down, not messages; Report
frames (``control.py``) are counted under their own kind.

A message whose payload is small (at most :data:`BATCH_MAX_BYTES`, and one chunk) is sent as ONE Batch frame
holding its head, header and chunk frames (:meth:`BundleMessage.__iter__`, ``framing.batch_frame_bytes``): one
gRPC message instead of three, whose message bytes are still those of the frames in it (the batch around them is
framing, not counted), so this module's counts do not depend on it.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from fedhop.common import timing
from fedhop.common.wire import staging
from fedhop.common.wire.budget import InflightBudget
from fedhop.common.wire.codec import (
    DEFAULT_CHECKSUM,
    DTYPES,
    MAX_CHUNK_BYTES,
    BundleDecoder,
    CodecError,
    PayloadSink,
    _chunks,
    bundle_header,
    chunk_parts,
    chunk_spans,
    encode_parts,
)
from fedhop.common.wire.framing import (
    BadFrame,
    BatchBytes,
    ChunkFrame,
    _frames,
    batch_frame_bytes,
    chunk_frame_head,
    frame_size,
)
from fedhop.common.wire.scalars import put_scalars
from fedhop.v1 import fedhop_pb2 as pb

PROTOCOL_VERSION = 2  # 2: the Batch frame (a small message's frames in one gRPC message)
CALL_ID_BASE = 1 << 56
POST_ID_BASE = 1 << 60  # a child numbers its Posts to its parent from here (never a call id of the parent)
ROUND_ARG = "_round"
HANDOFF = "handoff"
DESCRIBE = "describe"
MIN_DEADLINE_S = 1e-3  # a Task's deadline_s is never 0 (0 would change its encoded size)

_DTYPE_NAME = {v: k for k, v in DTYPES.items()}

BATCH_ENV = "FEDHOP_BATCH_MAX_BYTES"
DEFAULT_BATCH_MAX_BYTES = 64 << 10


def batch_max_bytes(env: Mapping[str, str]) -> int:
    """The largest payload whose message is sent as one Batch frame, from ``env``'s :data:`BATCH_ENV` (unset or
    empty: :data:`DEFAULT_BATCH_MAX_BYTES`; 0: never batch); ValueError naming the variable for anything but a
    whole number of bytes >= 0."""
    raw = env.get(BATCH_ENV, "").strip()
    if not raw:
        return DEFAULT_BATCH_MAX_BYTES
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{BATCH_ENV}={raw!r}: expected a whole number of bytes (0: never batch), "
                         f"default {DEFAULT_BATCH_MAX_BYTES}") from None
    if n < 0:
        raise ValueError(f"{BATCH_ENV}={raw!r}: expected a whole number of bytes >= 0 (0: never batch)")
    return n


# read once, when the process starts (a bad value stops it at once, naming the variable); tests may patch it
BATCH_MAX_BYTES = batch_max_bytes(os.environ)


def task_frame(call_id: int, name: str, args: Mapping[str, object], *, deadline_s: float,
               has_bundle: bool, round_idx: int | None = None) -> pb.Frame:
    """The Task frame of a request; ``round_idx`` (the sender's round) travels as ``args[ROUND_ARG]``;
    ``deadline_s`` is the receiver's budget from receipt (clamped to at least :data:`MIN_DEADLINE_S`)."""
    f = pb.Frame(call_id=call_id)
    f.task.name = name
    put_scalars(f.task.args, args)
    if round_idx is not None:
        f.task.args[ROUND_ARG].CopyFrom(pb.Scalar(double_value=float(round_idx)))
    f.task.has_bundle = has_bundle
    f.task.deadline_s = max(float(deadline_s), MIN_DEADLINE_S)
    return f


def post_frame(call_id: int, name: str, args: Mapping[str, object], *, has_bundle: bool, round_idx: int) -> pb.Frame:
    """The Post frame of a child's unprompted message to its parent (``Comm.post``)."""
    f = pb.Frame(call_id=call_id)
    f.post.name = name
    put_scalars(f.post.args, args)
    f.post.has_bundle = has_bundle
    f.post.round = round_idx
    return f


def post_bytes(kind: str, bundle: Mapping[str, torch.Tensor], scalars: Mapping[str, object], chunk_bytes: int,
               *, up: bool, round_idx: int) -> int:
    """Exact serialized bytes of one post as the networked engine sends it: to the parent (``up``) a Post frame
    on the session stream; to a neighbour a Task frame (name ``kind``, args ``scalars``, no round: the round
    travels in metadata) on an ``Edge.HandOff`` stream, answered by an Ack (:func:`message_bytes` ``handoff``
    ``reply``). Either way followed by the bundle's frames."""
    has = bool(bundle)
    cid = POST_ID_BASE if up else CALL_ID_BASE
    head = post_frame(cid, kind, scalars, has_bundle=has, round_idx=round_idx) if up else \
        task_frame(cid, kind, scalars, deadline_s=1.0, has_bundle=has)
    return head.ByteSize() + (bundle_frames_bytes(cid, bundle, chunk_bytes) if has else 0)


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


class BundleMessage:
    """A message with a bundle, ready to send: iterating it yields ``head``, the bundle's header frame and its chunk
    frames (built lazily from the tensors' storage, once), or, when the payload is small (:attr:`batched`), ONE
    Batch frame holding all three (:meth:`batch`). A transport with a bulk lane (``transport/lane.py``) sends only
    :meth:`control_frames` on the stream and writes :meth:`lane_buffers` (the chunk frames) on the lane (a payload
    the lane carries is never batched: the caller asks the lane first); :attr:`message_bytes` counts all the
    frames, so the byte meter counts the same every way.
    """

    def __init__(self, head: pb.Frame, header: pb.BundleHeader, views: list[memoryview], chunk_bytes: int) -> None:
        self.head = head
        self.header = header
        self.views = views
        self.chunk_bytes = chunk_bytes

    def __iter__(self) -> Iterator[pb.Frame | bytes | BatchBytes]:
        if self.batched:
            yield self.batch()
            return
        yield self.head
        yield from _frames(self.head.call_id, self.header, _chunks(self.views, self.chunk_bytes), True)

    @property
    def batched(self) -> bool:
        """Whether this message travels as one Batch frame: its payload is at most :data:`BATCH_MAX_BYTES` (0:
        never) and one chunk (at most ``chunk_bytes``)."""
        n = self.payload_bytes
        return n <= BATCH_MAX_BYTES and n <= self.chunk_bytes

    def batch(self) -> BatchBytes:
        """The message's frames (head, header, chunk) as one serialized Batch frame, built with one copy of the
        payload (the chunk's data is joined straight from the tensors' memory); its ``size`` is
        :attr:`message_bytes`."""
        started = time.perf_counter() if timing.ENABLED else 0.0
        cid = self.head.call_id
        parts: list[list[bytes | memoryview]] = [
            [self.head.SerializeToString()], [pb.Frame(call_id=cid, header=self.header).SerializeToString()]]
        for offset, views in chunk_parts(self.views, self.chunk_bytes):
            parts.append([chunk_frame_head(cid, offset, sum(v.nbytes for v in views)), *views])
        out = batch_frame_bytes(parts)
        if timing.ENABLED:
            timing.add("encode_s", time.perf_counter() - started)
        return out

    def lane_buffers(self) -> Iterator[list[bytes | memoryview]]:
        """The chunk frames of the payload as buffers, one list per chunk: the frame's head (the bytes before its
        data, :func:`chunk_frame_head`) and views of the tensors' memory: what a bulk lane writes, so that it
        carries the very bytes the chunk frames would have (never joined into one buffer)."""
        cid = self.head.call_id
        for offset, parts in chunk_parts(self.views, self.chunk_bytes):
            yield [chunk_frame_head(cid, offset, sum(v.nbytes for v in parts)), *parts]

    def control_frames(self) -> list[pb.Frame]:
        """What travels on the stream when the payload goes on a lane: ``head`` and the header frame."""
        return [self.head, pb.Frame(call_id=self.head.call_id, header=self.header)]

    @property
    def payload_bytes(self) -> int:
        return int(self.header.total_bytes)

    @property
    def message_bytes(self) -> int:
        """The serialized bytes of all the message's frames (those :meth:`__iter__` yields), without building them."""
        cid = self.head.call_id
        return (self.head.ByteSize() + pb.Frame(call_id=cid, header=self.header).ByteSize()
                + chunk_frames_bytes(cid, self.payload_bytes, self.chunk_bytes))


def chunk_frames_bytes(call_id: int, total_bytes: int, chunk_bytes: int) -> int:
    """Serialized size of the chunk frames of a ``total_bytes`` payload cut at ``chunk_bytes``."""
    return sum(len(chunk_frame_head(call_id, offset, n)) + n for offset, n in chunk_spans(total_bytes, chunk_bytes))


@dataclass(frozen=True)
class EncodedBundle:
    """A bundle's header and payload views (:func:`~fedhop.common.wire.codec.encode_parts`), computed once and
    shared by every message that sends that bundle (the calls of one scatter: ``CallTable.call``). Nothing
    mutates either: a message's header frame is a copy of ``header`` under its own call id, and its chunk frames
    (or a bulk lane's buffers) are read from ``views``, which refer to the tensors' memory."""

    header: pb.BundleHeader
    views: list[memoryview]
    chunk_bytes: int


def encode_bundle(bundle: Mapping[str, torch.Tensor], chunk_bytes: int) -> EncodedBundle:
    """``bundle`` encoded for :func:`message_frames` (header and checksum now; CodecError for a bundle that
    cannot travel)."""
    header, views = encode_parts(bundle, chunk_bytes)
    return EncodedBundle(header, views, chunk_bytes)


def message_frames(head: pb.Frame, bundle: Mapping[str, torch.Tensor], chunk_bytes: int,
                   encoded: EncodedBundle | None = None) -> list[pb.Frame] | BundleMessage:
    """``head`` (a Task or Result frame) then, when ``bundle`` is not empty, its frames (lazily): a
    :class:`BundleMessage`, whose header is computed now (a bundle that cannot travel raises CodecError here).
    ``encoded``: ``bundle`` already encoded at ``chunk_bytes`` (:func:`encode_bundle`), shared, not encoded again."""
    if not bundle:
        return [head]
    if encoded is None:
        encoded = encode_bundle(bundle, chunk_bytes)
    elif encoded.chunk_bytes != chunk_bytes:
        raise ValueError(f"the bundle was encoded at chunk_bytes={encoded.chunk_bytes}, not {chunk_bytes}")
    return BundleMessage(head, encoded.header, encoded.views, chunk_bytes)


def bundle_frames_bytes(call_id: int, bundle: Mapping[str, torch.Tensor], chunk_bytes: int) -> int:
    """Serialized size of a bundle's header frame and chunk frames, without encoding the payload."""
    specs = []
    for name, t in bundle.items():
        if t.dtype not in _DTYPE_NAME:
            raise CodecError(f"unsupported dtype {t.dtype} (supported: {', '.join(DTYPES)})")
        specs.append((name, _DTYPE_NAME[t.dtype], tuple(t.shape), t.numel() * t.element_size()))
    # a stand-in checksum value: fixed64, so its encoded size does not depend on the value (unless 0)
    header = bundle_header(specs, chunk_bytes, DEFAULT_CHECKSUM, 1)
    size = pb.Frame(call_id=call_id, header=header).ByteSize()
    return size + chunk_frames_bytes(call_id, int(header.total_bytes), chunk_bytes)


def message_bytes(kind: str, phase: str, bundle: Mapping[str, torch.Tensor], scalars: Mapping[str, object],
                  chunk_bytes: int) -> int:
    """Exact serialized bytes of one message as the networked engine sends it (docs/design.md section 6).

    * a task (any other ``kind``): request = Task frame (args = ``scalars`` + the round) + bundle frames;
      reply = Result frame (``scalars``) + bundle frames;
    * ``handoff``: request = Task frame (name "handoff", args = ``scalars``) + bundle frames; reply = Ack;
    * ``describe``: request = DescribeRequest (the asker travels in metadata); reply = DescribeReply.
    """
    if kind == DESCRIBE:
        if phase == "request":
            return pb.DescribeRequest().ByteSize()
        return describe_reply(scalars).ByteSize()
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
    return head.ByteSize() + (bundle_frames_bytes(CALL_ID_BASE, bundle, chunk_bytes) if has else 0)


def describe_reply(facts: Mapping[str, object]) -> pb.DescribeReply:
    """``Edge.Describe``'s answer: an edge's public facts."""
    r = pb.DescribeReply()
    put_scalars(r.info, facts)
    return r


TensorShape = tuple[str, str, tuple[int, ...]]  # (name, dtype name, shape) of one tensor a bundle must hold


def bundle_shapes(expect: Mapping[str, torch.Tensor]) -> tuple[TensorShape, ...]:
    """What a bundle must hold to match ``expect`` (its names in order, dtypes, shapes): what a receiver checks
    a bundle header against before it reads the bundle (:func:`header_mismatch`)."""
    return tuple((k, _DTYPE_NAME.get(v.dtype, str(v.dtype)), tuple(v.shape)) for k, v in expect.items())


def header_mismatch(header: pb.BundleHeader, expect: tuple[TensorShape, ...]) -> str | None:
    """Why a bundle announced by ``header`` cannot be what ``expect`` says (None: it can), worded as the engines'
    check of a whole bundle words it (``common/engine/base.py``'s ``check_bundle``)."""
    got = [(t.name, t.dtype, tuple(int(d) for d in t.shape)) for t in header.tensors]
    names, want = [g[0] for g in got], [e[0] for e in expect]
    if names != want:
        missing = [k for k in want if k not in names]
        extra = [k for k in names if k not in want]
        return f"tensor names differ: missing {missing}, unexpected {extra}"
    for (name, dtype, shape), (_, want_dtype, want_shape) in zip(got, expect, strict=True):
        if shape != want_shape:
            return f"tensor {name!r} has shape {shape}, expected {want_shape}"
        if dtype != want_dtype:
            return f"tensor {name!r} has dtype {_torch_name(dtype)}, expected {_torch_name(want_dtype)}"
    return None


def _torch_name(dtype: str) -> str:
    """A wire dtype name as torch prints it (``float32`` -> ``torch.float32``), as ``check_bundle`` words it."""
    return str(DTYPES[dtype]) if dtype in DTYPES else dtype


# -- reading messages --------------------------------------------------------------------------------------


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


class BodyLane(Protocol):
    """Where the payloads of a session's bundles arrive when they do not come on the stream (the bulk lane,
    ``transport/lane.py``): a byte stream carrying, in the order of their header frames, the chunk frames of every
    bundle it :meth:`carries` (the bytes the stream would have carried, :meth:`BundleMessage.lane_buffers`)."""

    def carries(self, total_bytes: int) -> bool: ...

    def recv_into(self, view: memoryview) -> int: ...

    def drain(self, nbytes: int) -> None: ...

    def fail(self, why: str, *, notify: bool = True) -> None: ...


def _drain(lane: BodyLane, cid: int, header: pb.BundleHeader) -> None:
    """Drop the chunk frames of a bundle refused at its header from ``lane`` (it stays in step)."""
    total, cb = int(header.total_bytes), int(header.chunk_bytes)
    if total and not 1 <= cb <= MAX_CHUNK_BYTES:  # no sender of ours cuts so: the lane cannot be kept in step
        lane.fail(f"a bundle header with chunk_bytes={cb} announced a payload on the lane", notify=False)
        return
    lane.drain(chunk_frames_bytes(cid, total, cb) if total else 0)


class _ChunkReader:
    """``recv_into`` for :meth:`BundleDecoder.fill` over a lane's chunk frames of one call: each frame's head is
    read and checked (this call's id, the next offset, the expected length: a lane out of step fails here, before
    a wrong byte lands), and only the data reaches the decode buffer."""

    def __init__(self, lane: BodyLane, call_id: int, total: int, chunk_bytes: int) -> None:
        self.lane = lane
        self.call_id = call_id
        self.total = total
        self.chunk_bytes = chunk_bytes
        self.pos = 0  # payload bytes read
        self.left = 0  # data bytes left in the current chunk frame

    def recv_into(self, view: memoryview) -> int:
        if self.left == 0:
            n = min(self.chunk_bytes, self.total - self.pos)
            want = chunk_frame_head(self.call_id, self.pos, n)
            got = bytearray(len(want))
            at = 0
            while at < len(want):
                k = self.lane.recv_into(memoryview(got)[at:])
                if k == 0:
                    return 0  # the lane ended: the decoder reports the truncation
                at += k
            if bytes(got) != want:
                raise OSError(f"the lane is out of step: expected the chunk frame of call {self.call_id} at "
                              f"offset {self.pos}")
            self.left = n
        k = self.lane.recv_into(view[:min(len(view), self.left)])
        self.pos += k
        self.left -= k
        return k


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

    Hostile input is bounded before anything is allocated: ``accept(head)`` (the receiver's rule, e.g. "a
    Result only for a call sent to this peer and still pending") may refuse a Task/Result frame, which raises
    FrameError; so does that call's bundle header, at once and before anything is reserved or allocated (a
    header needs an accepted head of its call that announced a bundle, and gets it once), and the call's
    chunks are then dropped unread, without a word each; ``budget`` caps the bundles and announced bytes in
    flight (a header over the cap fails its message); ``max_bytes`` caps one bundle (checked by the decoder
    before it allocates). ``expect(call_id)``: what that call's bundle must hold (names, dtypes, shapes; None:
    anything); a header announcing something else fails its message at once, before anything is reserved or
    allocated, and the call's chunks are dropped unread (a 512 MiB reply of the wrong shape is never buffered).
    ``sink(head, header)``: where that bundle's payload goes instead of a decode buffer (a
    :class:`~fedhop.common.wire.codec.PayloadSink`, e.g. a fold that adds it into an aggregate chunk by chunk;
    None: decode it); asked once the header passed every check above, and the sink is aborted when the bundle
    fails or is abandoned.

    ``lane`` (a :class:`BodyLane`, set once the session's lane is up): the chunk frames of a bundle the lane
    carries are read from it right after its header frame (their data into the decode buffer or the sink, every
    check above made first, each frame's head checked) and counted as if they had come on the stream. A header
    refused for any reason has its chunk frames read and dropped (the lane stays in step); a lane that ends or
    is out of step mid-payload fails the message and the lane (the session's reader then ends the session, as
    with a broken stream).
    """

    DROPPED_KEPT = 4096  # dropped call ids remembered (their stray frames are ignored, not complained about)

    def __init__(self, max_bytes: int | None = None, *, budget: InflightBudget | None = None,
                 accept: Callable[[pb.Frame], str | None] | None = None,
                 expect: Callable[[int], tuple[TensorShape, ...] | None] | None = None,
                 sink: Callable[[pb.Frame, pb.BundleHeader], PayloadSink | None] | None = None) -> None:
        self.max_bytes = max_bytes
        self.budget = budget
        self.accept = accept
        self.expect = expect
        self.sink = sink
        self.lane: BodyLane | None = None
        self._open: dict[int, tuple[pb.Frame, int, BundleDecoder | None]] = {}
        self._reserved: dict[int, int] = {}
        self._dropped: OrderedDict[int, None] = OrderedDict()
        self._refused: OrderedDict[int, str] = OrderedDict()  # calls whose head was refused: why (for the header)

    def _drop(self, cid: int) -> None:
        self._dropped[cid] = None
        self._dropped.move_to_end(cid)
        while len(self._dropped) > self.DROPPED_KEPT:
            self._dropped.popitem(last=False)

    def _unreserve(self, cid: int) -> None:
        n = self._reserved.pop(cid, None)
        if n is not None and self.budget is not None:
            self.budget.release(n)

    def feed(self, frame: pb.Frame | ChunkFrame | BadFrame) -> Message | None:
        if isinstance(frame, BadFrame):
            raise FrameError(f"malformed frame: {frame.error}")
        size = frame_size(frame)
        if isinstance(frame, ChunkFrame):
            return self._chunk(frame.call_id, frame, size)
        body = frame.WhichOneof("body")
        cid = frame.call_id
        if body in ("task", "result", "post"):
            if cid == 0:
                raise FrameError(f"{body} frame without a call id")
            if cid in self._open:
                raise FrameError(f"second {body} frame for call {cid} while its bundle arrives", cid)
            refused = self.accept(frame) if self.accept is not None else None
            if refused is not None:
                self._drop(cid)
                self._refused[cid] = refused
                while len(self._refused) > self.DROPPED_KEPT:
                    self._refused.popitem(last=False)
                raise FrameError(refused, cid)
            self._dropped.pop(cid, None)
            self._refused.pop(cid, None)
            has = {"task": frame.task, "result": frame.result, "post": frame.post}[body].has_bundle
            if not has:
                return Message(cid, frame, {}, 0, size)
            self._open[cid] = (frame, size, None)
            return None
        if body == "header":
            lane = self.lane
            if lane is None or not lane.carries(int(frame.header.total_bytes)):
                return self._header(cid, frame, size)
            try:
                msg = self._header(cid, frame, size)
            except FrameError:
                _drain(lane, cid, frame.header)
                raise
            opened = self._open.get(cid)
            if msg is not None or opened is None or opened[2] is None:  # refused or failed: its payload is dropped
                _drain(lane, cid, frame.header)
                return msg
            return self._from_lane(cid, lane, int(frame.header.chunk_bytes))
        if body == "chunk":
            return self._chunk(cid, frame.chunk, size)
        raise FrameError(f"unexpected {body or 'empty'} frame", cid)

    def _from_lane(self, cid: int, lane: BodyLane, chunk_bytes: int) -> Message:
        """Read call ``cid``'s payload from ``lane`` into its decoder; the message is complete (or failed) after."""
        head, n, dec = self._open[cid]
        assert dec is not None
        self._open[cid] = (head, n + chunk_frames_bytes(cid, dec.total_bytes, chunk_bytes), dec)
        try:
            dec.fill(_ChunkReader(lane, cid, dec.total_bytes, chunk_bytes).recv_into)
        except CodecError as e:
            if dec.received_bytes < dec.total_bytes:  # the lane ended or broke mid-payload: it is out of step
                lane.fail(str(e), notify=False)  # the session's reader ends the session once this message is handled
            return self._fail(cid, f"bad bundle: {e}")
        return self._maybe_done(cid)

    def _header(self, cid: int, frame: pb.Frame, size: int) -> Message | None:
        """A header frame (its payload comes as chunk frames or, read by the caller, on the lane)."""
        why = self._refused.pop(cid, None)
        if why is not None:  # refused at once, before any reservation; its chunks are dropped unread
            raise FrameError(f"bundle header for call {cid} refused ({why}); its chunks are dropped unread", cid)
        if cid in self._dropped:
            return None
        if cid not in self._open:  # a call never opened here, or closed: refused, its chunks dropped unread
            self._drop(cid)
            raise FrameError(f"bundle header for call {cid}, which announced no bundle", cid)
        if self._open[cid][2] is not None:
            raise FrameError(f"second bundle header for call {cid}", cid)
        head, n, _ = self._open[cid]
        shapes = self.expect(cid) if self.expect is not None else None
        wrong = header_mismatch(frame.header, shapes) if shapes is not None else None
        if wrong is not None:  # before any reservation or allocation; its chunks are dropped unread
            return self._fail(cid, f"bundle refused at its header, before its bytes were read: {wrong}")
        claimed = int(frame.header.total_bytes)
        if self.max_bytes is not None and claimed > self.max_bytes:  # before any reservation or allocation
            return self._fail(cid, f"bad bundle header: bundle of {claimed} bytes exceeds the limit "
                                   f"max_bytes={self.max_bytes}")
        if self.budget is not None:
            why = self.budget.reserve(claimed)
            if why is not None:
                return self._fail(cid, f"bundle refused: {why}")
            self._reserved[cid] = claimed
        try:
            BundleDecoder.check_header(frame.header, max_bytes=self.max_bytes)
            sink = self.sink(head, frame.header) if self.sink is not None else None
            dec = BundleDecoder(frame.header, max_bytes=self.max_bytes, sink=sink)
        except CodecError as e:
            return self._fail(cid, f"bad bundle header: {e}")
        self._open[cid] = (head, n + size, dec)
        return self._maybe_done(cid) if dec.total_bytes == 0 else None

    def _chunk(self, cid: int, chunk: object, size: int) -> Message | None:
        if cid in self._dropped:
            return None
        if cid not in self._open or self._open[cid][2] is None:
            if cid not in self._open:
                self._drop(cid)  # one complaint per call: its later chunks are dropped unread
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
        self._unreserve(cid)
        assert dec is not None
        try:
            bundle = dec.finish()
        except CodecError as e:
            self._drop(cid)
            return Message(cid, head, {}, dec.total_bytes, n, f"bad bundle: {e}")
        return Message(cid, head, bundle, dec.total_bytes, n)

    def _fail(self, cid: int, why: str) -> Message:
        head, n, dec = self._open.pop(cid)
        if dec is not None:
            dec.abandon()
        self._unreserve(cid)
        self._drop(cid)
        return Message(cid, head, {}, 0, n, why)

    def abandon(self, cid: int) -> None:
        """Forget a call whose frames no longer matter (e.g. a late reply)."""
        opened = self._open.pop(cid, None)
        if opened is not None and opened[2] is not None:
            opened[2].abandon()
        self._unreserve(cid)
        self._drop(cid)

    def close(self) -> None:
        """The stream ended: release every bundle still arriving (its buffer and its budget)."""
        for cid in list(self._open):
            self.abandon(cid)

    @property
    def open_bundles(self) -> int:
        return len(self._open)


# -- bundles at the edges of the wire ---------------------------------------------------------------------


def on_host(bundle: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``bundle`` on the CPU, without a copy for tensors already there.

    The codec streams chunks lazily from the tensors' storage, so a bundle must not be mutated in place
    until its message is sent. The engines guarantee it: a scatter returns once every reply arrived (so
    every request it still waits for was fully received) or its deadline passed (the streams still in
    flight then belong to calls already given up: a torn bundle fails its checksum there and is refused);
    a hand-off returns on its acknowledgement. A handler's reply is sent before the next task arrives.

    CUDA tensors (at least ``staging.PINNED_MIN_BYTES`` of them) are copied into the process's pinned staging buffer
    (``staging.to_host``: asynchronous copies, then a synchronisation); the buffer is reused once this bundle and
    every chunk of it are gone. Otherwise (a CPU bundle: no cost; a small one; the buffer in use; pinning off)
    each tensor is copied as before.
    """
    staged = staging.to_host(bundle)
    if staged is not None:
        return staged
    return {k: v.detach() if v.device.type == "cpu" else v.detach().to("cpu") for k, v in bundle.items()}


def to_device(bundle: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A received (CPU) bundle on this node's device. To a CUDA device the copies are asynchronous and synchronised
    before this returns (``staging.to_device``), and this process's next decode buffers are pinned."""
    return bundle if device.type == "cpu" else staging.to_device(bundle, device)
