"""Property-based fuzzing of the wire (hypothesis): the frame parser (``parse_frame_lenient``), the message
assembler (``MessageAssembler``, as a parent reading Results and as a child reading Tasks) and the tensor
codec (``encode`` / ``BundleDecoder``), fed valid, mutated, truncated, reordered, duplicated and oversized
input. Every case must end in a valid result or the module's own error (``CodecError``, ``FrameError``,
``BadFrame``): no other exception, no hang (hypothesis' deadline), and no decode buffer larger than the
assembler's ``max_bytes`` (a header that claims more is refused before anything is allocated; every
``torch.empty`` call is recorded to check it).

CI runs a few dozen examples per property (seconds); ``make fuzz`` runs many (``FEDHOP_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fedhop.common.wire import codec
from fedhop.common.wire.codec import DTYPES, BundleDecoder, CodecError, RawChunk, decode, encode
from fedhop.common.wire.frames import (
    BadFrame,
    ChunkFrame,
    FrameBatch,
    FrameError,
    Message,
    MessageAssembler,
    bundle_frames,
    chunk_frame_bytes,
    parse_frame_lenient,
    result_frame,
    serialize_frame,
    task_frame,
    unbatched,
)
from fedhop.v1 import fedhop_pb2 as pb

EXAMPLES = int(os.environ.get("FEDHOP_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=dt.timedelta(seconds=10), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
CALL_BASE = 1 << 56


# -- allocation spy ------------------------------------------------------------------------------------------


@pytest.fixture
def allocations(monkeypatch) -> list[int]:
    """Every byte count the codec allocates a decode buffer for (``codec._allocate``) while the test runs. One
    list per test function: a @given test clears it at the start of each example."""
    sizes: list[int] = []
    real = codec._allocate

    def spy(size: int):
        sizes.append(size)
        return real(size)

    monkeypatch.setattr(codec, "_allocate", spy)
    return sizes


# -- strategies ----------------------------------------------------------------------------------------------

dtypes = st.sampled_from(sorted(DTYPES))
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


@st.composite
def tensors(draw) -> torch.Tensor:
    dtype = DTYPES[draw(dtypes)]
    shape = draw(shapes)
    n = 1
    for d in shape:
        n *= d
    raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape) if n else \
        torch.empty(shape, dtype=dtype)
    if draw(st.booleans()) and t.dim() >= 2:
        t = t.transpose(0, 1)  # non-contiguous: the encoder must copy it in C order
    return t


bundles = st.dictionaries(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8),
                          tensors(), min_size=0, max_size=4)


def payload_of(bundle: dict[str, torch.Tensor]) -> bytes:
    # an empty tensor has no bytes (and may carry any strides, which .view(uint8) refuses)
    return b"".join(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in bundle.values()
                    if t.numel())


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and payload_of({k: a[k]}) == payload_of({k: b[k]})
        for k in a)


def message_wire(call_id: int, bundle: dict[str, torch.Tensor], chunk_bytes: int, reply: bool,
                 raw: bool) -> list[bytes]:
    """The serialized frames of one message: a Task (child side reads it) or a Result (parent side)."""
    has = bool(bundle)
    head = result_frame(call_id, {"n": 3}, has_bundle=has) if reply else \
        task_frame(call_id, "fedavg.train", {"lr": 0.1}, deadline_s=5.0, has_bundle=has, round_idx=1)
    out = [serialize_frame(head)]
    if has:
        out += [serialize_frame(f) for f in bundle_frames(call_id, bundle, chunk_bytes, raw=raw)]
    return out


class Outcome:
    """What feeding a stream of frames produced: messages, FrameErrors, bad frames."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.frame_errors: list[str] = []
        self.bad = 0


def feed_all(asm: MessageAssembler, wire: list[bytes]) -> Outcome:
    """Parse and feed every frame; any exception other than the module's own fails the test."""
    out = Outcome()
    for buf in wire:
        parsed = parse_frame_lenient(buf)
        assert isinstance(parsed, pb.Frame | ChunkFrame | BadFrame | FrameBatch)
        if isinstance(parsed, BadFrame):
            assert parsed.error and parsed.size == len(buf)
        for frame in unbatched(parsed):  # a batch's frames one by one, as every reader hands them on
            assert isinstance(frame, pb.Frame | ChunkFrame | BadFrame)
            if isinstance(frame, BadFrame):
                out.bad += 1
            try:
                msg = asm.feed(frame)
            except FrameError as e:
                assert str(e)
                out.frame_errors.append(str(e))
                continue
            if msg is not None:
                assert isinstance(msg, Message)
                out.messages.append(msg)
    return out


# -- the frame parser ----------------------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=256))
def test_parser_takes_any_bytes(buf):
    frame = parse_frame_lenient(buf)
    assert isinstance(frame, pb.Frame | ChunkFrame | BadFrame | FrameBatch)
    if isinstance(frame, ChunkFrame):
        assert frame.size == len(buf)
    if isinstance(frame, FrameBatch):
        assert frame.frames and all(isinstance(f, pb.Frame | ChunkFrame | BadFrame) for f in frame.frames)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@st.composite
def chunkish_frames(draw) -> bytes:
    """Bytes near the raw chunk encoding: canonical frames, then fields padded, reordered, cut or flipped."""
    call_id = draw(st.integers(0, (1 << 64) - 1))
    offset = draw(st.integers(0, (1 << 64) - 1))
    data = draw(st.binary(max_size=40))
    buf = bytearray(chunk_frame_bytes(call_id, offset, data))
    for op in draw(st.lists(st.sampled_from(["flip", "cut", "pad", "append", "overlong"]), max_size=3)):
        if not buf:
            break
        i = draw(st.integers(0, len(buf) - 1))
        if op == "flip":
            buf[i] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del buf[i:]
        elif op == "pad":  # a non-canonical varint: 0x80 continuation bytes before the last byte
            buf[i:i] = b"\x80" * draw(st.integers(1, 3))
        elif op == "append":
            buf += draw(st.binary(min_size=1, max_size=8))
        else:  # an over-long varint (11 bytes) where a length or id is read
            buf[i:i] = b"\xff" * 10
    return bytes(buf)


@FUZZ
@given(chunkish_frames())
def test_raw_chunk_parser_agrees_with_protobuf(buf):
    """Where the zero-copy path accepts bytes as a chunk frame, protobuf reads the same call id, offset and
    data from them; where protobuf rejects them, the result is a BadFrame."""
    frame = parse_frame_lenient(buf)
    try:
        ref = pb.Frame.FromString(buf)
    except Exception:  # protobuf's own DecodeError (and nothing the parser lets through)
        ref = None
    if isinstance(frame, ChunkFrame):
        assert ref is not None, f"the raw path accepted bytes protobuf rejects: {buf.hex()}"
        assert ref.WhichOneof("body") == "chunk"
        assert (frame.call_id, frame.offset, bytes(frame.data)) == (ref.call_id, ref.chunk.offset, ref.chunk.data)
    elif isinstance(frame, FrameBatch):  # a flip made the first byte a batch's tag
        _agrees_with_protobuf(frame, ref, buf)
    elif ref is None:
        assert isinstance(frame, BadFrame)
    else:
        assert frame == ref


def _agrees_with_protobuf(batch: FrameBatch, ref: pb.Frame | None, buf: bytes) -> None:
    """A batch the parser accepted is one protobuf reads too, with the same entries, each parsed alike."""
    assert ref is not None, f"the batch parser accepted bytes protobuf rejects: {buf.hex()}"
    assert ref.WhichOneof("body") == "batch" and ref.call_id == 0
    assert len(batch.frames) == len(ref.batch.frames) and batch.size == sum(map(len, ref.batch.frames))
    for got, entry in zip(batch.frames, ref.batch.frames, strict=True):
        if isinstance(got, ChunkFrame):
            assert (got.call_id, got.offset, bytes(got.data), got.size) == _chunk_of(entry)
        elif isinstance(got, pb.Frame):
            assert got == pb.Frame.FromString(entry)
        else:
            assert got.size == len(entry)


def _chunk_of(entry: bytes) -> tuple[int, int, bytes, int]:
    f = pb.Frame.FromString(entry)
    assert f.WhichOneof("body") == "chunk"
    return f.call_id, f.chunk.offset, f.chunk.data, len(entry)


@st.composite
def batchish_frames(draw) -> bytes:
    """Bytes near a batch's encoding: one to three frames (Task, Result, header, chunk) in a batch, then bytes
    flipped, cut, appended or a length made over-long."""
    cid = draw(st.sampled_from([CALL_BASE, CALL_BASE + 3]))
    pool = [serialize_frame(task_frame(cid, "t", {"a": 1}, deadline_s=1.0, has_bundle=True, round_idx=2)),
            serialize_frame(result_frame(cid, {"n": 2}, has_bundle=False)),
            pb.Frame(call_id=cid, header=pb.BundleHeader(total_bytes=4, chunk_bytes=4)).SerializeToString(),
            chunk_frame_bytes(cid, 0, draw(st.binary(max_size=12)))]
    entries = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
    buf = bytearray(pb.Frame(batch=pb.Batch(frames=entries)).SerializeToString())
    for op in draw(st.lists(st.sampled_from(["flip", "cut", "append", "overlong"]), max_size=2)):
        i = draw(st.integers(0, len(buf) - 1))
        if op == "flip":
            buf[i] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del buf[i:]
        elif op == "append":
            buf += draw(st.binary(min_size=1, max_size=8))
        else:
            buf[i:i] = b"\xff" * 10
        if not buf:
            break
    return bytes(buf)


@FUZZ
@given(batchish_frames())
def test_batch_parser_agrees_with_protobuf(buf):
    """Where the parser takes bytes for a batch, protobuf reads a batch with the same entries; where protobuf
    rejects the bytes, the parser returns a BadFrame (it may refuse more: a nested batch, unknown fields)."""
    frame = parse_frame_lenient(buf)
    try:
        ref = pb.Frame.FromString(buf)
    except Exception:  # protobuf's own DecodeError
        ref = None
    if isinstance(frame, FrameBatch):
        _agrees_with_protobuf(frame, ref, buf)
    elif ref is None:
        assert isinstance(frame, BadFrame)


# -- the codec, both sides -------------------------------------------------------------------------------------


@FUZZ
@given(bundles, st.integers(1, 64), st.sampled_from(["xxh3_64", "crc32", "none"]))
def test_codec_roundtrip(bundle, chunk_bytes, checksum):
    header, chunks = encode(bundle, chunk_bytes, checksum=checksum)
    dec = BundleDecoder(header, max_bytes=max(1, len(payload_of(bundle))))
    for c in chunks:
        dec.feed(c)
    assert same(dec.finish(), bundle)


odd_values = st.one_of(
    tensors(),
    st.builds(lambda n: torch.zeros(n, dtype=torch.complex64), st.integers(0, 3)),
    st.builds(lambda n: torch.zeros(n).to_sparse(), st.integers(1, 3)),
    st.builds(lambda n: torch.zeros(n, dtype=torch.float32)[::2], st.integers(0, 9)),
    st.none(), st.integers(), st.binary(max_size=4), st.lists(st.floats(), max_size=2),
)
odd_names = st.one_of(st.text(max_size=4), st.sampled_from(["\ud800", "w\udfff"]), st.integers(), st.none(),
                      st.binary(max_size=2))


@FUZZ
@given(st.one_of(st.dictionaries(odd_names, odd_values, max_size=3), st.lists(tensors(), max_size=2), st.none()),
       st.one_of(st.integers(-2, 80), st.sampled_from([True, 1.5, "8", 1 << 26, (1 << 26) + 1])))
def test_encoder_takes_anything(bundle, chunk_bytes):
    """The sending side: whatever an algorithm hands the encoder, it is sent faithfully or refused with a
    CodecError (names that are not UTF-8 too: see test_encoder_refuses_unencodable_names)."""
    try:
        header, chunks = encode(bundle, chunk_bytes)
        got = decode(header, chunks)
    except CodecError as e:
        assert str(e)
        return
    assert list(got) == list(bundle)
    for k, t in bundle.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape
        assert payload_of({k: got[k]}) == payload_of({k: t})


def test_encoder_refuses_unencodable_names():
    """A name that is not UTF-8 (a lone surrogate) is refused with a CodecError naming it, not a protobuf
    UnicodeEncodeError; a non-ASCII name that is UTF-8 still travels."""
    with pytest.raises(CodecError, match="not valid UTF-8"):
        encode({"\ud800": torch.zeros(2)})
    with pytest.raises(CodecError, match="not valid UTF-8"):
        encode({"w": torch.zeros(1), "b\udfff": torch.zeros(2)})
    header, chunks = encode({"poids-é": torch.ones(2)})
    assert list(decode(header, chunks)) == ["poids-é"]


@st.composite
def headers(draw) -> pb.BundleHeader:
    """Headers built field by field: mostly plausible, sometimes inconsistent or huge."""
    h = pb.BundleHeader(chunk_bytes=draw(st.one_of(st.integers(0, 64), st.integers(0, (1 << 32) - 1))),
                        checksum_algorithm=draw(st.sampled_from(["xxh3_64", "crc32", "none", "", "md5"])),
                        checksum=draw(st.integers(0, (1 << 64) - 1)))
    total = 0
    for i in range(draw(st.integers(0, 4))):
        dtype = draw(st.one_of(dtypes, st.sampled_from(["complex64", "", "float"])))
        shape = draw(st.lists(st.one_of(st.integers(0, 6), st.integers(-3, 1 << 40)), max_size=3))
        size = DTYPES[dtype].itemsize if dtype in DTYPES else 4
        n = size
        for d in shape:
            n *= d
        nbytes = draw(st.one_of(st.just(n), st.integers(0, (1 << 64) - 1))) if n >= 0 else draw(
            st.integers(0, (1 << 64) - 1))
        if not 0 <= nbytes < 1 << 64:
            nbytes = 0
        name = draw(st.sampled_from(["w", "b", "", f"t{i}", "w"]))
        h.tensors.add(name=name, dtype=dtype, shape=shape, nbytes=nbytes)
        total += nbytes
    h.total_bytes = draw(st.one_of(st.just(total % (1 << 64)), st.integers(0, (1 << 64) - 1)))
    return h


@FUZZ
@given(headers(), st.lists(st.tuples(st.integers(0, 200), st.binary(max_size=64)), max_size=6))
def test_decoder_takes_any_header_and_chunks(allocations, header, chunks):
    allocations.clear()  # the fixture lives across hypothesis' examples
    max_bytes = 4096
    try:
        dec = BundleDecoder(header, max_bytes=max_bytes)
    except CodecError as e:
        assert str(e)
        return
    finally:
        assert all(n <= max_bytes + 64 * len(header.tensors) for n in allocations), allocations
    try:
        for offset, data in chunks:
            dec.feed(RawChunk(offset, data))
        out = dec.finish()
    except CodecError as e:
        assert str(e)
        return
    assert [(k, t.dtype, tuple(t.shape)) for k, t in out.items()] == [
        (s.name, DTYPES[s.dtype], tuple(s.shape)) for s in header.tensors]


# -- the message assembler, from the parent's side (Results) and the child's (Tasks) ---------------------------

MUTATIONS = ["flip", "truncate", "drop", "duplicate", "swap", "junk", "recall", "oversize", "empty", "batch"]


@st.composite
def hostile_streams(draw) -> tuple[list[bytes], list[bytes], int]:
    """The frames of one to three messages, interleaved by call, then mutated. Returns (mutated frames,
    the original payloads, max_bytes)."""
    reply = draw(st.booleans())
    raw = draw(st.booleans())
    chunk_bytes = draw(st.integers(1, 48))
    msgs = [draw(bundles) for _ in range(draw(st.integers(1, 3)))]
    payloads = [payload_of(b) for b in msgs]
    max_bytes = max(1, *(len(p) for p in payloads))
    wires = [message_wire(CALL_BASE + i, b, chunk_bytes, reply, raw) for i, b in enumerate(msgs)]
    # interleave calls (a message's own frames stay in order), as concurrent calls on one stream do
    order = draw(st.permutations([i for i, w in enumerate(wires) for _ in w]))
    pos = [0] * len(wires)
    frames: list[bytes] = []
    for i in order:
        frames.append(wires[i][pos[i]])
        pos[i] += 1
    for op in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=4)):
        if not frames:
            break
        i = draw(st.integers(0, len(frames) - 1))
        f = bytearray(frames[i])
        if op == "flip" and f:
            f[draw(st.integers(0, len(f) - 1))] ^= draw(st.integers(1, 255))
            frames[i] = bytes(f)
        elif op == "truncate":
            frames[i] = bytes(f[:draw(st.integers(0, max(0, len(f) - 1)))])
        elif op == "drop":
            del frames[i]
        elif op == "duplicate":
            frames.insert(draw(st.integers(i, len(frames))), frames[i])
        elif op == "swap":
            j = draw(st.integers(0, len(frames) - 1))
            frames[i], frames[j] = frames[j], frames[i]
        elif op == "junk":
            frames.insert(i, draw(st.binary(max_size=32)))
        elif op == "recall":  # the frame re-addressed to another (possibly unknown) call
            parsed = parse_frame_lenient(frames[i])
            cid = draw(st.sampled_from([0, CALL_BASE, CALL_BASE + 1, CALL_BASE + 7]))
            if isinstance(parsed, ChunkFrame):
                frames[i] = chunk_frame_bytes(cid, parsed.offset, parsed.data)
            elif isinstance(parsed, pb.Frame):
                parsed.call_id = cid
                frames[i] = parsed.SerializeToString()
        elif op == "oversize":  # a header claiming far more than max_bytes, for an open or unknown call
            h = pb.BundleHeader(chunk_bytes=1 << 20, checksum_algorithm="xxh3_64",
                                total_bytes=draw(st.sampled_from([max_bytes + 1, 1 << 34, (1 << 64) - 1])))
            n = h.total_bytes
            h.tensors.add(name="w", dtype="uint8", shape=shape_of(n), nbytes=n)
            cid = draw(st.sampled_from([CALL_BASE, CALL_BASE + 1, CALL_BASE + 5]))
            frames.insert(i, pb.Frame(call_id=cid, header=h).SerializeToString())
        elif op == "empty":
            frames.insert(i, b"")
        elif op == "batch":  # the next one to three frames in one Batch (as a small message travels)
            j = draw(st.integers(i + 1, min(len(frames), i + 3)))
            frames[i:j] = [pb.Frame(batch=pb.Batch(frames=frames[i:j])).SerializeToString()]
    return frames, payloads, max_bytes


def shape_of(n: int) -> list[int]:
    """A uint8 shape of exactly ``n`` elements, within int64 dimensions (a BundleHeader's shape type)."""
    if n < 1 << 63:
        return [n]
    if n == (1 << 64) - 1:
        return [(1 << 32) + 1, (1 << 32) - 1]
    assert n % 2 == 0
    return [2, n // 2]


def header_tensor_counts(frames: list[bytes]) -> int:
    """The most tensor specs any (parsable) header frame in the stream declares, read with protobuf."""
    most = 0
    for f in frames:
        try:
            p = pb.Frame.FromString(f)
        except Exception:
            continue
        if p.WhichOneof("body") == "header":
            most = max(most, len(p.header.tensors))
        if p.WhichOneof("body") == "batch":
            most = max(most, header_tensor_counts(list(p.batch.frames)))
    return most


@FUZZ
@given(hostile_streams())
def test_assembler_survives_hostile_streams(allocations, stream):
    allocations.clear()
    frames, payloads, max_bytes = stream
    out = feed_all(MessageAssembler(max_bytes=max_bytes), frames)
    event(f"{sum(m.error is None for m in out.messages)} whole, {sum(m.error is not None for m in out.messages)} "
          f"bad messages; frame errors: {bool(out.frame_errors)}; bad frames: {bool(out.bad)}")
    for m in out.messages:
        if m.error is None and (m.bundle or b"" in payloads):
            # a message that decodes is one that was sent (the xxh3 checksum covers the payload)
            assert payload_of(m.bundle) in payloads
        elif m.error is None:
            # no bundle: a flipped head frame that no longer says one follows (``has_bundle`` lost, e.g. a task's
            # length byte shortened) is a valid head-only message; the checksum covers payloads, not heads
            assert m.payload_bytes == 0
        else:
            assert m.error.startswith("bad bundle")
    # decode buffers: never more than max_bytes of payload (plus per-tensor alignment padding, see
    # test_decode_buffer_never_exceeds_max_bytes)
    slack = 64 * header_tensor_counts(frames)
    assert all(n <= max_bytes + slack for n in allocations), (allocations, max_bytes)


@FUZZ
@given(st.lists(bundles, min_size=1, max_size=3), st.integers(1, 48), st.booleans(), st.booleans())
def test_assembler_untouched_streams_arrive_whole(allocations, msgs, chunk_bytes, reply, raw):
    wires = [message_wire(CALL_BASE + i, b, chunk_bytes, reply, raw) for i, b in enumerate(msgs)]
    out = feed_all(MessageAssembler(max_bytes=max(1, *(len(payload_of(b)) for b in msgs))),
                   [f for w in wires for f in w])
    assert not out.frame_errors and not out.bad
    assert [m.call_id for m in out.messages] == [CALL_BASE + i for i in range(len(msgs))]
    for m, b in zip(out.messages, msgs, strict=True):
        assert m.error is None and same(m.bundle, b)
        assert m.kind == ("result" if reply else "task")
        assert m.payload_bytes == len(payload_of(b))


# -- oversized headers are refused before allocating ---------------------------------------------------------


@pytest.mark.parametrize("claim", [(1 << 20) + 1, 1 << 34, 15 << 30, 1 << 62, (1 << 64) - 1])
@pytest.mark.parametrize("tensors_n", [1, 3, 1000])
def test_header_claiming_more_than_max_bytes_allocates_nothing(allocations, claim, tensors_n):
    max_bytes = 1 << 20
    asm = MessageAssembler(max_bytes=max_bytes)
    assert asm.feed(parse_frame_lenient(serialize_frame(result_frame(CALL_BASE, {}, has_bundle=True)))) is None
    h = pb.BundleHeader(chunk_bytes=1 << 20, checksum_algorithm="xxh3_64")
    each = claim // tensors_n
    for i in range(tensors_n):
        n = each if i else claim - each * (tensors_n - 1)
        h.tensors.add(name=f"t{i}", dtype="uint8", shape=shape_of(n), nbytes=n)
    h.total_bytes = claim
    msg = asm.feed(parse_frame_lenient(pb.Frame(call_id=CALL_BASE, header=h).SerializeToString()))
    assert msg is not None and msg.error is not None and "exceeds the limit" in msg.error
    assert allocations == []


def _decoding(max_bytes: int, specs: list[tuple[str, list[int]]]) -> int:
    h = pb.BundleHeader(chunk_bytes=64, checksum_algorithm="none")
    total = 0
    for i, (dtype, shape) in enumerate(specs):
        n = DTYPES[dtype].itemsize
        for d in shape:
            n *= d
        h.tensors.add(name=f"t{i}", dtype=dtype, shape=shape, nbytes=n)
        total += n
    h.total_bytes = total
    with contextlib.suppress(CodecError):  # refusing the header is a fine outcome; allocating more is not
        BundleDecoder(h, max_bytes=max_bytes)
    return total


def test_decode_buffer_never_exceeds_max_bytes(allocations):
    """[uint8[1], float64[1]] is 9 payload bytes but more to decode into (each tensor aligned): the buffer may
    exceed max_bytes by codec.ALIGN_SLACK per tensor and no more; a payload over max_bytes is never allocated."""
    total = _decoding(9, [("uint8", [1]), ("float64", [1])])
    assert total == 9
    assert allocations and all(n <= 9 + 2 * codec.ALIGN_SLACK for n in allocations), allocations
    allocations.clear()
    _decoding(8, [("uint8", [1]), ("float64", [1])])  # one byte over the limit: refused before allocating
    assert allocations == []
