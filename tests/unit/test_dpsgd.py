"""D-PSGD (common/algorithms/dpsgd.py) in-process: the Metropolis-Hastings mixing matrix, one round against a
hand-written reference (local SGD steps + W mixing, written here without the algorithm's code), the bytes per
directed peer link per round, and the missing-peer rule (its weight goes to W_ii)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from fedhop.check import formula_verdict
from fedhop.common.algorithms.dpsgd import SLOT, PeerState, mixing_matrix, mixing_row
from fedhop.common.algorithms.local import sample_batch
from fedhop.common.engine.api import ALGORITHMS
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology, peer_graph
from fedhop.common.wire.bundle import payload_bytes
from tests.specs import DIGITS, spec_dict

Bundle = dict[str, torch.Tensor]


def dpsgd_spec(clients: int = 3, rounds: int = 1, graph: str = "ring", **options: Any) -> RunSpec:
    raw = spec_dict("dpsgd", {"local_steps": 2, "lr": 0.1, "batch_size": 16, **options}, clients=clients,
                    edges=0, rounds=rounds, seed=3, data=DIGITS, model={"name": "mlp", "hidden": [8]})
    raw["topology"]["peer_graph"] = graph
    return RunSpec.parse(raw)


# -- the mixing matrix ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,kind,seed", [(3, "ring", 0), (6, "ring", 0), (5, "complete", 0), (7, "random", 1),
                                         (9, "random", 4), (12, "random", 11)])
def test_mixing_matrix_is_symmetric_and_doubly_stochastic(n: int, kind: str, seed: int) -> None:
    adj = peer_graph(n, kind, 3, seed)
    w = mixing_matrix(adj)
    assert np.allclose(w, w.T, atol=0, rtol=0) or np.array_equal(w, w.T)
    assert np.allclose(w.sum(axis=0), 1.0) and np.allclose(w.sum(axis=1), 1.0)
    assert (w >= 0).all() and (np.diag(w) > 0).all()
    for i in range(n):  # W_ij > 0 exactly on the links (and the diagonal)
        assert {j for j in range(n) if j != i and w[i, j] > 0} == adj[i]
        for j in adj[i]:
            assert w[i, j] == 1.0 / (1 + max(len(adj[i]), len(adj[j])))
    if kind == "random":
        assert len({len(a) for a in adj}) > 1, "want a graph with unequal degrees"


def test_mixing_row_is_the_matrix_row_and_gives_missing_weight_to_the_diagonal() -> None:
    adj = peer_graph(8, "random", 3, 2)
    names = [f"client-{i}" for i in range(8)]
    nb = {names[i]: tuple(names[j] for j in sorted(adj[i])) for i in range(8)}
    w = mixing_matrix(adj)
    for i in range(8):
        row = dict(mixing_row(names[i], nb, set(names)))
        assert row == {names[j]: w[i, j] for j in range(8) if w[i, j] > 0}
    i = max(range(8), key=lambda k: len(adj[k]))
    gone = names[sorted(adj[i])[0]]
    row = dict(mixing_row(names[i], nb, set(names) - {gone}))
    assert gone not in row
    assert row[names[i]] == pytest.approx(w[i, i] + w[i, names.index(gone)])
    assert sum(row.values()) == pytest.approx(1.0)


# -- one round against a hand-written reference -----------------------------------------------------------------
def ref_steps(ws: Workspace, client: str, x: Bundle, steps: int, lr: float, batch: int, rnd: int) -> Bundle:
    """``steps`` plain SGD steps on ``client``'s data from ``x``, on the client's stream of round ``rnd``."""
    gen = ws.torch_rng(client, "dpsgd.step", rnd)
    w = {k: v.detach().clone() for k, v in x.items()}
    for _ in range(steps):
        xb, yb = sample_batch(ws.client_data(client), batch, gen)
        leaves = {k: v.clone().requires_grad_(True) for k, v in w.items()}
        loss = ws.loss(ws.forward(leaves, xb), yb)
        grads = torch.autograd.grad(loss, list(leaves.values()))
        w = {k: (w[k] - lr * g).detach() for k, g in zip(leaves, grads, strict=True)}
    return w


def ref_round(ws: Workspace, xs: list[Bundle], order: str, rnd: int) -> list[Bundle]:
    """One D-PSGD round for every client: local steps, then x_i = sum_j W_ij s_j (+ y_i - x_i for "paper")."""
    topo = ws.topology
    n = len(topo.clients)
    adj = [{topo.clients.index(p) for p in topo.neighbours[c]} for c in topo.clients]
    w = mixing_matrix(adj)
    ys = [ref_steps(ws, c, xs[i], 2, 0.1, 16, rnd) for i, c in enumerate(topo.clients)]
    sent = ys if order == "step_then_mix" else xs
    out = []
    for i in range(n):
        mixed = {k: sum(float(w[i, j]) * sent[j][k] for j in range(n)) for k in xs[i]}
        if order == "paper":
            mixed = {k: mixed[k] + ys[i][k] - xs[i][k] for k in mixed}
        out.append(mixed)
    return out


def close(a: Bundle, b: Bundle) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)


@pytest.mark.parametrize("clients,graph,order", [(3, "ring", "step_then_mix"), (5, "random", "paper")])
def test_two_rounds_equal_the_reference(clients: int, graph: str, order: str) -> None:
    spec = dpsgd_spec(clients, rounds=2, graph=graph, order=order)
    eng = InProcessEngine(spec, device="cpu")
    res = eng.run()
    ws = Workspace(spec, "cpu")
    x0 = ws.initial_params()
    xs = [x0] * clients
    for t in range(2):
        xs = ref_round(ws, xs, order, t)
    for i, c in enumerate(ws.topology.clients):
        st: PeerState = eng.nodes[c].state
        assert st.x is not None and close(st.x, xs[i]), c
        assert not [k for k in eng.nodes[c].inbox if k.startswith(SLOT)], "the mix empties the gossip slots"
    avg = {k: sum(x[k] for x in xs) / clients for k in x0}
    assert close(res.final, avg)
    if clients == 3:  # the ring of 3 is complete: W = J / 3 and one mix is the exact average
        assert all(close(eng.nodes[c].state.x, res.final) for c in ws.topology.clients)
    else:
        assert not close(xs[0], xs[1]), "the clients' models should still differ after two rounds"
    assert [r["stepped"] for r in res.rounds] == [r["mixed"] for r in res.rounds] == [clients, clients]
    last = res.rounds[-1]
    assert last["accuracy_min"] <= last["accuracy"] <= last["accuracy_max"]


# -- bytes ------------------------------------------------------------------------------------------------------
def test_d_per_directed_peer_link_per_round_and_the_declared_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dpsgd_spec(5, rounds=2, graph="random")
    res = InProcessEngine(spec, device="cpu").run()
    d_bytes = payload_bytes(res.final)
    topo = build_topology(spec.topology, spec.seed)
    links = {(i, j) for i in topo.clients for j in topo.neighbours[i]}
    assert len(links) == 2 * sum(len(topo.neighbours[c]) for c in topo.clients) // 2 and links
    for t in range(2):
        moved = {(r["src"], r["dst"]): r["payload_bytes"] for r in res.links
                 if r["round"] == t and r["kind"] == "handoff" and r["phase"] == "request"}
        assert moved == {k: d_bytes for k in links}, t
    ps = [r for r in res.links if "ps" in (r["src"], r["dst"]) and r["payload_bytes"]]
    assert sorted((r["src"], r["kind"], r["phase"], r["round"], r["payload_bytes"]) for r in ps) == \
        [(c, "dpsgd.collect", "reply", 1, d_bytes) for c in topo.clients]
    assert ALGORITHMS["dpsgd"].payload_per_round(spec, topo, d_bytes) == {(i, j, "handoff"): d_bytes
                                                                          for i, j in links}
    verdict = formula_verdict(spec, res)
    assert verdict.ok is True and "as declared" in verdict.detail, verdict
    assert f"{len(topo.clients) * d_bytes} bytes of the final step" in verdict.detail
    # the final collect is left out of the last round, nothing else: a formula that forgets a link still fails
    right = ALGORITHMS["dpsgd"]
    short = lambda *a: dict(list(right.payload_per_round(*a).items())[1:])  # noqa: E731
    monkeypatch.setitem(ALGORITHMS, "dpsgd", dataclasses.replace(right, payload_per_round=short))
    wrong = formula_verdict(spec, res)
    assert wrong.ok is False and "round 1" in wrong.detail and "vs declared 0" in wrong.detail, wrong


# -- the missing-peer rule ---------------------------------------------------------------------------------------
def test_a_missing_peer_gives_its_weight_to_the_diagonal() -> None:
    """Round 1 on a ring of 4: hand-offs to client-1 fail (it mixes its own model alone) and client-2's step
    fails (its peers mix without it; it mixes x^0 as its own)."""
    spec = dpsgd_spec(4, rounds=1)
    down = {("client-1", "handoff"), ("client-2", "dpsgd.step")}
    eng = InProcessEngine(spec, device="cpu", faults=FaultPlan(lambda node, task, rnd: (node, task) in down))
    eng.run()
    ws = Workspace(spec, "cpu")
    x0 = ws.initial_params()
    y = {c: ref_steps(ws, c, x0, 2, 0.1, 16, 0) for c in ("client-0", "client-1", "client-3")}
    third = 1.0 / 3  # ring: every degree is 2, W_ij = 1/3 on a link, W_ii = 1/3
    want = {
        "client-0": {k: third * y["client-0"][k] + third * y["client-1"][k] + third * y["client-3"][k] for k in x0},
        "client-1": y["client-1"],  # nothing reached it: W_11 = 1
        "client-2": {k: third * x0[k] + third * y["client-1"][k] + third * y["client-3"][k] for k in x0},
        "client-3": {k: (1 - third) * y["client-3"][k] + third * y["client-0"][k] for k in x0},  # client-2 absent
    }
    for c, w in want.items():
        assert close(eng.nodes[c].state.x, w), c
    missed = {(e["by"], e["node"], e["task"]) for e in eng.missing.entries}
    assert missed == {("client-0", "client-1", "handoff"), ("ps", "client-2", "dpsgd.step")}, missed


def test_a_stale_model_from_an_earlier_round_is_not_mixed() -> None:
    """client-1 misses round 1's mix: the model client-0 handed it in round 1 stays in its inbox; in round 2
    client-0's step fails, and client-1 must mix without client-0 rather than with round 1's leftover."""
    spec = dpsgd_spec(3, rounds=2)
    down = {("client-1", "dpsgd.mix", 0), ("client-0", "dpsgd.step", 1)}
    eng = InProcessEngine(spec, device="cpu", faults=FaultPlan(lambda node, task, rnd: (node, task, rnd) in down))
    eng.run()
    ws = Workspace(spec, "cpu")
    x0 = ws.initial_params()
    third = 1.0 / 3
    y1 = [ref_steps(ws, f"client-{i}", x0, 2, 0.1, 16, 0) for i in range(3)]
    x2 = {k: sum(third * y[k] for y in y1) for k in x0}  # client-2 mixed all three in round 1
    y2 = {"client-1": ref_steps(ws, "client-1", x0, 2, 0.1, 16, 1),  # client-1 kept x^0
          "client-2": ref_steps(ws, "client-2", x2, 2, 0.1, 16, 1)}
    want = {k: (1 - third) * y2["client-1"][k] + third * y2["client-2"][k] for k in x0}
    assert close(eng.nodes["client-1"].state.x, want)
