"""frames.message_bytes (what the in-process engine counts) equals the serialized size of the frames the
networked engine really sends; the MessageAssembler regroups frames into messages and names bad ones."""

from __future__ import annotations

import pytest
import torch

from fedhop.common.wire import messages
from fedhop.common.wire.frames import (
    CALL_ID_BASE,
    DESCRIBE,
    HANDOFF,
    FrameError,
    MessageAssembler,
    chunk_frame_bytes,
    frame_size,
    message_bytes,
    message_frames,
    parse_frame,
    put_scalars,
    result_frame,
    serialize_frame,
    task_frame,
    unbatched,
)
from fedhop.v1 import fedhop_pb2 as pb

BUNDLES = {
    "empty": {},
    "zero-size": {"z": torch.zeros(0, 3)},
    "small": {"w": torch.randn(5, 3), "b": torch.arange(3, dtype=torch.int64), "flag": torch.tensor(True)},
    "multi-chunk": {"w": torch.randn(3000), "v": torch.randn(17, 31, dtype=torch.float64)},
}
SCALARS = {"solver.lr": 0.1, "solver.steps": 5, "weighting": "data_size", "on": False, "big": 1 << 40}


def sent_bytes(head: pb.Frame, bundle: dict) -> int:
    """The serialized bytes of the frames sent (a Batch's inner frames, parsed back from the wire: the batch around
    them is framing, not counted)."""
    return sum(frame_size(g) for f in message_frames(head, bundle, 1024)
               for g in unbatched(parse_frame(serialize_frame(f))))


@pytest.mark.parametrize("name", list(BUNDLES))
@pytest.mark.parametrize("call_id", [CALL_ID_BASE, CALL_ID_BASE + 1, CALL_ID_BASE + 987654321])
@pytest.mark.parametrize("round_idx", [0, 1, 999_999])
@pytest.mark.parametrize("batch_max", [0, 64 << 10])
def test_message_bytes_equal_serialized_frames(name: str, call_id: int, round_idx: int, batch_max: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "BATCH_MAX_BYTES", batch_max)  # sent as 1 + 1 + chunks frames, or as one batch
    b = BUNDLES[name]
    req = task_frame(call_id, "local.train", SCALARS, deadline_s=123.5, has_bundle=bool(b), round_idx=round_idx)
    assert sent_bytes(req, b) == message_bytes("local.train", "request", b, SCALARS, 1024)
    rep = result_frame(call_id, {"loss": 0.25, "n": 7}, has_bundle=bool(b))
    assert sent_bytes(rep, b) == message_bytes("local.train", "reply", b, {"loss": 0.25, "n": 7}, 1024)
    ho = task_frame(call_id, HANDOFF, {"visits": 3}, deadline_s=30.0, has_bundle=bool(b))
    assert sent_bytes(ho, b) == message_bytes(HANDOFF, "request", b, {"visits": 3}, 1024)


def test_handoff_ack_and_describe_sizes() -> None:
    assert message_bytes(HANDOFF, "reply", {}, {}, 1024) == pb.Ack(ok=True).ByteSize()
    assert message_bytes(DESCRIBE, "request", {}, {}, 1024) == pb.DescribeRequest().SerializeToString().__len__()
    facts = {"data_size": 1234, "visits": 2}
    r = pb.DescribeReply()
    put_scalars(r.info, facts)
    assert message_bytes(DESCRIBE, "reply", {}, facts, 1024) == len(r.SerializeToString())


def test_assembler_regroups_a_message_and_counts_its_bytes() -> None:
    b = BUNDLES["multi-chunk"]
    frames = [parse_frame(serialize_frame(f)) for f in message_frames(
        task_frame(CALL_ID_BASE, "t", {"a": 1}, deadline_s=1.0, has_bundle=True, round_idx=4), b, 1024)]
    asm = MessageAssembler()
    out = [asm.feed(f) for f in frames]
    assert all(m is None for m in out[:-1])
    msg = out[-1]
    assert msg is not None and msg.error is None and msg.kind == "task"
    assert list(msg.bundle) == list(b) and all(torch.equal(msg.bundle[k], b[k]) for k in b)
    assert msg.payload_bytes == sum(v.numel() * v.element_size() for v in b.values())
    assert msg.message_bytes == sum(frame_size(f) for f in frames) == message_bytes("t", "request", b, {"a": 1},
                                                                                     1024)


def test_assembler_names_bad_frames() -> None:
    asm = MessageAssembler(max_bytes=100)
    with pytest.raises(FrameError, match="no open bundle"):
        asm.feed(parse_frame(chunk_frame_bytes(CALL_ID_BASE, 0, b"xy")))
    with pytest.raises(FrameError, match="without a call id"):
        asm.feed(task_frame(0, "t", {}, deadline_s=1.0, has_bundle=False))
    head = task_frame(CALL_ID_BASE + 1, "t", {}, deadline_s=1.0, has_bundle=True)
    frames = list(message_frames(head, {"w": torch.zeros(1000)}, 1024))
    assert asm.feed(frames[0]) is None
    msg = asm.feed(frames[1])  # the header announces 4000 bytes > max_bytes
    assert msg is not None and msg.error is not None and "exceeds the limit" in msg.error
    assert asm.feed(parse_frame(frames[2])) is None  # the rest of that call is dropped quietly
