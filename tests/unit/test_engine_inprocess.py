"""The in-process engine and FedAvg/HierFAVG on it: payload formulas, canonical order, faults."""

import torch

from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.wire.bundle import payload_bytes, weighted_mean
from tests.specs import run_spec


def small(algorithm="fedavg", edges=0, clients=4, rounds=3, **opts):
    return run_spec(algorithm, {"local_steps": 2, "batch_size": 16, **opts}, clients=clients, edges=edges,
                    data={"dataset": "digits", "partition": "iid"}, model={"name": "logreg"}, rounds=rounds, seed=3)


def model_floats(spec):
    eng = InProcessEngine(spec)
    return sum(v.numel() for v in eng.ws.initial_params().values())


def test_fedavg_payload_per_round_is_2d4_per_client():
    spec = small(clients=5, rounds=3)
    d = model_floats(spec)
    res = InProcessEngine(spec).run()
    for r in range(3):
        per_round = sum(x["payload_bytes"] for x in res.links if x["round"] == r)
        assert per_round == 5 * 2 * d * 4
    assert res.rounds[-1]["cum_payload_bytes"] == 3 * 5 * 2 * d * 4
    assert {x["kind"] for x in res.links} == {"local.train"}


def test_fedavg_through_edges_counts_both_tiers():
    spec = small(edges=2, clients=6, rounds=2)
    d = model_floats(spec)
    res = InProcessEngine(spec).run()
    by_link = res.payload_by_link()
    assert by_link[("ps", "edge-0")] == by_link[("edge-0", "ps")] == 2 * d * 4
    for c in range(6):
        edge = "edge-0" if c < 3 else "edge-1"
        assert by_link[(edge, f"client-{c}")] == by_link[(f"client-{c}", edge)] == 2 * d * 4


def test_fedavg_equals_hand_computed_average():
    """One round of FedAvg with full batches equals the data-size-weighted mean of independent GD runs."""
    spec = small(clients=3, rounds=1, batch_size=0, local_steps=2, lr=0.5)
    eng = InProcessEngine(spec)
    w0 = eng.ws.initial_params()
    locals_, sizes = [], []
    for c in range(3):
        data = eng.ws.client_data(f"client-{c}")
        w = {k: v.clone().requires_grad_(True) for k, v in w0.items()}
        for _ in range(2):
            out = torch.func.functional_call(eng.ws.model, w, (data.x,))
            loss = torch.nn.functional.cross_entropy(out, data.y)
            g = torch.autograd.grad(loss, list(w.values()))
            w = {k: (v - 0.5 * gi).detach().requires_grad_(True) for (k, v), gi in zip(w.items(), g, strict=True)}
        locals_.append({k: v.detach() for k, v in w.items()})
        sizes.append(len(data))
    expected = weighted_mean(zip(sizes, locals_, strict=True))
    got = eng.run().final
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-5, atol=1e-6)


def test_hierfavg_edge_rounds_multiply_client_traffic():
    spec = small("hierfavg", edges=2, clients=4, rounds=1, edge_rounds=3)
    d = model_floats(spec)
    res = InProcessEngine(spec).run()
    by_link = res.payload_by_link()
    assert by_link[("edge-1", "client-3")] == 3 * d * 4
    assert by_link[("ps", "edge-1")] == d * 4


def test_runs_are_deterministic():
    a = InProcessEngine(small(edges=2, clients=4)).run()
    b = InProcessEngine(small(edges=2, clients=4)).run()
    for k in a.final:
        assert torch.equal(a.final[k], b.final[k])
    assert a.links == b.links


def test_dead_client_is_reported_missing_and_round_goes_on():
    spec = small(clients=4, rounds=3)
    faults = FaultPlan(lambda node, task, rnd: node == "client-2" and rnd >= 1)
    res = InProcessEngine(spec, faults=faults).run()
    missing = {(m["node"], m["round"]) for m in res.missing}
    assert missing == {("client-2", 2), ("client-2", 3)}
    assert len(res.rounds) == 3 and all("accuracy" in r for r in res.rounds)


def test_nan_update_is_rejected_and_run_continues(monkeypatch):
    from fedhop.common.engine import api

    real = api.get_task("local.train")

    def poisoned(ctx, params, args):
        reply = real(ctx, params, args)
        if ctx.node_id == "client-1":
            return api.Reply({k: torch.full_like(v, float("nan")) for k, v in reply.bundle.items()}, reply.scalars)
        return reply

    monkeypatch.setitem(api.TASKS, "local.train", poisoned)
    res = InProcessEngine(small(clients=3, rounds=2)).run()
    assert {m["node"] for m in res.missing} == {"client-1"}
    assert all("non-finite" in m["reason"] for m in res.missing)
    assert all(torch.isfinite(v).all() for v in res.final.values())


def test_scatter_only_reaches_children():
    import pytest

    eng = InProcessEngine(small(edges=2, clients=4))
    ps = eng.nodes["ps"]
    with pytest.raises(ValueError, match="only scatter to its children"):
        ps.comm.scatter(["client-0"], "local.train", {})


def test_payload_bytes_counts_every_dtype():
    b = {"a": torch.zeros(3, dtype=torch.float64), "b": torch.zeros((), dtype=torch.bfloat16),
         "c": torch.zeros(0, 5), "d": torch.zeros(7, dtype=torch.bool)}
    assert payload_bytes(b) == 24 + 2 + 0 + 7


def test_round_journal_keeps_finished_rounds_when_the_run_dies(tmp_path):
    import json

    import pytest

    eng = InProcessEngine(small(clients=3, rounds=5))
    real = eng.ws.evaluate
    calls = []

    def dies_in_round_3(params):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the driver's process died")
        return real(params)

    eng.ws.evaluate = dies_in_round_3
    journal = tmp_path / "rounds.jsonl"
    with pytest.raises(RuntimeError, match="died"):
        eng.run(journal=journal)
    rows = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all("accuracy" in r for r in rows)


def test_every_node_context_binds_its_comm_once():
    import pytest

    from fedhop.common.engine.api import NodeContext

    eng = InProcessEngine(small(edges=2))
    assert all(ctx.comm.ctx is ctx for ctx in eng.nodes.values())
    ctx = eng.nodes["ps"]
    with pytest.raises(RuntimeError, match="already serves a node context"):
        NodeContext(node_id="ps", role="server", ws=eng.ws, comm=ctx.comm)
    assert ctx.comm.ctx is ctx
