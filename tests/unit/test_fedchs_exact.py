"""Fed-CHS's exact flow (``flow = "exact"``, the paper's): no PS message during training. The edge that receives
the model (a post of ``fedchs.round``) runs the next round and posts its report to the PS. Same decisions and
the same model as the PS-driven flow, bit for bit, also when the active edge fails; 2 K |N_m| d + d payload per
round; the PS only starts m(0), collects the final model, and steps in after a fault."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedhop.common.engine.inprocess import RUN, FaultPlan, InProcessEngine
from fedhop.common.topology import build_topology
from fedhop.common.wire.bundle import payload_bytes
from tests.unit.test_fedchs import edge_sequence, spec


def both(options: dict, dead: Callable[[str, str, int], bool] | None = None, **kw):  # noqa: ANN201
    """The driven and the exact run; ``dead(node, task, round)``: which call of the driven flow fails, and the
    exact flow's counterpart: the post of that task for that round is taken, and the node goes down before
    running it (RUN)."""
    driven = InProcessEngine(spec(options, **kw), faults=FaultPlan(dead) if dead else None).run()
    ran = FaultPlan((lambda n, task, r: task.startswith(RUN) and dead(n, task[len(RUN):], r)) if dead else None)
    exact = InProcessEngine(spec({**options, "flow": "exact"}, **kw), faults=ran).run()
    return driven, exact


def same_model(a, b) -> bool:  # noqa: ANN001
    return list(a.final) == list(b.final) and all(torch.equal(a.final[k], b.final[k]) for k in a.final)


def test_the_exact_flow_walks_and_trains_as_the_driven_one() -> None:
    driven, exact = both({"K": 4}, clients=6, edges=4, graph="ring", rounds=5)
    assert same_model(driven, exact)
    assert edge_sequence(exact) == edge_sequence(driven)
    # the same records, but for the message bytes (a post's frames are not the PS's calls) and the timings
    skip = ("elapsed_s", "round_s", "cum_message_bytes")
    untimed = [{k: v for k, v in r.items() if k not in skip} for r in exact.rounds]
    assert untimed == [{k: v for k, v in r.items() if k not in skip} for r in driven.rounds]
    assert exact.missing == []


def test_no_ps_message_during_training_and_the_payload_formula() -> None:
    """The PS starts m(0) (round 1) and collects w^T (after the last round); every other message to or from it is
    an edge's report (control). Per round t: K interactions with each client of m(t), d down and d up, then w^{t+1}
    posted to m(t+1) (d): 2 K |N_m(t)| d + d."""
    s = spec({"K": 3, "flow": "exact"}, clients=7, edges=3, graph="complete", rounds=4)
    res = InProcessEngine(s).run()
    topo = build_topology(s.topology, s.seed)
    d = payload_bytes(res.final)
    first = f"edge-{edge_sequence(res)[0]}"
    holder = next(r["dst"] for r in res.links if r["kind"] == "fedchs.collect" and r["phase"] == "request")
    ps = {(r["src"], r["dst"], r["kind"], r["round"], r["payload_bytes"]) for r in res.links
          if "ps" in (r["src"], r["dst"]) and r["kind"] != "fedchs.report"}
    assert ps == {("ps", first, "fedchs.go", 0, 0), (first, "ps", "fedchs.go", 0, 0),
                  ("ps", holder, "fedchs.collect", 3, 0), (holder, "ps", "fedchs.collect", 3, d)}
    reports = [r for r in res.links if r["kind"] == "fedchs.report"]
    assert sorted((r["round"], r["src"], r["dst"], r["messages"], r["payload_bytes"]) for r in reports) == [
        (t, f"edge-{m}", "ps", 1, 0) for t, m in enumerate(edge_sequence(res))]
    for t, rec in enumerate(res.rounds):
        n_m = len(topo.children(rec["edge"]))
        work = [r for r in res.links if r["round"] == t and r["kind"] in ("fedchs.grad", "fedchs.round")]
        assert sum(r["payload_bytes"] for r in work) == 2 * 3 * n_m * d + d, t
        walk = [(r["src"], r["payload_bytes"]) for r in work if r["kind"] == "fedchs.round" and r["phase"] == "request"]
        assert walk == [(rec["edge"], d)]


def test_an_active_edge_that_fails_its_round_is_redone_as_in_the_driven_flow() -> None:
    """The edge that received round 3's model goes down before running it: its report never comes, the PS asks
    the previous holder to post its copy again (to another neighbour), and the run goes on exactly as the driven
    flow does when the same edge fails the same round."""
    clean = edge_sequence(InProcessEngine(spec({"K": 4}, clients=6, edges=3, graph="complete", rounds=5)).run())
    victim = f"edge-{clean[2]}"
    dead = lambda node, task, rnd: node == victim and task == "fedchs.round" and rnd == 2  # noqa: E731
    driven, exact = both({"K": 4}, dead, clients=6, edges=3, graph="complete", rounds=5)
    assert exact.rounds[2]["redo"] == f"{victim} failed" == driven.rounds[2]["redo"]
    assert edge_sequence(exact) == edge_sequence(driven) and edge_sequence(exact)[2] != clean[2]
    assert same_model(driven, exact)
    assert [(m["round"], m["by"], m["node"], m["task"]) for m in exact.missing] == [
        (3, "ps", victim, "fedchs.report")]


def test_a_failed_first_round_starts_again_at_the_next_edge() -> None:
    first = edge_sequence(InProcessEngine(spec({"K": 2}, clients=6, edges=3, graph="ring", rounds=3)).run())[0]
    victim = f"edge-{first}"
    kw = dict(clients=6, edges=3, graph="ring", rounds=3)
    # the driven flow's m(0) fails its fedchs.round call; the exact flow's, its start (fedchs.go)
    driven = InProcessEngine(spec({"K": 2}, **kw), faults=FaultPlan(
        lambda node, task, rnd: node == victim and task == "fedchs.round" and rnd == 0)).run()
    exact = InProcessEngine(spec({"K": 2, "flow": "exact"}, **kw), faults=FaultPlan(
        lambda node, task, rnd: node == victim and task == "fedchs.go" and rnd == 0)).run()
    assert edge_sequence(exact)[0] == (first + 1) % 3 and exact.rounds[0]["redo"] == f"{victim} failed"
    assert same_model(driven, exact)


def test_a_walk_that_stays_is_told_to_go_on() -> None:
    """One cluster: no neighbour takes the model, it stays at edge-0, which the PS tells to run each round (an
    edge does not post to itself); equal to the driven flow."""
    driven, exact = both({"K": 2}, clients=3, edges=1, graph="complete", rounds=3)
    assert same_model(driven, exact)
    gos = [(r["src"], r["round"]) for r in exact.links if r["kind"] == "fedchs.go" and r["phase"] == "request"]
    assert gos == [("ps", 0), ("ps", 1), ("ps", 2)]


def test_a_next_edge_that_cannot_take_the_model_is_ruled_out_as_in_the_driven_flow() -> None:
    """The post of round 2's model to m(1) fails (its receiver is down): PostError, and the two-step rule is
    applied again without it, as the driven flow does with a failed hand-off."""
    kw = dict(clients=6, edges=3, graph="complete", rounds=4)
    clean = edge_sequence(InProcessEngine(spec({"K": 4}, **kw)).run())
    victim = f"edge-{clean[1]}"
    driven = InProcessEngine(spec({"K": 4}, **kw), faults=FaultPlan(
        lambda node, task, rnd: node == victim and task == "handoff" and rnd == 0)).run()
    exact = InProcessEngine(spec({"K": 4, "flow": "exact"}, **kw), faults=FaultPlan(
        lambda node, task, rnd: node == victim and task == "fedchs.round" and rnd == 1)).run()
    assert edge_sequence(exact) == edge_sequence(driven) and edge_sequence(exact)[1] != clean[1]
    assert same_model(driven, exact)
    assert [(m["node"], m["task"]) for m in exact.missing] == [(victim, "fedchs.round")]
