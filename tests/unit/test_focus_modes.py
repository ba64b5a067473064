"""FOCUS on the wire (issue 8): pull and push as distinct message kinds, client-decided participation, and the
edge tier, over the in-process engine (the networked side: tests/integration/test_focus_modes.py).

Expected values are computed here independently: byte counts from the model's size (a float64 linear model
with D weights: 8 D bytes per vector), availability from each client's documented stream, trajectories from the
numpy Algorithm 1 of test_focus.py.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from fedhop.common.algorithms.participation import ClientAvailability, MarkovParticipation
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.spec import RunSpec, SpecError
from fedhop.common.wire.bundle import flat
from tests.specs import LINEAR_F64, focus_lsq, run_spec
from tests.unit.test_focus import focus_alg1, problem, rel, trace

N, D, ROWS, SEED = 6, 5, 20, 3
VEC = 8 * D  # one model-sized vector: D float64 weights (linear model, no bias)


def make_spec(opts: dict, *, edges: int = 0, clients: int = N, rounds: int = 10, seed: int = SEED,
              alg: str = "focus", transport: dict | None = None) -> RunSpec:
    return run_spec(alg, {"lr": 0.05, "local_steps": 3, **opts}, clients=clients, edges=edges,
                    data=focus_lsq(D, ROWS), model=LINEAR_F64, rounds=rounds, seed=seed, transport=transport or {})


def engine(opts: dict, **kw) -> InProcessEngine:
    return InProcessEngine(make_spec(opts, **kw))


def clients_with(links: list[dict], kind: str, phase: str, rounds: int) -> list[list[str]]:
    """Per round, the clients on the client end of a ``kind``/``phase`` message (sorted by ordinal)."""
    out: list[set[str]] = [set() for _ in range(rounds)]
    for r in links:
        if r["kind"] == kind and r["phase"] == phase and r["round"] >= 0:
            node = r["dst"] if phase == "request" else r["src"]
            if node.startswith("client-"):
                out[r["round"]].add(node)
    return [sorted(s, key=lambda c: int(c.split("-")[1])) for s in out]


def ordinals(sets: list[list[str]]) -> list[list[int]]:
    return [[int(c.split("-")[1]) for c in s] for s in sets]


def stream_uniform(seed: int, node: str, r: int) -> float:
    """The first U(0,1) of client ``node``'s availability stream for round r (the documented derivation:
    blake2b over (seed, node, "availability", r), numpy's default generator)."""
    parts = "\x1f".join(map(str, (seed, node, "availability", r))).encode()
    s = int.from_bytes(hashlib.blake2b(parts, digest_size=8).digest(), "little") >> 1
    return float(np.random.default_rng(s).random())


def invariant_errors(eng: InProcessEngine) -> list[float]:
    """Run; after every round rel. error of y_server against sum_i g_i (spec 3.4.1)."""
    errs: list[float] = []

    def check(t: int) -> None:
        if t < 0:  # the set-up step
            return
        y = flat(eng.nodes["ps"].state.y).numpy()
        g = sum((flat(eng.nodes[c].state.g).numpy() for c in eng.ws.topology.clients
                 if eng.nodes[c].state.g is not None), np.zeros_like(y))
        errs.append(float(np.linalg.norm(y - g) / max(np.linalg.norm(g), 1e-300)))

    eng.run(after_commit=check)
    return errs


# -- pull and push: distinct kinds, the paper's bytes ---------------------------------------------------------

@pytest.mark.parametrize("edges", [0, 2])
def test_pull_and_push_are_distinct_kinds_with_one_vector_each(edges):
    """A pull carries x down (8 D bytes), a push carries y_tau (or an edge's sum) up; no other payload."""
    rounds = 12
    eng = engine({"participation": {"kind": "bernoulli", "p": 0.25}}, edges=edges, rounds=rounds)
    res = eng.run()
    assert {r["kind"] for r in res.links} == {"pull", "push"}
    for r in res.links:
        assert (r["kind"], r["phase"]) in {("pull", "request"), ("push", "reply")}, r
        assert r["payload_bytes"] == VEC * r["messages"], r
    pulls = clients_with(res.links, "pull", "request", rounds)
    assert pulls == clients_with(res.links, "push", "reply", rounds)
    assert [len(s) for s in pulls] == [rec["participants"] for rec in res.rounds]
    assert any(not s for s in pulls) and any(len(s) > 1 for s in pulls)
    for t, s in enumerate(pulls):  # per round: one pull per participant on its own link (and per edge above it)
        down = sum(r["payload_bytes"] for r in res.links if r["round"] == t and r["kind"] == "pull")
        hops = len(s) + len({eng.ws.topology.parent[c] for c in s}) if edges else len(s)
        assert down == VEC * hops


# -- client-decided participation -------------------------------------------------------------------------------

def test_client_decided_bernoulli_follows_each_clients_own_stream():
    p = [0.9, 0.6, 0.5, 0.4, 0.3, 0.2]
    rounds = 14
    eng = engine({"participation": {"kind": "bernoulli", "p": p}, "decided_by": "client"}, rounds=rounds)
    got = trace(eng)
    links = eng.meter.rows()
    want = [[i for i in range(N) if stream_uniform(SEED, f"client-{i}", r) < p[i]] for r in range(rounds)]
    assert ordinals(clients_with(links, "focus.open", "request", rounds)) == [list(range(N))] * rounds
    assert ordinals(clients_with(links, "focus.open", "reply", rounds)) == want  # silence = not available
    assert ordinals(clients_with(links, "pull", "request", rounds)) == want
    assert any(len(s) < N for s in want) and any(s for s in want)
    assert eng.missing.entries == []  # not being available is not a fault
    assert {(r["kind"], r["payload_bytes"]) for r in links if r["kind"] == "focus.open"} == {("focus.open", 0)}
    grads, _ = problem(eng)  # = Algorithm 1 with S_r = the clients that answered
    ref = focus_alg1(grads, np.zeros(D), 0.05, 3, want)
    assert max(rel(g, w) for g, w in zip(got, ref, strict=True)) < 1e-12


def test_client_decided_trace_with_an_empty_round(tmp_path):
    """Column i of the table is client i's availability; a round nobody answers is skipped (no retry, no
    failure: nobody was asked to train)."""
    table = [[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1], [1, 1, 0, 0]]
    np.save(tmp_path / "t.npy", np.array(table, dtype=np.int8))
    part = {"kind": "trace", "path": str(tmp_path / "t.npy")}
    eng = engine({"participation": part, "decided_by": "client"}, clients=4, rounds=4)
    got = trace(eng)
    links = eng.meter.rows()
    want = [[i for i, v in enumerate(row) if v] for row in table]
    assert ordinals(clients_with(links, "pull", "request", 4)) == want
    assert got[1].tolist() == got[0].tolist()  # the empty round left the model as it was
    assert eng.missing.entries == []


def test_client_decided_runs_are_reproducible_and_depend_on_the_seed():
    opts = {"participation": {"kind": "markov", "p_stay": 0.5}, "decided_by": "client"}
    a, b = engine(opts, rounds=12).run(), engine(opts, rounds=12).run()
    assert all(torch.equal(a.final[k], b.final[k]) for k in a.final)
    assert a.links == b.links
    c = engine(opts, rounds=12, seed=SEED + 1).run()
    assert clients_with(c.links, "pull", "request", 12) != clients_with(a.links, "pull", "request", 12)


def test_markov_availability_is_a_pure_function_of_seed_client_and_round():
    """Rounds a client never heard of are drawn when it next hears; a round asked again (a retry, a resumed
    run) is answered the same."""
    model = MarkovParticipation(p_stay=0.6)
    def stream(r):
        return np.random.default_rng([11, r])

    def fresh():
        return ClientAvailability.build(model, 2, 5, np.random.default_rng(5))

    every = fresh()
    seq = [every.available(r, stream) for r in range(20)]
    assert 0 < sum(seq) < 20
    sparse = fresh()
    assert [sparse.available(r, stream) for r in (4, 11, 19)] == [seq[4], seq[11], seq[19]]
    assert sparse.available(19, stream) == seq[19] and sparse.available(7, stream) == seq[7]


def test_quorum_closes_the_call_with_the_first_answers_in_client_order():
    rounds = 3
    eng = engine({"participation": {"kind": "full"}, "decided_by": "client", "round_close": {"quorum": 2}},
                 clients=4, rounds=rounds)
    res = eng.run()
    assert ordinals(clients_with(res.links, "pull", "request", rounds)) == [[0, 1]] * rounds
    # every client answered the call (counted), the two after the quorum too late to be pulled
    assert ordinals(clients_with(res.links, "focus.open", "reply", rounds)) == [[0, 1, 2, 3]] * rounds
    assert res.missing == []


def test_quorum_scatter_records_the_replies_it_used_and_a_replay_uses_those():
    """The quorum's choice is recorded per round (``arrivals``); a replay with a recorded choice given by hand
    (clients 2 and 3 first in round 2, as a networked run may see them arrive) pulls exactly those, and the
    model follows (it differs from the canonical run's)."""
    from fedhop.common.engine.inprocess import ReplayError

    rounds = 3
    opts = {"participation": {"kind": "full"}, "decided_by": "client", "round_close": {"quorum": 2}}
    first = engine(opts, clients=4, rounds=rounds).run()
    assert [r["arrivals"] for r in first.rounds] == [f"client-0:{t} client-1:{t}" for t in (1, 2, 3)]
    again = InProcessEngine(make_spec(opts, clients=4, rounds=rounds), replay=first.rounds).run()
    assert all(torch.equal(again.final[k], first.final[k]) for k in first.final)
    by_hand = [{**r, "arrivals": "client-2:2 client-3:2"} if r["round"] == 2 else r for r in first.rounds]
    other = InProcessEngine(make_spec(opts, clients=4, rounds=rounds), replay=by_hand).run()
    assert ordinals(clients_with(other.links, "pull", "request", rounds)) == [[0, 1], [2, 3], [0, 1]]
    assert [r["arrivals"] for r in other.rounds] == [r["arrivals"] for r in by_hand]
    assert not all(torch.equal(other.final[k], first.final[k]) for k in first.final)
    # a recorded failure is a failure (logged missing); a recorded reply this run does not call is refused
    failed = [{**r, "arrivals": "client-1:1:failed client-3:1"} if r["round"] == 1 else r for r in first.rounds]
    res = InProcessEngine(make_spec(opts, clients=4, rounds=rounds), replay=failed).run()
    assert ordinals(clients_with(res.links, "pull", "request", rounds)) == [[3], [0, 1], [0, 1]]
    assert [(m["round"], m["node"], m["reason"]) for m in res.missing] == [(1, "client-1",
                                                                             "failed in the recorded run")]
    stray = [{**r, "arrivals": "client-9:1"} if r["round"] == 1 else r for r in first.rounds]
    with pytest.raises(ReplayError, match="client-9"):
        InProcessEngine(make_spec(opts, clients=4, rounds=rounds), replay=stray).run()
    with pytest.raises(ReplayError, match="round 2 has no record"):  # e.g. a round that was not reported
        InProcessEngine(make_spec(opts, clients=4, rounds=rounds), replay=first.rounds[:1]).run()


@pytest.mark.parametrize("alg", ["focus", "sg-focus"])
def test_client_decided_keeps_the_tracking_invariant(alg):
    opts = {"participation": {"kind": "markov"}, "decided_by": "client", "batch_size": 4 if alg == "sg-focus" else 0}
    errs = invariant_errors(engine(opts, alg=alg, edges=2, rounds=15))
    assert len(errs) == 15 and max(errs) < 1e-12


# -- the edge tier ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("opts", [
    {"participation": {"kind": "bernoulli", "p": [0.9, 0.2, 0.5, 0.5, 0.1, 0.7]}},
    {"participation": {"kind": "markov"}, "decided_by": "client"},
    {"participation": {"kind": "uniform", "m": 2}, "init": "matched"},
])
def test_edge_tier_equals_the_flat_run_and_saves_ps_ingress(opts):
    rounds = 25
    flat_eng, edge_eng = engine(opts, rounds=rounds), engine(opts, edges=3, rounds=rounds)
    f, e = trace(flat_eng), trace(edge_eng)
    assert max(rel(a, b) for a, b in zip(e, f, strict=True)) < 1e-12
    assert rel(f[-1], f[0]) > 1e-2  # the model moved: the comparison is not vacuous
    sets = clients_with(flat_eng.meter.rows(), "pull", "request", rounds)
    assert clients_with(edge_eng.meter.rows(), "pull", "request", rounds) == sets

    def ingress(eng: InProcessEngine) -> int:
        return sum(r["payload_bytes"] for r in eng.meter.rows() if r["dst"] == "ps" and r["round"] >= 0)

    parent = edge_eng.ws.topology.parent
    assert ingress(flat_eng) == VEC * sum(len(s) for s in sets)
    assert ingress(edge_eng) == VEC * sum(len({parent[c] for c in s}) for s in sets)
    assert ingress(edge_eng) < ingress(flat_eng)


def test_edge_tier_lost_push_is_rolled_back():
    eng = engine({}, edges=2, rounds=8)
    eng.faults = FaultPlan(lambda node, task, rnd: node == "client-1" and rnd in (2, 3))
    errs = invariant_errors(eng)
    assert max(errs) < 1e-12
    assert {m["node"] for m in eng.missing.entries} == {"client-1"}


# -- options, validated before anything starts --------------------------------------------------------------------

@pytest.mark.parametrize("opts,edges,transport,needle", [
    ({"participation": {"kind": "uniform", "m": 2}, "decided_by": "client"}, 0, None, "kind 'uniform'"),
    ({"participation": 0.5, "decided_by": "client"}, 0, None, "a fraction"),
    ({"round_close": {"deadline_s": 3}}, 0, None, "round_close applies only with decided_by = 'client'"),
    ({"decided_by": "client", "round_close": {"quorum": 7}}, 0, None, "quorum (7) exceeds topology.clients (6)"),
    ({"decided_by": "client", "round_close": {"quorum": 2}}, 2, None, "flat FOCUS only"),
    ({"decided_by": "client", "round_close": {"deadline_s": 30}}, 2, {"round_deadline_s": 20},
     "round_close.deadline_s (30s) must be shorter"),
    ({"decided_by": "client", "round_close": {"deadline_s": 0}}, 0, None, "deadline_s"),
    ({"decided_by": "everyone"}, 0, None, "decided_by"),
    ({"participation": {"kind": "bernoulli", "p": [0.5, 0.5]}}, 0, None, "participation.p has 2 entries"),
])
def test_bad_options_are_named(opts, edges, transport, needle):
    with pytest.raises(SpecError, match=None) as e:
        make_spec(opts, edges=edges, transport=transport)
    assert needle in str(e.value), str(e.value)


# -- the networked engine's quorum wait (transport/netcomm.py) -----------------------------------------------------

def test_network_quorum_wait_counts_replies_not_failures():
    import time

    from fedhop.common.engine.api import Reply
    from fedhop.common.engine.base import Failure
    from fedhop.transport.netcomm import _wait_quorum
    from fedhop.transport.session import Call

    calls = [Call(i, f"client-{i}", "focus.open", 0) for i in range(3)]
    calls[0].finish(Reply())
    calls[1].finish(Failure("connection lost"))
    assert _wait_quorum(calls, 1, time.monotonic() + 60)  # already there: returns at once
    assert not _wait_quorum(calls, 2, time.monotonic())  # a failure is no answer; the deadline has passed
    calls[2].finish(Reply())
    assert _wait_quorum(calls, 2, time.monotonic() + 60)
