"""Fed-CHS (docs/specs/fedchs.md): next-edge rule, literal visit counter, Eq. (5) == gradient descent with full
batches, exact payload per round, the model never at the PS, and the random ES graph."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from fedhop.common.algorithms.fedchs import FedCHSOptions, choose_next
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec, TopologySpec
from fedhop.common.topology import build_topology, edge_graph, is_connected
from tests.specs import run_spec


def spec(options: dict[str, Any] | None = None, *, clients: int = 6, edges: int = 3,
         per_edge: list[int] | None = None, rounds: int = 5, seed: int = 0, graph: str = "random",
         partition: str = "iid", model: str = "logreg", algo: str = "fedchs") -> RunSpec:
    return run_spec(algo, options or {}, clients=clients, edges=edges, clients_per_edge=per_edge, edge_graph=graph,
                    data={"dataset": "synthetic", "partition": partition, "train_limit": 240, "test_limit": 100},
                    model={"name": model}, rounds=rounds, seed=seed)


def edge_sequence(result: Any) -> list[int]:
    return [int(r["edge"].split("-")[1]) for r in result.rounds]


# -- the two-step rule (sec. 3.3), hand-worked ------------------------------------------------------

def test_choose_next_least_visited_beats_larger_data() -> None:
    assert choose_next([(0, 2, 100), (1, 1, 5), (2, 3, 50)]) == 1


def test_choose_next_tie_on_visits_goes_to_larger_data_then_smallest_index() -> None:
    assert choose_next([(0, 1, 5), (1, 1, 9), (2, 1, 7)]) == 1
    assert choose_next([(0, 1, 7), (1, 4, 9), (2, 1, 7)]) == 0
    assert choose_next([(4, 0, 3)]) == 4


def test_choose_next_spec_path_graph_example() -> None:
    """Spec sec. 8 item 5: path 0-1-2, D_A = [5, 9, 7], m(0) = 1, c = [0, 0, 0], literal counters."""
    nbrs = {0: [1], 1: [0, 2], 2: [1]}
    d_a = [5, 9, 7]
    c = [0, 0, 0]
    m = 1
    seq, counters = [m], []
    for _ in range(8):
        m = choose_next([(j, c[j], d_a[j]) for j in nbrs[m]])
        c[m] += 1  # only the receiver counts (Alg. 1 line 18)
        seq.append(m)
        counters.append(list(c))
    # by hand from the spec text: 1 -> 2 (tie, 7 > 5) -> 1 -> 0 (c0 = 0 < c2 = 1) -> 1 -> 2 (tie) -> ...
    assert seq == [1, 2, 1, 0, 1, 2, 1, 0, 1]
    assert counters[:4] == [[0, 0, 1], [0, 1, 1], [1, 1, 1], [1, 2, 1]]
    assert counters[4] == [1, 2, 2]


# -- the rule and the literal counter through the engine --------------------------------------------

# Triangle 0-1-2 with D_A0 < D_A1 < D_A2, five rounds, derived by hand for each m(0):
# literal (c(m(0)) starts at 0) and with count_initial_es (c(m(0)) starts at 1).
EXPECTED_LITERAL = {0: [0, 2, 1, 0, 2], 1: [1, 2, 1, 0, 2], 2: [2, 1, 2, 0, 2]}
EXPECTED_COUNTED = {0: [0, 2, 1, 2, 1], 1: [1, 2, 0, 2, 1], 2: [2, 1, 0, 2, 1]}


@pytest.mark.parametrize("count_initial", [False, True])
def test_engine_walk_follows_rule_and_literal_counter(count_initial: bool) -> None:
    seen = set()
    for seed in range(6):
        s = spec({"K": 1, "count_initial_es": count_initial}, per_edge=[1, 2, 3], graph="complete", seed=seed)
        ws = Workspace(s, "cpu")
        sizes = ws.client_sizes()
        d_a = [sum(sizes[c] for c in ws.topology.cluster(e)) for e in ws.topology.edges]
        assert d_a[0] < d_a[1] < d_a[2], d_a  # precondition of the hand-worked tables
        seq = edge_sequence(InProcessEngine(s).run())
        table = EXPECTED_COUNTED if count_initial else EXPECTED_LITERAL
        assert seq == table[seq[0]]
        seen.add(seq[0])
    assert len(seen) >= 2  # m(0) really is drawn at random


def test_every_edge_visited_and_balanced_on_random_graph() -> None:
    s = spec({"K": 1}, clients=16, edges=8, rounds=80, seed=3)
    seq = edge_sequence(InProcessEngine(s).run())
    counts = [seq.count(m) for m in range(8)]
    assert min(counts) > 0
    topo = build_topology(s.topology, s.seed)
    for a, b in zip(seq, seq[1:], strict=False):
        assert f"edge-{b}" in topo.neighbours[f"edge-{a}"]  # one ES-ES hop per round


# -- Eq. (5) with full batches == gradient descent --------------------------------------------------

def gd_reference(ws: Workspace, clusters: list[list[str]], rounds_edges: list[int],
                 K: int) -> dict[str, torch.Tensor]:
    """Plain GD on F_m(t) = mean loss over the union of cluster m(t)'s data (one batch), in float64,
    eta_k = 1/(K sqrt(k+1)) restarting every round."""
    w = {k: v.detach().clone().to(torch.float64) for k, v in ws.initial_params().items()}
    model = torch.func.functional_call
    for m in rounds_edges:
        xs = torch.cat([ws.client_data(c).x for c in clusters[m]]).to(torch.float64)
        ys = torch.cat([ws.client_data(c).y for c in clusters[m]])
        for k in range(K):
            leaves = {n: v.clone().requires_grad_(True) for n, v in w.items()}
            out = model(ws.model, leaves, (xs,))
            loss = torch.nn.functional.cross_entropy(out, ys)
            grads = torch.autograd.grad(loss, list(leaves.values()))
            eta = 1.0 / (K * math.sqrt(k + 1))
            w = {n: w[n] - eta * g for n, g in zip(w, grads, strict=True)}
    return w


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for k in a:
        torch.testing.assert_close(a[k].to(torch.float64), b[k].to(torch.float64), atol=2e-5, rtol=1e-4)


def test_one_cluster_full_batch_equals_gradient_descent() -> None:
    K, T = 4, 3
    s = spec({"K": K, "batch_size": 0}, clients=3, edges=1, rounds=T, partition="dirichlet")
    res = InProcessEngine(s).run()
    ws = Workspace(s, "cpu")
    ref = gd_reference(ws, [list(ws.topology.cluster("edge-0"))], [0] * T, K)
    assert_close(res.final, ref)
    moved = sum(float((res.final[k].double() - ws.initial_params()[k].double()).abs().sum()) for k in ref)
    assert moved > 1e-3  # the test can fail: training did happen


def test_many_clusters_full_batch_equals_gd_on_each_visited_cluster() -> None:
    K, T = 3, 5
    s = spec({"K": K, "batch_size": 0}, clients=7, edges=3, per_edge=[2, 2, 3], rounds=T,
             partition="dirichlet")
    res = InProcessEngine(s).run()
    ws = Workspace(s, "cpu")
    clusters = [list(ws.topology.cluster(e)) for e in ws.topology.edges]
    assert_close(res.final, gd_reference(ws, clusters, edge_sequence(res), K))


def test_uniform_weighting_differs_from_data_size_weighting() -> None:
    base = {"K": 2, "batch_size": 0}
    a = InProcessEngine(spec(base, clients=3, edges=1, rounds=2, partition="dirichlet")).run().final
    b = InProcessEngine(spec({**base, "weighting": "uniform"}, clients=3, edges=1, rounds=2,
                             partition="dirichlet")).run().final
    assert any(not torch.allclose(a[k], b[k]) for k in a)


# -- payload (spec sec. 7): 2 K |N_m(t)| d + d floats per round, the PS never holds the model -------

@pytest.mark.parametrize("options", [{"K": 3}, {"K": 4, "E": 2}])
def test_payload_per_round_is_exact(options: dict[str, Any]) -> None:
    T = 6
    per_edge = [2, 3, 4]
    s = spec(options, clients=9, edges=3, per_edge=per_edge, rounds=T, seed=1)
    res = InProcessEngine(s).run()
    d = sum(v.numel() for v in Workspace(s, "cpu").initial_params().values())
    interactions = options["K"] // options.get("E", 1)
    seq = edge_sequence(res)
    by_round = [0] * T
    for row in res.links:
        if row["kind"] != "fedchs.collect":
            by_round[row["round"]] += row["payload_bytes"]
    assert by_round == [2 * interactions * per_edge[m] * d * 4 + d * 4 for m in seq]
    # directions: downlink = uplink = K Q sum_t |N_m(t)|, ES-ES = T Q
    def total(kind: str, phase: str) -> int:
        return sum(r["payload_bytes"] for r in res.links if r["kind"] == kind and r["phase"] == phase)

    down, up = total("fedchs.grad", "request"), total("fedchs.grad", "reply")
    assert down == up == interactions * d * 4 * sum(per_edge[m] for m in seq)
    assert total("handoff", "request") == T * d * 4
    # the parameter server sees tensors exactly once: the final collect
    ps_rows = [r for r in res.links if "ps" in (r["src"], r["dst"]) and r["payload_bytes"] > 0]
    assert [(r["kind"], r["src"], r["payload_bytes"]) for r in ps_rows] == [
        ("fedchs.collect", _holder(res), d * 4)]


def _holder(res: Any) -> str:
    """The edge the last round handed the model to (the last hand-off's destination)."""
    rows = [r for r in res.links if r["kind"] == "handoff" and r["phase"] == "request"]
    return max(rows, key=lambda r: r["round"])["dst"]


def test_final_model_is_the_last_handed_off_one_and_is_trained() -> None:
    s = spec({"K": 2}, rounds=4, seed=2)
    res = InProcessEngine(s).run()
    assert res.rounds[-1]["accuracy"] >= 0.0
    init = Workspace(s, "cpu").initial_params()
    assert any(not torch.equal(res.final[k], init[k]) for k in init)


def test_missing_client_is_left_out_of_the_step() -> None:
    from fedhop.common.engine.inprocess import FaultPlan

    s = spec({"K": 2, "batch_size": 0}, clients=3, edges=1, rounds=2, partition="dirichlet")
    res = InProcessEngine(s, faults=FaultPlan(lambda n, t, r: n == "client-2")).run()
    ws = Workspace(s, "cpu")
    assert_close(res.final, gd_reference(ws, [["client-0", "client-1"]], [0, 0], 2))
    assert res.missing


def test_options_validate_divisibility() -> None:
    with pytest.raises(ValueError):
        FedCHSOptions(K=20, E=3)


# -- the random ES graph (topology.edge_graph) ------------------------------------------------------

def test_random_edge_graph_connected_degree_at_most_three() -> None:
    for m in range(1, 31):
        for seed in range(40):
            adj = edge_graph(m, "random", 3, seed)
            assert len(adj) == m
            assert is_connected(adj)
            assert max((len(a) for a in adj), default=0) <= 3
            for i, a in enumerate(adj):
                assert i not in a
                assert all(i in adj[j] for j in a)


def test_is_connected_detects_disconnection() -> None:
    assert not is_connected([{1}, {0}, set()])
    assert is_connected([{1}, {0, 2}, {1}])


def test_topology_neighbours_symmetric() -> None:
    topo = build_topology(TopologySpec(clients=20, edges=10), seed=5)
    for e, nb in topo.neighbours.items():
        assert len(nb) <= 3 and e not in nb
        assert all(e in topo.neighbours[x] for x in nb)


def test_compressed_uploads_payload_per_round() -> None:
    """upload_levels = s: each upload is d int8 levels + one float32 norm per tensor (qsgd.py)."""
    T, K = 4, 3
    per_edge = [2, 3, 4]
    s = spec({"K": K, "upload_levels": 127}, clients=9, edges=3, per_edge=per_edge, rounds=T, seed=1)
    res = InProcessEngine(s).run()
    params = Workspace(s, "cpu").initial_params()
    d, p = sum(v.numel() for v in params.values()), len(params)
    by_round = [0] * T
    for row in res.links:
        if row["kind"] != "fedchs.collect":
            by_round[row["round"]] += row["payload_bytes"]
    assert by_round == [K * per_edge[m] * (4 * d + d + 4 * p) + 4 * d for m in edge_sequence(res)]
    plain = InProcessEngine(spec({"K": K}, clients=9, edges=3, per_edge=per_edge, rounds=T, seed=1)).run()
    assert edge_sequence(plain) == edge_sequence(res)
    diff = max(float((res.final[k] - plain.final[k]).abs().max()) for k in params)
    scale = max(float((plain.final[k] - params[k]).abs().max()) for k in params)
    assert 0 < diff < scale  # quantisation noise, but the same training
