"""FedAvg + QSGD uploads (Fed-CHS Fig. 2 baseline, docs/specs/fedchs.md section 5 items 1 and 4) against a numpy
FedAvg written here: the quantised round stays within QSGD's deterministic error bound of exact FedAvg, and the
upload is the QSGD encoding (d int8 levels + one float32 norm per tensor)."""

from __future__ import annotations

import numpy as np
import pytest

from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.spec import SpecError
from tests.specs import DIGITS, LINEAR_F64, focus_lsq, run_spec

N, D, ROWS = 5, 6, 30


def lsq_engine(opts: dict, rounds: int = 1) -> InProcessEngine:
    return InProcessEngine(run_spec("fedavg", {"batch_size": 0, "local_steps": 3, "lr": 0.05, **opts}, clients=N,
                                    data=focus_lsq(D, ROWS), model=LINEAR_F64, rounds=rounds, seed=4))


def numpy_updates(eng: InProcessEngine, lr: float, steps: int) -> list[np.ndarray]:
    """Delta_k = (steps full-batch GD steps on 0.5 mean (A_k x - b_k)^2 from x = 0) - 0, per client."""
    out = []
    for c in eng.ws.fed.clients:
        a, b = c.x.double().numpy(), c.y.double().numpy()
        x = np.zeros(D)
        for _ in range(steps):
            x = x - lr * a.T @ (a @ x - b) / len(b)
        out.append(x)
    return out


def final(eng: InProcessEngine) -> np.ndarray:
    return eng.run().final["out.weight"].double().numpy().reshape(-1)


def test_plain_fedavg_round_is_the_numpy_reference():
    eng = lsq_engine({})
    ref = np.mean(numpy_updates(eng, 0.05, 3), axis=0)
    assert np.allclose(final(eng), ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("levels", [127, 4])
def test_quantised_round_within_the_qsgd_bound(levels):
    """|Q_s(v)_j - v_j| <= ||v||_2 / s for every coordinate (QSGD rounds to a neighbouring level), so one round
    of FedAvg + QSGD is within sum_k alpha_k ||Delta_k|| / s of exact FedAvg, coordinate by coordinate."""
    eng = lsq_engine({"upload_levels": levels})
    deltas = numpy_updates(eng, 0.05, 3)
    exact = np.mean(deltas, axis=0)
    bound = np.mean([np.linalg.norm(d) for d in deltas]) / levels
    err = np.abs(final(eng) - exact)
    assert err.max() <= bound * (1 + 1e-5)   # float32 norm and decode
    assert err.max() > 0                      # the upload really was quantised


def test_large_levels_track_fedavg_over_rounds():
    a = final(lsq_engine({"upload_levels": 127}, rounds=10))
    b = final(lsq_engine({}, rounds=10))
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 0.05
    assert not np.array_equal(a, b)


def test_upload_is_the_qsgd_encoded_size_reading_a():
    """Reading A (spec 5: 20 communications a round) with QSGD: per round syncs * N * (Q_up + Q) bytes, Q = 4d
    (float32 model down), Q_up = d + 4 P (int8 levels + a float32 norm for each of the P tensors)."""
    syncs, clients, rounds = 3, 4, 2
    spec = run_spec("fedavg", {"local_steps": 1, "syncs_per_round": syncs, "lr_schedule_K": 20, "lr": 1.0,
                               "batch_size": 8, "upload_levels": 127},
                    clients=clients, data=DIGITS, model={"name": "mlp", "hidden": [8]}, rounds=rounds, seed=0)
    res = InProcessEngine(spec).run()
    d, tensors = 64 * 8 + 8 + 8 * 10 + 10, 4          # mlp 64 -> 8 -> 10: two weights, two biases
    q, q_up = 4 * d, d + 4 * tensors
    rows = [r for r in res.links if r["kind"] == "fedavg.train_qsgd"]
    # one meter row per (round, link, kind, phase): the syncs of a round add up in it
    assert {r["payload_bytes"] for r in rows if r["phase"] == "request"} == {syncs * q}
    assert {r["payload_bytes"] for r in rows if r["phase"] != "request"} == {syncs * q_up}
    assert len(rows) == rounds * clients * 2
    for t in range(rounds):
        assert sum(r["payload_bytes"] for r in res.links if r["round"] == t) == syncs * clients * (q_up + q)


def test_levels_out_of_range_is_a_clear_error():
    with pytest.raises(SpecError, match="upload_levels"):
        lsq_engine({"upload_levels": 128})


def test_through_edges_only_client_uploads_are_quantised():
    spec = run_spec("fedavg", {"local_steps": 2, "batch_size": 8, "upload_levels": 127}, clients=4, edges=2,
                    edge_graph="complete", data=DIGITS, model={"name": "mlp", "hidden": [8]}, rounds=1, seed=0)
    res = InProcessEngine(spec).run()
    d = 64 * 8 + 8 + 8 * 10 + 10
    up = {r["payload_bytes"] for r in res.links if r["kind"] == "fedavg.train_qsgd" and r["phase"] != "request"}
    edge_up = {r["payload_bytes"] for r in res.links if r["kind"] == "hier.edge_round" and r["phase"] != "request"}
    assert up == {d + 4 * 4} and edge_up == {4 * d}
