"""Issue 19, one gRPC message per small message: a message whose payload is small travels as ONE Batch frame holding
its head, header and chunk frames (``framing.batch_frame_bytes``, protobuf's own bytes, built with one copy of the
payload); the receiver parses it into its inner frames (``FrameBatch``: chunks zero-copy, a bad one a ``BadFrame``);
the byte meter counts the inner frames, not the batch around them; malformed batches are refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedhop.common.wire import messages
from fedhop.common.wire.framing import (
    BadFrame,
    BatchBytes,
    ChunkFrame,
    FrameBatch,
    batch_frame_bytes,
    chunk_frame_bytes,
    frame_kind,
    frame_size,
    parse_frame,
    parse_frame_lenient,
    serialize_frame,
    unbatched,
)
from fedhop.common.wire.messages import (
    BATCH_ENV,
    CALL_ID_BASE,
    DEFAULT_BATCH_MAX_BYTES,
    BundleMessage,
    FrameError,
    MessageAssembler,
    batch_max_bytes,
    message_bytes,
    message_frames,
    result_frame,
    task_frame,
)
from fedhop.transport.session import ChildLink
from fedhop.v1 import fedhop_pb2 as pb

SMALL = {"w": torch.arange(40, dtype=torch.float32).reshape(4, 10), "b": torch.ones(10, dtype=torch.float64)}
CHUNK = 1 << 20


def _task(cid: int = CALL_ID_BASE + 7, bundle: dict | None = None, chunk_bytes: int = CHUNK) -> Any:
    b = SMALL if bundle is None else bundle
    head = task_frame(cid, "fedavg.train", {"lr": 0.1}, deadline_s=5.0, has_bundle=True, round_idx=3)
    return message_frames(head, b, chunk_bytes)


def _plain(msg: BundleMessage, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """``msg``'s frames as sent one by one (batching off), serialized."""
    with monkeypatch.context() as m:
        m.setattr(messages, "BATCH_MAX_BYTES", 0)
        return [serialize_frame(f) for f in msg]


def test_a_small_message_is_one_batch_whose_bytes_are_protobufs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _task()
    assert isinstance(msg, BundleMessage) and msg.batched
    sent = list(msg)
    assert len(sent) == 1 and isinstance(sent[0], BatchBytes)
    plain = _plain(msg, monkeypatch)
    assert len(plain) == 3  # Task, header, one chunk
    assert serialize_frame(sent[0]) == pb.Frame(batch=pb.Batch(frames=plain)).SerializeToString()
    # counted as its inner frames (the batch's tag and lengths are framing): what the in-process engine counts
    assert frame_size(sent[0]) == sum(map(len, plain)) == msg.message_bytes
    assert frame_size(sent[0]) == message_bytes("fedavg.train", "request", SMALL, {"lr": 0.1}, CHUNK)
    assert frame_kind(sent[0]) == "batch"


def test_a_batch_parses_into_its_frames_the_chunk_a_view_of_the_received_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _task()
    wire = serialize_frame(next(iter(msg)))
    got = parse_frame_lenient(wire)
    assert isinstance(got, FrameBatch) and frame_kind(got) == "batch"
    head, header, chunk = got.frames
    assert head == msg.head and header == pb.Frame(call_id=msg.head.call_id, header=msg.header)
    assert isinstance(chunk, ChunkFrame) and chunk.call_id == msg.head.call_id and chunk.offset == 0
    assert chunk.data.obj is wire  # not copied out of the received message
    assert bytes(chunk.data) == b"".join(bytes(v) for v in msg.views)
    assert got.size == frame_size(got) == msg.message_bytes == sum(frame_size(f) for f in got.frames)
    assert unbatched(got) == got.frames and unbatched(head) == (head,)
    # protobuf's own parse agrees on the entries
    entries = pb.Frame.FromString(wire).batch.frames
    assert list(entries) == _plain(msg, monkeypatch)


def test_the_assembler_takes_a_batchs_frames_as_one_message() -> None:
    cid = CALL_ID_BASE + 9
    sent = list(message_frames(result_frame(cid, {"n": 3}, has_bundle=True), SMALL, CHUNK))
    assert len(sent) == 1
    asm = MessageAssembler()
    out = [asm.feed(f) for f in unbatched(parse_frame(serialize_frame(sent[0])))]
    assert out[:2] == [None, None]
    got = out[2]
    assert got is not None and got.error is None and got.call_id == cid
    assert all(torch.equal(got.bundle[k], SMALL[k]) for k in SMALL)
    assert got.message_bytes == message_bytes("x", "reply", SMALL, {"n": 3}, CHUNK)


@pytest.mark.parametrize("why, max_bytes, chunk_bytes", [
    ("over BATCH_MAX_BYTES", 200, CHUNK),
    ("batching off", 0, CHUNK),
    ("more than one chunk", DEFAULT_BATCH_MAX_BYTES, 128),
])
def test_a_message_over_the_threshold_or_of_several_chunks_is_not_batched(
        why: str, max_bytes: int, chunk_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "BATCH_MAX_BYTES", max_bytes)
    msg = _task(chunk_bytes=chunk_bytes)  # 240 payload bytes
    assert not msg.batched, why
    sent = list(msg)
    assert not any(isinstance(f, BatchBytes) for f in sent)
    assert len(sent) == 2 + -(-msg.payload_bytes // chunk_bytes)
    assert sum(frame_size(f) for f in sent) == msg.message_bytes


def test_a_payload_of_exactly_the_threshold_is_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "BATCH_MAX_BYTES", 240)
    assert _task().batched
    monkeypatch.setattr(messages, "BATCH_MAX_BYTES", 239)
    assert not _task().batched


class _Lane:
    """A bulk lane that carries everything (what ``ChildLink.sent_frames`` asks and writes)."""

    def __init__(self) -> None:
        self.sent: list[list] = []

    def carries(self, total_bytes: int) -> bool:
        return True

    def send(self, chunks: Any) -> None:
        self.sent.append(list(chunks))


def test_a_message_whose_payload_goes_on_the_lane_is_not_batched() -> None:
    link = ChildLink("ipv4:127.0.0.1:1")
    link.lane = _Lane()  # type: ignore[assignment]
    msg = _task()
    counted: list[int] = []
    link.send(msg, counted.append)
    frames = list(link.sent_frames(link.poll()))
    assert [f.WhichOneof("body") for f in frames] == ["task", "header"]  # on the stream; the chunk on the lane
    assert len(link.lane.sent) == 1  # type: ignore[union-attr]
    assert counted == [msg.message_bytes]
    plain = ChildLink("ipv4:127.0.0.1:2")  # no lane: the same message is one batch, counted the same
    plain.send(_task(), counted.append)
    frames = list(plain.sent_frames(plain.poll()))
    assert len(frames) == 1 and isinstance(frames[0], BatchBytes)
    assert counted == [msg.message_bytes, msg.message_bytes]


def _batch(*entries: bytes) -> bytes:
    return pb.Frame(batch=pb.Batch(frames=list(entries))).SerializeToString()


TASK = task_frame(CALL_ID_BASE, "t", {}, deadline_s=1.0, has_bundle=False).SerializeToString()


@pytest.mark.parametrize("wire, words", [
    (_batch(), "an empty batch"),
    (_batch(TASK, _batch(TASK)), "holding a batch frame"),
    (_batch(pb.Frame(hello=pb.Hello(node_id="x")).SerializeToString()), "holding a hello frame"),
    (_batch(pb.Frame(welcome=pb.Welcome(node_id="x")).SerializeToString()), "holding a welcome frame"),
    (_batch(TASK, b""), "holding a keep-alive frame"),
    (pb.Frame(call_id=5, batch=pb.Batch(frames=[TASK])).SerializeToString(), "a batch with a call id (5)"),
    (b"\x6a\x05\x0a\x09abc", "runs past the frame"),
    (b"\x6a\x02\x12\x00", "a field other than its frames"),
])
def test_a_malformed_batch_is_a_bad_frame_that_says_why(wire: bytes, words: str) -> None:
    got = parse_frame_lenient(wire)
    assert isinstance(got, BadFrame), got
    assert words in got.error and "malformed Frame" in got.error
    assert got.size == len(wire)
    with pytest.raises(FrameError, match="malformed frame"):
        MessageAssembler().feed(got)


def test_a_bad_inner_frame_is_a_bad_frame_in_its_place_and_the_others_still_parse() -> None:
    chunk = chunk_frame_bytes(CALL_ID_BASE, 0, b"abcd")
    got = parse_frame_lenient(_batch(TASK, b"\xff\xff\xff", chunk))
    assert isinstance(got, FrameBatch)
    task, bad, ch = got.frames
    assert isinstance(task, pb.Frame) and task.WhichOneof("body") == "task"
    assert isinstance(bad, BadFrame) and "malformed Frame in a batch (3 bytes)" in bad.error and bad.size == 3
    assert isinstance(ch, ChunkFrame) and bytes(ch.data) == b"abcd"
    asm = MessageAssembler()
    assert asm.feed(task) is not None  # a Task without a bundle: whole at once
    with pytest.raises(FrameError, match="malformed frame: malformed Frame in a batch"):
        asm.feed(bad)


def test_batch_frame_bytes_refuses_an_empty_batch_and_a_keep_alive() -> None:
    with pytest.raises(ValueError, match="empty batch"):
        batch_frame_bytes([])
    with pytest.raises(ValueError, match="keep-alive"):
        batch_frame_bytes([[TASK], [b""]])
    one = batch_frame_bytes([[TASK[:3], memoryview(TASK)[3:]]])  # an inner frame given as several buffers
    assert one.data == _batch(TASK) and one.size == len(TASK)


def test_the_threshold_comes_from_the_environment_and_a_bad_value_names_the_variable() -> None:
    assert batch_max_bytes({}) == DEFAULT_BATCH_MAX_BYTES == 64 << 10
    assert batch_max_bytes({BATCH_ENV: ""}) == DEFAULT_BATCH_MAX_BYTES
    assert batch_max_bytes({BATCH_ENV: "0"}) == 0
    assert batch_max_bytes({BATCH_ENV: " 16384 "}) == 16384
    for bad in ("64K", "1.5", "-1"):
        with pytest.raises(ValueError, match=f"{BATCH_ENV}={bad!r}"):
            batch_max_bytes({BATCH_ENV: bad})
