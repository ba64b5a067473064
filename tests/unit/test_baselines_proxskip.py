"""ProxSkip / Scaffnew (docs/specs/focus.md section 6 item 4) against references written here in numpy (float64):
the notebook's iteration, plain gradient descent (p = 1), SCAFFOLD's equivalence under full participation,
and the payload of one pull + one push of d floats per participant."""

from __future__ import annotations

import numpy as np
import pytest

from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.wire.bundle import flat
from tests.specs import LINEAR_F64, focus_lsq, run_spec

N, D, ROWS = 6, 5, 20


def engine(alg: str, opts: dict, rounds: int = 15, seed: int = 0) -> InProcessEngine:
    return InProcessEngine(run_spec(alg, {"batch_size": 0, **opts}, clients=N, data=focus_lsq(D, ROWS),
                                    model=LINEAR_F64, rounds=rounds, seed=seed))


def grads_of(eng: InProcessEngine) -> list:
    """grad f_i(x) = (1/n_i) A_i^T (A_i x - b_i) (fedhop's mean squared loss)."""
    data = [(c.x.double().numpy(), c.y.double().numpy()) for c in eng.ws.fed.clients]
    return [(lambda x, a=a, b=b: a.T @ (a @ x - b) / len(b)) for a, b in data]


def trace(eng: InProcessEngine) -> tuple[list[np.ndarray], list[dict]]:
    """The server model after every round, and the byte meter's rows."""
    out: list[np.ndarray] = []
    eng.ws.evaluate = lambda params, data=None: out.append(flat(params).numpy().copy()) or {}
    res = eng.run()
    return out, res.links


def sets_from_links(links: list[dict], rounds: int) -> list[list[int]]:
    sets: list[list[int]] = [[] for _ in range(rounds)]
    for row in links:
        if row["kind"] == "proxskip.local" and row["phase"] == "request" and row["round"] >= 0:
            sets[row["round"]].append(int(row["dst"].split("-")[1]))
    return [sorted(s) for s in sets]


def notebook_proxskip(grads, x0, eta, tau, sets, shifted=False):
    """docs/specs/focus.md 6.4, written from the spec: on pull h_i += (x - x_prev_i)/(eta tau), x_i = x; tau steps
    x_i -= eta (grad f_i(x_i) - h_i); the server averages the x_i (or x_i - eta tau h_i) over S."""
    x = x0.copy()
    h = [np.zeros_like(x0) for _ in grads]
    last = [x0.copy() for _ in grads]
    traj = []
    for s in sets:
        ups = []
        for i in s:
            h[i] = h[i] + (x - last[i]) / (eta * tau)
            xi = x.copy()
            for _ in range(tau):
                xi = xi - eta * (grads[i](xi) - h[i])
            last[i] = xi
            ups.append(xi - eta * tau * h[i] if shifted else xi)
        if ups:
            x = np.mean(ups, axis=0)
        traj.append(x.copy())
    return traj


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


@pytest.mark.parametrize("average", ["model", "shifted"])
@pytest.mark.parametrize("participation", [{"kind": "full"}, {"kind": "uniform", "m": 2}])
def test_matches_the_notebook_iteration(participation, average):
    eta, tau, rounds = 0.05, 3, 15
    eng = engine("proxskip", {"lr": eta, "local_steps": tau, "participation": participation, "average": average},
                 rounds)
    grads = grads_of(eng)
    got, links = trace(eng)
    sets = sets_from_links(links, rounds)
    ref = notebook_proxskip(grads, np.zeros(D), eta, tau, sets, shifted=average == "shifted")
    for r in range(rounds):
        assert rel(got[r], ref[r]) < 1e-12, r


def test_p_one_is_gradient_descent():
    """tau = 1 (p = 1): h_i += (x - y_i)/eta and sum_i h_i = 0, so x+ = x - eta mean_i grad f_i(x)."""
    eta, rounds = 0.1, 12
    eng = engine("proxskip", {"lr": eta, "local_steps": 1}, rounds)
    grads = grads_of(eng)
    got, _ = trace(eng)
    x = np.zeros(D)
    for r in range(rounds):
        x = x - eta * np.mean([g(x) for g in grads], axis=0)
        assert rel(got[r], x) < 1e-12, r


def test_full_participation_equals_scaffold():
    """FOCUS Fig. 4: "SCAFFOLD and ProxSkip" coincide under full participation (h_i = c_i - c)."""
    opts = {"lr": 0.05, "local_steps": 3}
    a, _ = trace(engine("proxskip", opts, 20))
    b, _ = trace(engine("scaffold", opts, 20))
    assert max(rel(x, y) for x, y in zip(a, b, strict=True)) < 1e-11


def test_shifted_and_model_average_differ_under_partial_participation():
    opts = {"lr": 0.05, "local_steps": 3, "participation": {"kind": "uniform", "m": 2}}
    a, _ = trace(engine("proxskip", {**opts, "average": "model"}, 6))
    b, _ = trace(engine("proxskip", {**opts, "average": "shifted"}, 6))
    assert rel(a[-1], b[-1]) > 1e-6


def test_payload_is_one_pull_and_one_push_of_d_floats():
    eng = engine("proxskip", {"lr": 0.05, "local_steps": 3, "participation": {"kind": "uniform", "m": 2}}, 4)
    _, links = trace(eng)
    rows = [r for r in links if r["kind"] == "proxskip.local"]
    assert len(rows) == 4 * 2 * 2  # rounds x participants x (request, reply)
    assert all(r["payload_bytes"] == D * 8 for r in rows)


def test_stale_control_variates_diverge_under_partial_participation():
    """Fig. 4: ProxSkip "diverges under uniform and arbitrary participation"; under full it converges."""
    opts = {"lr": 0.3, "local_steps": 3}
    full, _ = trace(engine("proxskip", opts, 100))
    part, _ = trace(engine("proxskip", {**opts, "participation": {"kind": "uniform", "m": 2}}, 100))
    grads = grads_of(engine("proxskip", opts, 1))
    assert np.linalg.norm(np.mean([g(full[-1]) for g in grads], axis=0)) < 1e-8
    assert np.linalg.norm(part[-1]) > 1e6 * np.linalg.norm(full[-1])
    assert np.linalg.norm(part[-1]) > 100 * np.linalg.norm(part[len(part) // 2])  # still growing
