"""Fed-CHS when a hand-off target is unreachable: the model is rerouted by the same two-step rule among the
remaining neighbours, or kept, never lost (docs/design.md section 7)."""

import torch

from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from tests.unit.test_fedchs import edge_sequence, spec


def test_unreachable_next_edge_is_ruled_out_and_the_rule_reapplied():
    s = spec({"K": 4}, clients=6, edges=3, graph="complete", rounds=4)
    clean = edge_sequence(InProcessEngine(s).run())
    victim = f"edge-{clean[1]}"  # where round 1's model would have gone
    faults = FaultPlan(lambda node, task, rnd: node == victim and task == "handoff" and rnd == 0)
    res = InProcessEngine(s, faults=faults).run()
    seq = edge_sequence(res)
    # on a complete graph of 3 the only other neighbour of the round-0 edge takes the model
    expected_second = ({0, 1, 2} - {clean[0], clean[1]}).pop()
    assert seq[0] == clean[0] and seq[1] == expected_second
    assert [(m["node"], m["task"], m["round"]) for m in res.missing] == [(victim, "handoff", 1)]
    assert len(res.rounds) == 4 and all(torch.isfinite(v).all() for v in res.final.values())


def test_no_reachable_neighbour_keeps_the_model_here():
    s = spec({"K": 4}, clients=6, edges=3, graph="complete", rounds=3)
    first = edge_sequence(InProcessEngine(s).run())[0]
    others = {f"edge-{m}" for m in range(3)} - {f"edge-{first}"}
    faults = FaultPlan(lambda node, task, rnd: node in others and task == "describe" and rnd == 0)
    res = InProcessEngine(s, faults=faults).run()
    seq = edge_sequence(res)
    assert seq[:2] == [first, first]  # nobody answered describe: the model stayed and trained here again
    assert {m["node"] for m in res.missing} == others
    assert len(res.rounds) == 3
