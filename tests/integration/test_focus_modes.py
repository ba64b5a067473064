"""FOCUS's wire modes over real processes (issue 8): client-decided participation (flat, with a quorum) and the
edge tier (each edge pre-sums its clients' pushes), each equal to the in-process run, bit for bit and byte for
byte, with pull and push as distinct kinds; the edge tier equals the flat run to 1e-12 and saves PS ingress.

Two federations (4 clients, 2 rounds, a 64-16-10 MLP on digits), launched once for the module."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.common.wire.control import CONTROL_KINDS
from tests.integration.netutil import launch_here, load_result, small_spec

D = 64 * 16 + 16 + 16 * 10 + 10  # digits (8x8 inputs, 10 classes) through an MLP with one hidden layer of 16
VEC = 8 * D  # float64 (so that the flat and edge sums, associated differently, agree to 1e-12)
# with this seed: round 1 S = {0, 2, 3} (the edges add y_2 + y_3 first, the flat run y_0 + y_2), round 2 {0, 3}
AVAILABILITY = {"kind": "bernoulli", "p": [1.0, 0.5, 0.5, 1.0]}


def spec_of(edges: int) -> RunSpec:
    # flat: the call closes at a quorum of 4 (= every client: never fewer than the available ones, so the run
    # stays equal to the in-process one) or at the deadline; through edges each edge waits for the deadline
    close = {"deadline_s": 3.0, "quorum": 0 if edges else 4}
    spec = small_spec("focus", clients=4, edges=edges, rounds=2, options={
        "lr": 0.01, "local_steps": 2, "participation": AVAILABILITY, "decided_by": "client", "round_close": close})
    raw = spec.model_dump(mode="json", exclude_none=True)
    raw["model"]["dtype"] = "float64"
    return RunSpec.parse(raw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    out = {}
    for edges in (0, 2):
        spec = spec_of(edges)
        tmp = tmp_path_factory.mktemp(f"focus-{edges}e")
        oracle = InProcessEngine(spec, device="cpu").run()
        res, final = load_result(launch_here(spec, tmp))
        out[edges] = {"spec": spec, "oracle": oracle, "res": res, "final": final}
    return out


def _work(links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in links if r["kind"] not in CONTROL_KINDS]


@pytest.mark.parametrize("edges", [0, 2])
def test_networked_equals_inprocess(runs, edges):
    run = runs[edges]
    oracle, res, final = run["oracle"], run["res"], run["final"]
    sizes = [rec["participants"] for rec in oracle.rounds]
    assert any(0 < n < 4 for n in sizes)  # some client stayed silent: the deadline closed that call
    assert res["missing"] == [] and oracle.missing == []
    for k, v in oracle.final.items():
        assert torch.equal(final[k], v), f"tensor {k} differs between engines"
    net = {(r["src"], r["dst"], r["kind"], r["phase"], r["round"]): r for r in _work(res["links"])}
    ora = {(r["src"], r["dst"], r["kind"], r["phase"], r["round"] + 1): r for r in oracle.links}
    assert set(net) == set(ora)
    for k, r in ora.items():
        assert (net[k]["messages"], net[k]["payload_bytes"], net[k]["message_bytes"]) == \
            (r["messages"], r["payload_bytes"], r["message_bytes"]), k
    assert [rec["participants"] for rec in res["rounds"]] == sizes


@pytest.mark.parametrize("edges", [0, 2])
def test_call_pull_and_push_on_the_wire(runs, edges):
    """Every client is called each round; the ones that answer are pulled (x: d floats down each hop) and push
    (y_tau up; an edge pushes one sum for its clients)."""
    res = runs[edges]["res"]
    topo = build_topology(runs[edges]["spec"].topology, 7)
    work = _work(res["links"])
    assert {r["kind"] for r in work} == {"focus.open", "pull", "push"}
    for r in work:
        if r["kind"] == "focus.open":
            assert r["payload_bytes"] == 0
        else:
            assert (r["kind"], r["phase"]) in {("pull", "request"), ("push", "reply")}
            assert r["payload_bytes"] == VEC * r["messages"], r
    for rec in res["rounds"]:
        t = rec["round"]
        called = {r["dst"] for r in work if r["round"] == t and r["kind"] == "focus.open" and
                  r["dst"].startswith("client-")}
        answered = {r["src"] for r in work if r["round"] == t and r["kind"] == "focus.open" and
                    r["phase"] == "reply" and r["src"].startswith("client-")}
        pulled = {r["dst"] for r in work if r["round"] == t and r["kind"] == "pull" and r["dst"].startswith("client-")}
        pushed = {r["src"] for r in work if r["round"] == t and r["kind"] == "push" and r["src"].startswith("client-")}
        assert called == set(topo.clients)
        assert answered == pulled == pushed and len(pulled) == rec["participants"]
        ingress = sum(r["payload_bytes"] for r in work if r["round"] == t and r["dst"] == "ps")
        senders = {topo.parent[c] for c in pushed} if edges else pushed
        assert ingress == VEC * len(senders)


def test_edge_tier_equals_flat_and_saves_ps_ingress(runs):
    flat, tier = runs[0]["final"], runs[2]["final"]
    num = sum(float((tier[k].double() - flat[k].double()).pow(2).sum()) for k in flat) ** 0.5
    den = sum(float(flat[k].double().pow(2).sum()) for k in flat) ** 0.5
    moved = sum(float((flat[k].double() - v.double()).pow(2).sum()) for k, v in
                InProcessEngine(runs[0]["spec"], device="cpu").ws.initial_params().items()) ** 0.5
    assert moved > 0 and num / den < 1e-12
    sizes = [[r["participants"] for r in runs[e]["res"]["rounds"]] for e in (0, 2)]
    assert sizes[0] == sizes[1]

    def ingress(res: dict[str, Any]) -> int:
        return sum(r["payload_bytes"] for r in _work(res["links"]) if r["dst"] == "ps")

    assert ingress(runs[2]["res"]) < ingress(runs[0]["res"])


def test_clients_that_say_they_are_away_close_the_call_at_once(tmp_path) -> None:
    """``round_close.absent = "say"``: an unavailable client answers "away" at once, so a round's call closes when
    every client answered, not at the deadline (120 s here: a round that waited for it would last that long); S_r,
    the model and the payload equal the in-process run's, and the silent mode's."""
    raw = spec_of(0).model_dump(mode="json", exclude_none=True)
    raw["algorithm"]["options"]["round_close"] = {"deadline_s": 120.0, "absent": "say"}
    spec = RunSpec.parse(raw)
    oracle = InProcessEngine(spec, device="cpu").run()
    silent = InProcessEngine(spec_of(0), device="cpu").run()
    assert all(torch.equal(oracle.final[k], v) for k, v in silent.final.items())
    assert [r["participants"] for r in oracle.rounds] == [r["participants"] for r in silent.rounds]
    res, final = load_result(launch_here(spec, tmp_path))
    assert all(torch.equal(final[k], v) for k, v in oracle.final.items())
    assert any(r["participants"] < 4 for r in res["rounds"])  # someone was away...
    assert all(r["round_s"] < 60 for r in res["rounds"])  # ...and no round waited for the 120 s deadline
    away = [r for r in _work(res["links"]) if r["kind"] == "focus.open" and r["phase"] == "reply"]
    assert {r["src"] for r in away} == {f"client-{i}" for i in range(4)}  # every client answered every call
