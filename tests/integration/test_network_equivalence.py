"""The central integration test (DESIGN.md section 3): the same spec and seed through real processes over
gRPC and through the in-process engine give bit-identical final models and identical byte counts."""

from __future__ import annotations

import pytest
import torch

from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.wire.bundle import payload_bytes
from fedhop.common.wire.control import CONTROL_KINDS
from tests.integration.netutil import launch_run, load_result, rows_by_key, small_spec

CASES = {
    "fedavg-flat": dict(algorithm="fedavg", clients=3, edges=0),
    "fedavg-edges": dict(algorithm="fedavg", clients=4, edges=2),
    "hierfavg": dict(algorithm="hierfavg", clients=4, edges=2, options={"edge_rounds": 2}),
    # edge -> edge hand-offs and describes (Fed-CHS walks the model over a ring of edges)
    "fedchs-handoff": dict(algorithm="fedchs", clients=3, edges=3, edge_graph="ring"),
    # the model cycles edge -> edge inside every round, in a reshuffled order
    "fedcluster": dict(algorithm="fedcluster", clients=4, edges=2, edge_graph="complete",
                       options={"participation": 1.0, "local_steps": 2, "batch_size": 16}),
    # clients keep state across rounds (their last gradient); Bernoulli participation drawn by the PS
    "focus-bernoulli": dict(algorithm="focus", clients=4, edges=0,
                            options={"participation": {"kind": "bernoulli", "p": [0.9, 0.5, 0.5, 0.2]}}),
    # scalars travel as 0-d tensors next to the model, momentum and second moment (3d + 1 values)
    "fgdro-kl-adam": dict(algorithm="fgdro-kl-adam", clients=3, edges=0, options={"local_steps": 3}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_network_matches_inprocess(case: str, tmp_path) -> None:
    spec = small_spec(**CASES[case])
    oracle = InProcessEngine(spec, device="cpu").run()
    res, final = load_result(launch_run(spec, tmp_path))

    assert res["engine"] == "network"
    assert res["missing"] == []
    assert list(final) == list(oracle.final)
    for k, v in oracle.final.items():
        assert torch.equal(final[k], v), f"{case}: tensor {k} differs between engines"
    # (the run folder numbers rounds from 1, set-up 0; the in-memory meter rows from 0, set-up -1)
    # identical per-link tables: same keys (src, dst, kind, phase, round), same payload and message bytes.
    # Reports (byte-meter rows sent up after each task) exist only over the network: their own kind, no payload.
    control = [r for r in res["links"] if r["kind"] in CONTROL_KINDS]
    assert all(r["payload_bytes"] == 0 and r["phase"] == "request" for r in control)
    res["links"] = [r for r in res["links"] if r["kind"] not in CONTROL_KINDS]
    net_rows = {(r["src"], r["dst"], r["kind"], r["phase"], r["round"]): r for r in res["links"]}
    ora_rows = {(r["src"], r["dst"], r["kind"], r["phase"], r["round"] + 1): r for r in oracle.links}
    assert set(net_rows) == set(ora_rows)
    assert rows_by_key(res["links"], "payload_bytes") == rows_by_key(oracle.links, "payload_bytes")
    for k, r in ora_rows.items():
        assert net_rows[k]["messages"] == r["messages"], k
        assert net_rows[k]["payload_bytes"] == r["payload_bytes"], k
        assert net_rows[k]["message_bytes"] == r["message_bytes"], k
    assert [r["accuracy"] for r in res["rounds"]] == [r["accuracy"] for r in oracle.rounds]
    if case == "fedchs-handoff":
        assert {"handoff", "describe"} <= {r["kind"] for r in res["links"]}
    if CASES[case].get("edges"):  # edges report the links they counted (their clients') to the PS as they go
        edges = {f"edge-{m}" for m in range(CASES[case]["edges"])}
        assert control and {r["src"] for r in control} <= edges and {r["dst"] for r in control} == {"ps"}
    else:  # clients have no meter of their own: nothing to report
        assert control == []


def test_fedavg_flat_payload_formula(tmp_path) -> None:
    """FedAvg without edges: each participating client receives and returns the model, 2 * d * 4 bytes per
    round (float32), and nothing else carries payload."""
    spec = small_spec("fedavg", clients=3, edges=0, rounds=2)
    res, final = load_result(launch_run(spec, tmp_path))
    d = sum(v.numel() for v in final.values())
    assert all(v.dtype == torch.float32 for v in final.values())
    assert payload_bytes(final) == 4 * d
    per_round: dict[int, int] = {}
    for r in res["links"]:
        per_round[r["round"]] = per_round.get(r["round"], 0) + r["payload_bytes"]
    assert per_round == {t: 2 * d * 4 * spec.topology.clients for t in range(1, spec.rounds + 1)}
    for r in res["links"]:
        assert r["payload_bytes"] == d * 4 * r["messages"]
        assert {r["src"], r["dst"]} & {"ps"}
    cumulative = [r["cum_payload_bytes"] for r in res["rounds"]]
    assert cumulative == [2 * d * 4 * spec.topology.clients * (t + 1) for t in range(spec.rounds)]
