"""FOCUS client-initiated (issue 16, ``flow = "client"``), over the in-process engine: each client posts its own
``focus.pull`` for the rounds ahead (``away = 1`` when it says it is absent), the PS answers a pull with x and
the client posts ``focus.push`` when done (the networked side: tests/integration/test_network_equivalence.py,
case ``focus-client-flow``).

Expected values are computed independently: each client's availability from its documented stream
(test_focus_modes.stream_uniform), trajectories from the numpy Algorithm 1 of test_focus.py, bytes from the
model's size.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.spec import SpecError
from tests.unit.test_focus import focus_alg1, problem, rel, trace
from tests.unit.test_focus_modes import SEED, VEC, N, engine, invariant_errors, make_spec, ordinals, stream_uniform

P = [0.9, 0.6, 0.5, 0.4, 0.3, 0.2]
BERN = {"kind": "bernoulli", "p": P}
MARKOV = {"kind": "markov", "p_stay": 0.5}


def client_flow(participation: dict, absent: str = "silent", **extra) -> dict:
    return {"participation": participation, "decided_by": "client", "flow": "client",
            "round_close": {"absent": absent}, **extra}


def want_bernoulli(rounds: int) -> list[list[int]]:
    """S_r from each client's own stream: client i is available in round r iff u_r < p_i."""
    return [[i for i in range(N) if stream_uniform(SEED, f"client-{i}", r) < P[i]] for r in range(rounds)]


def rows(links: list[dict], kind: str, phase: str, *, up: bool) -> list[dict]:
    """The meter rows of ``kind``/``phase`` on the client -> PS direction (``up``) or PS -> client."""
    return [r for r in links if r["kind"] == kind and r["phase"] == phase and (r["dst"] == "ps") == up]


def per_round(rs: list[dict], end: str, rounds: int) -> list[list[int]]:
    """Per round, the ordinals of the clients at ``end`` ("src" or "dst") of ``rs``."""
    out: list[set[str]] = [set() for _ in range(rounds)]
    for r in rs:
        out[r["round"]].add(r[end])
    return ordinals([sorted(s, key=lambda c: int(c.split("-")[1])) for s in out])


def payload_per_link(links: list[dict]) -> Counter:
    """Payload bytes per (src, dst, kind) (the phase differs between flows: a push is a reply, or a post)."""
    out: Counter = Counter()
    for r in links:
        out[(r["src"], r["dst"], r["kind"])] += r["payload_bytes"]
    return +out


@pytest.mark.parametrize("participation", [BERN, MARKOV], ids=["bernoulli", "markov"])
@pytest.mark.parametrize("absent", ["silent", "say"])
def test_client_flow_is_bit_identical_to_the_called_flow(participation, absent):
    """Same draws, same S_r, same model, same payload per link and kind; only the control messages differ."""
    rounds = 10
    called = engine({**client_flow(participation, absent), "flow": "server"}, rounds=rounds).run()
    own = engine(client_flow(participation, absent), rounds=rounds).run()
    assert list(own.final) == list(called.final)
    assert all(torch.equal(own.final[k], called.final[k]) for k in called.final)
    assert [r["participants"] for r in own.rounds] == [r["participants"] for r in called.rounds]
    assert payload_per_link(own.links) == payload_per_link(called.links)
    assert not [r for r in own.links if r["kind"] == "focus.open"]  # nobody is called
    assert own.missing == [] and called.missing == []


@pytest.mark.parametrize("empty_round", ["skip", "step"])
def test_client_flow_with_an_empty_round_and_a_trace(empty_round, tmp_path):
    """Column i of the table is client i's availability; a round nobody pulls is skipped (or stepped) as in the
    called flow, bit for bit."""
    table = [[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1], [1, 1, 0, 0]]
    np.save(tmp_path / "t.npy", np.array(table, dtype=np.int8))
    opts = {**client_flow({"kind": "trace", "path": str(tmp_path / "t.npy")}, "say"), "empty_round": empty_round}
    own = engine(opts, clients=4, rounds=4).run()
    called = engine({**opts, "flow": "server"}, clients=4, rounds=4).run()
    assert all(torch.equal(own.final[k], called.final[k]) for k in called.final)
    down = rows(own.links, "pull", "request", up=False)
    assert [[int(r["dst"].split("-")[1]) for r in down if r["round"] == t] for t in range(4)] == \
        [[i for i, v in enumerate(row) if v] for row in table]
    assert [r["participants"] for r in own.rounds] == [sum(row) for row in table]


@pytest.mark.parametrize("alg, extra", [("focus", {"init": "matched"}), ("sg-focus", {})])
def test_client_flow_with_the_matched_init_and_sg_focus(alg, extra):
    """The set-up step of ``init = "matched"`` stays the PS's; SG-FOCUS's mini-batches are the client's own
    streams: both equal the called flow, bit for bit, and keep y = sum_i g_i."""
    opts = {**client_flow(MARKOV, "say"), **extra}
    own = engine(opts, rounds=6, alg=alg).run()
    called = engine({**opts, "flow": "server"}, rounds=6, alg=alg).run()
    assert all(torch.equal(own.final[k], called.final[k]) for k in called.final)
    assert max(invariant_errors(engine(opts, rounds=6, alg=alg))) < 1e-12


def test_client_flow_follows_each_clients_own_stream_and_algorithm_1():
    rounds = 12
    eng = engine(client_flow(BERN), rounds=rounds)
    got = trace(eng)
    want = want_bernoulli(rounds)
    assert any(len(s) < N for s in want) and any(s for s in want)
    links = eng.meter.rows()
    assert per_round(rows(links, "pull", "request", up=False), "dst", rounds) == want  # x answers the pulls
    grads, _ = problem(eng)
    ref = focus_alg1(grads, np.zeros(5), 0.05, 3, want)
    assert max(rel(g, w) for g, w in zip(got, ref, strict=True)) < 1e-12


@pytest.mark.parametrize("absent", ["silent", "say"])
def test_tracking_invariant_holds_after_every_round(absent):
    """y = sum_i g_i (spec 3.4.1), read from the PS's and the clients' exposed state after every round."""
    rounds = 10
    errs = invariant_errors(engine(client_flow(MARKOV, absent), rounds=rounds))
    assert len(errs) == rounds
    assert max(errs) < 1e-12, errs


@pytest.mark.parametrize("absent", ["silent", "say"])
def test_pull_is_control_x_down_and_the_push_up_are_payload(absent):
    """A client's pull (and its "away") is a control post (no payload); x goes down to each client that pulled
    (d values, kind ``pull``) and its push comes up as its own post (d values, kind ``push``); the kick is
    sent once, in round 0. A silent client says nothing for a round it is away; one that says so is heard."""
    rounds = 12
    res = engine(client_flow(BERN, absent), rounds=rounds).run()
    want = want_bernoulli(rounds)
    assert {r["kind"] for r in res.links} == {"focus.join", "pull", "push"}
    assert {r["round"] for r in res.links if r["kind"] == "focus.join"} == {0}
    assert all(r["payload_bytes"] == 0 for r in res.links if r["kind"] == "focus.join")

    intents = rows(res.links, "pull", "request", up=True)
    assert intents and all(r["payload_bytes"] == 0 for r in intents)  # the pull itself: control
    heard = per_round(intents, "src", rounds)
    assert heard == ([list(range(N))] * rounds if absent == "say" else want)

    down = rows(res.links, "pull", "request", up=False)
    up = rows(res.links, "push", "request", up=True)  # a post: the client's own message, not a reply
    assert not rows(res.links, "push", "reply", up=True)
    for r in down + up:
        assert r["payload_bytes"] == VEC * r["messages"] and r["messages"] == 1, r
    assert per_round(down, "dst", rounds) == per_round(up, "src", rounds) == want
    assert all(r["payload_bytes"] == 0 for r in rows(res.links, "pull", "reply", up=True))  # the acks
    assert [r["participants"] for r in res.rounds] == [len(s) for s in want]


@pytest.mark.parametrize("absent", ["silent", "say"])
def test_a_client_whose_push_is_lost_is_kicked_and_pulls_again(absent):
    """client-1 takes x in round 2 and goes down before pushing (and before posting its next intents): the
    ledger rolls its g back (y = sum g_i still holds), the PS kicks it in round 3, and it pulls again from
    then on; the run equals the called flow's with the same fault, bit for bit."""
    rounds = 6

    def lost(node: str, task: str, rnd: int) -> bool:
        return node == "client-1" and task in ("focus.train", "focus.local") and rnd == 2

    full = {"kind": "full"}
    own = engine(client_flow(full, absent), rounds=rounds)
    own.faults = FaultPlan(lost)
    errs = invariant_errors(own)
    assert max(errs) < 1e-12, errs
    pushed = per_round(rows(own.meter.rows(), "push", "request", up=True), "src", rounds)
    assert pushed == [list(range(N))] * 2 + [[i for i in range(N) if i != 1]] + [list(range(N))] * 3
    assert {r["round"] for r in own.meter.rows() if r["kind"] == "focus.join" and r["dst"] == "client-1"} == {0, 3}
    assert {m["node"] for m in own.missing.entries} == {"client-1"}
    called = engine({**client_flow(full, absent), "flow": "server"}, rounds=rounds)
    called.faults = FaultPlan(lost)
    want = called.run().final
    assert all(torch.equal(own.nodes["ps"].state.model[k], want[k]) for k in want)


def test_resumed_client_flow_is_bit_identical(tmp_path: Path):
    """A PS resumed from its checkpoint kicks every client again (the intents it held were lost with it): the
    model and every payload byte are the uninterrupted run's; only control messages are added (the kick and the
    intents posted again, no payload)."""
    spec = make_spec(client_flow(MARKOV, "say"), rounds=6)
    whole = InProcessEngine(spec).run()

    class Crash(Exception):
        pass

    def crash(t: int) -> None:
        if t == 2:
            raise Crash

    with pytest.raises(Crash):
        InProcessEngine(spec).run(checkpoints=tmp_path, after_commit=crash)
    resumed = InProcessEngine(spec).run(checkpoints=tmp_path, resume=True)
    assert all(torch.equal(resumed.final[k], v) for k, v in whole.final.items())
    assert payload_per_link(resumed.links) == payload_per_link(whole.links)
    key = ("src", "dst", "kind", "phase", "round")
    before = {tuple(r[k] for k in key): r for r in whole.links}
    after = {tuple(r[k] for k in key): r for r in resumed.links}
    added = [k for k in after if after[k] != before.get(k)]
    assert added and {(k[2], k[4]) for k in added} <= {("focus.join", 3), ("pull", 3), ("pull", 4), ("pull", 5)}
    assert all(after[k]["payload_bytes"] == before.get(k, {"payload_bytes": 0})["payload_bytes"] for k in added)
    assert set(before) <= set(after)
    assert resumed.missing == whole.missing


@pytest.mark.parametrize("opts, edges, needle", [
    ({"flow": "client", "participation": MARKOV}, 0, "flow = 'client' needs decided_by = 'client'"),
    ({**client_flow(MARKOV), "round_close": {"quorum": 2}}, 0, "a quorum (the first Q pulls to arrive)"),
    (client_flow(MARKOV), 2, "flow = 'client' applies to flat FOCUS only"),
])
def test_bad_client_flow_options_are_named(opts, edges, needle):
    with pytest.raises(SpecError) as e:
        make_spec(opts, edges=edges)
    assert needle in str(e.value), str(e.value)
