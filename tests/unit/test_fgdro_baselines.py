"""FGDRO's baselines (docs/specs/fgdro.md section 5): DRFA, DR-DSGD, FedAdam. Small sanity checks against
independent numpy computations, payload formulas and the DRO direction of DRFA's lambda."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedhop.common.algorithms.drfa import project_simplex
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.spec import RunSpec
from tests.specs import fgdro_toy, run_spec

DIM = 4


def toy_spec(algorithm: str, clients: int = 3, rounds: int = 2, n: int = 30, **opts) -> RunSpec:
    return run_spec(algorithm, {"local_steps": 3, "batch_size": 0, **opts}, clients=clients, data=fgdro_toy(DIM, n),
                    model={"name": "linear", "bias": False}, rounds=rounds, seed=2)


def arrays(eng):
    return [(eng.ws.client_data(c).x.double().numpy(), eng.ws.client_data(c).y.double().numpy())
            for c in eng.ws.topology.clients]


def loss_grad(w, X, Y):
    r = X @ w - Y
    return 0.5 * float(np.mean(r ** 2)), X.T @ r / len(Y)


def w0_of(eng):
    return eng.ws.initial_params()["out.weight"].double().numpy().reshape(-1)


def final_of(res):
    return res.final["out.weight"].double().numpy().reshape(-1)


# ---------------------------------------------------------------------------------------------------------
# DRFA
# ---------------------------------------------------------------------------------------------------------
def test_project_simplex_is_the_closest_simplex_point():
    rng = np.random.default_rng(0)
    for _ in range(50):
        y = rng.normal(size=6) * 2
        p = project_simplex(y)
        assert p.min() >= 0 and p.sum() == pytest.approx(1.0)
        # KKT: p = max(y - theta, 0) for one theta; every random simplex point is no closer to y
        theta = (y - p)[p > 0]
        assert np.ptp(theta) < 1e-9 and np.all(y[p == 0] <= theta[0] + 1e-12)
        for _ in range(20):
            z = rng.dirichlet(np.ones(6))
            assert np.linalg.norm(z - y) >= np.linalg.norm(p - y) - 1e-12
    assert np.allclose(project_simplex(np.array([0.2, 0.3, 0.5])), [0.2, 0.3, 0.5])


def test_drfa_payload_and_lambda_moves_to_the_worst_client():
    N, R = 4, 6
    d = DIM
    spec = toy_spec("drfa", clients=N, rounds=R, lr=0.02, gamma=0.05, lambda_floor=0.0)
    res = InProcessEngine(spec).run()
    for r in res.links:
        want = {("drfa.train", "request"): d, ("drfa.train", "reply"): 2 * d,      # final + snapshot
                ("drfa.loss", "request"): d, ("drfa.loss", "reply"): 1}[(r["kind"], r["phase"])]
        assert r["payload_bytes"] == 4 * want * r["messages"]
    # every round: the loss scatter reaches m = N clients (uniform, without replacement)
    for t in range(R):
        assert sum(1 for r in res.links if r["round"] == t and r["kind"] == "drfa.loss"
                   and r["phase"] == "reply") == N
    # the toy's clients grow more heterogeneous with their index; lambda ends on the client with the
    # largest loss of the final model, computed here independently
    eng = InProcessEngine(spec)
    w = final_of(res)
    losses = [loss_grad(w, X, Y)[0] for X, Y in arrays(eng)]
    assert res.rounds[-1]["lambda_argmax"] == int(np.argmax(losses))
    assert res.rounds[-1]["lambda_max"] > 1 / N


def test_drfa_with_one_client_is_local_sgd():
    spec = toy_spec("drfa", clients=1, rounds=2, lr=0.05)
    eng = InProcessEngine(spec)
    (X, Y), = arrays(eng)
    w = w0_of(eng)
    for _ in range(2 * 3):
        w = w - 0.05 * loss_grad(w, X, Y)[1]
    np.testing.assert_allclose(final_of(eng.run()), w, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# DR-DSGD
# ---------------------------------------------------------------------------------------------------------
def test_dr_dsgd_matches_numpy_and_weights_high_loss_steps():
    lr, mu = 0.02, 4.0
    spec = toy_spec("dr-dsgd", clients=3, rounds=2, lr=lr, mu=mu)
    eng = InProcessEngine(spec)
    data = arrays(eng)
    wbar = w0_of(eng)
    for _ in range(2):
        outs = []
        for X, Y in data:
            w = wbar.copy()
            for _ in range(3):
                loss, g = loss_grad(w, X, Y)
                w = w - lr / mu * math.exp(loss / mu) * g
            outs.append(w)
        wbar = np.mean(outs, axis=0)
    res = eng.run()
    np.testing.assert_allclose(final_of(res), wbar, rtol=1e-5, atol=1e-6)
    assert {r["payload_bytes"] for r in res.links} == {4 * DIM}


# ---------------------------------------------------------------------------------------------------------
# FedAdam
# ---------------------------------------------------------------------------------------------------------
def test_fedadam_server_step_matches_numpy():
    lr, eg, b1, b2, tau = 0.05, 0.1, 0.9, 0.99, 1e-3
    spec = toy_spec("fedadam", clients=3, rounds=3, lr=lr, server_lr=eg, server_beta1=b1, server_beta2=b2,
                    server_tau=tau, weighting="uniform")
    eng = InProcessEngine(spec)
    data = arrays(eng)
    w = w0_of(eng)
    m, v = np.zeros_like(w), np.full_like(w, tau ** 2)
    for _ in range(3):
        outs = []
        for X, Y in data:
            wl = w.copy()
            for _ in range(3):
                wl = wl - lr * loss_grad(wl, X, Y)[1]
            outs.append(wl)
        delta = np.mean(outs, axis=0) - w
        m = b1 * m + (1 - b1) * delta
        v = b2 * v + (1 - b2) * delta ** 2
        w = w + eg * m / (np.sqrt(v) + tau)
    res = eng.run()
    np.testing.assert_allclose(final_of(res), w, rtol=1e-5, atol=1e-6)
    assert {r["payload_bytes"] for r in res.links} == {4 * DIM}
