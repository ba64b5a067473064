"""DRFA-Prox with the KL regulariser (FGDRO's baseline, docs/specs/fgdro.md section 5): the lambda prox steps against
their optimality conditions and an independent bisection solver written here, one round of the algorithm
against numpy losses, and the payload of Algorithm 2."""

from __future__ import annotations

import numpy as np
import pytest

from fedhop.common.algorithms.drfa import kl_prox_entropic, kl_prox_euclidean
from fedhop.common.engine.inprocess import InProcessEngine
from tests.specs import fgdro_toy, run_spec

DIM, N = 4, 5


def kl(u: np.ndarray) -> float:
    return float(np.sum(u * np.log(len(u) * u)))


def bisect_prox(y: np.ndarray, c: float) -> np.ndarray:
    """argmin_{simplex} 1/2||u - y||^2 + c KL(u || 1/N) by nested bisection: u_i(nu) solves the increasing
    equation u + c log(N u) + c = y_i - nu; nu makes sum u = 1."""
    n = len(y)

    def u_of(nu: float) -> np.ndarray:
        lo, hi = np.full(n, -700.0), np.full(n, 15.0)   # bisection on t = log u
        rhs = y - nu
        for _ in range(64):
            mid = 0.5 * (lo + hi)
            big = np.exp(mid) + c * (np.log(n) + mid) + c > rhs
            hi, lo = np.where(big, mid, hi), np.where(big, lo, mid)
        return np.exp(0.5 * (lo + hi))

    a, b = float(y.min()) - 50, float(y.max()) + 50
    for _ in range(80):
        nu = 0.5 * (a + b)
        if u_of(nu).sum() > 1:
            a = nu
        else:
            b = nu
    return u_of(0.5 * (a + b))


def test_euclidean_kl_prox_solves_its_problem():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(2, 9))
        y, c = rng.normal(size=n) * 2, float(rng.uniform(0.01, 3))
        u = kl_prox_euclidean(y, c)
        assert u.min() > 0 and u.sum() == pytest.approx(1.0, abs=1e-14)
        # KKT: u_i - y_i + c (log(N u_i) + 1) is the same for every i (= -nu)
        assert np.ptp(u - y + c * (np.log(n * u) + 1)) < 1e-9
        assert np.allclose(u, bisect_prox(y, c), atol=1e-9)
        obj = 0.5 * np.sum((u - y) ** 2) + c * kl(u)
        for z in rng.dirichlet(np.ones(n), size=50):
            assert obj <= 0.5 * np.sum((z - y) ** 2) + c * kl(z) + 1e-12


def test_entropic_kl_prox_is_the_closed_form_maximiser():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(2, 9))
        lam, v = rng.dirichlet(np.ones(n)), rng.normal(size=n) * 3
        a, r = float(rng.uniform(0.01, 2)), float(rng.uniform(0.01, 3))
        u = kl_prox_entropic(lam, a, v, r)

        def obj(z, a=a, v=v, r=r, lam=lam):
            return a * v @ z - a * r * kl(z) - float(np.sum(z * np.log(z / lam)))

        # stationarity: a v_i - a r (log(N u_i) + 1) - log(u_i / lam_i) - 1 is the same for every i
        assert np.ptp(a * v - a * r * (np.log(n * u) + 1) - np.log(u / lam)) < 1e-9
        for z in rng.dirichlet(np.ones(n), size=50):
            assert obj(u) >= obj(z) - 1e-12


def toy_engine(rounds: int = 1, **opts) -> InProcessEngine:
    return InProcessEngine(run_spec(
        "drfa-prox", {"local_steps": 3, "batch_size": 0, "lr": 0.05, "gamma": 0.05, **opts}, clients=N,
        data=fgdro_toy(DIM, 30), model={"name": "linear", "bias": False}, rounds=rounds, seed=2))


@pytest.mark.parametrize("prox", ["euclidean", "entropic"])
def test_one_round_lambda_step_against_numpy(prox):
    """m = N: U is every client, v_i = f_i(w^1) (full batch) at the new model (Alg. 2); lambda^0 = n_i/n = 1/N."""
    reg, gamma, steps = 0.5, 0.05, 3
    eng = toy_engine(reg=reg, prox=prox)
    res = eng.run()
    w = res.final["out.weight"].double().numpy().reshape(-1)
    v = np.array([0.5 * np.mean((c.x.double().numpy() @ w - c.y.double().numpy()) ** 2) for c in eng.ws.fed.clients])
    lam0 = np.full(N, 1 / N)
    a = steps * gamma
    if prox == "euclidean":
        ref = bisect_prox(lam0 + a * v, a * reg)
    else:
        e = (lam0 * np.exp(a * v)) ** (1 / (1 + a * reg))
        ref = e / e.sum()
    lam = eng.nodes[eng.ws.topology.server].state.lam
    assert np.allclose(lam, ref, atol=1e-6)   # v from float32 losses
    assert np.argmax(lam) == np.argmax(v)


def test_strong_regulariser_keeps_lambda_near_uniform():
    weak = toy_engine(rounds=4, reg=0.01)
    strong = toy_engine(rounds=4, reg=100.0)
    weak.run()
    strong.run()
    spread = [np.ptp(e.nodes[e.ws.topology.server].state.lam) for e in (weak, strong)]
    assert spread[1] < 0.1 * spread[0]


@pytest.mark.parametrize("loss_at, up", [("final", 1), ("snapshot", 2)])
def test_payload_per_round(loss_at, up):
    """D: d down, d up (final) or 2d up (snapshot); U: d down, one float up. d = DIM float32."""
    res = toy_engine(rounds=1, loss_at=loss_at).run()
    train = [r for r in res.links if r["kind"] in ("drfa_prox.train", "drfa.train")]
    loss = [r for r in res.links if r["kind"] == "drfa.loss"]
    assert train and all(r["payload_bytes"] == (4 * DIM if r["phase"] == "request" else up * 4 * DIM) for r in train)
    assert len(loss) == 2 * N and all(r["payload_bytes"] == (4 * DIM if r["phase"] == "request" else 4)
                                      for r in loss)
