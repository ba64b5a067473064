"""Issue 19, over a real (in-process) gRPC server with fake children: the PS's spilled starting model
(common/engine/spill.py) is sent from its file mapping, and its pages leave memory before the first reply is
folded (NetComm tells the round loop when a reply starts streaming into the aggregate: ``BaseComm.model_sent``),
so the PS never holds it beside the aggregate; a second scatter of it after the drop (what a redone round sends)
carries the same bytes, read back from the page cache."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest
import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.engine import spill as spill_module
from fedhop.common.engine.base import MissingLog
from fedhop.common.engine.spill import Spill, spill_state
from fedhop.common.wire.bundle import clone
from fedhop.common.wire.framing import bundle_frames
from fedhop.common.wire.messages import result_frame
from fedhop.transport.child import ChildSession
from fedhop.transport.netcomm import NetComm
from fedhop.transport.session import ParentHub
from tests.net.hubs import parent_with_children, take_task
from tests.smaps import mapped_rss
from tests.specs import DIGITS, run_spec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not spill_module.CAN_DROP,
                                reason="reads /proc/self/smaps; needs madvise(MADV_DONTNEED)")

CHUNK = 64 << 10
SHAPES = {"w": (96, 1000), "b": (1000,)}
MODEL_BYTES = sum(4 * torch.Size(s).numel() for s in SHAPES.values())
WEIGHTS = {"client-0": 10, "client-1": 25, "client-2": 7}


@pytest.fixture
def parent() -> Iterator[tuple[ParentHub, dict[str, ChildSession], object]]:
    spec = run_spec("fedavg", {}, clients=3, edges=0, name="spill", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]}, transport={"chunk_bytes": CHUNK, "rpc_timeout_s": 30.0})
    with parent_with_children(spec, WEIGHTS) as (hub, children, topo):
        yield hub, children, (spec, topo)


def resident(spill: Spill) -> int:
    """The mapping's resident bytes."""
    return mapped_rss(spill.address)


def test_the_spilled_model_is_sent_and_leaves_memory_before_the_first_reply_is_folded(parent) -> None:
    hub, children, (spec, topo) = parent
    g = torch.Generator().manual_seed(0)
    model = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    want = clone(model)
    spill = spill_state({"model": model}, 1)
    assert spill is not None
    replies = {n: {k: torch.randn(s, generator=g) for k, s in SHAPES.items()} for n in WEIGHTS}
    comm = NetComm(topo.server, topo, MissingLog(), hub, spec)
    events: list[str] = []  # "drop" and "sink" (a reply starts streaming into the aggregate) in their order

    class Mean(WeightedMean):
        def sink(self, *a, **kw):  # type: ignore[no-untyped-def]
            events.append("sink")
            return super().sink(*a, **kw)

    def drop() -> None:
        events.append("drop")
        spill.drop()

    comm.on_model_sent = drop

    got: dict[str, list[dict[str, torch.Tensor]]] = {n: [] for n in WEIGHTS}  # the requests each child received

    def answer(node: str) -> None:
        msg = take_task(children[node])
        got[node].append(clone(msg.bundle))
        children[node].send([result_frame(msg.call_id, {"n": WEIGHTS[node]}, has_bundle=True),
                             *bundle_frames(msg.call_id, replies[node], CHUNK)])

    def scatter() -> dict:
        helpers = [threading.Thread(target=answer, args=(n,), daemon=True) for n in WEIGHTS]
        for h in helpers:
            h.start()
        mean = Mean(lambda node, r: r.scalars["n"], sum(WEIGHTS.values()))
        out = comm.scatter(list(WEIGHTS), "fedavg.train", model, {}, expect=want, fold=mean)
        for h in helpers:
            h.join(10)
        return out

    assert list(scatter()) == list(WEIGHTS)
    # each reply's stream is preceded by a drop: the first one before the aggregate existed (the first sink makes it)
    assert events.count("sink") == len(WEIGHTS) and events[0] == "drop", events
    assert all(events[i - 1] == "drop" for i, e in enumerate(events) if e == "sink"), events
    assert spill.drops == events.count("drop") >= 2 * len(WEIGHTS) + 1  # each stream, each settle, the end
    assert resident(spill) == 0
    # a redone round sends the model again after its pages were dropped: read back from the page cache
    assert list(scatter()) == list(WEIGHTS)
    assert resident(spill) == 0
    for node, requests in got.items():
        assert len(requests) == 2 and all(torch.equal(r[k], want[k]) for r in requests for k in want), node
    assert all(torch.equal(model[k], want[k]) for k in want)
    assert model["w"].untyped_storage().data_ptr() == spill.address
