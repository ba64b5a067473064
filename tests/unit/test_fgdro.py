"""FGDRO-CVaR / -KL / -KL-Adam / LocalAdam (docs/specs/fgdro.md): objectives, payload, locality of u_i, and an
independent numpy re-implementation of the client rounds (spec 2.2-2.6) compared with the module."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
import torch

from fedhop.common.algorithms.fgdro import cvar_objective, kl_objective
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.spec import RunSpec
from tests.specs import fgdro_toy, run_spec

DIM = 4


def toy_spec(algorithm: str, clients: int = 3, rounds: int = 3, n: int = 40, seed: int = 5,
             bias: bool = False, **opts) -> RunSpec:
    return run_spec(algorithm, {"local_steps": 4, "batch_size": 8, **opts}, clients=clients, data=fgdro_toy(DIM, n),
                    model={"name": "linear", "bias": bias}, rounds=rounds, seed=seed)


# ---------------------------------------------------------------------------------------------------------
# objectives
# ---------------------------------------------------------------------------------------------------------
def test_cvar_objective_is_k_over_n_times_mean_of_top_k():
    rng = np.random.default_rng(0)
    for _ in range(20):
        g = rng.exponential(3.0, size=7)
        for K in range(1, 8):
            top = sorted(g, reverse=True)[:K]
            assert cvar_objective(g, K) == pytest.approx(K / 7 * (sum(top) / K), rel=1e-12)


def test_cvar_objective_equals_dual_max_over_capped_simplex():
    """K/N * max_{p in simplex, p_i <= 1/K} sum p_i g_i: brute force over the vertices (non-integer K)."""
    rng = np.random.default_rng(1)
    g = rng.normal(size=5) * 2
    for K in (1.0, 1.5, 2.5, 4.0):
        best = -np.inf
        cap = 1.0 / K
        # vertices of {0 <= p <= cap, sum p = 1}: floor(K) coordinates at cap, at most one fractional
        for full in combinations(range(5), int(math.floor(K))):
            rest = 1.0 - cap * len(full)
            for j in [j for j in range(5) if j not in full] or [None]:
                p = np.zeros(5)
                p[list(full)] = cap
                if j is not None:
                    p[j] = rest
                if abs(p.sum() - 1) < 1e-12:
                    best = max(best, float(p @ g))
        assert cvar_objective(g, K) == pytest.approx(K / 5 * best, rel=1e-10)


def test_kl_objective_matches_log_mean_exp_and_its_limits():
    g = np.array([1.0, 2.0, 5.0])
    assert kl_objective(g, 1.0) == pytest.approx(math.log(np.mean(np.exp(g))), rel=1e-12)
    assert kl_objective(g, 1e-3) == pytest.approx(5.0 + 1e-3 * math.log(1 / 3), abs=1e-9)   # -> max
    assert kl_objective(g, 1e4) == pytest.approx(g.mean(), abs=1e-3)                          # -> mean
    assert math.isfinite(kl_objective(g * 1000, 1.0))                                          # no overflow


# ---------------------------------------------------------------------------------------------------------
# payload and locality
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("algo", "floats", "task"), [
    ("fgdro-cvar", lambda d: d + 1, "fgdro.cvar.round"),
    ("fgdro-kl", lambda d: 2 * d + 1, "fgdro.kl.round"),
    ("fgdro-kl-adam", lambda d: 3 * d + 1, "fgdro.kl.round"),
    ("local-adam", lambda d: 3 * d, "fgdro.kl.round"),
])
@pytest.mark.parametrize("bias", [False, True])
def test_payload_per_round_is_the_papers_count(algo, floats, task, bias):
    N, R = 3, 3
    d = DIM + (1 if bias else 0)       # linear regression: d weights (+ 1 bias)
    res = InProcessEngine(toy_spec(algo, clients=N, rounds=R, bias=bias)).run()
    rows = [r for r in res.links if r["kind"] == task]
    assert len(rows) == 2 * N * R
    for r in rows:
        assert r["messages"] == 1
        assert r["payload_bytes"] == 4 * floats(d), r      # float32: 4 bytes a float, each direction
    for t in range(R):
        for c in range(N):
            one = [r for r in rows if r["round"] == t and f"client-{c}" in (r["src"], r["dst"])]
            want = [(f"client-{c}", "reply"), ("ps", "request")]
            assert sorted((r["src"], r["phase"]) for r in one) == want
    other = {r["kind"] for r in res.links} - {task}
    if algo in ("fgdro-kl", "fgdro-kl-adam"):      # the warm init (spec 9): one float up, nothing down, once
        assert other == {"fgdro.kl.init"}
        init = [r for r in res.links if r["kind"] == "fgdro.kl.init"]
        assert sorted(r["payload_bytes"] for r in init) == [0] * N + [4] * N
    else:
        assert other == set()


def test_u_never_leaves_the_client(monkeypatch):
    sent: list[tuple[str, str, list[str]]] = []
    real = InProcessEngine.send

    def spy(self, src, dst, kind, phase, bundle, scalars):
        sent.append((src, dst, [*bundle, *scalars]))
        return real(self, src, dst, kind, phase, bundle, scalars)

    monkeypatch.setattr(InProcessEngine, "send", spy)
    for algo in ("fgdro-cvar", "fgdro-kl", "fgdro-kl-adam"):
        sent.clear()
        eng = InProcessEngine(toy_spec(algo, rounds=2))
        eng.run()
        names = {n for _, _, ns in sent for n in ns}
        assert names, "nothing was sent?"
        assert not [n for n in names if n == "u" or n.startswith("u.") or "fgdro.u" in n or n.endswith(".u")]
        tensors = {n for n in names if "." in n and n.split(".")[0] in "wmq" or n in ("s", "v")}
        assert {n.split(".")[0] for n in tensors} <= {"w", "m", "q", "s", "v"}
        # ...but every client does hold its own u_i, and they differ (local data)
        us = [eng.nodes[f"client-{c}"].state.u for c in range(3)]
        assert len(set(us)) == 3
        assert not hasattr(eng.nodes["ps"].state, "u")


# ---------------------------------------------------------------------------------------------------------
# the module equals an independent numpy re-implementation of the spec's pseudocode (2.6)
# ---------------------------------------------------------------------------------------------------------
def client_arrays(eng: InProcessEngine) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for c in eng.ws.topology.clients:
        ds = eng.ws.client_data(c)
        out.append((ds.x.double().numpy(), ds.y.double().numpy()))
    return out


def loss_grad(w: np.ndarray, X: np.ndarray, Y: np.ndarray) -> tuple[float, np.ndarray]:
    r = X @ w - Y                           # 0.5 * mean squared error of the linear model (no bias)
    return 0.5 * float(np.mean(r ** 2)), X.T @ r / len(Y)


def reference(algo: str, data, w0: np.ndarray, R: int, I: int, hp: dict) -> tuple[np.ndarray, float]:
    """Spec 2.6 ``client_round`` + the server's uniform means, full-batch z (so no sampling to mirror)."""
    N = len(data)
    wbar = w0.copy()
    if algo == "cvar":
        sbar, u = hp.get("s_init", 0.0), [0.0] * N
    else:
        lam = hp.get("lam", 1.0)
        u = [loss_grad(w0, X, Y)[0] for X, Y in data]          # u_i^0 = first-batch loss at wbar^1 (spec 9)
        vbar = float(np.mean(np.exp(np.array(u) / lam)))        # vbar^1 = mean_i exp(u_i^0 / lambda)
        mbar = np.zeros_like(w0)
        qbar = np.zeros_like(w0)
    for _ in range(R):
        outs = []
        for i, (X, Y) in enumerate(data):
            w = wbar.copy()
            if algo == "cvar":
                s = sbar
            else:
                v, m, q = vbar, mbar.copy(), qbar.copy()
            for _ in range(I):
                loss, grad = loss_grad(w, X, Y)
                if algo == "localadam":                         # Alg. 4: h = grad l, no u, no v
                    m = (1 - hp["beta3"]) * m + hp["beta3"] * grad
                    q = (1 - hp["beta4"]) * q + hp["beta4"] * grad * grad
                    w = w - hp["lr"] * m / (np.sqrt(q) + hp["tau"])
                    continue
                u[i] = (1 - hp["beta1"]) * u[i] + hp["beta1"] * loss
                if algo == "cvar":
                    assert abs(u[i] - s) > 1e-4, "gate too close to its kink for a float32 comparison"
                    a = 1.0 if u[i] > s else 0.0
                    s = s - hp["lr"] * (-a + hp["K"] / N)
                    w = w - hp["lr"] * a * grad
                else:
                    e = math.exp(u[i] / lam)
                    v = (1 - hp["beta2"]) * v + hp["beta2"] * e
                    h = (e / v) * grad
                    m = (1 - hp["beta3"]) * m + hp["beta3"] * h
                    if algo == "kl":
                        w = w - hp["lr"] * m
                    else:
                        q = (1 - hp["beta4"]) * q + hp["beta4"] * h * h
                        w = w - hp["lr"] * m / (np.sqrt(q) + hp["tau"])
            outs.append((w, s) if algo == "cvar" else (w, v, m, q))
        wbar = np.mean([o[0] for o in outs], axis=0)
        if algo == "cvar":
            sbar = float(np.mean([o[1] for o in outs]))
        else:
            vbar = float(np.mean([o[1] for o in outs]))
            mbar = np.mean([o[2] for o in outs], axis=0)
            qbar = np.mean([o[3] for o in outs], axis=0)
    return wbar, (sbar if algo == "cvar" else vbar)


@pytest.mark.parametrize(("algo", "name", "hp"), [
    ("cvar", "fgdro-cvar", {"lr": 0.05, "beta1": 0.3, "K": 1.0}),
    ("cvar", "fgdro-cvar", {"lr": 0.05, "beta1": 0.3, "K": 2.0}),
    ("cvar", "fgdro-cvar", {"lr": 0.05, "beta1": 0.3, "K": 1.0, "s_at_median_loss": True}),
    ("kl", "fgdro-kl", {"lr": 0.05, "beta1": 0.3, "beta2": 0.05, "beta3": 0.5, "lam": 2.0}),
    ("adam", "fgdro-kl-adam", {"lr": 0.01, "beta1": 0.3, "beta2": 0.05, "beta3": 0.5, "beta4": 0.1,
                               "tau": 1e-3, "lam": 2.0}),
    ("localadam", "local-adam", {"lr": 0.01, "beta3": 0.5, "beta4": 0.1, "tau": 1e-3}),
])
def test_module_matches_numpy_reimplementation(algo, name, hp):
    R, I = 3, 4
    hp = dict(hp)
    at_median = hp.pop("s_at_median_loss", False)
    eng = InProcessEngine(toy_spec(name, clients=3, rounds=R, n=30, batch_size=0, local_steps=I, **hp))
    w0 = eng.ws.initial_params()["out.weight"].double().numpy().reshape(-1)
    if at_median:
        # a threshold inside the clients' loss range: gates open and close as u_i moves (exercises u and a)
        hp["s_init"] = float(np.median([loss_grad(w0, X, Y)[0] for X, Y in client_arrays(eng)])) * 0.6
        eng = InProcessEngine(toy_spec(name, clients=3, rounds=R, n=30, batch_size=0, local_steps=I, **hp))
    want_w, want_stat = reference(algo, client_arrays(eng), w0, R, I, hp)
    res = eng.run()
    got_w = res.final["out.weight"].double().numpy().reshape(-1)
    np.testing.assert_allclose(got_w, want_w, rtol=0, atol=1e-6)
    key = "s_bar" if algo == "cvar" else "v_bar"
    if algo != "localadam":
        assert res.rounds[-1][key] == pytest.approx(want_stat, abs=1e-6 * max(1.0, abs(want_stat)))
    assert not np.allclose(want_w, w0)          # the run actually moved


def test_cvar_gate_is_closed_while_threshold_is_above_every_loss():
    """With s far above every loss, a = 0: w never moves and s falls by eta2 * K/N per step (Alg.1 line 7)."""
    spec = toy_spec("fgdro-cvar", rounds=2, s_init=1e6, K=1.0, lr=0.1, lr_s=0.5)
    eng = InProcessEngine(spec)
    w0 = eng.ws.initial_params()
    res = eng.run()
    # the mean of 3 identical copies, up to float32 rounding
    torch.testing.assert_close(res.final["out.weight"], w0["out.weight"], rtol=0, atol=1e-7)
    assert res.rounds[-1]["s_bar"] == pytest.approx(1e6 - 2 * 4 * 0.5 * (1 / 3), rel=1e-7)


def test_kl_with_huge_lambda_is_fedavg_with_momentum():
    """lambda -> inf: every weight exp(u/lambda)/v -> 1 (spec 8 test b). Compare with a local-adam-free
    momentum reference: the same reference with e = 1."""
    hp = {"lr": 0.05, "beta1": 0.3, "beta2": 0.05, "beta3": 0.5, "lam": 1e9}
    spec = toy_spec("fgdro-kl", rounds=2, n=30, batch_size=0, local_steps=3, **hp)
    eng = InProcessEngine(spec)
    data = client_arrays(eng)
    wbar = eng.ws.initial_params()["out.weight"].double().numpy().reshape(-1)
    mbar = np.zeros_like(wbar)
    for _ in range(2):
        outs = []
        for X, Y in data:
            w, m = wbar.copy(), mbar.copy()
            for _ in range(3):
                m = 0.5 * m + 0.5 * loss_grad(w, X, Y)[1]
                w = w - 0.05 * m
            outs.append((w, m))
        wbar, mbar = np.mean([o[0] for o in outs], 0), np.mean([o[1] for o in outs], 0)
    got = eng.run().final["out.weight"].double().numpy().reshape(-1)
    np.testing.assert_allclose(got, wbar, atol=1e-6)


def test_exp_shift_leaves_the_iterates_unchanged():
    """exp((u - c)/lambda) with a fixed c: the weight exp(u/lambda)/v is shift invariant (spec 9)."""
    base = {"lr": 0.05, "beta1": 0.3, "beta2": 0.05, "beta3": 0.5, "lam": 0.5, "batch_size": 0}
    a = InProcessEngine(toy_spec("fgdro-kl", **base)).run()
    b = InProcessEngine(toy_spec("fgdro-kl", exp_shift=30.0, **base)).run()
    torch.testing.assert_close(a.final["out.weight"], b.final["out.weight"], atol=1e-6, rtol=1e-5)
    assert b.rounds[-1]["v_bar"] == pytest.approx(a.rounds[-1]["v_bar"] * math.exp(-30.0 / 0.5), rel=1e-4)


def test_missing_client_is_left_out_of_the_mean_and_keeps_its_u():
    spec = toy_spec("fgdro-cvar", clients=3, rounds=2)
    faults = FaultPlan(lambda node, task, rnd: node == "client-2" and rnd == 1)
    eng = InProcessEngine(spec, faults=faults)
    res = eng.run()
    assert [m["node"] for m in res.missing] == ["client-2"]
    assert res.rounds[-1]["present"] == 2 and res.rounds[0]["present"] == 3
    # client-2 trained in round 0 only: its u is what one round from the start gives, unlike the others'
    ref = InProcessEngine(toy_spec("fgdro-cvar", clients=3, rounds=1))
    ref.run()
    assert eng.nodes["client-2"].state.u == ref.nodes["client-2"].state.u
    assert eng.nodes["client-1"].state.u != ref.nodes["client-1"].state.u


def test_cvar_rejects_k_above_n():
    with pytest.raises(ValueError, match="exceeds the number of clients"):
        InProcessEngine(toy_spec("fgdro-cvar", clients=3, K=4.0)).run()
