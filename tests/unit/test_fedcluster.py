"""FedCluster (docs/specs/fedcluster.md sec. 8.1): M = 1 is FedAvg, payload formula, cycle order, hand-offs,
normalised weights, learning-rate rules, topology checks and missing nodes."""

from collections import Counter

import pytest
import torch

from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.spec import SpecError
from fedhop.common.wire.bundle import non_finite
from tests.specs import run_spec

DIM, C = 5, 10
D = DIM * C + C  # softmax regression: weight [C, DIM] + bias [C]


def gauss(**kw):
    return {"dataset": "fedcluster-gauss", "partition": "major_class", "rho_device": 0.9,
            "samples_per_client": 20, "options": {"dim": DIM, "test_samples": 200}, **kw}


def spec(algorithm="fedcluster", edges=3, clients=12, rounds=2, graph="complete", data=None, seed=1, **opts):
    return run_spec(algorithm, {"local_steps": 2, "batch_size": 8, "participation": 0.5, **opts}, clients=clients,
                    edges=edges, edge_graph=graph, data=data or gauss(), model={"name": "logreg"}, rounds=rounds,
                    seed=seed)


def run(s, faults=None):
    return InProcessEngine(s, faults=faults).run()


def rows(res, kind, phase="request", rnd=None):
    return [r for r in res.links
            if r["kind"] == kind and r["phase"] == phase and (rnd is None or r["round"] == rnd)]


def assert_same(a, b):
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


# -- T1: FedAvg is FedCluster with M = 1 -------------------------------------------------------------------

@pytest.mark.parametrize("solver", [
    {"solver": "sgd"},
    {"solver": "momentum", "momentum": 0.5},
    {"solver": "adam", "lr": 0.01},
    {"solver": "sgd", "prox_mu": 0.1},
])
def test_m1_is_fedavg_bit_for_bit(solver):
    common = {"lr": 0.1, "participation": 0.3, **solver}
    fc = run(spec("fedcluster", edges=1, clients=10, rounds=3, lr_rule="over_M", **common))
    fa = run(spec("fedavg", edges=1, clients=10, rounds=3, **common))
    assert_same(fc.final, fa.final)
    assert [r["loss"] for r in fc.rounds] == [r["loss"] for r in fa.rounds]
    # same devices trained in every round
    assert {(r["dst"], r["round"]) for r in rows(fc, "local.train")} == \
        {(r["dst"], r["round"]) for r in rows(fa, "local.train")}
    assert any(bool(v.abs().sum() > 0) for v in fc.final.values())  # it trained


def test_m1_differs_from_fedavg_when_lr_differs():
    """The equality above is not vacuous: a different step size changes the model."""
    fc = run(spec("fedcluster", edges=1, clients=10, lr=0.05))
    fa = run(spec("fedavg", edges=1, clients=10, lr=0.1))
    assert any(not torch.equal(fc.final[k], fa.final[k]) for k in fc.final)


# -- T2/T3: cycles, participants, payload -----------------------------------------------------------------

def test_payload_per_round_is_sum_of_participants_times_2d4():
    res = run(spec(edges=3, clients=12, rounds=3))
    assert sum(v.numel() for v in res.final.values()) == D
    for j in range(3):
        train = rows(res, "local.train", rnd=j)
        per_edge = Counter(r["src"] for r in train for _ in range(r["messages"]))
        assert per_edge == {"edge-0": 2, "edge-1": 2, "edge-2": 2}  # round(0.5 * 4) per cycle
        device_bytes = sum(r["payload_bytes"] for r in res.links
                           if r["kind"] == "local.train" and r["round"] == j)
        assert device_bytes == sum(per_edge.values()) * 2 * D * 4
    # the first edge builds W_0 from the seed; the PS only collects W_TM once, after the last round: every
    # other PS <-> edge message is control only
    ps = {(r["src"], r["dst"], r["kind"], r["round"]): r["payload_bytes"] for r in res.links
          if (r["src"] == "ps" or r["dst"] == "ps") and r["payload_bytes"]}
    assert ps == {(res.rounds[-1]["order"].split(",")[-1], "ps", "fedcluster.collect", 2): D * 4}


def test_each_device_at_most_once_and_only_by_its_own_edge():
    res = run(spec(edges=4, clients=20, rounds=3, participation=0.6))
    for j in range(3):
        train = rows(res, "local.train", rnd=j)
        assert all(r["messages"] == 1 for r in train)
        for r in train:
            c = int(r["dst"].split("-")[1])
            assert r["src"] == f"edge-{c // 5}"
        assert len(train) == 4 * 3  # round(0.6 * 5) per cluster


@pytest.mark.parametrize("order", ["reshuffle", "fixed"])
def test_every_cluster_once_per_round(order):
    res = run(spec(edges=4, clients=8, rounds=6, order=order))
    edges = ["edge-0", "edge-1", "edge-2", "edge-3"]
    orders = []
    for j, rec in enumerate(res.rounds):
        cyc = rows(res, "fedcluster.cycle", rnd=j)
        assert sorted(r["dst"] for r in cyc) == edges and all(r["messages"] == 1 for r in cyc)
        seq = rec["order"].split(",")
        assert sorted(seq) == edges
        orders.append(tuple(seq))
    if order == "fixed":
        assert set(orders) == {tuple(edges)}
    else:
        assert len(set(orders)) > 1


def test_hand_offs_follow_the_visit_order():
    res = run(spec(edges=4, clients=8, rounds=4))
    visits = [e for rec in res.rounds for e in rec["order"].split(",")]
    per_round = [rec["order"].split(",") for rec in res.rounds]
    prev = None
    for j, seq in enumerate(per_round):
        expected = Counter()
        for e in seq:
            if prev is not None and prev != e:
                expected[(prev, e)] += 1
            prev = e
        got = Counter()
        for r in rows(res, "handoff", rnd=j):
            got[(r["src"], r["dst"])] += r["messages"]
            assert r["payload_bytes"] == r["messages"] * D * 4
        assert got == expected
    assert len(visits) == 16


def test_cycles_are_sequential_updates_with_normalised_weights():
    """Re-implementation of Algorithm 1 (fixed order, full local batches so that training is deterministic):
    the sampled set A_K of each cycle is read from the links, each device runs E GD steps from the previous
    cycle's model, and the cycle's model is sum_{k in A_K} (n_k / sum_{i in A_K} n_i) w^(k)."""
    data = {"dataset": "digits", "partition": "dirichlet", "dirichlet_lambda": 0.5}
    s = spec(edges=3, clients=9, rounds=2, data=data, order="fixed", batch_size=0, local_steps=2, lr=0.3,
             participation=0.67)
    eng = InProcessEngine(s)
    ws = eng.ws
    sizes = [len(ws.client_data(f"client-{k}")) for k in range(9)]
    assert len(set(sizes)) > 1  # unequal sizes, so the weights matter
    w = {k: v.clone() for k, v in ws.initial_params().items()}
    res = eng.run()
    for j in range(2):
        sampled = {r["dst"] for r in rows(res, "local.train", rnd=j)}
        for e in range(3):
            members = [k for k in range(3 * e, 3 * e + 3) if f"client-{k}" in sampled]
            assert len(members) == 2  # round(0.67 * 3)
            total = sum(sizes[k] for k in members)
            new = {k: torch.zeros_like(v) for k, v in w.items()}
            for k in members:
                d = ws.client_data(f"client-{k}")
                wk = {n: v.clone().requires_grad_(True) for n, v in w.items()}
                for _ in range(2):
                    out = torch.func.functional_call(ws.model, wk, (d.x,))
                    loss = torch.nn.functional.cross_entropy(out, d.y)
                    g = torch.autograd.grad(loss, list(wk.values()))
                    wk = {n: (v - 0.3 * gi).detach().requires_grad_(True)
                          for (n, v), gi in zip(wk.items(), g, strict=True)}
                for n in new:
                    new[n] += sizes[k] / total * wk[n].detach()
            w = new
    for k in w:
        torch.testing.assert_close(res.final[k], w[k], rtol=1e-5, atol=1e-6)


def test_reported_loss_is_the_holders_model_on_the_test_set():
    eng = InProcessEngine(spec(edges=3, clients=6, rounds=2))
    res = eng.run()
    ev = eng.ws.evaluate(res.final)
    assert res.rounds[-1]["loss"] == pytest.approx(ev["loss"], rel=1e-12)
    assert res.rounds[-1]["accuracy"] == ev["accuracy"]


# -- options -------------------------------------------------------------------------------------------------

def test_lr_rules():
    base = run(spec(edges=2, clients=6, lr=0.1))
    assert_same(run(spec(edges=2, clients=6, lr=0.2, lr_rule="over_M")).final, base.final)
    assert_same(run(spec(edges=2, clients=6, lr=1.0, lr_rule="fixed_over_10")).final, base.final)
    other = run(spec(edges=2, clients=6, lr=0.1, lr_rule="over_M")).final
    assert any(not torch.equal(other[k], base.final[k]) for k in other)


def test_defaults_are_the_papers_protocol():
    o = spec(edges=2, clients=4).options().model_validate({})
    assert (o.lr, o.local_steps, o.batch_size, o.participation, o.order, o.solver) == \
        (0.01, 20, 30, 0.1, "reshuffle", "sgd")


def test_needs_edges():
    with pytest.raises(SpecError, match="edge"):
        spec(edges=0)


def test_reshuffle_needs_a_complete_edge_graph():
    with pytest.raises(ValueError, match="complete"):
        run(spec(edges=4, clients=8, graph="ring", rounds=1))
    with pytest.raises(ValueError, match="complete"):
        run(spec(edges=5, clients=10, graph="random", rounds=1))  # degree <= 3: not complete
    run(spec(edges=4, clients=8, graph="ring", rounds=2, order="fixed"))  # a ring is enough for a fixed order
    run(spec(edges=2, clients=4, graph="ring", rounds=2))  # two edges are always linked


def test_runs_are_deterministic():
    assert_same(run(spec()).final, run(spec()).final)
    a, b = run(spec(seed=1)), run(spec(seed=2))
    assert a.rounds[0]["order"] != b.rounds[0]["order"] or any(not torch.equal(a.final[k], b.final[k])
                                                                for k in a.final)


# -- missing nodes ----------------------------------------------------------------------------------------

def test_a_dead_edge_is_skipped_and_the_model_survives():
    dead = FaultPlan(lambda node, task, rnd: node == "edge-1" and rnd == 1)
    res = run(spec(edges=3, clients=9, rounds=3), faults=dead)
    assert res.rounds[1]["cycles"] == 2 and "edge-1" not in res.rounds[1]["order"].split(",")
    assert res.rounds[0]["cycles"] == res.rounds[2]["cycles"] == 3
    assert any(m["node"] == "edge-1" for m in res.missing)
    assert not non_finite(res.final)


def test_a_lost_holder_rolls_back_to_the_previous_one():
    """The holder dies right after its cycle: the next cluster trains from the previous holder's model."""
    s = spec(edges=3, clients=9, rounds=2, order="fixed")
    dead = FaultPlan(lambda node, task, rnd: node == "edge-1" and rnd == 0 and task == "fedcluster.pass")
    res = run(s, faults=dead)
    assert any(m["node"] == "edge-1" and m["task"] == "fedcluster.pass" for m in res.missing)
    # round 0: edge-0 -> edge-1 (dies) so edge-2 receives edge-0's model
    hand = {(r["src"], r["dst"]) for r in rows(res, "handoff", rnd=0)}
    assert hand == {("edge-0", "edge-1"), ("edge-0", "edge-2")}
    assert not non_finite(res.final)


def test_missing_clients_leave_the_average():
    dead = FaultPlan(lambda node, task, rnd: task == "local.train" and node in ("client-0", "client-1"))
    res = run(spec(edges=2, clients=4, rounds=2, participation=1.0), faults=dead)
    assert {m["node"] for m in res.missing} == {"client-0", "client-1"}
    assert not non_finite(res.final)
