"""Issue 20: what counts toward ``transport.min_participants``. An edge that replies with n = 0 (none of its
clients' replies was usable) trained no one (its clients are in the missing log): a round whose replies are all
such is redone and then ends the run, as a flat round with no usable reply does, instead of counting as trained
with the model frozen. A node left out
of the run (it came back without the state the run depends on) was not sent a task: it is named in the missing
log, but a round is not redone for it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fedhop.common.engine.api import Reply
from fedhop.common.engine.base import BaseComm, Failure, MissingLog
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.engine.loop import RoundFailed
from fedhop.common.topology import build_topology
from tests.specs import DIGITS, run_spec


def hier(rounds: int = 3):
    return run_spec("fedavg", {"local_steps": 2}, clients=4, edges=2, name="n0", rounds=rounds, seed=5, data=DIGITS,
                    model={"name": "mlp", "hidden": [8]})


def test_a_round_in_which_no_client_trained_under_edges_is_not_trained() -> None:
    s = hier(rounds=2)
    with pytest.raises(RoundFailed, match=r"round 2: 0 usable replies of 2 tasks"):
        InProcessEngine(s, faults=FaultPlan(lambda node, task, rnd: node.startswith("client") and rnd == 1)).run()


def test_a_focus_round_in_which_no_client_pushed_under_edges_is_not_trained() -> None:
    s = run_spec("focus", {}, clients=4, edges=2, name="n0-focus", rounds=2, seed=5, data=DIGITS,
                 model={"name": "mlp", "hidden": [8]})
    with pytest.raises(RoundFailed, match=r"round 2: 0 usable replies of 2 tasks"):
        InProcessEngine(s, faults=FaultPlan(lambda node, task, rnd: node.startswith("client") and rnd == 1)).run()


def test_an_edge_whose_clients_all_failed_leaves_the_round_to_the_others() -> None:
    s = hier(rounds=2)
    dead = set(InProcessEngine(s).ws.topology.cluster("edge-0"))
    res = InProcessEngine(s, faults=FaultPlan(lambda node, task, rnd: node in dead and rnd == 1)).run()
    assert len(res.rounds) == s.rounds
    assert {(m["round"], m["by"], m["node"]) for m in res.missing} == {(2, "edge-0", c) for c in dead}


class Scripted(BaseComm):
    """A Comm whose exchange answers what the test says."""

    def __init__(self, answers) -> None:
        super().__init__("ps", build_topology(hier().topology, 0), MissingLog())
        self.answers = answers
        self.bind(SimpleNamespace(sizes=None))  # type: ignore[arg-type]

    def current_round(self) -> int:
        return 0

    def _exchange(self, targets, task, bundle, args, deadline_s, quorum=None):
        return {t: self.answers[t] for t in targets}


def test_left_out_nodes_are_named_but_not_counted_as_sent() -> None:
    w = {"w": torch.ones(2)}
    comm = Scripted({"edge-0": Failure("edge-0 lost state", left_out=True), "edge-1": Reply(w, {"n": 0})})
    comm.begin_round(0)
    got = comm.scatter(["edge-0", "edge-1"], "t")
    assert list(got) == ["edge-1"]  # an n = 0 reply still goes to the algorithm (which may drop it)
    assert comm.round_counts() == (1, 0)  # the left-out node was not sent a task; the n = 0 reply trained no one
    assert [(m["node"], m["reason"]) for m in comm.missing.entries] == [("edge-0", "edge-0 lost state")]
