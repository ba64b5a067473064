"""The PS's fold above edges (issue 19, ``fedavg.cloud_round``): each edge's model is folded into the aggregate as
it arrives instead of being collected and averaged whole (``average_replies``).

Bits: when every client of every edge trained, the fold is ``average_replies`` bit for bit; an edge that reports
fewer samples than its subtree holds (a client missing, participation below 1) is rescaled at the end (the same
mean to rounding, the same bits in every engine: ``tests/integration/test_network_equivalence.py``, case
``fedavg-edges-sampled``); an edge reporting 0 samples is no reply; a single edge's model is the mean as it is.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from fedhop.common.algorithms import fedavg
from fedhop.common.engine.api import Reply
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.wire.bundle import Bundle
from tests.specs import run_spec


def small(edges: int = 2, clients: int = 4, rounds: int = 2, **opts: Any):
    return run_spec("fedavg", {"local_steps": 2, "batch_size": 16, **opts}, clients=clients, edges=edges,
                    data={"dataset": "digits", "partition": "iid"}, model={"name": "logreg"}, rounds=rounds, seed=5)


def collected_cloud_round(ctx, params: Bundle) -> Bundle:
    """The PS above edges before issue 19's fold: collect every edge's model, drop those of n = 0, average."""
    replies = ctx.comm.scatter(ctx.children, "hier.edge_round", params, {}, expect=params)
    replies = {e: r for e, r in replies.items() if int(r.scalars["n"]) > 0}
    return fedavg.average_replies(ctx, replies, "data_size")[0] if replies else params


def both(monkeypatch: pytest.MonkeyPatch, spec, faults: FaultPlan | None = None):
    folded = InProcessEngine(spec, faults=faults).run()
    with monkeypatch.context() as m:
        m.setattr(fedavg, "cloud_round", collected_cloud_round)
        collected = InProcessEngine(spec, faults=faults).run()
    assert folded.missing == collected.missing
    assert [r["loss"] for r in folded.rounds] == pytest.approx([r["loss"] for r in collected.rounds], rel=1e-5)
    return folded.final, collected.final


def test_every_edge_complete_is_the_collected_average_bit_for_bit(monkeypatch) -> None:
    folded, collected = both(monkeypatch, small())
    assert list(folded) == list(collected)
    for k in folded:
        assert torch.equal(folded[k], collected[k]), k


def test_single_edge_is_the_collected_average_bit_for_bit_under_sampling(monkeypatch) -> None:
    """One edge reporting fewer samples than its subtree (half its clients sampled): its model is the mean."""
    folded, collected = both(monkeypatch, small(edges=1, clients=4, participation=0.5))
    for k in folded:
        assert torch.equal(folded[k], collected[k]), k


def test_a_missing_client_under_an_edge_gives_the_same_mean_to_rounding(monkeypatch) -> None:
    dead = FaultPlan(lambda node, task, rnd: node == "client-1" and task == "local.train")
    folded, collected = both(monkeypatch, small(rounds=2), dead)
    for k in folded:
        torch.testing.assert_close(folded[k], collected[k], rtol=1e-6, atol=1e-7)


# -- the fold's arithmetic, on synthetic edge models -------------------------------------------------------------

def models(seed: int, k: int) -> list[Bundle]:
    g = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(1000, generator=g), "b": torch.randn(7, generator=g)} for _ in range(k)]


def fold(sizes: dict[str, int], replies: dict[str, tuple[int, Bundle]]) -> tuple[Bundle | None, list[str]]:
    ctx = SimpleNamespace(sizes=sizes)
    mean = fedavg.edge_mean(ctx, tuple(sizes))  # type: ignore[arg-type]
    for e, (n, b) in replies.items():
        mean(e, Reply({k: v.clone() for k, v in b.items()}, {"n": n}))
    return (None if mean.empty else mean.result()), mean.nodes


def test_edge_weights_fold_as_normalised_then_rescaled() -> None:
    b = models(1, 3)
    sizes = {"edge-0": 60, "edge-1": 40, "edge-2": 50}
    got, nodes = fold(sizes, {"edge-0": (45, b[0]), "edge-1": (0, b[1]), "edge-2": (50, b[2])})
    assert nodes == ["edge-0", "edge-2"]  # the edge of weight 0 is no reply
    assert got is not None
    expected_total, total = 150.0, 95.0
    for k in got:  # the fold's own arithmetic, spelled out: products and sum in canonical order, then the rescale
        want = (b[0][k] * (45 / expected_total)).add_(b[2][k], alpha=50 / expected_total).mul_(expected_total / total)
        assert torch.equal(got[k], want), k
        whole = (b[0][k] * (45 / total)).add_(b[2][k], alpha=50 / total)  # the collected average: rounding apart
        torch.testing.assert_close(got[k], whole, rtol=1e-6, atol=1e-6)


def test_complete_edges_fold_as_the_collected_average() -> None:
    b = models(2, 2)
    sizes = {"edge-0": 30, "edge-1": 70}
    got, _ = fold(sizes, {"edge-0": (30, b[0]), "edge-1": (70, b[1])})
    ctx = SimpleNamespace(data_size=lambda n: sizes[n])
    want, n = fedavg.average_replies(ctx, {e: Reply(m, {"n": sizes[e]}) for e, m in zip(sizes, b, strict=True)},
                                     "data_size")
    assert got is not None and n == 100
    for k in got:
        assert torch.equal(got[k], want[k]), k


def test_no_edge_trained_leaves_the_model() -> None:
    b = models(3, 2)
    got, nodes = fold({"edge-0": 10, "edge-1": 10}, {"edge-0": (0, b[0]), "edge-1": (0, b[1])})
    assert got is None and nodes == []


def test_single_edge_model_is_the_mean_whatever_its_weight() -> None:
    b = models(4, 1)
    got, _ = fold({"edge-0": 100}, {"edge-0": (37, b[0])})
    assert got is not None
    for k in got:
        assert torch.equal(got[k], b[0][k]), k
    assert fold({"edge-0": 100}, {"edge-0": (0, b[0])})[0] is None


def test_cloud_round_hands_the_edges_replies_to_a_streaming_fold() -> None:
    """The PS asks its scatter to fold (the networked engine then streams each edge's reply chunk by chunk into
    the fold's sink: ``StreamingFold``) and keeps no edge's reply: the scatter returns them without bundles."""
    from fedhop.common.wire.fold import StreamingFold

    b = models(5, 2)
    seen: dict[str, Any] = {}

    class Comm:
        def scatter(self, to, task, bundle, args, *, expect=None, fold=None):
            seen.update(to=tuple(to), task=task, fold=fold)
            assert fold is not None
            for e, m in zip(to, b, strict=True):
                fold(e, Reply({k: v.clone() for k, v in m.items()}, {"n": 10}))
            return {e: Reply({}, {"n": 10}) for e in to}

    edges = ("edge-0", "edge-1")
    ctx = SimpleNamespace(children=edges, sizes={"edge-0": 10, "edge-1": 10}, comm=Comm())
    params = {k: torch.zeros_like(v) for k, v in b[0].items()}
    got = fedavg.cloud_round(ctx, params)  # type: ignore[arg-type]
    assert seen["to"] == edges and seen["task"] == "hier.edge_round"
    assert isinstance(seen["fold"], StreamingFold)
    for k in got:
        assert torch.equal(got[k], (b[0][k] * 0.5).add_(b[1][k], alpha=0.5)), k
