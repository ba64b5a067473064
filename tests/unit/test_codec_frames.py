"""Frames (common/wire/frames.py): scalars, bundles as frames, and the raw chunk path's byte equality with
protobuf's own serialization."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhop.common.wire import frames
from fedhop.common.wire.bundle import payload_bytes
from fedhop.common.wire.codec import BundleDecoder, CodecError
from fedhop.common.wire.frames import ChunkFrame, chunk_frame_bytes, frame_size, parse_frame
from fedhop.v1 import fedhop_pb2 as pb

CASES = [
    (0, 0, b""),
    (0, 0, b"x"),
    (1, 0, b"abc"),
    (0, 5, b"abc"),
    (300, 1 << 40, bytes(range(256)) * 3),
    ((1 << 64) - 1, (1 << 63) + 7, b"\x00" * 127),
    (7, 128, b"\xff" * 128),
    (2**31, 16384, bytes(16384)),
    (9, 3 << 20, bytes(1 << 20)),
]


def pb_chunk_frame(call_id: int, offset: int, data: bytes) -> pb.Frame:
    frame = pb.Frame(call_id=call_id)
    frame.chunk.offset = offset
    frame.chunk.data = data
    return frame


@pytest.mark.parametrize(("call_id", "offset", "data"), CASES, ids=range(len(CASES)))
def test_raw_chunk_frame_is_byte_identical_to_protobuf(call_id, offset, data):
    reference = pb_chunk_frame(call_id, offset, data)
    raw = chunk_frame_bytes(call_id, offset, memoryview(data))
    assert raw == reference.SerializeToString()
    assert len(raw) == reference.ByteSize()
    parsed = parse_frame(raw)
    assert isinstance(parsed, ChunkFrame)
    assert (parsed.call_id, parsed.offset, bytes(parsed.data)) == (call_id, offset, data)
    assert parsed.size == len(raw)
    assert pb.Frame.FromString(raw) == reference


def test_parse_frame_returns_protobuf_for_other_frames():
    task = pb.Frame(call_id=4)
    task.task.name = "fedavg.train"
    task.task.has_bundle = True
    frames.put_scalars(task.task.args, {"round": 3, "lr": 0.1})
    header = pb.Frame(call_id=4, header=pb.BundleHeader(total_bytes=8, chunk_bytes=4))
    for f in (task, header, pb.Frame(), pb.Frame(call_id=9), pb.Frame(bye=pb.Bye(reason="done"))):
        parsed = parse_frame(f.SerializeToString())
        assert isinstance(parsed, pb.Frame) and parsed == f
    assert frames.frame_kind(task) == "task" and frames.frame_kind(pb.Frame()) == "keepalive"
    assert frames.frame_kind(chunk_frame_bytes(1, 0, b"ab")) == "chunk"


def test_parse_frame_falls_back_on_non_canonical_chunk_encodings():
    reference = pb_chunk_frame(5, 10, b"hello")
    inner = b"\x12\x05hello" + b"\x08\x0a"  # data before offset
    variants = [
        b"\x3a" + bytes([len(inner)]) + inner + b"\x08\x05",  # call_id after chunk
        b"\x08\x05\x3a" + bytes([len(inner)]) + inner,
        reference.SerializeToString() + b"\x08\x05",  # call_id repeated (last wins)
        b"\x08\x05\x3a\x09\x08\x0a\x12\x05hello" + b"\x3a\x00",  # chunk field repeated (merged)
    ]
    for v in variants:
        parsed = parse_frame(v)
        assert isinstance(parsed, pb.Frame), v
        assert parsed == reference, v
    with_unknown = reference.SerializeToString() + b"\xa0\x06\x01"  # unknown field 100
    assert isinstance(parse_frame(with_unknown), pb.Frame)


def test_malformed_frame_is_a_codec_error():
    with pytest.raises(CodecError, match=r"malformed Frame \(4 bytes\)"):
        parse_frame(b"\x3a\x05ab")


@pytest.mark.parametrize("raw", [True, False])
def test_bundle_frames_roundtrip_and_count_message_bytes(raw):
    g = torch.Generator().manual_seed(0)
    bundle = {
        "w": torch.randn(40, 30, generator=g),
        "b": torch.randn(30, generator=g).bfloat16(),
        "n": torch.tensor(3),
    }
    out = list(frames.bundle_frames(11, bundle, 1000, raw=raw))
    wire = [frames.serialize_frame(f) for f in out]
    parsed = [parse_frame(w) for w in wire]
    assert frames.frame_kind(parsed[0]) == "header" and parsed[0].call_id == 11
    dec = BundleDecoder(parsed[0].header)
    for f in parsed[1:]:
        assert frames.frame_kind(f) == "chunk"
        if isinstance(f, ChunkFrame):
            assert f.call_id == 11
            dec.feed(f)
        else:
            assert f.call_id == 11
            dec.feed(f.chunk)
    got = dec.finish()
    for k in bundle:
        assert torch.equal(got[k], bundle[k])
    assert sum(frame_size(f) for f in out) == sum(len(w) for w in wire) == sum(frame_size(p) for p in parsed)
    assert sum(len(w) for w in wire[1:]) - payload_bytes(bundle) < 20 * len(wire)


def test_raw_and_protobuf_paths_send_the_same_bytes():
    bundle = {"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3, 3, dtype=torch.int64)}
    raw = [frames.serialize_frame(f) for f in frames.bundle_frames(2, bundle, 333, raw=True)]
    plain = [frames.serialize_frame(f) for f in frames.bundle_frames(2, bundle, 333, raw=False)]
    assert raw == plain


def test_bundle_frames_validates_eagerly():
    with pytest.raises(CodecError, match="unsupported dtype"):
        frames.bundle_frames(1, {"z": torch.zeros(1, dtype=torch.complex64)})


def test_scalars_roundtrip():
    values = {
        "b": True, "f": False, "i": -(1 << 63), "j": (1 << 63) - 1, "x": 0.1, "s": "héllo",
        "nan": float("nan"),
        "np_i": np.int32(7), "np_f": np.float32(0.5), "np_b": np.bool_(True),
    }
    task = pb.Task(name="t")
    frames.put_scalars(task.args, values)
    back = frames.get_scalars(pb.Task.FromString(task.SerializeToString()).args)
    assert list(back) == sorted(values)
    for k, v in values.items():
        got = back[k]
        assert type(got) is {np.int32: int, np.float32: float, np.bool_: bool}.get(type(v), type(v)), k
        assert got == v or (v != v and got != got), k
    assert isinstance(frames.from_scalar(frames.to_scalar(2.0)), float)
    assert isinstance(frames.from_scalar(frames.to_scalar(2)), int)


def test_scalar_rejections():
    with pytest.raises(CodecError, match="integer scalar 9223372036854775808 does not fit in int64"):
        frames.to_scalar(1 << 63)
    with pytest.raises(CodecError, match="a scalar is a bool, int, float or str, got list"):
        frames.to_scalar([1])
    with pytest.raises(CodecError, match="empty Scalar"):
        frames.from_scalar(pb.Scalar())
