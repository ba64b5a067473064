"""Fed-CHS baselines (docs/specs/fedchs.md section 5): QSGD, Hier-Local-QSGD, WRWGD, FedAvg readings A and B."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from fedhop.common.algorithms.qsgd import decode, encode, encoded_bytes, quantize
from fedhop.common.algorithms.wrwgd import client_graph, mh_row
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec
from fedhop.common.topology import is_connected
from fedhop.common.wire.bundle import payload_bytes
from tests.specs import run_spec


def spec(algo: str, options: dict[str, Any], *, clients: int = 6, edges: int = 0,
         per_edge: list[int] | None = None, rounds: int = 3, seed: int = 0) -> RunSpec:
    return run_spec(algo, options, clients=clients, edges=edges, clients_per_edge=per_edge,
                    data={"dataset": "synthetic", "partition": "dirichlet", "train_limit": 240, "test_limit": 100},
                    model={"name": "logreg"}, rounds=rounds, seed=seed)


def n_params(s: RunSpec) -> tuple[int, int]:
    p = Workspace(s, "cpu").initial_params()
    return sum(v.numel() for v in p.values()), len(p)


# -- QSGD -------------------------------------------------------------------------------------------

def test_qsgd_is_unbiased_and_within_its_variance_bound() -> None:
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(40, generator=gen)
    s, reps = 4, 6000
    samples = torch.stack([(lambda nl: nl[0] * nl[1].float() / s)(quantize(v, s, gen)) for _ in range(reps)])
    norm = float(v.norm())
    # every coordinate is on the grid ||v|| * l / s with |l| <= s and the sign of v
    levels = samples * s / norm
    assert torch.allclose(levels, levels.round(), atol=1e-4)
    assert float(levels.abs().max()) <= s + 1e-4
    assert bool(((samples * v) >= 0).all())
    # unbiased: per-coordinate variance <= (||v|| / s)^2 / 4, so the mean is within 5 sigma of v
    tol = 5 * norm / (2 * s * math.sqrt(reps))
    assert float((samples.mean(0) - v).abs().max()) < tol
    # E ||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2 (Alistarh et al. 2017, Lemma 3.1)
    d = v.numel()
    mse = float(((samples - v) ** 2).sum(1).mean())
    assert mse <= min(d / s**2, math.sqrt(d) / s) * norm**2
    assert mse > 0


def test_qsgd_zero_vector_and_extremes() -> None:
    gen = torch.Generator().manual_seed(1)
    norm, lv = quantize(torch.zeros(5), 8, gen)
    assert float(norm) == 0 and int(lv.abs().sum()) == 0
    e = torch.tensor([0.0, -3.0, 0.0])  # a single non-zero coordinate is exact
    norm, lv = quantize(e, 8, gen)
    assert lv.tolist() == [0, -8, 0] and float(norm) == 3.0


def test_qsgd_payload_is_int8_levels_plus_a_norm_per_tensor() -> None:
    bundle = {"w": torch.randn(10, 7), "b": torch.randn(10)}
    enc = encode(bundle, 127, torch.Generator().manual_seed(0))
    d = 70 + 10
    assert payload_bytes(enc) == d * 1 + 2 * 4 == encoded_bytes(bundle)
    assert payload_bytes(enc) < payload_bytes(bundle) == d * 4
    assert {v.dtype for k, v in enc.items() if k.endswith(".q")} == {torch.int8}
    dec = decode(enc, bundle, 127)
    for k in bundle:  # s = 127: error per coordinate at most ||v|| / 127
        assert float((dec[k] - bundle[k]).abs().max()) <= float(bundle[k].norm()) / 127 + 1e-6


# -- Hier-Local-QSGD --------------------------------------------------------------------------------

def test_hier_local_qsgd_payload_per_round() -> None:
    per_edge = [2, 3, 1]
    s = spec("hier-local-qsgd", {"local_steps": 2, "edge_rounds": 3, "K": 6}, clients=6, edges=3,
             per_edge=per_edge, rounds=3)
    res = InProcessEngine(s).run()
    d, p = n_params(s)
    q, q_enc = 4 * d, d + 4 * p
    by_round = [0, 0, 0]
    for r in res.links:
        by_round[r["round"]] += r["payload_bytes"]
    # 4 sum_m |N_m| (Q1 + Q) + M (Q2 + Q), with tau2 = 3 here (spec sec. 7 table)
    expected = 3 * sum(per_edge) * (q_enc + q) + 3 * (q_enc + q)
    assert by_round == [expected] * 3
    assert res.rounds[-1]["loss"] < res.rounds[0]["loss"] * 1.5


def test_hier_local_qsgd_learns() -> None:
    s = spec("hier-local-qsgd", {"lr": 8.0, "K": 4, "local_steps": 2, "edge_rounds": 2}, clients=6, edges=2,
             rounds=4)
    res = InProcessEngine(s).run()
    init = Workspace(s, "cpu").evaluate(Workspace(s, "cpu").initial_params())["loss"]
    assert res.rounds[-1]["loss"] < init


# -- WRWGD ------------------------------------------------------------------------------------------

def test_client_graph_and_metropolis_hastings_stationary_law() -> None:
    n = 12
    adj = client_graph(n, 3, seed=4)
    assert is_connected(adj) and max(len(a) for a in adj) <= 3
    pi = np.arange(1, n + 1, dtype=float)
    pi /= pi.sum()
    P = np.stack([mh_row(i, adj, pi) for i in range(n)])
    assert np.allclose(P.sum(1), 1.0) and (P >= 0).all()
    for i in range(n):
        assert all(P[i, j] == 0 for j in range(n) if j != i and j not in adj[i])
    assert np.allclose(pi @ P, pi)  # detailed balance gives pi P = pi
    assert np.allclose(pi[:, None] * P, (pi[:, None] * P).T)


def test_wrwgd_walks_on_the_graph_and_costs_d_per_hop() -> None:
    """The model goes client -> client: d floats on the link of each move, nothing when the walk stays, nothing
    through the PS during training; d once at the end (the PS collects the final model)."""
    T = 12
    s = spec("wrwgd", {"K": 3}, clients=8, rounds=T, seed=2)
    assert s.topology.peer_graph == "random"  # what WRWGD needs, filled in
    res = InProcessEngine(s).run()
    d, _ = n_params(s)
    adj = client_graph(8, 3, s.seed)
    visited = [int(r["client"].split("-")[1]) for r in res.rounds]
    for a, b in zip(visited, visited[1:], strict=False):
        assert b == a or b in adj[a]
    assert len(set(visited)) > 1
    expected: dict[tuple[int, str, str], int] = {}
    for t, (a, b) in enumerate(zip(visited, visited[1:], strict=False)):
        if a != b:
            expected[(t, f"client-{a}", f"client-{b}")] = 4 * d
    got: dict[tuple[int, str, str], int] = {}
    for r in res.links:
        if r["payload_bytes"] and r["round"] < T - 1:
            got[(r["round"], r["src"], r["dst"])] = got.get((r["round"], r["src"], r["dst"]), 0) + r["payload_bytes"]
    assert got == expected
    assert {r["kind"] for r in res.links if r["payload_bytes"] and r["round"] < T - 1} == {"handoff"}
    last = [r for r in res.links if r["payload_bytes"] and r["round"] == T - 1]
    assert sum(r["payload_bytes"] for r in last if r["dst"] == "ps") == 4 * d  # the final collect


def test_wrwgd_step_at_one_client_full_batch_is_k_gd_steps() -> None:
    """One client, full batch, pi uniform = gamma: K GD steps with eta_k = c / (K sqrt(k+1))."""
    K = 4
    s = spec("wrwgd", {"K": K, "batch_size": 0, "lr": 2.0}, clients=1, rounds=1)
    res = InProcessEngine(s).run()
    ws = Workspace(s, "cpu")
    ref = k_gd_steps(ws, ws.client_data("client-0"), [2.0 / (K * math.sqrt(k + 1)) for k in range(K)])
    for k in ref:
        torch.testing.assert_close(res.final[k].double(), ref[k], atol=2e-5, rtol=1e-4)


# -- FedAvg readings (spec sec. 5 item 1) -----------------------------------------------------------

def k_gd_steps(ws: Workspace, data: Any, etas: list[float], w: dict | None = None) -> dict[str, torch.Tensor]:
    w = {k: v.detach().double() for k, v in (w or ws.initial_params()).items()}
    for eta in etas:
        leaves = {n: v.clone().requires_grad_(True) for n, v in w.items()}
        out = torch.func.functional_call(ws.model, leaves, (data.x.double(),))
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(out, data.y), list(leaves.values()))
        w = {n: w[n] - eta * g for n, g in zip(w, grads, strict=True)}
    return w


def test_fedavg_reading_a_full_batch_is_gd_with_restarting_steps() -> None:
    """Reading A: 20 communications a round, one local step each, eta_k = 1/(K sqrt(k+1)); with full
    batches and data-size weights that is GD on F (the union of all clients) with those steps."""
    K, T = 5, 2
    s = spec("fedavg", {"local_steps": 1, "syncs_per_round": K, "lr_schedule_K": K, "lr": 1.0,
                        "batch_size": 0}, clients=4, rounds=T)
    res = InProcessEngine(s).run()
    ws = Workspace(s, "cpu")
    etas = [1.0 / (K * math.sqrt(k + 1)) for k in range(K)] * T
    ref = k_gd_steps(ws, ws.fed.union(), etas)
    for k in ref:
        torch.testing.assert_close(res.final[k].double(), ref[k], atol=2e-5, rtol=1e-4)
    d, _ = n_params(s)
    assert sum(r["payload_bytes"] for r in res.links) == T * K * 4 * 2 * 4 * d  # 20 N (Q_up + Q)


def test_fedavg_reading_b_local_schedule() -> None:
    """Reading B: one average per round of K local steps with eta_k; one client == K GD steps."""
    K = 4
    s = spec("fedavg", {"local_steps": K, "lr_schedule_K": K, "lr": 1.0, "batch_size": 0}, clients=1,
             rounds=2)
    res = InProcessEngine(s).run()
    ws = Workspace(s, "cpu")
    etas = [1.0 / (K * math.sqrt(k + 1)) for k in range(K)] * 2
    ref = k_gd_steps(ws, ws.client_data("client-0"), etas)
    for k in ref:
        torch.testing.assert_close(res.final[k].double(), ref[k], atol=2e-5, rtol=1e-4)


def test_wrwgd_failed_visit_steps_the_walk_back_to_the_copy() -> None:
    """The visited client fails: the model is unchanged (the copy kept by the client that handed it on, as the
    relay version left it unchanged), no tensor moves, and the walk goes on from that client."""
    T = 12
    s = spec("wrwgd", {"K": 3}, clients=8, rounds=T, seed=2)
    clean = InProcessEngine(s).run()
    visited = [r["client"] for r in clean.rounds]
    t = next(t for t in range(2, T - 1) if visited[t] != visited[t - 1])
    dead, previous = visited[t], visited[t - 1]
    res = InProcessEngine(s, faults=FaultPlan(lambda n, task, r: n == dead and r == t)).run()
    route = [r["client"] for r in res.rounds]
    assert route[: t + 1] == visited[: t + 1] and route[t + 1] == previous
    assert [(m["round"], m["node"]) for m in res.missing] == [(t + 1, dead)]
    assert not [r for r in res.links if r["round"] == t and r["payload_bytes"] and r["kind"] != "wrwgd.collect"]
    assert res.rounds[t]["accuracy"] == clean.rounds[t - 1]["accuracy"]  # the copy is the model before round t


def test_wrwgd_model_stays_when_the_next_client_cannot_take_it() -> None:
    T = 6
    s = spec("wrwgd", {"K": 3}, clients=8, rounds=T, seed=2)
    visited = [r["client"] for r in InProcessEngine(s).run().rounds]
    t = next(t for t in range(1, T - 1) if visited[t + 1] != visited[t])
    blocked = visited[t + 1]
    res = InProcessEngine(s, faults=FaultPlan(lambda n, task, r: n == blocked and task == "handoff" and r == t)).run()
    route = [r["client"] for r in res.rounds]
    assert route[: t + 1] == visited[: t + 1] and route[t + 1] == visited[t]  # it stayed one round
    assert any(m["node"] == blocked and m["task"] == "handoff" for m in res.missing)
