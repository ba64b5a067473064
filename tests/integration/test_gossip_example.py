"""examples/gossip (randomized pairwise gossip on a client ring, a user module on ``fedhop.api`` only) at a small
size: launched over real processes (listening clients, models client -> client) it ends with the model the
in-process engine (``fedhop simulate``) ends with, bit for bit, with the same payload on every link: d floats per
hand-off between matched ring neighbours, and no model on a PS link but the final collect.

The launch is :func:`fedhop.launch.launch` in the test process (children forked from the session's fork server,
with the example's folder as their working directory, as ``fedhop launch`` run there would have):
tests/integration/test_user_protocol.py covers the command lines with the other example."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.spec import RunSpec
from fedhop.common.wire.bundle import payload_bytes
from fedhop.common.wire.control import CONTROL_KINDS
from tests.integration.netutil import example_here, launch_here, load_result

SMALL = (("rounds = 10", "rounds = 3"), ("clients = 6", "clients = 4"))


def test_gossip_example_launch_equals_simulate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = example_here("gossip", tmp_path, monkeypatch, SMALL)
    spec = RunSpec.load(folder / "spec.toml")
    assert spec.topology.peer_graph == "ring"  # the protocol's Algorithm.peers

    oracle = InProcessEngine(spec, device="cpu").run()
    res, final = load_result(launch_here(spec, tmp_path))
    assert res["missing"] == []
    assert list(final) == list(oracle.final) and all(torch.equal(final[k], oracle.final[k]) for k in final)

    work = [r for r in res["links"] if r["kind"] not in CONTROL_KINDS]
    net = {(r["src"], r["dst"], r["kind"], r["phase"], r["round"]): (r["messages"], r["payload_bytes"]) for r in work}
    sim = {(r["src"], r["dst"], r["kind"], r["phase"], r["round"] + 1): (r["messages"], r["payload_bytes"])
           for r in oracle.links}
    assert net == sim

    d_bytes = payload_bytes(final)
    ring = {(f"client-{i}", f"client-{(i + k) % 4}") for i in range(4) for k in (1, 3)}
    handoffs = {k: v for k, v in net.items() if k[2] == "handoff" and k[3] == "request"}
    assert handoffs and {k[:2] for k in handoffs} <= ring
    assert set(handoffs.values()) == {(1, d_bytes)}  # one model per matched direction and round
    for rnd in (1, 2, 3):  # a matching: each client sends to at most one partner, who sends back
        pairs = {k[:2] for k in handoffs if k[4] == rnd}
        assert pairs and {(b, a) for a, b in pairs} == pairs and len({a for a, _ in pairs}) == len(pairs)
    carrying = sorted(k for k, (_, payload) in net.items() if payload and "ps" in k[:2])
    assert carrying == [(f"client-{i}", "ps", "gossip.collect", "reply", 3) for i in range(4)]
    assert [r["pairs"] for r in res["rounds"]] == [len({k[:2] for k in handoffs if k[4] == t}) // 2 for t in (1, 2, 3)]
