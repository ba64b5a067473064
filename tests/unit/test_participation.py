"""Participation models (docs/specs/focus.md section 4): empirical frequencies vs p_i, passive sampling vs exact
inclusion probabilities (enumerated here), the Markov chain's transitions and stationary frequency."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pydantic import TypeAdapter

from fedhop.common.algorithms.fedavg import sample_participants
from fedhop.common.algorithms.participation import (
    ParticipationModel,
    ParticipationProcess,
    ParticipationState,
    participants,
    successive_sample,
)
from fedhop.common.engine.inprocess import InProcessEngine
from tests.specs import run_spec

MODEL = TypeAdapter(ParticipationModel)


def draws(spec: dict, n: int, rounds: int, seed: int = 0) -> tuple[ParticipationProcess, np.ndarray]:
    proc = ParticipationProcess.build(MODEL.validate_python(spec), n, np.random.default_rng([seed, 1]))
    masks = np.zeros((rounds, n), dtype=bool)
    for r in range(rounds):
        masks[r, proc.sample(r, np.random.default_rng([seed, 2, r]))] = True
    return proc, masks


def within(freq: np.ndarray, p: np.ndarray, rounds: int, sigmas: float = 5.0) -> bool:
    sd = np.sqrt(np.maximum(p * (1 - p), 1e-12) / rounds)
    return bool(np.all(np.abs(freq - p) <= sigmas * sd + 1e-12))


def test_full_and_uniform():
    _, m = draws({"kind": "full"}, 7, 50)
    assert m.all()
    _, m = draws({"kind": "uniform", "m": 3}, 10, 4000)
    assert (m.sum(1) == 3).all()
    assert within(m.mean(0), np.full(10, 0.3), 4000)


def test_bernoulli_explicit_p():
    p = np.array([0.05, 0.2, 0.5, 0.9, 1.0])
    _, m = draws({"kind": "bernoulli", "p": p.tolist()}, 5, 6000)
    assert within(m.mean(0), p, 6000)


def test_bernoulli_fig9_scheme_and_empty_rounds():
    proc, m = draws({"kind": "bernoulli"}, 32, 6000)
    p = proc.p
    assert p is not None and len(p) == 32
    assert np.all((p[:28] >= 0.1) & (p[:28] <= 0.3))  # 90% of 32 -> 28 clients in U(0.1, 0.3)
    assert np.all((p[28:] >= 0.1) & (p[28:] <= 0.9))
    assert p[28:].max() > 0.3  # the second group really uses the wider range (seeded, 4 draws)
    assert within(m.mean(0), p, 6000)
    _, few = draws({"kind": "bernoulli", "p": 0.1}, 4, 400)
    assert (few.sum(1) == 0).any()  # active participation can leave a round empty


def _inclusion_exact(q: np.ndarray, m: int) -> np.ndarray:
    """P(i in S) for successive sampling without replacement, by enumerating ordered draws."""
    out = np.zeros(len(q))
    for seq in itertools.permutations(range(len(q)), m):
        pr, left = 1.0, 1.0
        for i in seq:
            pr *= q[i] / left
            left -= q[i]
        out[list(seq)] += pr
    return out


def test_weighted_passive_sampling_inclusion_probabilities():
    q = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    proc, m = draws({"kind": "weighted", "m": 2, "q": q.tolist()}, 5, 10000)
    assert np.allclose(proc.q, q)
    assert (m.sum(1) == 2).all()
    exact = _inclusion_exact(q, 2)
    assert np.isclose(exact.sum(), 2.0)
    assert within(m.mean(0), exact, 10000)
    assert not np.allclose(exact, 2 * q, atol=0.02)  # passive: p_i is NOT proportional to q_i (pitfall 10)


def test_weighted_default_q_is_notebook_recipe():
    proc, _ = draws({"kind": "weighted", "m": 4}, 16, 1)
    assert proc.q is not None and np.isclose(proc.q.sum(), 1.0)
    assert proc.q.min() >= 0.01 / (16 * 1.01)


def test_successive_sample_distinct():
    rng = np.random.default_rng(0)
    for _ in range(200):
        s = successive_sample(np.array([0.7, 0.1, 0.1, 0.05, 0.05]), 4, rng)
        assert len(set(s.tolist())) == 4


def test_markov_chain_transitions_and_stationary_frequency():
    p_stay, p_join = 0.7, np.array([0.05, 0.1, 0.3, 0.6])
    _, m = draws({"kind": "markov", "p_stay": p_stay, "p_join": p_join.tolist()}, 4, 30000)
    stationary = p_join / (1 - p_stay + p_join)
    assert np.all(np.abs(m[1000:].mean(0) - stationary) < 0.03)
    prev, nxt = m[:-1], m[1:]
    stay = (prev & nxt).sum(0) / prev.sum(0)
    join = (~prev & nxt).sum(0) / (~prev).sum(0)
    assert np.all(np.abs(stay - p_stay) < 0.03)
    assert np.all(np.abs(join - p_join) < 0.02)


def test_markov_default_uses_groups_and_is_not_iid():
    proc, m = draws({"kind": "markov"}, 20, 20000)
    assert proc.p is not None and np.all((proc.p >= 0.025) & (proc.p <= 0.25))  # 0.5 * U(0.05, 0.5)
    assert np.allclose(proc.inclusion_probabilities(), proc.p / (0.3 + proc.p))
    prev, nxt = m[:-1], m[1:]
    stay = (prev & nxt).sum() / prev.sum()
    assert abs(stay - 0.7) < 0.02 and stay > m.mean() + 0.3  # memory: P(1->1) far above P(1)


def test_cyclic_blocks():
    _, m = draws({"kind": "cyclic", "m": 3}, 7, 7)
    assert [np.flatnonzero(r).tolist() for r in m[:3]] == [[0, 1, 2], [3, 4, 5], [0, 1, 6]]
    assert (m.sum(0) == 3).all()


def test_invalid_models_are_rejected():
    for bad in ({"kind": "bernoulli", "p": [0.0, 0.5]}, {"kind": "weighted", "q": [1, -1]},
                {"kind": "uniform", "m": 0}, {"kind": "nope"}):
        with pytest.raises(ValueError):
            MODEL.validate_python(bad)


def _server(seed: int = 0) -> InProcessEngine:
    spec = run_spec("focus", {}, clients=8,
                    data={"dataset": "focus-lsq", "partition": "iid", "options": {"dim": 2, "rows_per_client": 3}},
                    model={"name": "linear", "bias": False}, rounds=5, seed=seed)
    return InProcessEngine(spec)


def test_server_draws_are_deterministic_and_seeded():
    model = MODEL.validate_python({"kind": "markov", "p_stay": 0.5})

    def seq(seed):
        ps = _server(seed).nodes["ps"]
        out = []
        state = ParticipationState()
        for r in range(30):
            ps.round = r
            out.append(participants(ps, model, state))
        return out

    a, b, c = seq(0), seq(0), seq(1)
    assert a == b and a != c
    assert all(s == sorted(s, key=lambda n: int(n.split("-")[1])) for s in a)


def test_float_fraction_is_fedavgs_sampler():
    ps = _server().nodes["ps"]
    for r in range(5):
        ps.round = r
        assert participants(ps, 0.5) == sample_participants(ps, ps.children, 0.5)
