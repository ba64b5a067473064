"""What keeps a node's memory near the model size (issue 11): the streaming weighted mean, the scatter fold, the
reply gate, the by-reference retry snapshot, training in the received buffer and the meta-device template."""

import threading

import pytest
import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.algorithms.local import LocalSolver, local_train
from fedhop.common.engine.api import Reply
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.engine.state_io import StateError, snapshot_state
from fedhop.common.wire.bundle import clone, weighted_mean
from fedhop.transport.reply_gate import ReplyGate
from tests.specs import run_spec


def bundles(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(7, 5, generator=g), "b": torch.randn(5, generator=g)} for _ in range(n)]


def spec(clients=4, rounds=2, **opts):
    return run_spec("fedavg", {"local_steps": 2, "batch_size": 16, **opts}, clients=clients,
                    data={"dataset": "digits", "partition": "iid"}, model={"name": "mlp", "hidden": [16]},
                    rounds=rounds, seed=5)


# -- WeightedMean -------------------------------------------------------------------------------------------

def test_weighted_mean_fold_is_bit_identical_to_weighted_mean_when_every_reply_comes():
    bs, n = bundles(4), [360, 359, 361, 7]
    expected = weighted_mean(zip(n, clone_all(bs), strict=True))
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(n))
    for i, (b, k) in enumerate(zip(bs, n, strict=True)):
        mean(f"c{i}", Reply(b, {"n": k}))
    got = mean.result()
    for k in expected:
        assert torch.equal(got[k], expected[k])


def test_weighted_mean_fold_rescales_when_a_reply_is_missing():
    bs = bundles(3)
    mean = WeightedMean(lambda node, r: r.scalars["n"], 60)
    mean("c0", Reply(bs[0], {"n": 10}))
    mean("c2", Reply(bs[2], {"n": 30}))
    expected = weighted_mean([(10, bundles(3)[0]), (30, bundles(3)[2])])
    for k, v in mean.result().items():
        torch.testing.assert_close(v, expected[k], rtol=1e-6, atol=1e-7)
    assert mean.nodes == ["c0", "c2"] and mean.total == 40


def test_weighted_mean_refuses_mismatched_names_and_no_replies():
    mean = WeightedMean(lambda node, r: 1.0, 2)
    with pytest.raises(ValueError, match="no replies"):
        mean.result()
    mean("a", Reply({"w": torch.ones(2)}, {}))
    with pytest.raises(ValueError, match="disagree on tensor names"):
        mean("b", Reply({"v": torch.ones(2)}, {}))


def clone_all(bs):
    return [clone(b) for b in bs]


# -- scatter with a fold (in-process engine) -----------------------------------------------------------------

def test_fold_sees_replies_in_canonical_order_and_scatter_returns_them_without_bundles():
    eng = InProcessEngine(spec(clients=3))
    ps = eng.nodes["ps"]
    ps.comm.begin_round(0)
    seen = []
    params = ps.initial_params()
    out = ps.comm.scatter(["client-2", "client-0", "client-1"], "local.train", params, {}, expect=params,
                          fold=lambda node, r: seen.append((node, sorted(r.bundle))))
    assert [s[0] for s in seen] == ["client-0", "client-1", "client-2"]
    assert all(names == sorted(params) for _, names in seen)
    assert list(out) == ["client-0", "client-1", "client-2"]
    assert all(r.bundle == {} and r.scalars["n"] > 0 for r in out.values())


def test_fedavg_with_a_missing_client_rescales_and_stays_close_to_the_plain_mean():
    dead = FaultPlan(lambda node, task, rnd: node == "client-1")
    res = InProcessEngine(spec(clients=3, rounds=1), faults=dead).run()
    assert [e["node"] for e in res.missing] == ["client-1"]
    assert all(bool(torch.isfinite(v).all()) for v in res.final.values())


# -- the reply gate ----------------------------------------------------------------------------------------

def _enter_later(gate, cid, entered):
    t = threading.Thread(target=lambda: (gate.enter(cid), entered.append(cid)), daemon=True)
    t.start()
    return t


def test_reply_gate_admits_the_head_and_window_more_then_the_next_as_each_settles():
    gate = ReplyGate(window=1)
    for cid in (1, 2, 3, 4):
        gate.add(cid)
    entered = []
    gate.enter(4)  # the window's one extra place
    entered.append(4)
    waiter = _enter_later(gate, 3, entered)
    waiter.join(0.3)
    assert waiter.is_alive() and entered == [4]  # 3 waits: 4 holds the window
    gate.enter(1)  # the head always enters
    gate.settled(1)
    gate.settled(4)  # place free: 3 enters
    waiter.join(5)
    assert not waiter.is_alive() and entered == [4, 3]


def test_reply_gate_with_window_zero_admits_in_order_and_open_releases_everyone():
    gate = ReplyGate(window=0)
    for cid in (1, 2, 3):
        gate.add(cid)
    entered = []
    late = _enter_later(gate, 3, entered)
    late.join(0.3)
    assert late.is_alive()
    gate.settled(1)
    gate.settled(2)
    late.join(5)
    assert entered == [3]
    other = ReplyGate(window=0)
    other.add(1)
    other.add(2)
    blocked = _enter_later(other, 2, entered)
    other.open()
    blocked.join(5)
    assert entered == [3, 2]
    with pytest.raises(ValueError):
        ReplyGate(window=-1)


# -- the retry snapshot -------------------------------------------------------------------------------------

def test_shared_snapshot_keeps_tensors_by_reference_and_refuses_after_an_in_place_change():
    state = {"model": {"w": torch.ones(3)}, "counts": [1, 2]}
    snap = snapshot_state(state, share_tensors=True)
    state["counts"].append(3)
    back = snap.restore()
    assert back["model"]["w"].data_ptr() == state["model"]["w"].data_ptr() and back["counts"] == [1, 2]
    state["model"]["w"].add_(1)
    with pytest.raises(StateError, match="changed in place"):
        snap.restore()


def test_copied_snapshot_survives_in_place_changes():
    state = {"w": torch.ones(3)}
    snap = snapshot_state(state)
    state["w"].add_(1)
    assert torch.equal(snap.restore()["w"], torch.ones(3))


def test_fedavg_retry_restores_the_round_start_state():
    """A round with no usable reply is redone from the state it started from (FedAvg keeps it by reference)."""
    fails = {"n": 0}

    def dead(node, task, rnd):
        if rnd == 1 and fails["n"] < 3:  # every client of round 2's first attempt
            fails["n"] += 1
            return True
        return False

    s = spec(clients=3, rounds=2, participation=1.0)
    redone = InProcessEngine(s, faults=FaultPlan(dead)).run()
    plain = InProcessEngine(s).run()
    for k in plain.final:
        assert torch.equal(redone.final[k], plain.final[k])


# -- the client's local training ------------------------------------------------------------------------------

@pytest.mark.parametrize("solver", [{"solver": "sgd"}, {"solver": "sgd", "weight_decay": 0.01},
                                    {"solver": "momentum", "momentum": 0.9}, {"solver": "sgd", "prox_mu": 0.1}])
def test_training_in_the_received_buffer_gives_the_same_model(solver):
    eng = InProcessEngine(spec())
    data, ws = eng.ws.client_data("client-0"), eng.ws
    cfg = LocalSolver(steps=3, lr=0.1, batch_size=16, **solver)
    w0 = ws.initial_params()
    copied, _ = local_train(ws, w0, data, cfg, torch.Generator().manual_seed(1))
    mine = clone(w0)
    consumed, _ = local_train(ws, mine, data, cfg, torch.Generator().manual_seed(1), consume=True)
    for k in w0:
        assert torch.equal(copied[k], consumed[k])
        assert not torch.equal(copied[k], w0[k])  # it trained, and the copying path left w0 alone
    if solver["solver"] == "sgd" and "prox_mu" not in solver:
        assert all(consumed[k].data_ptr() == mine[k].data_ptr() for k in mine)  # no copy


def test_sgd_step_matches_the_textbook_update_bit_for_bit():
    eng = InProcessEngine(spec())
    ws, data = eng.ws, eng.ws.client_data("client-0")
    w0 = ws.initial_params()
    got, _ = local_train(ws, w0, data, LocalSolver(steps=1, lr=0.37, batch_size=0), torch.Generator())
    leaves = {k: v.clone().requires_grad_(True) for k, v in w0.items()}
    loss = torch.nn.functional.cross_entropy(torch.func.functional_call(ws.model, leaves, (data.x,)), data.y)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    for (k, v), g in zip(w0.items(), grads, strict=True):
        assert torch.equal(got[k], v - 0.37 * g)


def test_template_holds_no_parameter_memory_and_initial_params_are_fresh():
    ws = InProcessEngine(spec()).ws
    assert all(p.device.type == "meta" for p in ws.model.parameters())
    a, b = ws.initial_params(), ws.initial_params()
    for k in a:
        assert torch.equal(a[k], b[k]) and a[k].data_ptr() != b[k].data_ptr()


def test_scatter_checks_replies_against_the_sizes_the_exchange_refreshed():
    """A networked engine replaces ctx.sizes when its round begins, inside the exchange: replies are checked
    against those, with and without a fold (a late joiner's first reply must not be refused)."""
    from types import SimpleNamespace

    from fedhop.common.engine.base import BaseComm, MissingLog
    from fedhop.common.topology import build_topology

    topo = build_topology(spec(clients=2).topology, 0)

    class Refreshing(BaseComm):
        def current_round(self):
            return 0

        def _exchange(self, targets, task, bundle, args, deadline_s, quorum=None):
            self.ctx.sizes = {"client-0": 3, "client-1": 4}
            return {t: Reply({"w": torch.ones(2)}, {"n": self.ctx.sizes[t]}) for t in targets}

    for fold in (None, lambda node, r: None):
        comm = Refreshing("ps", topo, MissingLog())
        comm.bind(SimpleNamespace(sizes={}))
        got = comm.scatter(["client-0", "client-1"], "t", {}, fold=fold)
        assert list(got) == ["client-0", "client-1"] and comm.missing.entries == []
