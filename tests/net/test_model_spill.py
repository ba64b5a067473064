"""Issue 19, over a real (in-process) gRPC server with fake children: the PS's spilled starting model
(common/engine/spill.py) is sent from its file mapping, and its pages leave memory before the first reply is
folded (NetComm tells the round loop when a reply starts streaming into the aggregate: ``BaseComm.model_sent``),
so the PS never holds it beside the aggregate; a second scatter of it after the drop (what a redone round sends)
carries the same bytes, read back from the page cache. An edge (edge/comm.py) does the same with the model its
parent sent, spilled by its scatter: the decode buffer it arrived in is freed, and a failed spill write leaves
the model in memory, logged."""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterator

import pytest
import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.engine import spill as spill_module
from fedhop.common.engine.base import MissingLog
from fedhop.common.engine.spill import Spill, Spiller, spill_state
from fedhop.common.wire import codec
from fedhop.common.wire.bundle import clone
from fedhop.common.wire.framing import bundle_frames
from fedhop.common.wire.messages import result_frame
from fedhop.edge.comm import EdgeComm
from fedhop.transport.child import ChildSession
from fedhop.transport.netcomm import NetComm
from fedhop.transport.session import ParentHub
from tests.net.hubs import fedavg_parent, take_task
from tests.smaps import mapped_rss

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not spill_module.CAN_DROP,
                                reason="reads /proc/self/smaps; needs madvise(MADV_DONTNEED)")

CHUNK = 64 << 10
SHAPES = {"w": (96, 1000), "b": (1000,)}
MODEL_BYTES = sum(4 * torch.Size(s).numel() for s in SHAPES.values())
WEIGHTS = {"client-0": 10, "client-1": 25, "client-2": 7}


@pytest.fixture
def parent() -> Iterator[tuple[ParentHub, dict[str, ChildSession], object]]:
    with fedavg_parent("spill", WEIGHTS, CHUNK) as p:
        yield p


def resident(spill: Spill) -> int:
    """The mapping's resident bytes."""
    return mapped_rss(spill.address)


class Round:
    """Scatters of ``model`` from ``comm`` to the fake children, each answering with its reply: which requests each
    child received (``got``) and, in order, each page drop of the spill (``"drop"``, when a test points the drop
    at :meth:`drop`) and each reply starting to stream into the aggregate (``"sink"``)."""

    def __init__(self, comm: NetComm, children: dict[str, ChildSession], replies: dict[str, dict[str, torch.Tensor]],
                 want: dict[str, torch.Tensor]) -> None:
        self.comm, self.children, self.replies, self.want = comm, children, replies, want
        self.events: list[str] = []
        self.got: dict[str, list[dict[str, torch.Tensor]]] = {n: [] for n in WEIGHTS}

    def drop(self, spill: Spill) -> None:
        self.events.append("drop")
        spill.drop()

    def _answer(self, node: str) -> None:
        msg = take_task(self.children[node])
        self.got[node].append(clone(msg.bundle))
        self.children[node].send([result_frame(msg.call_id, {"n": WEIGHTS[node]}, has_bundle=True),
                                  *bundle_frames(msg.call_id, self.replies[node], CHUNK)])

    def scatter(self, model: dict[str, torch.Tensor]) -> dict:
        events = self.events

        class Mean(WeightedMean):
            def sink(self, *a, **kw):  # type: ignore[no-untyped-def]
                events.append("sink")
                return super().sink(*a, **kw)

        helpers = [threading.Thread(target=self._answer, args=(n,), daemon=True) for n in WEIGHTS]
        for h in helpers:
            h.start()
        mean = Mean(lambda node, r: r.scalars["n"], sum(WEIGHTS.values()))
        out = self.comm.scatter(list(WEIGHTS), "fedavg.train", model, {}, expect=self.want, fold=mean)
        for h in helpers:
            h.join(10)
        return out

    def check_drops(self, spill: Spill) -> None:
        """Each reply's stream was preceded by a drop, the first one before the aggregate existed (the first sink
        makes it); the mapping holds no page now."""
        events = self.events
        assert events.count("sink") == len(WEIGHTS) and events[0] == "drop", events
        assert all(events[i - 1] == "drop" for i, e in enumerate(events) if e == "sink"), events
        assert spill.drops == events.count("drop") >= 2 * len(WEIGHTS) + 1  # each stream, each settle, the end
        assert resident(spill) == 0

    def check_requests(self, times: int) -> None:
        for node, requests in self.got.items():
            assert len(requests) == times, node
            assert all(torch.equal(r[k], self.want[k]) for r in requests for k in self.want), node


def replies_and_model(seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    model = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    return model, {n: {k: torch.randn(s, generator=g) for k, s in SHAPES.items()} for n in WEIGHTS}


def test_the_spilled_model_is_sent_and_leaves_memory_before_the_first_reply_is_folded(parent) -> None:
    hub, children, (spec, topo) = parent
    model, replies = replies_and_model()
    want = clone(model)
    spill = spill_state({"model": model}, 1)
    assert spill is not None
    comm = NetComm(topo.server, topo, MissingLog(), hub, spec)
    rnd = Round(comm, children, replies, want)
    comm.on_model_sent = lambda: rnd.drop(spill)

    assert list(rnd.scatter(model)) == list(WEIGHTS)
    rnd.check_drops(spill)
    # a redone round sends the model again after its pages were dropped: read back from the page cache
    assert list(rnd.scatter(model)) == list(WEIGHTS)
    assert resident(spill) == 0
    rnd.check_requests(2)
    assert all(torch.equal(model[k], want[k]) for k in want)
    assert model["w"].untyped_storage().data_ptr() == spill.address


class Recording(Spiller):
    """An edge's spills, each kept (``made``) with its drop recorded in ``rnd``'s events."""

    def __init__(self, rnd: Round | None = None) -> None:
        super().__init__(1)
        self.rnd = rnd
        self.made: list[Spill | None] = []

    def spill(self, state: object) -> Spill | None:
        s = super().spill(state)
        self.made.append(s)
        if s is not None and self.rnd is not None:
            s.drop = lambda s=s, drop=s.drop: (self.rnd.events.append("drop"), drop())[1]  # type: ignore[method-assign]
        return s


def received(model: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, torch.Tensor], list]:
    """``model`` as an edge holds the model its parent sent: decoded by the codec into one buffer of its own (the
    tensors are views of it); with a weak reference to that buffer."""
    buffers: list[weakref.ref] = []
    allocate = codec.allocate

    def recorded(size: int, **kw):  # type: ignore[no-untyped-def]
        buf = allocate(size, **kw)
        buffers.append(weakref.ref(buf))
        return buf

    with monkeypatch.context() as m:
        m.setattr(codec, "allocate", recorded)
        header, chunks = codec.encode_views(model, CHUNK)
        bundle = codec.decode(header, list(chunks))
    assert len(buffers) == 1 and buffers[0]() is not None
    return bundle, buffers


def test_an_edge_spills_the_model_it_received_and_drops_it_before_the_first_reply_is_folded(
        parent, monkeypatch: pytest.MonkeyPatch) -> None:
    """An edge's scatter (edge/comm.py): the model its parent sent leaves the edge's memory once the requests are
    out, the decode buffer it came in is freed, and a second scatter of it after the drop (a resend) carries the
    same bytes from the same mapping."""
    hub, children, (spec, topo) = parent
    model, replies = replies_and_model(1)
    want = clone(model)
    params, buffers = received(model, monkeypatch)
    comm = EdgeComm(topo.server, topo, MissingLog(), hub, spec, spills=Recording())
    rnd = Round(comm, children, replies, want)
    comm.spills.rnd = rnd

    assert list(rnd.scatter(params)) == list(WEIGHTS)
    [spill] = comm.spills.made
    assert spill is not None and spill.tensors >= len(params)
    assert all(t.untyped_storage().data_ptr() == spill.address for t in params.values())
    assert buffers[0]() is None  # the anonymous copy is gone
    rnd.check_drops(spill)
    assert comm.on_model_sent is None  # the drop hook is the scatter's only

    assert list(rnd.scatter(params)) == list(WEIGHTS)  # the same model again: the same mapping, not a new spill
    assert comm.spills.made == [spill, spill]
    assert resident(spill) == 0
    rnd.check_requests(2)
    assert all(torch.equal(params[k], want[k]) for k in want)


def test_an_edge_whose_spill_cannot_be_written_sends_its_model_from_memory(
        parent, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """No temporary file at the edge (a full or read-only $TMPDIR): the scatter goes on with the model where it
    was, the same bytes, and the log says so."""
    hub, children, (spec, topo) = parent
    model, replies = replies_and_model(2)
    want = clone(model)
    params, buffers = received(model, monkeypatch)
    where = {k: t.data_ptr() for k, t in params.items()}

    def full(*a: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill_module.tempfile, "mkstemp", full)
    comm = EdgeComm(topo.server, topo, MissingLog(), hub, spec, spills=Recording())
    rnd = Round(comm, children, replies, want)
    with caplog.at_level("WARNING", logger="fedhop.engine"):
        assert list(rnd.scatter(params)) == list(WEIGHTS)
    assert comm.spills.made == [None]
    assert any("stays in memory" in r.message and "No space left" in r.message for r in caplog.records)
    assert {k: t.data_ptr() for k, t in params.items()} == where and buffers[0]() is not None
    rnd.check_requests(1)
