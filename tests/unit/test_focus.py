"""FOCUS / SG-FOCUS and the family's baselines (docs/specs/focus.md sections 3.2-3.5, 6, 9: T3-T6).

References are written here independently from the spec (numpy, float64): Algorithm 1 (appendix), the
switched-order matrix form with the schedule of section 3.2, and the gradients of the least squares.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhop.common.algorithms.fedau import IntervalWeights
from fedhop.common.engine.api import TASKS
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.wire.bundle import flat
from tests.specs import LINEAR_F64, focus_lsq, run_spec

N, D, ROWS = 6, 5, 20


def engine(alg: str, opts: dict, rounds: int = 20, clients: int = N, seed: int = 0, hetero: float = 1.0,
           dim: int = D) -> InProcessEngine:
    spec = run_spec(alg, opts, clients=clients, data=focus_lsq(dim, ROWS, hetero), model=LINEAR_F64, rounds=rounds,
                    seed=seed)
    return InProcessEngine(spec)


def problem(eng: InProcessEngine) -> tuple[list, np.ndarray]:
    """grad f_i(x) = (1/n_i) A_i^T (A_i x - b_i) (fedhop's mean loss) and x* of the pooled problem."""
    data = [(c.x.double().numpy(), c.y.double().numpy()) for c in eng.ws.fed.clients]
    grads = [(lambda x, a=a, b=b: a.T @ (a @ x - b) / len(b)) for a, b in data]
    a = np.concatenate([d[0] for d in data])
    b = np.concatenate([d[1] for d in data])
    return grads, np.linalg.lstsq(a, b, rcond=None)[0]


def trace(eng: InProcessEngine) -> list[np.ndarray]:
    """Run the engine; the server model after every round (the model each round reports)."""
    out: list[np.ndarray] = []
    eng.ws.evaluate = lambda params, data=None: out.append(flat(params).numpy().copy()) or {}
    eng.run()
    return out


def sets_from_links(links: list[dict], task: str, rounds: int) -> list[list[int]]:
    """S_r read off the byte meter: the clients that received a ``task`` request in round r."""
    sets: list[list[int]] = [[] for _ in range(rounds)]
    for row in links:
        if row["kind"] == task and row["phase"] == "request" and row["round"] >= 0:
            sets[row["round"]].append(int(row["dst"].split("-")[1]))
    return [sorted(s) for s in sets]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def focus_alg1(grads, x0, eta, tau, sets, skip_empty=True):
    """Algorithm 1 (spec appendix), g_i = 0, y = 0."""
    x, y = x0.copy(), np.zeros_like(x0)
    g = [np.zeros_like(x0) for _ in grads]
    traj = []
    for s in sets:
        if s or not skip_empty:
            push = np.zeros_like(x0)
            for i in s:
                xi, yi = x.copy(), np.zeros_like(x0)
                for t in range(tau):
                    if t > 0:
                        xi = xi - eta * yi
                    gc = grads[i](xi)
                    yi = yi + gc - g[i]
                    g[i] = gc
                push = push + yi
            y = y + push
            x = x - eta * y
        traj.append(x.copy())
    return traj


def pull(s, n):
    """R(S) of spec 2.1: row i in S copies the server (row 0); everyone else keeps its row."""
    r = np.eye(n + 1)
    for i in s:
        r[i] = 0.0
        r[i, 0] = 1.0
    return r


def push_matrix(s, n):
    """C(S) = R(S)^T: the server row sums the participants' rows."""
    return pull(s, n).T


def focus_matrix(grads, x0, eta, tau, sets):
    """Switched-order matrix form (eq. 65-68) with the verified schedule of spec 3.2 and the paper init.

    Client i is row i+1. Returns the server model X[0] after each t == 0 step: entry 0 is the model before
    round 0 (after the virtual init), entry r+1 the model after round r.
    """
    n = len(grads)

    def grad_rows(x):
        out = np.zeros_like(x)
        for i in range(n):
            out[i + 1] = grads[i](x[i + 1])
        return out

    eye = np.eye(n + 1)
    c_all = np.zeros((n + 1, n + 1))
    c_all[0, :] = 1.0
    x = np.tile(x0, (n + 1, 1))
    x_prev, y = x.copy(), grad_rows(x)
    out = []
    for r, s in enumerate([*sets, []]):
        rows = [i + 1 for i in s]
        for t in range(tau):
            if t == 0:
                c, rr, dd = c_all, pull(rows, n), np.diag([1.0] + [0.0] * n)
            else:
                c, rr, dd = eye, eye, np.diag([0.0] + [1.0 if i in rows else 0.0 for i in range(1, n + 1)])
            y_new = c @ (y + grad_rows(x) - grad_rows(x_prev))
            x_new = rr @ (x - eta * dd @ y_new)
            x_prev, x, y = x, x_new, y_new
            if t == 0:
                out.append(x[0].copy())
                if r == len(sets):
                    return out
    return out


# -- T1: the matrices of the reference implementation (Fig. 1) ---------------------------------------------

def test_figure1_matrices_and_stochasticity():
    r, c = pull([1, 3], 4), push_matrix([1, 3], 4)
    assert np.array_equal(r, [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
    assert np.array_equal(c, [[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
    assert np.allclose(r.sum(1), 1) and np.allclose(c.sum(0), 1)


# -- T3: Algorithm 1 == numpy Algorithm 1 == matrix form -----------------------------------------------------

@pytest.mark.parametrize("tau", [1, 3])
def test_focus_matches_numpy_algorithm1(tau):
    eta = 0.05
    eng = engine("focus", {"lr": eta, "local_steps": tau,
                           "participation": {"kind": "bernoulli", "p": [0.5, 0.4, 0.3, 0.3, 0.2, 0.05]}},
                 rounds=40)
    got = trace(eng)
    links = eng.meter.rows()
    sets = sets_from_links(links, "pull", 40)
    assert any(not s for s in sets) and any(len(s) > 1 for s in sets)  # empty and multi-client rounds
    grads, _ = problem(eng)
    want = focus_alg1(grads, np.zeros(D), eta, tau, sets)
    assert max(rel(g, w) for g, w in zip(got, want, strict=True)) < 1e-12


def test_focus_matrix_form_equals_algorithm1_with_matched_init():
    eta, tau, rounds = 0.05, 4, 30
    eng = engine("focus", {"lr": eta, "local_steps": tau, "init": "matched",
                           "participation": {"kind": "uniform", "m": 3}}, rounds=rounds)
    got = trace(eng)
    sets = sets_from_links(eng.meter.rows(), "pull", rounds)
    assert all(len(s) == 3 for s in sets)
    grads, _ = problem(eng)
    want = focus_matrix(grads, np.zeros(D), eta, tau, sets)
    assert len(want) == rounds + 1
    assert max(rel(g, w) for g, w in zip(got, want[1:], strict=True)) < 1e-12
    assert rel(got[-1], want[1]) > 1e-3  # the trajectory moved: the comparison is not vacuous


def test_matrix_form_with_empty_rounds_equals_literal_step():
    """With S_r empty the matrix form still steps the server (Alg. 1 read literally: empty_round=step)."""
    eta, tau, rounds = 0.05, 2, 20
    eng = engine("focus", {"lr": eta, "local_steps": tau, "init": "matched", "empty_round": "step",
                           "participation": {"kind": "bernoulli", "p": 0.15}}, rounds=rounds)
    got = trace(eng)
    sets = sets_from_links(eng.meter.rows(), "pull", rounds)
    assert any(not s for s in sets)
    grads, _ = problem(eng)
    want = focus_matrix(grads, np.zeros(D), eta, tau, sets)
    assert max(rel(g, w) for g, w in zip(got, want[1:], strict=True)) < 1e-12


# -- T4: tracking invariant ---------------------------------------------------------------------------------

def _tracking_errors(eng: InProcessEngine, skip_rounds: set[int] = frozenset()) -> list[float]:
    errs: list[float] = []
    clients = eng.ws.topology.clients

    def check(t):  # after round t, from the state the engine exposes
        if t < 0 or t in skip_rounds:  # t = -1: the set-up step
            return
        y = flat(eng.nodes["ps"].state.y).numpy()
        g = sum((flat(eng.nodes[c].state.g).numpy() for c in clients if eng.nodes[c].state.g is not None),
                np.zeros_like(y))
        errs.append(float(np.linalg.norm(y - g) / max(np.linalg.norm(g), 1e-300)))

    eng.run(after_commit=check)
    return errs


@pytest.mark.parametrize("alg,batch", [("focus", 0), ("sg-focus", 4)])
def test_tracking_invariant_every_round(alg, batch):
    """y_server == sum_i g_i after every round, with empty rounds and a client that never participates."""
    eng = engine(alg, {"lr": 0.05, "local_steps": 3, "batch_size": batch,
                       "participation": {"kind": "bernoulli", "p": [0.3, 0.3, 0.2, 0.2, 0.2, 1e-12]}},
                 rounds=30)
    errs = _tracking_errors(eng)
    assert len(errs) == 30 and max(errs) < 1e-12
    assert eng.nodes["client-5"].state.g is None  # never participated
    res_sets = sets_from_links(eng.meter.rows(), "pull", 30)
    assert any(not s for s in res_sets)


def test_sg_focus_reuses_the_stored_gradient():
    """Re-evaluating the previous gradient on the new batch (spec pitfall 8) would break the invariant: the
    client's reply must equal its last stochastic gradient minus the one it stored before the round."""
    eng = engine("sg-focus", {"lr": 0.05, "local_steps": 2, "batch_size": 3}, rounds=2)
    before: dict[str, np.ndarray] = {}
    seen: list[float] = []
    real = TASKS["focus.local"]

    def spy(ctx, bundle, args):
        g = ctx.state.g if ctx.state.g is not None else {k: torch.zeros_like(v) for k, v in bundle.items()}
        before[ctx.node_id] = flat(g)
        reply = real(ctx, bundle, args)
        seen.append(rel(flat(reply.bundle).numpy(), (flat(ctx.state.g) - before[ctx.node_id]).numpy()))
        return reply

    TASKS["focus.local"] = spy
    try:
        eng.run()
    finally:
        TASKS["focus.local"] = real
    assert len(seen) == 2 * N and max(seen) < 1e-12


def test_node_down_keeps_invariant():
    eng = engine("focus", {"lr": 0.05, "local_steps": 3}, rounds=8)
    eng.faults = FaultPlan(lambda node, task, rnd: node == "client-2" and rnd in (2, 3))
    errs = _tracking_errors(eng)
    assert max(errs) < 1e-12
    assert {m["node"] for m in eng.missing.entries} == {"client-2"}


def test_lost_push_is_rolled_back(monkeypatch):
    """client-1 computes in round 3 but its push is lost: at its next pull it restores g_i, so the
    invariant holds again from then on and the run equals one where client-1 sat out round 3."""
    real = TASKS["focus.local"]

    def flaky(ctx, bundle, args):
        reply = real(ctx, bundle, args)
        if ctx.node_id == "client-1" and ctx.round == 3:
            raise ConnectionError("push lost")
        return reply

    monkeypatch.setitem(TASKS, "focus.local", flaky)
    eng = engine("focus", {"lr": 0.05, "local_steps": 3}, rounds=8)
    got_errs = _tracking_errors(eng, skip_rounds={3})
    assert max(got_errs) < 1e-12
    eng2 = engine("focus", {"lr": 0.05, "local_steps": 3}, rounds=8)
    got = trace(eng2)  # flaky is still installed: same sets; compare with numpy where client-1 skips round 3
    grads, _ = problem(eng2)
    sets = [list(range(N)) if r != 3 else [i for i in range(N) if i != 1] for r in range(8)]
    want = focus_alg1(grads, np.zeros(D), 0.05, 3, sets)
    assert max(rel(g, w) for g, w in zip(got, want, strict=True)) < 1e-12


# -- T5: fixed point ---------------------------------------------------------------------------------------

def _start_at(eng: InProcessEngine, x: np.ndarray, grads=None) -> None:
    names = eng.ws.initial_params()
    (name, t), = names.items()
    eng.ws.initial_params = lambda: {name: torch.from_numpy(x.copy()).reshape(t.shape)}
    if grads is not None:
        for i, c in enumerate(eng.ws.topology.clients):
            eng.nodes[c].state.g = {name: torch.from_numpy(grads[i](x)).reshape(t.shape)}


def test_fixed_point_is_exact_for_focus_but_not_fedavg():
    part = {"kind": "weighted", "m": 2}
    eng = engine("focus", {"lr": 0.05, "local_steps": 4, "participation": part}, rounds=30)
    grads, xs = problem(eng)
    _start_at(eng, xs, grads)
    got = trace(eng)
    assert max(rel(g, xs) for g in got) < 1e-13
    fa = engine("fedavg", {"lr": 0.05, "local_steps": 4, "batch_size": 0, "participation": part}, rounds=30)
    _start_at(fa, xs)
    assert rel(trace(fa)[-1], xs) > 1e-6  # heterogeneous clients and tau > 1: FedAvg drifts away


# -- T6: tau = 1 FOCUS == correct MIFA (eta_l eta_g / N = eta) ------------------------------------------------

def test_tau1_focus_equals_mifa():
    eta = 0.04
    part = {"kind": "bernoulli", "p": [0.9, 0.5, 0.5, 0.3, 0.3, 0.1]}
    f = trace(engine("focus", {"lr": eta, "local_steps": 1, "participation": part}, rounds=40))
    m = trace(engine("mifa", {"lr": eta / 2, "server_lr": 2.0 * N, "local_steps": 1, "participation": part},
                     rounds=40))
    assert max(rel(a, b) for a, b in zip(f, m, strict=True)) < 1e-12
    assert rel(f[-1], f[0]) > 1e-2


# -- baselines ----------------------------------------------------------------------------------------------

def test_fedau_interval_weights_by_hand():
    """K = 3; client 0 joins at rounds 0 and 4, client 1 every round, client 2 never."""
    w = IntervalWeights.new(3, 3)
    pattern = [[0, 1], [1], [1], [1], [0, 1]]
    seen = []
    for s in pattern:
        w.update(np.isin(np.arange(3), s))
        seen.append(w.weights().tolist())
    assert seen[0] == [1.0, 1.0, 1.0]  # intervals recorded: c0 {1}, c1 {1}; c2 nothing yet
    assert seen[2] == [1.0, 1.0, 3.0]  # c0 interval 2 (not yet recorded), c2 hits K=3 at round 2
    assert seen[3] == [2.0, 1.0, 3.0]  # c0 hits K=3 at round 3: mean(1, 3)
    assert seen[4] == pytest.approx([5 / 3, 1.0, 3.0])  # c0 joins: records 1 -> mean(1, 3, 1)


def test_fedau_equals_fedavg_under_full_participation():
    fa = trace(engine("fedavg", {"lr": 0.05, "local_steps": 3, "batch_size": 0, "weighting": "uniform"},
                      rounds=15))
    for variant in ("original", "notebook"):
        au = trace(engine("fedau", {"lr": 0.05, "local_steps": 3, "variant": variant}, rounds=15))
        assert max(rel(a, b) for a, b in zip(fa, au, strict=True)) < 1e-12


def test_fedavg_matches_numpy_under_a_participation_model():
    eta, tau = 0.05, 3
    eng = engine("fedavg", {"lr": eta, "local_steps": tau, "batch_size": 0, "weighting": "uniform",
                            "participation": {"kind": "markov"}}, rounds=20)
    got = trace(eng)
    sets = sets_from_links(eng.meter.rows(), "local.train", 20)
    grads, _ = problem(eng)
    x = np.zeros(D)
    for r, s in enumerate(sets):
        if s:
            locs = []
            for i in s:
                xi = x.copy()
                for _ in range(tau):
                    xi = xi - eta * grads[i](xi)
                locs.append(xi)
            x = np.mean(locs, axis=0)
        assert rel(got[r], x) < 1e-12


def test_scaffold_matches_numpy_option2():
    eta, tau, eta_g = 0.05, 3, 1.0
    eng = engine("scaffold", {"lr": eta, "local_steps": tau, "batch_size": 0, "server_lr": eta_g,
                              "participation": {"kind": "uniform", "m": 2}}, rounds=20)
    got = trace(eng)
    sets = sets_from_links(eng.meter.rows(), "scaffold.local", 20)
    grads, _ = problem(eng)
    x, c, ci = np.zeros(D), np.zeros(D), [np.zeros(D) for _ in range(N)]
    for r, s in enumerate(sets):
        dys, dcs = [], []
        for i in s:
            y = x.copy()
            for _ in range(tau):
                y = y - eta * (grads[i](y) - ci[i] + c)
            cplus = ci[i] - c + (x - y) / (tau * eta)
            dys.append(y - x)
            dcs.append(cplus - ci[i])
            ci[i] = cplus
        x = x + eta_g * np.mean(dys, axis=0)
        c = c + np.sum(dcs, axis=0) / N
        assert rel(got[r], x) < 1e-12


def test_scaffold_and_focus_converge_exactly_fedavg_does_not():
    part = {"kind": "weighted", "m": 3}
    f = engine("focus", {"lr": 0.05, "local_steps": 3, "participation": part}, rounds=200)
    _, xs = problem(f)
    assert rel(trace(f)[-1], xs) < 1e-13
    s = engine("scaffold", {"lr": 0.1, "local_steps": 3, "batch_size": 0, "participation": part}, rounds=200)
    assert rel(trace(s)[-1], xs) < 1e-10
    a = engine("fedavg", {"lr": 0.1, "local_steps": 3, "batch_size": 0, "weighting": "uniform",
                          "participation": part}, rounds=200)
    assert rel(trace(a)[-1], xs) > 1e-4


# -- payload per round (pull d down, push d up; SCAFFOLD 2d each way) ---------------------------------------

@pytest.mark.parametrize("alg,task,factor", [("focus", ("pull", "push"), 1), ("sg-focus", ("pull", "push"), 1),
                                             ("mifa", "local.train", 1), ("fedau", "local.train", 1),
                                             ("scaffold", "scaffold.local", 2)])
def test_payload_per_round(alg, task, factor):
    kinds = set(task) if isinstance(task, tuple) else {task}
    task = task[0] if isinstance(task, tuple) else task
    opts = {"lr": 0.05, "local_steps": 2, "participation": {"kind": "bernoulli", "p": 0.2}}
    if alg == "sg-focus":
        opts["batch_size"] = 4
    eng = engine(alg, opts, rounds=12)
    eng.run()
    links = eng.meter.rows()
    sets = sets_from_links(links, task, 12)
    assert any(not s for s in sets)
    for r, s in enumerate(sets):
        rows = [x for x in links if x["round"] == r]
        down = sum(x["payload_bytes"] for x in rows if x["src"] == "ps" and x["phase"] == "request")
        up = sum(x["payload_bytes"] for x in rows if x["dst"] == "ps" and x["phase"] == "reply")
        assert down == up == factor * len(s) * D * 8  # float64
        assert {x["kind"] for x in rows} <= kinds
        if not s:
            assert rows == []  # an empty round sends nothing
