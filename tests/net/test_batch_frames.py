"""Issue 19, one gRPC message per small message, over a real (in-process) gRPC server: a scatter's small Task and
each child's small Result cross the wire as ONE gRPC message each way (a Batch, counted by wrapping the
deserializers at both ends), a folding scatter's batched replies pass the reply gate in order and fold bit for bit
as the plain fold does, the byte meter counts what it counted before, and a payload above the threshold or on the
bulk lane travels as before. The PS's servicer hands a batch's frames to the protocol in ONE session-pool job."""

from __future__ import annotations

import os
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.engine.api import Reply
from fedhop.common.engine.base import MissingLog
from fedhop.common.wire import framing, messages
from fedhop.common.wire.bundle import clone
from fedhop.common.wire.framing import BadFrame, batch_frame_bytes, frame_kind
from fedhop.common.wire.messages import message_bytes, message_frames, result_frame
from fedhop.transport import child as child_mod
from fedhop.transport import parent as parent_mod
from fedhop.transport.lane import ENV_MIN_BYTES
from fedhop.transport.netcomm import NetComm
from fedhop.v1 import fedhop_pb2 as pb
from tests.net.hubs import fedavg_parent, next_task, parent_with_children, take_task
from tests.net.test_session_batching import Host, _serve, _stream
from tests.specs import DIGITS, run_spec
from tests.waiting import wait_until

CHUNK = 64 << 10
SHAPES = {"w": (16, 50), "b": (50,)}  # 3,400 bytes: one chunk, under BATCH_MAX_BYTES
EXPECT = {k: torch.zeros(s) for k, s in SHAPES.items()}
WEIGHTS = {"client-0": 10, "client-1": 25, "client-2": 7}
MESSAGE_KINDS = ("task", "result", "header", "chunk", "batch")  # what a Task or a Result travels as


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The kinds of the gRPC messages the PS ("up") and the children ("down") deserialize, in order (each end's
    deserializer wrapped before its streams are opened)."""
    seen: dict[str, list[str]] = {"up": [], "down": []}

    def counting(side: str) -> Callable[[bytes], Any]:
        def parse(buf: bytes) -> Any:
            out = framing.parse_frame_lenient(buf)
            seen[side].append("bad" if isinstance(out, BadFrame) else frame_kind(out))
            return out
        return parse

    monkeypatch.setattr(parent_mod, "parse_frame_lenient", counting("up"))
    monkeypatch.setattr(child_mod, "parse_frame_lenient", counting("down"))
    return seen


def _messages(kinds: list[str]) -> Counter:
    return Counter(k for k in kinds if k in MESSAGE_KINDS)


def _replies(seed: int) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {n: {k: torch.randn(s, generator=g) for k, s in SHAPES.items()} for n in WEIGHTS}


def _folding_scatter(parent: Any, model: dict[str, torch.Tensor], bundles: dict[str, dict[str, torch.Tensor]],
                     ) -> tuple[dict, WeightedMean, MissingLog]:
    """A folding scatter of ``model`` to the three children, each answering (in its own thread, in reverse order:
    the reply gate holds the early ones) with its bundle as a Result message sent as the transport sends it."""
    hub, children, (spec, topo) = parent
    comm = NetComm(topo.server, topo, missing := MissingLog(), hub, spec)

    def answer(node: str) -> None:
        cid = next_task(children[node])
        children[node].send(message_frames(result_frame(cid, {"n": WEIGHTS[node]}, has_bundle=True),
                                           bundles[node], CHUNK))

    helpers = [threading.Thread(target=answer, args=(n,), daemon=True) for n in reversed(list(WEIGHTS))]
    for h in helpers:
        h.start()
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(WEIGHTS.values()))
    out = comm.scatter(list(WEIGHTS), "fedavg.train", model, {}, expect=EXPECT, deadline_s=30.0, fold=mean)
    for h in helpers:
        h.join(10)
    return out, mean, missing


def _plain_fold(bundles: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(WEIGHTS.values()))
    for n in WEIGHTS:
        mean(n, Reply(clone(bundles[n]), {"n": WEIGHTS[n]}))
    return mean.result()


def _meter(hub: Any, phase: str) -> list[tuple[int, int, int]]:
    """(messages, payload bytes, message bytes) of the PS's rows of ``phase`` for fedavg.train, per child."""
    return [(r["messages"], r["payload_bytes"], r["message_bytes"]) for r in hub.meter.rows()
            if r["kind"] == "fedavg.train" and r["phase"] == phase]


@pytest.mark.parametrize("batch_max", [messages.DEFAULT_BATCH_MAX_BYTES, 0])
def test_a_small_task_and_its_result_are_one_grpc_message_each_way_and_counted_as_before(
        wire: dict[str, list[str]], batch_max: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "BATCH_MAX_BYTES", batch_max)  # 0: the frames one by one, as protocol 1 sent them
    model = {k: torch.full(s, 0.5) for k, s in SHAPES.items()}
    bundles = _replies(4)
    with fedavg_parent("batch", WEIGHTS, CHUNK) as parent:
        out, mean, missing = _folding_scatter(parent, model, bundles)
        hub = parent[0]
        assert list(out) == list(WEIGHTS) and missing.entries == []
        got, want = mean.result(), _plain_fold(bundles)
        assert all(torch.equal(got[k], want[k]) for k in want)  # the gate's canonical order: bit for bit
        n = len(WEIGHTS)
        if batch_max:
            assert _messages(wire["down"]) == {"batch": n}  # one gRPC message per Task ...
            assert _messages(wire["up"]) == {"batch": n}  # ... and per Result
        else:
            assert _messages(wire["down"]) == {"task": n, "header": n, "chunk": n}
            assert _messages(wire["up"]) == {"result": n, "header": n, "chunk": n}
        payload = sum(4 * torch.Size(s).numel() for s in SHAPES.values())
        assert _meter(hub, "request") == [
            (1, payload, message_bytes("fedavg.train", "request", model, {}, CHUNK))] * n
        assert sorted(_meter(hub, "reply")) == sorted(
            (1, payload, message_bytes("fedavg.train", "reply", bundles[c], {"n": w}, CHUNK))
            for c, w in WEIGHTS.items())


def test_a_task_over_the_threshold_is_not_batched(wire: dict[str, list[str]],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "BATCH_MAX_BYTES", 1024)  # the model is 3,400 bytes
    model = {k: torch.full(s, 0.5) for k, s in SHAPES.items()}
    with fedavg_parent("batch-over", {"client-0": 1}, CHUNK) as (hub, children, _):
        call = hub.call("client-0", "fedavg.train", model, {}, 0, 30.0)
        assert not hasattr(call, "reason"), call
        msg = take_task(children["client-0"])
        assert torch.equal(msg.bundle["w"], model["w"])
        assert _messages(wire["down"]) == {"task": 1, "header": 1, "chunk": 1}


def test_a_small_payload_on_the_lane_is_not_batched(wire: dict[str, list[str]]) -> None:
    spec = run_spec("fedavg", {}, clients=1, edges=0, name="batch-lane", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]}, transport={"chunk_bytes": CHUNK, "rpc_timeout_s": 30.0})
    model = {k: torch.full(s, 0.25) for k, s in SHAPES.items()}
    with mock.patch.dict(os.environ, {ENV_MIN_BYTES: "100"}), \
            parent_with_children(spec, {"client-0": 1}, lane=True) as (hub, children, _):
        assert children["client-0"]._stream is not None and children["client-0"]._stream.lane is not None
        call = hub.call("client-0", "fedavg.train", model, {}, 0, 30.0)
        assert not hasattr(call, "reason"), call
        msg = take_task(children["client-0"])  # its payload read from the lane
        assert torch.equal(msg.bundle["b"], model["b"])
        assert _messages(wire["down"]) == {"task": 1, "header": 1}  # the chunk frame went on the lane


def _numbered_batch(first: int, n: int, q: queue.Queue) -> Iterator[Any]:
    """One Batch of frames numbered first..first+n-1 (Error frames: not empty, so they may be batched), then the
    stream stays open until told."""
    yield batch_frame_bytes([[pb.Frame(call_id=k, error=pb.Error(message="x")).SerializeToString()]
                             for k in range(first, first + n)])
    q.get()


def test_the_frames_of_one_batch_are_handled_in_order_by_one_pool_job() -> None:
    host = Host()
    server, servicer, addr = _serve(host)
    q: queue.Queue = queue.Queue()
    channel, call = _stream(addr, _numbered_batch(1, 5, q))
    try:
        wait_until(lambda: len(host.seen) == 5, "the batch's frames to be handled")
        assert host.seen == [1, 2, 3, 4, 5]
        assert servicer.messages_read == 1 and servicer.frames_read == 5
        assert servicer.jobs == 1  # one hand-off to the session pool for the whole batch
    finally:
        q.put(None)
        call.cancel()
        channel.close()
        server.stop(0)

