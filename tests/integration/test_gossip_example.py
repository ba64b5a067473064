"""examples/gossip (randomized pairwise gossip on a client ring, a user module on ``fedhop.api`` only) at a small
size: ``fedhop launch`` (listening clients, models client -> client) ends with the model ``fedhop simulate`` ends
with, bit for bit, with the same payload on every link: d floats per hand-off between ring neighbours, and no
model on a PS link but the final collect."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from tests.integration.test_user_protocol import assert_same_model, fedhop, payload_per_link

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gossip"
SMALL = (("rounds = 10", "rounds = 3"), ("clients = 6", "clients = 4"))


def test_gossip_example_launch_equals_simulate(tmp_path: Path) -> None:
    folder = tmp_path / "gossip"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    text = (folder / "spec.toml").read_text()
    for old, new in SMALL:
        assert old in text
        text = text.replace(old, new)
    (folder / "spec.toml").write_text(text)
    fedhop(["simulate", "spec.toml", "--out", str(tmp_path / "sim")], folder)
    fedhop(["launch", "spec.toml", "--out", str(tmp_path / "net"), "--http", "off"], folder)
    assert_same_model(tmp_path / "sim", tmp_path / "net")
    sim, net = payload_per_link(tmp_path / "sim"), payload_per_link(tmp_path / "net")
    assert sim == net
    d_bytes = sum(v.numel() * v.element_size() for v in torch.load(tmp_path / "net" / "model.pt").values())
    ring = {(f"client-{i}", f"client-{(i + k) % 4}") for i in range(4) for k in (1, 3)}
    handoffs = {k: v for k, v in net.items() if k[2] == "handoff" and k[3] == "request"}
    assert handoffs and {k[:2] for k in handoffs} <= ring
    assert set(handoffs.values()) == {(1, d_bytes)}  # one model per matched direction and round
    for rnd in ("1", "2", "3"):  # a matching: each client sends to at most one partner, who sends back
        pairs = {k[:2] for k in handoffs if k[4] == rnd}
        assert pairs and {(b, a) for a, b in pairs} == pairs and len({a for a, _ in pairs}) == len(pairs)
    carrying = sorted(k for k, (_, payload) in net.items() if payload and "ps" in k[:2])
    assert carrying == [(f"client-{i}", "ps", "gossip.collect", "reply", "3") for i in range(4)]
