"""Chunked tensor codec (common/wire/codec.py): round trips and every rejection, with its message."""

from __future__ import annotations

import itertools
import tracemalloc

import pytest
import torch

from fedhop.common.wire import codec, frames
from fedhop.common.wire.bundle import payload_bytes
from fedhop.common.wire.codec import BundleDecoder, CodecError, RawChunk, decode, encode, encode_views
from fedhop.v1 import fedhop_pb2 as pb

INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Same dtype, shape and bits (NaN payloads and -0.0 included)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.numel():
        ia = a.contiguous().reshape(-1).view(INT_VIEW[a.element_size()])
        ib = b.contiguous().reshape(-1).view(INT_VIEW[b.element_size()])
        assert torch.equal(ia, ib)


def assert_bundles_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for k in a:
        assert_same(a[k], b[k])


def roundtrip(bundle, chunk_bytes=codec.DEFAULT_CHUNK_BYTES, **kw):
    header, chunks = encode(bundle, chunk_bytes, **kw)
    return decode(header, chunks)


def mixed_bundle() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "conv.weight": random_tensor(torch.float32, (4, 3, 3, 3), g),
        "flag": torch.tensor(True),
        "steps": random_tensor(torch.int64, (5,), g),
        "half": random_tensor(torch.float16, (7,), g),
        "bf": random_tensor(torch.bfloat16, (3, 5), g),
        "empty": torch.zeros(0, 3),
        "bytes": random_tensor(torch.uint8, (13,), g),
        "i32": random_tensor(torch.int32, (2, 2), g),
        "f64": random_tensor(torch.float64, (3,), g),
    }


@pytest.mark.parametrize("dtype", list(codec.DTYPES.values()), ids=list(codec.DTYPES))
@pytest.mark.parametrize("shape", [(), (0,), (1,), (7, 13, 3), (3, 0, 2), (1, 1, 1, 1, 5)], ids=str)
def test_roundtrip_every_dtype_and_shape(dtype, shape):
    g = torch.Generator().manual_seed(1)
    bundle = {"x": random_tensor(dtype, shape, g), "y": random_tensor(dtype, (3,), g)}
    out = roundtrip(bundle, chunk_bytes=5)
    assert_bundles_equal(out, bundle)


def test_special_float_values_survive_bit_exactly():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45, 3.4e38], dtype=torch.float32)
    bundle = {"f32": x, "f16": x.half(), "bf16": x.bfloat16(), "f64": x.double()}
    assert_bundles_equal(roundtrip(bundle, 3), bundle)


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 7, 64, 1000, 4096, 1 << 20, codec.MAX_CHUNK_BYTES])
def test_roundtrip_chunk_sizes(chunk_bytes):
    bundle = mixed_bundle()
    header, chunks = encode(bundle, chunk_bytes)
    chunks = list(chunks)
    total = payload_bytes(bundle)
    assert header.total_bytes == total == sum(len(c.data) for c in chunks)
    assert len(chunks) == -(-total // chunk_bytes)
    assert [c.offset for c in chunks] == [i * chunk_bytes for i in range(len(chunks))]
    assert_bundles_equal(decode(header, chunks), bundle)


def test_non_contiguous_inputs():
    base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    bundle = {
        "transposed": base.transpose(0, 2),
        "strided": base[:, ::2, 1::2],
        "expanded": torch.arange(3.0).expand(4, 3),  # stride 0
        "negview": torch._neg_view(base[0]),
        "grad": torch.ones(3, requires_grad=True) * 2,
    }
    out = roundtrip(bundle, 7)
    for k, v in bundle.items():
        assert torch.equal(out[k], v.detach()), k
        assert out[k].is_contiguous()


def test_empty_bundle_and_all_empty_tensors():
    header, chunks = encode({})
    assert list(chunks) == [] and header.total_bytes == 0
    assert decode(header, []) == {}
    bundle = {"a": torch.zeros(0), "b": torch.zeros(2, 0, dtype=torch.int64)}
    header, chunks = encode(bundle)
    assert list(chunks) == []
    assert_bundles_equal(decode(header, []), bundle)


def test_order_and_header_fields():
    bundle = mixed_bundle()
    header, _ = encode(bundle, 100)
    assert [t.name for t in header.tensors] == list(bundle)
    for spec, (name, t) in zip(header.tensors, bundle.items(), strict=True):
        assert spec.name == name
        assert codec.DTYPES[spec.dtype] == t.dtype
        assert tuple(spec.shape) == tuple(t.shape)
        assert spec.nbytes == t.numel() * t.element_size()
    assert header.chunk_bytes == 100 and header.checksum_algorithm == "xxh3_64"
    assert codec.header_payload_bytes(header) == payload_bytes(bundle)


def test_decoded_tensors_are_aligned_views_of_one_buffer():
    g = torch.Generator().manual_seed(2)
    bundle = {
        "b": torch.tensor([True]),
        "big": random_tensor(torch.float64, (1000,), g),
        "c": torch.tensor([True]),
        "i64": random_tensor(torch.int64, (3,), g),
        "h": random_tensor(torch.float16, (5,), g),
    }
    out = roundtrip(bundle, 11)
    storages = {t.untyped_storage().data_ptr() for t in out.values()}
    assert len(storages) == 1
    for name, t in out.items():
        assert t.data_ptr() % t.element_size() == 0, name
    assert out["big"].data_ptr() % 64 == 0
    assert_bundles_equal(out, bundle)


@pytest.mark.parametrize("algorithm", ["xxh3_64", "crc32", "none"])
def test_checksum_algorithms_roundtrip(algorithm):
    bundle = mixed_bundle()
    header, chunks = encode(bundle, 50, checksum=algorithm)
    assert header.checksum_algorithm == algorithm
    assert_bundles_equal(decode(header, chunks), bundle)


def test_chunk_views_alias_tensor_storage():
    """Chunks inside one tensor are views of its storage (no copy); the header checksum is taken up front,
    so mutating the tensor before the chunks are sent is caught by the receiver."""
    x = torch.zeros(1024, dtype=torch.float32)
    header, chunks = encode_views({"x": x}, 1024)
    first = next(chunks)
    assert isinstance(first.data, memoryview) and first.data.nbytes == 1024
    x[0] = 1.0
    assert bytes(first.data[:4]) == torch.tensor([1.0]).numpy().tobytes()
    decoder = BundleDecoder(header)
    decoder.feed(first)
    for c in chunks:
        decoder.feed(c)
    with pytest.raises(CodecError, match=r"checksum mismatch \(xxh3_64\): header says 0x[0-9a-f]{16}"):
        decoder.finish()


def test_spanning_chunks_join_pieces():
    three = torch.arange(3, dtype=torch.uint8)
    header, chunks = encode_views({"a": three, "b": three}, 4)
    chunks = list(chunks)
    assert [bytes(c.data) for c in chunks] == [b"\x00\x01\x02\x00", b"\x01\x02"]


def test_decoder_accepts_any_bytes_like_chunk_data():
    bundle = {"x": torch.arange(10, dtype=torch.int32)}
    header, chunks = encode_views(bundle, 8)
    dec = BundleDecoder(header)
    for i, c in enumerate(chunks):
        data = bytes(c.data)
        as_numpy = torch.tensor(list(data), dtype=torch.uint8).numpy()
        variants = [data, bytearray(data), memoryview(data), as_numpy]
        dec.feed(RawChunk(c.offset, variants[i % len(variants)]))
    assert_bundles_equal(dec.finish(), bundle)


def test_decoder_progress_properties():
    header, chunks = encode({"x": torch.zeros(10)}, 16)
    dec = BundleDecoder(header)
    assert (dec.total_bytes, dec.received_bytes, dec.complete) == (40, 0, False)
    for c in chunks:
        dec.feed(c)
    assert dec.received_bytes == 40 and dec.complete
    dec.finish()
    assert not dec.complete


# -- rejections ---------------------------------------------------------------------------------------------


def encoded(chunk_bytes=16):
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    bundle = {"w": w, "b": torch.arange(5, dtype=torch.int64)}
    header, chunks = encode(bundle, chunk_bytes)
    return header, list(chunks)


def test_truncated_stream_names_incomplete_tensors():
    header, chunks = encoded()
    msg = r"truncated bundle: received 80 of 88 bytes; incomplete tensors: 'b' has 32 of 40 bytes"
    with pytest.raises(CodecError, match=msg):
        decode(header, chunks[:-1])
    msg = r"received 0 of 88 bytes; incomplete tensors: 'w' has 0 of 48 bytes, 'b' has 0 of 40 bytes"
    with pytest.raises(CodecError, match=msg):
        decode(header, [])


def test_wrong_checksum_in_header():
    header, chunks = encoded()
    header.checksum ^= 1
    with pytest.raises(CodecError, match="checksum mismatch"):
        decode(header, chunks)


def test_corrupted_chunk_detected_by_every_checksum():
    for algorithm in ("xxh3_64", "crc32"):
        header, chunks = encode({"x": torch.arange(100, dtype=torch.float32)}, 64, checksum=algorithm)
        chunks = list(chunks)
        bad = bytearray(chunks[2].data)
        bad[5] ^= 0x10
        chunks[2] = RawChunk(chunks[2].offset, bytes(bad))
        with pytest.raises(CodecError, match=rf"checksum mismatch \({algorithm}\)"):
            decode(header, chunks)
    header, chunks = encode({"x": torch.arange(100, dtype=torch.float32)}, 64, checksum="none")
    chunks = [RawChunk(c.offset, bytes(len(c.data))) for c in chunks]
    assert decode(header, chunks)["x"].sum() == 0  # "none" checks nothing, by definition


def test_size_mismatch_between_nbytes_and_shape():
    header, chunks = encoded()
    header.tensors[0].nbytes = 44
    msg = r"tensor 'w' \(#0\): header says nbytes=44, but shape \[3, 4\] of float32 \(4 bytes each\) is 48 "
    with pytest.raises(CodecError, match=msg):
        BundleDecoder(header)


def test_total_bytes_mismatch():
    header, _ = encoded()
    header.total_bytes = 100
    with pytest.raises(CodecError, match="header says total_bytes=100, but its tensors add up to 88"):
        BundleDecoder(header)


def test_unknown_dtype():
    header, _ = encoded()
    header.tensors[1].dtype = "complex64"
    with pytest.raises(CodecError, match=r"tensor 'b' \(#1\): unknown dtype 'complex64' \(supported: float3"):
        BundleDecoder(header)


def test_duplicate_names():
    header, _ = encoded()
    header.tensors[1].name = "w"
    with pytest.raises(CodecError, match=r"duplicate tensor name 'w' \(tensors #0 and #1\)"):
        BundleDecoder(header)


def test_empty_name_and_negative_dimension():
    header, _ = encoded()
    header.tensors[1].name = ""
    with pytest.raises(CodecError, match="tensor #1 has an empty name"):
        BundleDecoder(header)
    header, _ = encoded()
    header.tensors[0].shape[0] = -3
    with pytest.raises(CodecError, match=r"tensor 'w' \(#0\): negative dimension in shape \[-3, 4\]"):
        BundleDecoder(header)


def test_unknown_checksum_algorithm_and_bad_chunk_size_in_header():
    header, _ = encoded()
    header.checksum_algorithm = "md5"
    with pytest.raises(CodecError, match="unknown checksum algorithm 'md5'"):
        BundleDecoder(header)
    header, _ = encoded()
    header.chunk_bytes = 0
    with pytest.raises(CodecError, match=r"header chunk_bytes=0 is outside \[1, "):
        BundleDecoder(header)


def test_chunk_past_end():
    header, chunks = encoded()
    msg = "chunk past the end: 16 bytes at offset 88 run past the bundle's 88 bytes"
    with pytest.raises(CodecError, match=msg):
        decode(header, [*chunks, RawChunk(88, bytes(16))])
    dec = BundleDecoder(header)
    for c in chunks[:-1]:
        dec.feed(c)
    with pytest.raises(CodecError, match="chunk past the end: 16 bytes at offset 80"):
        dec.feed(RawChunk(80, bytes(16)))


def test_gap_repeat_and_wrong_chunk_size():
    header, chunks = encoded()
    with pytest.raises(CodecError, match=r"chunk at offset 32, expected offset 16 \(a gap"):
        decode(header, [chunks[0], chunks[2]])
    with pytest.raises(CodecError, match=r"chunk at offset 0, expected offset 16 \(a repeated or overlap"):
        decode(header, [chunks[0], chunks[0]])
    with pytest.raises(CodecError, match=r"chunk at offset 16 carries 8 bytes, expected 16 \(header chunk"):
        decode(header, [chunks[0], RawChunk(16, bytes(8))])
    with pytest.raises(CodecError, match="chunk at offset 0 carries 0 bytes, expected 16"):
        decode(header, [RawChunk(0, b"")])


def test_max_bytes():
    header, chunks = encoded()
    assert_bundles_equal(decode(header, chunks, max_bytes=88), decode(header, chunks))
    with pytest.raises(CodecError, match="bundle of 88 bytes exceeds the limit max_bytes=87 bytes"):
        BundleDecoder(header, max_bytes=87)
    big = pb.BundleHeader(total_bytes=3 << 30, chunk_bytes=1 << 20, checksum_algorithm="none")
    big.tensors.add(name="x", dtype="uint8", shape=[3 << 30], nbytes=3 << 30)
    msg = r"bundle of 3221225472 bytes \(3072.0 MiB\) exceeds the limit max_bytes=1073741824 bytes \(1024.0"
    with pytest.raises(CodecError, match=msg):
        BundleDecoder(big, max_bytes=1 << 30)


def test_unallocatable_header_is_a_codec_error():
    n = 1 << 62
    header = pb.BundleHeader(total_bytes=n, chunk_bytes=1 << 20, checksum_algorithm="none")
    header.tensors.add(name="huge", dtype="uint8", shape=[n], nbytes=n)
    with pytest.raises(CodecError, match="cannot allocate"):
        BundleDecoder(header)
    n = (1 << 64) - 1  # does not even fit torch's int64 sizes
    header = pb.BundleHeader(total_bytes=n, chunk_bytes=1 << 20, checksum_algorithm="none")
    header.tensors.add(name="huge", dtype="uint8", shape=[(1 << 62) - 1, 4], nbytes=(1 << 64) - 4)
    with pytest.raises(CodecError, match="total_bytes"):
        BundleDecoder(header)
    header.total_bytes = (1 << 64) - 4
    with pytest.raises(CodecError, match="cannot allocate"):
        BundleDecoder(header)


def test_failed_or_finished_decoder_accepts_nothing():
    header, chunks = encoded()
    dec = BundleDecoder(header)
    with pytest.raises(CodecError, match="gap"):
        dec.feed(chunks[1])
    with pytest.raises(CodecError, match="the decoder has failed; it accepts nothing more"):
        dec.feed(chunks[0])
    with pytest.raises(CodecError, match="has failed"):
        dec.finish()
    dec = BundleDecoder(header)
    for c in chunks:
        dec.feed(c)
    dec.finish()
    with pytest.raises(CodecError, match="the decoder has finished"):
        dec.finish()


def test_bad_chunk_objects():
    header, _ = encoded()
    with pytest.raises(CodecError, match="chunk data must be a contiguous bytes-like object, got int"):
        BundleDecoder(header).feed(RawChunk(0, 12345))  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="expected a chunk with an int offset and data, got str"):
        BundleDecoder(header).feed("chunk")  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="expected a chunk with an int offset and data, got RawChunk"):
        BundleDecoder(header).feed(RawChunk("zero", b"x"))  # type: ignore[arg-type]
    strided = torch.arange(32, dtype=torch.uint8).numpy()[::2]
    with pytest.raises(CodecError, match="chunk data must be a contiguous bytes-like object, got ndarray"):
        BundleDecoder(header).feed(RawChunk(0, strided))  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="expected a BundleHeader, got dict"):
        BundleDecoder({})  # type: ignore[arg-type]


def test_encode_rejections():
    with pytest.raises(CodecError, match=r"tensor 'z': unsupported dtype torch.complex64 \(supported: float"):
        encode({"z": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(CodecError, match="tensor 'n': expected a torch.Tensor, got list"):
        encode({"n": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(CodecError, match="tensor 's': only dense"):
        encode({"s": torch.eye(3).to_sparse()})
    with pytest.raises(CodecError, match="tensor names must be non-empty strings, got ''"):
        encode({"": torch.zeros(1)})
    with pytest.raises(CodecError, match="a bundle is a mapping"):
        encode([torch.zeros(1)])  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="unknown checksum algorithm 'sha1'"):
        encode({"x": torch.zeros(1)}, checksum="sha1")
    for bad in (0, -1, codec.MAX_CHUNK_BYTES + 1, 1.5, True):
        with pytest.raises(CodecError, match=r"chunk_bytes must be an int in \[1, "):
            encode({"x": torch.zeros(1)}, bad)  # type: ignore[arg-type]


def test_meta_tensor_cannot_be_read():
    with pytest.raises(CodecError, match="tensor 'm': cannot read it on the host"):
        encode({"m": torch.empty(3, device="meta")})


def test_every_prefix_truncation_and_every_single_byte_flip_is_caught():
    """Exhaustive on a small bundle: no truncation and no flipped byte slips through."""
    bundle = {"a": torch.arange(6, dtype=torch.float16), "b": torch.tensor([1, -2], dtype=torch.int32)}
    header, chunks = encode(bundle, 4)
    data = b"".join(c.data for c in chunks)
    for cut in range(len(data)):
        pieces = [RawChunk(o, data[o:min(o + 4, cut)]) for o in range(0, cut, 4)]
        with pytest.raises(CodecError):
            decode(header, pieces)
    for i, bit in itertools.product(range(len(data)), (0x01, 0x80)):
        bad = bytearray(data)
        bad[i] ^= bit
        with pytest.raises(CodecError, match="checksum mismatch"):
            decode(header, [RawChunk(o, bytes(bad[o:o + 4])) for o in range(0, len(bad), 4)])


def test_streaming_holds_one_chunk_at_a_time():
    """Sending and receiving a 32 MiB bundle as 1 MiB raw chunk frames allocates at most a few chunks of
    Python memory at once (tracemalloc sees the frames' bytes; the decode buffer is torch's, allocated once).
    Materializing the frames instead would trace over 32 MiB."""
    x = torch.arange(8 << 20, dtype=torch.float32)
    tracemalloc.start()
    try:
        stream = frames.bundle_frames(1, {"x": x}, 1 << 20)
        decoder = BundleDecoder(next(stream).header)
        for wire in stream:
            decoder.feed(frames.parse_frame(wire))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        materialized = list(frames.bundle_frames(1, {"x": x}, 1 << 20))
        _, peak_materialized = tracemalloc.get_traced_memory()
        del materialized
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak traced memory {peak} bytes"
    assert peak_materialized > 32 << 20  # the measurement can see a non-streaming sender
    assert torch.equal(decoder.finish()["x"], x)


# -- caches and buffers (codec internals that must not change what a bundle decodes to) ---------------------


def test_cached_header_template_is_never_shared_with_a_caller():
    """Two bundles of one layout get headers from the same cached template: each header is a copy (a caller
    that edits one does not edit the next), and each carries its own data's checksum."""
    a = {"w": torch.zeros(4), "b": torch.ones(2, dtype=torch.int64)}
    b = {"w": torch.full((4,), 3.0), "b": torch.ones(2, dtype=torch.int64)}
    ha, _ = encode_views(a)
    ha.tensors[0].name = "edited"
    ha.tensors.add(name="extra", dtype="uint8", shape=[1], nbytes=1)
    hb, chunks = encode_views(b)
    assert [t.name for t in hb.tensors] == ["w", "b"]
    assert hb.checksum != ha.checksum
    assert_bundles_equal(decode(hb, chunks), b)


def test_cached_layout_still_checks_limit_checksum_and_rejects_bad_headers_every_time():
    bundle = {"x": torch.arange(100, dtype=torch.float32)}
    header, chunks = encode(bundle, 64)
    chunks = list(chunks)
    assert_bundles_equal(decode(header, chunks), bundle)  # the layout is cached now
    with pytest.raises(CodecError, match="exceeds the limit max_bytes=100 bytes"):
        BundleDecoder(header, max_bytes=100)
    forged = pb.BundleHeader()
    forged.CopyFrom(header)
    forged.checksum ^= 1  # same layout, other checksum: the cache must not remember the checksum
    with pytest.raises(CodecError, match="checksum mismatch"):
        decode(forged, chunks)
    bad = pb.BundleHeader()
    bad.CopyFrom(header)
    bad.total_bytes += 1
    for _ in range(2):  # an invalid header is not cached as valid
        with pytest.raises(CodecError, match="total_bytes=401, but its tensors add up to 400"):
            BundleDecoder(bad)


def _vm_flags(address: int) -> str:
    """The VmFlags line of the mapping of this process that contains ``address``."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line
    raise LookupError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="Linux-only: madvise(MADV_HUGEPAGE)")
def test_big_bundles_decode_into_a_huge_page_mapping_that_lives_as_long_as_its_tensors(monkeypatch):
    monkeypatch.setattr(codec, "_HUGE_BUFFER_BYTES", 1 << 16)
    g = torch.Generator().manual_seed(3)
    bundle = {"w": random_tensor(torch.float32, (300, 100), g), "flag": torch.tensor(True),
              "h": random_tensor(torch.bfloat16, (7, 9), g), "i": random_tensor(torch.int64, (5,), g)}
    header, chunks = encode(bundle, 4096)
    decoder = BundleDecoder(header)
    for c in chunks:
        decoder.feed(c)
    out = decoder.finish()
    del decoder
    assert_bundles_equal(out, bundle)
    w = out["w"]
    assert w.data_ptr() % 4096 == 0  # the mapping's first page: w is the first tensor
    assert " hg" in _vm_flags(w.data_ptr())  # advised for transparent huge pages
    assert len({t.untyped_storage().data_ptr() for t in out.values()}) == 1
    del out
    w.add_(1.0)  # the mapping outlives the decoder and the other tensors; tensors stay writable
    assert torch.equal(w, bundle["w"] + 1.0)


def test_decoded_tensors_are_separate_contiguous_regions():
    bundle = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.arange(4, dtype=torch.int16),
              "c": torch.zeros(2, 2, dtype=torch.float64)}
    out = roundtrip(bundle, 5)
    assert all(t.is_contiguous() and t.shape == bundle[k].shape for k, t in out.items())
    out["a"].fill_(-1.0)
    out["b"].zero_()
    assert torch.equal(out["c"], bundle["c"]) and torch.equal(out["b"], torch.zeros(4, dtype=torch.int16))
    assert torch.equal(out["a"], torch.full((2, 3), -1.0))


def _reader(data: bytes, step: int):
    """A recv_into over ``data`` that hands out at most ``step`` bytes per call, then 0 (end of stream)."""
    pos = 0

    def recv_into(view: memoryview) -> int:
        nonlocal pos
        n = min(len(view), step, len(data) - pos)
        view[:n] = data[pos:pos + n]
        pos += n
        return n

    return recv_into


def test_fill_receives_a_plain_byte_stream_into_place():
    """fill() reads the payload stream (tensor bytes back to back, no chunk frames) straight into the decode
    buffer, across tensor boundaries and alignment gaps, with any piece size the stream hands out."""
    bundle = mixed_bundle()
    header, views = encode_views(bundle, 64)
    stream = b"".join(bytes(c.data) for c in views)
    for step in (1, 7, 4096):
        dec = BundleDecoder(header)
        dec.fill(_reader(stream, step))
        assert dec.complete
        assert_bundles_equal(dec.finish(), bundle)
    dec = BundleDecoder(header)  # chunks first, then the rest as a stream
    first = stream[:64]
    dec.feed(RawChunk(0, first))
    dec.fill(_reader(stream[64:], 1000))
    assert_bundles_equal(dec.finish(), bundle)


def test_fill_reports_truncation_corruption_and_a_broken_reader():
    bundle = {"a": torch.arange(10, dtype=torch.int32), "b": torch.arange(4, dtype=torch.float64)}
    header, views = encode_views(bundle)
    stream = b"".join(bytes(c.data) for c in views)
    dec = BundleDecoder(header)
    with pytest.raises(CodecError, match=r"truncated bundle: received 30 of 72 bytes; incomplete tensors: "
                                         r"'a' has 30 of 40 bytes, 'b' has 0 of 32 bytes"):
        dec.fill(_reader(stream[:30], 8))
    with pytest.raises(CodecError, match="has failed"):
        dec.fill(_reader(stream, 8))
    bad = bytearray(stream)
    bad[50] ^= 0x10
    dec = BundleDecoder(header)
    dec.fill(_reader(bytes(bad), 64))
    with pytest.raises(CodecError, match="checksum mismatch"):
        dec.finish()

    def broken(view: memoryview) -> int:
        raise ConnectionResetError("peer went away")

    with pytest.raises(CodecError, match="receiving the payload at offset 0 failed: peer went away"):
        BundleDecoder(header).fill(broken)
    with pytest.raises(CodecError, match=r"recv_into returned 99 for a 40-byte view at offset 0"):
        BundleDecoder(header).fill(lambda view: 99)
