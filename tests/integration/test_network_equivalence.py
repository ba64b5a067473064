"""The central integration test (docs/design.md section 4): the same spec and seed through real processes over
gRPC and through the in-process engine give bit-identical final models and identical byte counts.

Every registered algorithm has a case, and so does every reading or option that changes the message flow
(FedAvg readings A and B, the participation models, Fed-CHS E > 1 with QSGD uploads, FedCluster's local
solvers and fixed order, the random edge graph). On the networked result of some cases the paper's payload
formula is asserted too (:data:`FORMULAS`), so each launch serves both checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fedhop.common.algorithms  # noqa: F401  (registers every algorithm)
from fedhop.common.engine.api import ALGORITHMS
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.common.wire.bundle import payload_bytes
from fedhop.common.wire.control import BYE, CONTROL_KINDS, HELLO, READY, REPORT, SESSION_KINDS, WELCOME
from fedhop.common.wire.meter import WIRE_KIND, WIRE_PHASE
from tests.integration.netutil import launch_here, load_result, node_log, rows_by_key, small_spec

BERN = {"kind": "bernoulli", "p": [0.9, 0.5, 0.2]}
MARKOV = {"kind": "markov", "p_stay": 0.5}
TRACE = "TRACE"  # replaced by a rounds x clients 0/1 table written into the test's folder

CASES: dict[str, dict[str, Any]] = {
    "fedavg-flat": dict(algorithm="fedavg", clients=3, edges=0),
    "fedavg-edges": dict(algorithm="fedavg", clients=4, edges=2),
    # each edge trains 2 of its 3 clients: it reports fewer samples than its subtree holds, and the PS's fold
    # of the edges' models rescales its sum at the end (fedavg.edge_mean), the same in both engines
    "fedavg-edges-sampled": dict(algorithm="fedavg", clients=6, edges=2, options={"participation": 0.5}),
    # Fed-CHS spec sec. 5: reading A (one local step, syncs_per_round averages a round), Markov participation
    "fedavg-reading-a-markov": dict(algorithm="fedavg", clients=3, edges=0, rounds=2, options={
        "local_steps": 1, "syncs_per_round": 2, "lr_schedule_K": 2, "participation": MARKOV}),
    # reading B (K local steps, one average a round), passive (weighted) participation
    "fedavg-reading-b-weighted": dict(algorithm="fedavg", clients=3, edges=0, rounds=2, options={
        "local_steps": 2, "lr_schedule_K": 2, "participation": {"kind": "weighted", "m": 2}}),
    "hierfavg": dict(algorithm="hierfavg", clients=4, edges=2, options={"edge_rounds": 2}),
    # the PS spills each round's starting model into a file mapping and drops its pages once the requests are
    # out (common/engine/spill.py; by default only from 64 MiB of state): the same bits as the in-process engine
    "fedavg-spill": dict(algorithm="fedavg", clients=3, edges=0, transport={"spill_model_bytes": 1}),
    # the same at the edges: each edge spills the model of each of its scatters (the PS's, then its own aggregate
    # for the second client round) and drops its pages once its requests are out (edge/comm.py)
    "hierfavg-spill": dict(algorithm="hierfavg", clients=4, edges=2, options={"edge_rounds": 2},
                           transport={"spill_model_bytes": 1}),
    # edge -> edge hand-offs and describes (Fed-CHS walks the model over a ring of edges)
    "fedchs-handoff": dict(algorithm="fedchs", clients=3, edges=3, edge_graph="ring", options={"K": 2}),
    # the paper's flow: no PS message during training; the model is posted edge -> edge (fedchs.round), which
    # makes the receiver run the next round, and each edge posts its round report to the PS (control)
    "fedchs-exact": dict(algorithm="fedchs", clients=3, edges=3, edge_graph="ring", options={"K": 2, "flow": "exact"}),
    # E > 1 (spec 3.6) with QSGD uploads (Fig. 2 "with compression") over the random edge graph
    "fedchs-e2-qsgd-random": dict(algorithm="fedchs", clients=4, edges=3, edge_graph="random", rounds=2,
                                  options={"K": 4, "E": 2, "upload_levels": 8}),
    "hier-local-qsgd": dict(algorithm="hier-local-qsgd", clients=4, edges=2, rounds=2,
                            options={"local_steps": 2, "edge_rounds": 2}),
    # the model walks client -> client over the peer graph (listening clients), d floats per move
    "wrwgd": dict(algorithm="wrwgd", clients=4, edges=0, rounds=4, options={"K": 3}),
    # asynchronous: replies taken in arrival order (recorded, and replayed by the oracle); stale updates buffered
    "fedbuff": dict(algorithm="fedbuff", clients=4, edges=0, rounds=3,
                    options={"concurrency": 3, "buffer": 2, "local_steps": 2}),
    "fedasync": dict(algorithm="fedasync", clients=3, edges=0, rounds=3,
                     options={"concurrency": 2, "local_steps": 2}),
    # gossip: every client hands its model to both ring neighbours every round (listening clients), the PS
    # sends control messages only and collects the clients' models once at the end
    "dpsgd": dict(algorithm="dpsgd", clients=4, edges=0, rounds=2, options={"local_steps": 2, "batch_size": 16}),
    # the model cycles edge -> edge inside every round, in a reshuffled order; the Adam local solver, half of
    # each cluster sampled per cycle
    "fedcluster-adam": dict(algorithm="fedcluster", clients=4, edges=2, edge_graph="complete",
                            options={"participation": 0.5, "local_steps": 2, "batch_size": 16, "solver": "adam"}),
    # Algorithm 1's fixed order with the SGDm solver and FedProx's proximal term
    "fedcluster-momentum-prox-fixed": dict(algorithm="fedcluster", clients=4, edges=2, edge_graph="complete",
                                           rounds=2, options={"participation": 1.0, "local_steps": 2,
                                                              "batch_size": 16, "solver": "momentum",
                                                              "momentum": 0.5, "prox_mu": 0.1, "order": "fixed"}),
    # clients keep state across rounds (their last gradient); Bernoulli participation drawn by the PS
    "focus-bernoulli": dict(algorithm="focus", clients=4, edges=0,
                            options={"participation": {"kind": "bernoulli", "p": [0.9, 0.5, 0.5, 0.2]}}),
    "focus-matched-markov": dict(algorithm="focus", clients=3, edges=0, rounds=2,
                                 options={"lr": 0.05, "init": "matched", "participation": MARKOV}),
    "sg-focus-trace": dict(algorithm="sg-focus", clients=3, edges=0, rounds=2,
                           options={"lr": 0.05, "participation": TRACE}),
    # client-decided participation closed at a first-2 quorum: which replies the PS uses depends on their arrival
    # (recorded, and replayed by the oracle)
    "focus-quorum": dict(algorithm="focus", clients=4, edges=0, rounds=2,
                         options={"participation": {"kind": "full"}, "decided_by": "client",
                                  "round_close": {"quorum": 2}}),
    # FOCUS client-initiated (issue 16): each client posts its own pull (or says it is away) for the rounds ahead,
    # the PS answers a pull with x, the client posts its push; the round closes once every client was heard from
    "focus-client-flow": dict(algorithm="focus", clients=3, edges=0, rounds=3,
                              options={"lr": 0.05, "participation": MARKOV, "decided_by": "client",
                                       "flow": "client", "round_close": {"absent": "say"}}),
    "fedau": dict(algorithm="fedau", clients=3, edges=0, rounds=2, options={"participation": BERN}),
    "scaffold-cyclic": dict(algorithm="scaffold", clients=3, edges=0, rounds=2,
                            options={"participation": {"kind": "cyclic", "m": 2}}),
    "mifa": dict(algorithm="mifa", clients=3, edges=0, rounds=2,
                 options={"participation": {"kind": "uniform", "m": 2}}),
    # scalars travel as 0-d tensors next to the model, momentum and second moment (3d + 1 values)
    "fgdro-kl-adam": dict(algorithm="fgdro-kl-adam", clients=3, edges=0, options={"local_steps": 3}),
    "fgdro-cvar": dict(algorithm="fgdro-cvar", clients=3, edges=0, rounds=2, options={"K": 2, "local_steps": 2}),
    "fgdro-kl": dict(algorithm="fgdro-kl", clients=3, edges=0, rounds=2, options={
        "local_steps": 2, "u_init": "first_batch", "v_init": "mean_exp_u"}),
    "local-adam": dict(algorithm="local-adam", clients=3, edges=0, rounds=2, options={"local_steps": 2}),
    "fedadam": dict(algorithm="fedadam", clients=3, edges=0, rounds=2,
                    options={"local_steps": 2, "participation": {"kind": "full"}}),
    "drfa": dict(algorithm="drfa", clients=3, edges=0, rounds=2, options={"local_steps": 2, "clients_per_round": 2}),
    "dr-dsgd": dict(algorithm="dr-dsgd", clients=3, edges=0, rounds=2, options={"local_steps": 2}),
    # baselines of the papers' headline claims
    "fedavg-qsgd-edges": dict(algorithm="fedavg", clients=4, edges=2, rounds=2,
                              options={"local_steps": 2, "upload_levels": 7}),
    "proxskip": dict(algorithm="proxskip", clients=3, edges=0, rounds=2,
                     options={"local_steps": 2, "participation": {"kind": "uniform", "m": 2}}),
    "centralized-sgd": dict(algorithm="centralized-sgd", clients=1, edges=0, rounds=2,
                            options={"iters_per_round": 3, "batch_size": 8}),
    "drfa-prox-snapshot-entropic": dict(algorithm="drfa-prox", clients=3, edges=0, rounds=2, options={
        "local_steps": 2, "clients_per_round": 2, "loss_at": "snapshot", "prox": "entropic"}),
}
TRACE_ROWS = [[1, 0, 1], [0, 1, 1]]


def spec_of(case: str, tmp: Path) -> RunSpec:
    kw = dict(CASES[case])
    opts = dict(kw.pop("options", {}))
    if opts.get("participation") == TRACE:
        table = tmp / "trace.npy"
        np.save(table, np.array(TRACE_ROWS, dtype=np.int8))
        opts["participation"] = {"kind": "trace", "path": str(table)}
    return small_spec(**kw, options=opts)


# -- the papers' payload formulas, asserted on the networked result ------------------------------------------
def _d(final: dict[str, torch.Tensor]) -> int:
    assert all(v.dtype == torch.float32 for v in final.values())
    return sum(v.numel() for v in final.values())


def _per_round(links: list[dict[str, Any]], kinds: set[str] | None = None) -> dict[int, int]:
    """Payload bytes per round of the task traffic (``kinds``: of those kinds only); the network-only kinds,
    which carry no payload (asserted in the test), are left out."""
    out: dict[int, int] = {}
    for r in links:
        if r["kind"] not in CONTROL_KINDS and (kinds is None or r["kind"] in kinds):
            out[r["round"]] = out.get(r["round"], 0) + r["payload_bytes"]
    return out


def _ps_moves_no_model(res: dict[str, Any], final: dict[str, torch.Tensor], collect: str,
                       first: str | None = None) -> None:
    """Fed-CHS / FedCluster: the PS is control plane only. No PS link carries payload, except the final model
    that the PS fetches once, after the last round, from the edge holding it (``collect``), and, for
    FedCluster, W_0 that the PS sends once to the first cluster of round 1 (task ``first``; Fed-CHS's edges
    build w_0 from the seed themselves)."""
    d = _d(final)
    ps_rows = [r for r in res["links"] if "ps" in (r["src"], r["dst"])]
    assert ps_rows, "the PS exchanged no messages at all"
    carrying = sorted((r for r in ps_rows if r["payload_bytes"]), key=lambda r: r["round"])
    last = res["rounds"][-1]["round"]  # the run's last round (an edge may send a control frame after it)
    expected = [(collect, "reply", "ps", last, 1, 4 * d)]
    if first is not None:
        expected.insert(0, (first, "request", "ps", 1, 1, 4 * d))
    got = [(r["kind"], r["phase"], r["dst"] if r["phase"] == "reply" else r["src"], r["round"], r["messages"],
            r["payload_bytes"]) for r in carrying]
    assert got == expected, carrying
    # the model itself went edge -> edge (hand-offs) and edge <-> client
    assert any(r["src"].startswith("edge-") and r["dst"].startswith("edge-") and r["payload_bytes"]
               for r in res["links"])


def _fedavg_flat(res: dict[str, Any], final: dict[str, torch.Tensor], spec: RunSpec) -> None:
    """FedAvg without edges: each participating client receives and returns the model, 2 * d * 4 bytes per
    round (float32), and nothing else carries payload."""
    d = _d(final)
    assert payload_bytes(final) == 4 * d
    assert _per_round(res["links"]) == {t: 2 * d * 4 * spec.topology.clients for t in range(1, spec.rounds + 1)}
    for r in (r for r in res["links"] if r["kind"] not in CONTROL_KINDS):  # the task traffic
        assert r["payload_bytes"] == d * 4 * r["messages"]
        assert {r["src"], r["dst"]} & {"ps"}
    cumulative = [r["cum_payload_bytes"] for r in res["rounds"]]
    assert cumulative == [2 * d * 4 * spec.topology.clients * (t + 1) for t in range(spec.rounds)]
    # the formula FedAvg declares for `fedhop check` (Algorithm.payload_per_round) is this one, link by link
    declared = ALGORITHMS["fedavg"].payload_per_round(spec, build_topology(spec.topology, spec.seed), 4 * d)
    assert declared == {k: 4 * d for c in build_topology(spec.topology, spec.seed).clients
                        for k in (("ps", c, "local.train"), (c, "ps", "local.train"))}


def _fedchs(res: dict[str, Any], final: dict[str, torch.Tensor], spec: RunSpec) -> None:
    """Fed-CHS sec. 7: per round t, K interactions with every client of the active cluster m(t), each a model
    down (d floats) and an upload up, then one hand-off of the model (d floats): 2 K |N_m(t)| d + d floats
    for E = 1. With E > 1 there are K / E interactions; with QSGD an upload is 1 byte per coordinate plus
    one float32 norm per tensor."""
    _ps_moves_no_model(res, final, "fedchs.collect")
    o, d = spec.algorithm.options, _d(final)
    topo = build_topology(spec.topology, spec.seed)
    interactions = o.get("K", 20) // o.get("E", 1)
    up = d + 4 * len(final) if o.get("upload_levels", 0) else 4 * d
    work = [r for r in res["links"] if r["kind"] not in CONTROL_KINDS and r["kind"] != "fedchs.collect"]
    per_round = _per_round(work)
    assert set(per_round) - {0} == set(range(1, spec.rounds + 1)) and per_round.get(0, 0) == 0
    for rec in res["rounds"]:
        t, n_m = rec["round"], len(topo.children(rec["edge"]))
        assert per_round[t] == interactions * n_m * (4 * d + up) + 4 * d, (t, rec["edge"])
    for r in work:
        if r["kind"] == "fedchs.grad":
            assert r["payload_bytes"] == r["messages"] * (4 * d if r["phase"] == "request" else up), r


def _fedcluster(res: dict[str, Any], final: dict[str, torch.Tensor], spec: RunSpec) -> None:
    _ps_moves_no_model(res, final, "fedcluster.collect")  # edge-0.. builds W_0 itself: no model from the PS


def _wrwgd(res: dict[str, Any], final: dict[str, torch.Tensor], spec: RunSpec) -> None:
    """WRWGD over real processes: d floats per move of the walk, on the client -> client link of the move,
    nothing when the walk stays; the PS sends and receives no model until it collects the final one."""
    d = _d(final)
    visited = [r["client"] for r in res["rounds"]]
    hops = {t + 1: (a, b) for t, (a, b) in enumerate(zip(visited, visited[1:], strict=False)) if a != b}
    assert hops, f"the walk never moved: {visited}"
    moved = {(r["round"], r["src"], r["dst"]): r["payload_bytes"] for r in res["links"] if r["kind"] == "handoff"
             and r["phase"] == "request"}
    assert {k: v for k, v in moved.items() if k[0] < spec.rounds} == {(t, a, b): 4 * d for t, (a, b) in hops.items()}
    ps = [r for r in res["links"] if "ps" in (r["src"], r["dst"]) and r["payload_bytes"]]
    assert [(r["kind"], r["phase"], r["payload_bytes"]) for r in ps] == [("wrwgd.collect", "reply", 4 * d)]


def _dpsgd(res: dict[str, Any], final: dict[str, torch.Tensor], spec: RunSpec) -> None:
    """D-PSGD over real processes: d floats per directed peer link per round (4 clients on a ring: 8 links),
    no payload on a PS link but each client's model collected once after the last round."""
    d = _d(final)
    topo = build_topology(spec.topology, spec.seed)
    links = {(i, j) for i in topo.clients for j in topo.neighbours[i]}
    assert len(links) == 2 * spec.topology.clients
    moved = {(r["round"], r["src"], r["dst"]): r["payload_bytes"] for r in res["links"] if r["kind"] == "handoff"
             and r["phase"] == "request"}
    assert moved == {(t, i, j): 4 * d for t in range(1, spec.rounds + 1) for i, j in links}
    assert all(r["messages"] == 1 for r in res["links"] if r["kind"] == "handoff" and r["phase"] == "request")
    ps = [r for r in res["links"] if "ps" in (r["src"], r["dst"]) and r["payload_bytes"]]
    assert sorted((r["src"], r["kind"], r["phase"], r["round"], r["payload_bytes"]) for r in ps) == \
        [(c, "dpsgd.collect", "reply", spec.rounds, 4 * d) for c in topo.clients]
    declared = ALGORITHMS["dpsgd"].payload_per_round(spec, topo, 4 * d)
    assert declared == {(i, j, "handoff"): 4 * d for i, j in links}


def _fgdro(extra: int, scalar: bool) -> Callable[[dict[str, Any], dict[str, torch.Tensor], RunSpec], None]:
    def check(res: dict[str, Any], final: dict[str, torch.Tensor], spec: RunSpec) -> None:
        """FGDRO sec. 6: each client receives and returns (1 + extra) d floats (+ 1 scalar) per round."""
        d = _d(final)
        size = 4 * ((1 + extra) * d + (1 if scalar else 0))
        rows = [r for r in res["links"] if r["kind"].endswith(".round")]
        assert {r["round"] for r in rows} == set(range(1, spec.rounds + 1))
        for r in rows:
            assert r["payload_bytes"] == size * r["messages"] and r["messages"] == 1, r
        assert _per_round(rows) == {t: 2 * size * spec.topology.clients for t in range(1, spec.rounds + 1)}
    return check


def _focus(res: dict[str, Any], final: dict[str, torch.Tensor], spec: RunSpec) -> None:
    """FOCUS: a participant pulls x (d floats down) and pushes its tracker y (d floats up); nothing else."""
    d = _d(final)
    rows = [r for r in res["links"] if r["kind"] not in CONTROL_KINDS]
    assert {r["kind"] for r in rows} == {"pull", "push"}
    for r in rows:
        assert r["payload_bytes"] == 4 * d * r["messages"], r
    for rec in res["rounds"]:
        t = rec["round"]
        pulls = sum(r["messages"] for r in rows if r["round"] == t and r["phase"] == "request")
        pushes = sum(r["messages"] for r in rows if r["round"] == t and r["phase"] == "reply")
        assert pulls == pushes == rec["participants"], t


def _focus_quorum(res: dict[str, Any], final: dict[str, torch.Tensor], spec: RunSpec) -> None:
    """FOCUS closed at a quorum of 2: every client is called each round, and the PS pulls (d floats down) exactly
    the clients whose answers its recorded ``arrivals`` name, which push (d floats up)."""
    d = _d(final)
    rows = [r for r in res["links"] if r["kind"] not in CONTROL_KINDS]
    assert {r["kind"] for r in rows} == {"focus.open", "pull", "push"}
    assert all(r["payload_bytes"] == 4 * d * r["messages"] for r in rows if r["kind"] != "focus.open")
    for rec in res["rounds"]:
        used = sorted(e.split(":")[0] for e in rec["arrivals"].split())
        assert len(used) >= 2 and rec["participants"] == len(used), rec
        pulled = sorted(r["dst"] for r in res["links"] if r["kind"] == "pull" and r["round"] == rec["round"])
        assert pulled == used, rec
        pushed = sorted(r["src"] for r in res["links"] if r["kind"] == "push" and r["round"] == rec["round"])
        assert pushed == used, rec


def _focus_client_flow(res: dict[str, Any], final: dict[str, torch.Tensor], spec: RunSpec) -> None:
    """FOCUS, client flow: the clients' pulls are control (no payload); x goes down to each client that pulled
    (d floats) and its push comes up as its own post (d floats); every client is heard from every round."""
    d = _d(final)
    rows = [r for r in res["links"] if r["kind"] not in CONTROL_KINDS]
    assert {r["kind"] for r in rows} <= {"focus.join", "pull", "push"}
    for r in rows:
        carries = (r["kind"], r["phase"], r["src"] == "ps") in {("pull", "request", True), ("push", "request", False)}
        assert r["payload_bytes"] == (4 * d * r["messages"] if carries else 0), r
    for rec in res["rounds"]:
        t = rec["round"]
        down = sorted(r["dst"] for r in rows if r["round"] == t and r["kind"] == "pull" and r["src"] == "ps"
                      and r["phase"] == "request")
        up = sorted(r["src"] for r in rows if r["round"] == t and r["kind"] == "push")
        heard = {r["src"] for r in rows if r["round"] == t and r["kind"] == "pull" and r["phase"] == "request"
                 and r["src"] != "ps"}
        assert down == up and len(down) == rec["participants"], rec
        assert heard == {f"client-{i}" for i in range(spec.topology.clients)}, rec


def _focus_trace(res: dict[str, Any], final: dict[str, torch.Tensor], spec: RunSpec) -> None:
    """The trace is replayed row by row: round r's participants are the clients marked 1 in row r."""
    _focus(res, final, spec)
    assert [rec["participants"] for rec in res["rounds"]] == [sum(row) for row in TRACE_ROWS]
    pulled = [{r["dst"] for r in res["links"] if r["round"] == t and r["phase"] == "request"
               and r["kind"] not in CONTROL_KINDS} for t in (1, 2)]
    assert pulled == [{f"client-{i}" for i, x in enumerate(row) if x} for row in TRACE_ROWS]


FORMULAS = {
    "wrwgd": _wrwgd,
    "dpsgd": _dpsgd,
    "fedavg-flat": _fedavg_flat,
    "fedchs-handoff": _fedchs,
    "fedchs-exact": _fedchs,
    "fedchs-e2-qsgd-random": _fedchs,
    "fedcluster-adam": _fedcluster,
    "fedcluster-momentum-prox-fixed": _fedcluster,
    "focus-bernoulli": _focus,
    "focus-matched-markov": _focus,
    "focus-quorum": _focus_quorum,
    "focus-client-flow": _focus_client_flow,
    "sg-focus-trace": _focus_trace,
    "fgdro-cvar": _fgdro(0, True),
    "fgdro-kl": _fgdro(1, True),
    "fgdro-kl-adam": _fgdro(2, True),
    "local-adam": _fgdro(2, False),
}


# equal by replay (fedhop simulate --replay), not by themselves: algorithms, and cases with a first-k quorum
ORDER_DEPENDENT = {"fedasync", "fedbuff", "focus-quorum"}


def test_every_algorithm_has_a_networked_case() -> None:
    assert {c["algorithm"] for c in CASES.values()} == set(ALGORITHMS)


def _rows_differ(net: dict[tuple, dict], ora: dict[tuple, dict], work: list[dict], out: Path) -> str:
    """What to read when the networked run's byte rows are not the oracle's: the keys on one side only, the
    network's rows of the same (src, dst, kind) under any phase or round, and the logs of the nodes involved."""
    lines = [f"only over the network: {sorted(set(net) - set(ora))}",
             f"only in process: {sorted(set(ora) - set(net))}"]
    for k in sorted(set(net) ^ set(ora)):
        same = [(r["phase"], r["round"], r["messages"]) for r in work if (r["src"], r["dst"], r["kind"]) == k[:3]]
        lines.append(f"{k}: network rows of {k[:3]} (phase, round, messages): {same}")
        for node in sorted({k[0], k[1]}):
            try:
                tail = "\n".join(node_log(out, node).splitlines()[-30:])
            except AssertionError as e:
                tail = str(e)
            lines.append(f"--- {node}'s log (last 30 lines)\n{tail}")
    return "\n".join(lines)


@pytest.mark.parametrize("case", list(CASES))
def test_network_matches_inprocess(case: str, tmp_path: Path) -> None:
    spec = spec_of(case, tmp_path)
    out = launch_here(spec, tmp_path)
    res, final = load_result(out)
    # an asynchronous protocol takes replies in arrival order: its oracle replays the order the network recorded
    replay = res["rounds"] if ORDER_DEPENDENT & {spec.algorithm.name, case} else None
    oracle = InProcessEngine(spec, device="cpu", replay=replay).run()

    assert res["engine"] == "network"
    assert res["missing"] == []
    assert list(final) == list(oracle.final)
    for k, v in oracle.final.items():
        assert torch.equal(final[k], v), f"{case}: tensor {k} differs between engines"
    # (the run folder numbers rounds from 1, set-up 0; the in-memory meter rows from 0, set-up -1)
    # identical per-link tables: same keys (src, dst, kind, phase, round), same payload and message bytes.
    # Reports (byte-meter rows sent up after each task), the session's control frames and the wire level (the
    # kernel's TCP counters) exist only over the network: their own kinds, no payload.
    network_only = [r for r in res["links"] if r["kind"] in CONTROL_KINDS]
    assert all(r["payload_bytes"] == 0 for r in network_only)
    wire = [r for r in network_only if r["kind"] == WIRE_KIND]
    assert all(r["phase"] == WIRE_PHASE and r["messages"] == 0 == r["message_bytes"] for r in wire)
    assert all(r["phase"] == "request" for r in network_only if r["kind"] != WIRE_KIND)
    session = {r["kind"] for r in network_only if r["kind"] in SESSION_KINDS.values()}
    assert {HELLO, WELCOME, READY, BYE} <= session
    control = [r for r in network_only if r["kind"] == REPORT]
    work = [r for r in res["links"] if r["kind"] not in CONTROL_KINDS]
    net_rows = {(r["src"], r["dst"], r["kind"], r["phase"], r["round"]): r for r in work}
    ora_rows = {(r["src"], r["dst"], r["kind"], r["phase"], r["round"] + 1): r for r in oracle.links}
    assert set(net_rows) == set(ora_rows), _rows_differ(net_rows, ora_rows, work, out)
    assert rows_by_key(work, "payload_bytes") == rows_by_key(oracle.links, "payload_bytes")
    for k, r in ora_rows.items():
        assert net_rows[k]["messages"] == r["messages"], k
        assert net_rows[k]["payload_bytes"] == r["payload_bytes"], k
        assert net_rows[k]["message_bytes"] == r["message_bytes"], k
    assert [r.get("accuracy") for r in res["rounds"]] == [r.get("accuracy") for r in oracle.rounds]
    # how the model moves edge -> edge: hand-offs, or (Fed-CHS's exact flow) posts that make the receiver act
    walk = "fedchs.round" if spec.algorithm.options.get("flow") == "exact" else "handoff"
    if case.startswith(("fedchs", "fedcluster")):
        assert walk in {r["kind"] for r in work}
        assert all(r["src"].startswith("edge-") and r["dst"].startswith("edge-") for r in work if r["kind"] == walk)
    if case.startswith("fedchs"):
        assert {walk, "describe"} <= {r["kind"] for r in work}
    if CASES[case].get("edges"):  # edges report the links they counted (their clients') to the PS as they go
        edges = {f"edge-{m}" for m in range(CASES[case]["edges"])}
        assert control and {r["src"] for r in control} <= edges and {r["dst"] for r in control} == {"ps"}
    elif spec.topology.peer_graph not in (None, "none"):  # peer clients count their hand-offs and report them
        assert control and {r["dst"] for r in control} == {"ps"}
        assert {r["src"] for r in control} <= {f"client-{i}" for i in range(spec.topology.clients)}
        assert "handoff" in {r["kind"] for r in work}  # client -> client, never through the PS
        assert all(r["src"].startswith("client-") and r["dst"].startswith("client-")
                   for r in work if r["kind"] == "handoff")
    else:  # clients have no meter of their own: nothing to report
        assert control == []
    if case in FORMULAS:
        FORMULAS[case](res, final, spec)
