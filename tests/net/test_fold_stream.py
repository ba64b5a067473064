"""Issue 19, over a real (in-process) gRPC server with fake children that send their replies by hand: a folding
scatter adds each reply into the aggregate chunk by chunk as it arrives (``common/wire/fold.py``), so the parent
never holds a whole reply beside the aggregate, and the result is bit for bit the plain fold's (the in-process
engine's) also when a reply fails after part of it was added (NaN in a late chunk, a checksum mismatch, a stall
past the deadline): the aggregate is restored from the undo log and the reply is dropped alone.

The memory bound is asserted on the codec's count of live decode buffers (``codec.BUFFERS``), not on RSS or time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.engine.api import Reply
from fedhop.common.engine.base import MissingLog
from fedhop.common.wire.bundle import clone
from fedhop.common.wire.codec import BUFFERS
from fedhop.common.wire.framing import bundle_frames
from fedhop.common.wire.messages import result_frame
from fedhop.transport.child import ChildSession
from fedhop.transport.netcomm import NetComm
from fedhop.transport.session import ParentHub
from tests.net.hubs import fedavg_parent, next_task

CHUNK = 64 << 10
SHAPES = {"w": (96, 1000), "b": (1000,)}  # 388,000 bytes: six chunks, one spanning the two tensors
MODEL_BYTES = sum(4 * torch.Size(s).numel() for s in SHAPES.values())
EXPECT = {k: torch.zeros(s) for k, s in SHAPES.items()}
WEIGHTS = {"client-0": 10, "client-1": 25, "client-2": 7}


@pytest.fixture
def parent() -> Iterator[tuple[ParentHub, dict[str, ChildSession], object]]:
    with fedavg_parent("fold", WEIGHTS, CHUNK) as p:
        yield p


def replies(seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {n: {k: torch.randn(s, generator=g) for k, s in SHAPES.items()} for n in WEIGHTS}


def frames_of(node: str, cid: int, bundle: dict[str, torch.Tensor]) -> list:
    return [result_frame(cid, {"n": WEIGHTS[node]}, has_bundle=True), *bundle_frames(cid, bundle, CHUNK)]


def plain_fold(bundles: dict[str, dict[str, torch.Tensor]], usable: list[str]) -> dict[str, torch.Tensor]:
    """The in-process engine's fold of the usable replies, in canonical order (whole decoded replies)."""
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(WEIGHTS.values()))
    for n in usable:
        mean(n, Reply(clone(bundles[n]), {"n": WEIGHTS[n]}))
    return mean.result()


def run_scatter(parent, send, deadline_s: float = 30.0):
    """A folding scatter to the three children; ``send(node, cid)`` answers for each (in its own thread)."""
    hub, children, (spec, topo) = parent
    comm = NetComm(topo.server, topo, missing := MissingLog(), hub, spec)

    def answer(node: str) -> None:
        send(node, next_task(children[node]))

    helpers = [threading.Thread(target=answer, args=(n,), daemon=True) for n in reversed(list(WEIGHTS))]
    for h in helpers:
        h.start()
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(WEIGHTS.values()))
    BUFFERS.reset()
    live = BUFFERS.live
    out = comm.scatter(list(WEIGHTS), "fedavg.train", {}, {}, expect=EXPECT, deadline_s=deadline_s, fold=mean)
    peak = BUFFERS.peak - live
    for h in helpers:
        h.join(10)
    return out, mean, missing, peak


def test_replies_stream_into_the_aggregate_and_only_the_first_reply_gets_a_buffer(parent) -> None:
    hub, children, _ = parent
    bundles = replies()
    out, mean, missing, peak = run_scatter(parent, lambda n, cid: children[n].send(frames_of(n, cid, bundles[n])))
    assert list(out) == list(WEIGHTS) and missing.entries == []
    got, want = mean.result(), plain_fold(bundles, list(WEIGHTS))
    assert all(torch.equal(got[k], want[k]) for k in want)
    # one buffer for all three replies: the first one's, which became the aggregate (decoding every reply
    # would hold the aggregate and the reply being received: two models)
    assert peak <= MODEL_BYTES + 64 * len(SHAPES), f"{peak} bytes of decode buffers for a {MODEL_BYTES}-byte model"
    assert mean.undo.saved_total == 2 * MODEL_BYTES and mean.undo.restored_total == 0


def test_a_reply_with_nan_in_its_last_chunk_is_dropped_alone_and_the_aggregate_restored(parent) -> None:
    hub, children, _ = parent
    bundles = replies(1)
    bundles["client-1"]["b"][-1] = float("nan")  # in the last chunk: every earlier chunk was already added
    out, mean, missing, _ = run_scatter(parent, lambda n, cid: children[n].send(frames_of(n, cid, bundles[n])))
    assert list(out) == ["client-0", "client-2"]
    assert [(m["node"], m["reason"]) for m in missing.entries] == [
        ("client-1", "rejected reply: non-finite values (NaN/Inf) in ['b']")]
    got, want = mean.result(), plain_fold(bundles, ["client-0", "client-2"])
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert mean.undo.restored_total > 0


def test_a_reply_failing_its_checksum_is_dropped_alone_and_the_aggregate_restored(parent) -> None:
    hub, children, _ = parent
    bundles = replies(2)

    def send(node: str, cid: int) -> None:
        frames = frames_of(node, cid, bundles[node])
        if node == "client-2":  # the last reply, into an aggregate of two: one byte of its last chunk flipped
            last = bytearray(frames[-1])
            last[-1] ^= 0x40
            frames[-1] = bytes(last)
        children[node].send(frames)

    out, mean, missing, _ = run_scatter(parent, send)
    assert list(out) == ["client-0", "client-1"]
    assert [m["node"] for m in missing.entries] == ["client-2"]
    assert "checksum mismatch" in missing.entries[0]["reason"]
    got, want = mean.result(), plain_fold(bundles, ["client-0", "client-1"])
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert mean.undo.restored_total > 0


def test_a_reply_stalling_after_some_chunks_were_added_is_given_up_and_undone(parent) -> None:
    hub, children, _ = parent
    bundles = replies(3)
    sent = threading.Event()

    def send(node: str, cid: int) -> None:
        frames = frames_of(node, cid, bundles[node])
        if node == "client-1":
            children[node].send(frames[:4])  # Result, header, two chunks: then nothing more
            sent.set()
            return
        if node == "client-2":
            sent.wait(10)
        children[node].send(frames)

    out, mean, missing, _ = run_scatter(parent, send, deadline_s=1.5)
    assert list(out) == ["client-0", "client-2"]
    assert [(m["node"], m["reason"]) for m in missing.entries] == [
        ("client-1", "no reply within the deadline of 1.5s")]
    got, want = mean.result(), plain_fold(bundles, ["client-0", "client-2"])
    assert all(torch.equal(got[k], want[k]) for k in want)
