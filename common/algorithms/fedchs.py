"""Fed-CHS (Yan, Zuo, Fan, Hu, Shen, Zhao, Luo: "Sequential Federated Learning in Hierarchical Architecture
on Non-IID Datasets", Algorithm 1; docs/specs/fedchs.md sections 2-3).

One cluster is active per round t. Inside the active cluster m(t) the edge server (ES) and all its clients
run K interactions (Eq. 5): the ES sends w_k^t to every client, each client uploads ONE mini-batch
gradient, and the ES steps

    w_{k+1}^t = w_k^t - eta_k * sum_{n in N_m(t)} gamma_n^m(t) grad f(w_k^t, xi_{n,k}),   k = 0..K-1     (5)

with eta_k = c / (K sqrt(k+1)) restarting at k = 0 every round (App. B.1, c = 1) and gamma_n^m =
D_n / D_{A,m} ([UNSPECIFIED] in the paper; spec 3.1 default). The ES then picks the next ES by the two-step
rule (sec. 3.3, :func:`choose_next`) and hands w^{t+1} = w_K^t to it; the receiver increments its visit
counter c (Alg. 1 line 18). The counter of m(0) is literally never incremented (flag ``count_initial_es``,
default False = literal).

Where things live on the engine: the model lives at the edges; the parameter server is control plane only.
It draws m(0) uniformly at random and, with ``flow = "driven"`` (the default), tells the active edge to run
a round (no tensors) and receives scalars (the next edge, evaluation metrics). With ``flow = "exact"`` (the
paper's flow, :func:`exact_round`) there is no PS message during training: the PS starts m(0) once
(``fedchs.go``, control), and from then on the edge that receives the model (a post of ``fedchs.round``
carrying it) runs the next round itself and posts its round report (scalars, control) to the PS, whose round
is the ``receive`` of that report. The report goes after the model was passed on (it names m(t+1)); a model
posted for round T (after the last) is kept for ``fedchs.collect``. A walk that stays at an edge (no neighbour
takes the model) is told to go on by the PS (``fedchs.go``: an edge does not post to itself). A PS crash:
an edge runs a posted round only while its session to the PS works, and the post it holds is its state; the
resumed PS (checkpoint at round c) rolls the edges back to before round c, the edge that held round c's
model runs it again, and the run is bit-identical to the uninterrupted one (docs/protocols.md, ``post``).
Each edge learns its neighbours' visit counts and cluster sizes D_{A,m} through ``describe`` (visit counter in
``ctx.public["visits"]``) and passes the model with ``hand_off`` (exact flow: the post).
After the last round the PS fetches the final model from the edge holding it with the separate task
``fedchs.collect``, so every other message kind carries exactly 2 K |N_m(t)| d + d floats per round (sec. 7).

Multi-step variant (spec 3.6, ``E > 1``): K / E interactions per round; in each, every client runs E local
SGD steps from the broadcast model and uploads its model delta (d floats), and the ES adds the gamma-weighted
mean delta. The step size of those local steps is [UNSPECIFIED]; ``e_lr_index`` chooses between eta_k of the
interaction k (default, "with the current eta_k") and eta_{kE+j} of the j-th local step.

Compression (Fig. 2 "with compression", spec 5 item 4, presumably QSGD on the uplink): ``upload_levels =
s > 0`` QSGD-quantises every upload (int8 levels + one float32 norm per tensor, see ``qsgd.py``); the ES
steps with the dequantised uploads. Downlink and hand-off stay uncompressed.

Missing clients (scatter returns fewer replies) are left out of the step and gamma is renormalised over those
that replied; if none replied the interaction makes no step. With a single cluster (no neighbour edge) the
walk degenerates to a self-loop: the model stays at that edge and no hand-off is sent (spec sec. 8 item 2).
A model that is never lost (outside the paper, which assumes reliable nodes): the sender of a hand-off keeps
its copy (``EdgeState.sent``) until it next receives a model. If the active edge does not finish its round,
the PS asks the previous holder to hand its copy again, with the two-step rule applied among its reachable
neighbours other than the failed one (or to keep it: then it runs the round itself), and the round is redone
there; the round's ``redo`` metric names the failed edge. The model still never passes through the PS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fedhop.common.algorithms.local import LocalSolver, local_train, loss_and_grad, sample_batch
from fedhop.common.algorithms.qsgd import decode, encode, encoded_template
from fedhop.common.engine.api import Algorithm, NodeContext, NodeId, Reply, Scalar, register, task
from fedhop.common.engine.base import HandOffError
from fedhop.common.options.fedchs import FedCHSOptions  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, axpy, sub, weighted_sum

VISITS = "visits"  # the public fact holding an edge's visit counter c(m)


def step_size(k: int, o: FedCHSOptions) -> float:
    """eta_k of App. B.1: c / (K sqrt(k+1)), k the index inside the round (restarts every round)."""
    return o.lr / (o.K * math.sqrt(k + 1)) if o.lr_schedule == "sqrt" else o.lr


def choose_next(candidates: Sequence[tuple[NodeId, int, int]]) -> NodeId:
    """The two-step rule of sec. 3.3 over (neighbour, c(m'), D_{A,m'}) triples given in canonical order.

    Step 1: the least-visited neighbours C(t); if one, it is m(t+1) (the paper's "output m(t)" is a typo for
    m(t+1)). Step 2: among C(t) the largest cluster dataset D_{A,m'}; a remaining tie goes to the first in
    canonical order, i.e. the smallest index ([UNSPECIFIED]; spec default).
    """
    if not candidates:
        raise ValueError("choose_next needs at least one neighbour")
    c_min = min(c for _, c, _ in candidates)
    least = [(m, d) for m, c, d in candidates if c == c_min]  # Step 1
    d_max = max(d for _, d in least)
    return next(m for m, d in least if d == d_max)  # Step 2, then smallest index


def _gammas(ctx: NodeContext, present: Sequence[NodeId], weighting: str) -> dict[NodeId, float]:
    sizes = {n: float(ctx.data_size(n)) if weighting == "data_size" else 1.0 for n in present}
    total = sum(sizes.values())
    return {n: s / total for n, s in sizes.items()}


@task("fedchs.grad")
def client_interaction(ctx: NodeContext, w: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client n, interaction k: grad f(w_k^t, xi_{n,k}) on one fresh mini-batch (E = 1), or the model delta of
    E local SGD steps (spec 3.6). Only k travels; the rest is the RunSpec's."""
    o: FedCHSOptions = ctx.opts
    k = int(args["k"])
    gen = ctx.rng("fedchs.grad", ctx.round, k)
    if o.E > 1:
        x, loss = local_train(ctx.ws, w, ctx.data, interaction_solver(o, k), gen)
        up = sub(x, w)
    else:
        xb, yb = sample_batch(ctx.data, o.batch_size, gen)
        loss, up = loss_and_grad(ctx.ws, w, xb, yb)
    if o.upload_levels:
        up = encode(up, o.upload_levels, ctx.rng("fedchs.qsgd", ctx.round, k))
    return Reply(up, {"loss": loss, "n": len(ctx.data)})


def interaction_solver(o: FedCHSOptions, k: int) -> LocalSolver:
    """E > 1: the E local SGD steps of interaction k, at eta_k (``e_lr_index = "interaction"``) or at
    eta_{kE+j} for local step j."""
    if o.e_lr_index == "interaction":
        return LocalSolver(steps=o.E, lr=step_size(k, o), batch_size=o.batch_size)
    if o.lr_schedule == "sqrt":
        return LocalSolver(steps=o.E, lr=o.lr, batch_size=o.batch_size, lr_K=o.K, step_offset=k * o.E)
    return LocalSolver(steps=o.E, lr=o.lr, batch_size=o.batch_size)


def cluster_round(ctx: NodeContext, w: Bundle, o: FedCHSOptions) -> tuple[Bundle, float, int]:
    """The K interactions of Eq. (5) in this edge's cluster; returns w^{t+1}, mean client loss, uploads."""
    losses: list[float] = []
    uploads = 0
    expect = encoded_template(w) if o.upload_levels else w
    for k in range(o.K // o.E):
        replies = ctx.comm.scatter(ctx.children, "fedchs.grad", w, {"k": k}, expect=expect)
        if not replies:
            continue
        gamma = _gammas(ctx, list(replies), o.weighting)
        ups = {n: decode(r.bundle, w, o.upload_levels) if o.upload_levels else r.bundle
               for n, r in replies.items()}
        agg = weighted_sum((gamma[n], ups[n]) for n in replies)
        w = axpy(-step_size(k, o), agg, w) if o.E == 1 else axpy(1.0, agg, w)  # Eq. (5) / spec 3.6
        losses.append(sum(gamma[n] * float(r.scalars["loss"]) for n, r in replies.items()))
        uploads += len(replies)
    return w, (sum(losses) / len(losses) if losses else float("nan")), uploads


@dataclass
class EdgeState:
    """An edge: the model it holds when the walk stays here (``held``) and its copy of the last model it handed
    on (``sent``, dropped when it next receives one). Its visit counter c(m) is the public fact VISITS."""

    held: Bundle | None = None
    sent: Bundle | None = None


def node_state(role: str) -> EdgeState | None:
    return EdgeState() if role == "edge" else None


def _acquire(ctx: NodeContext, first: bool, o: FedCHSOptions) -> Bundle:
    """The model this edge trains this round: w^0 at m(0), else the one handed to it."""
    st: EdgeState = ctx.state
    st.sent = None
    if first:
        if o.count_initial_es:  # not in Algorithm 1 (spec 3.3 flag)
            ctx.public[VISITS] = int(ctx.public.get(VISITS, 0)) + 1
        return ctx.initial_params()
    if "model" in ctx.inbox:
        w, _ = ctx.take("model")
        ctx.public[VISITS] = int(ctx.public.get(VISITS, 0)) + 1  # Alg. 1 line 18: c(m(t+1)) += 1
        return w
    if st.held is not None:  # the walk stayed here (one cluster, or no neighbour could take the model)
        w, st.held = st.held, None
        return w
    raise RuntimeError(f"{ctx.node_id}: told to run a Fed-CHS round but holds no model")


@task("fedchs.round")
def edge_round(ctx: NodeContext, w: Bundle, args: dict[str, Scalar]) -> Reply:
    """Active ES m(t): K interactions (Eq. 5), then the two-step rule and the hand-off of w^{t+1}. Called by
    the PS (``flow = "driven"``, no tensors), or posted by the previous ES with the model (``"exact"``)."""
    if args.get("flow") == "exact":
        return _posted_round(ctx, w)
    o: FedCHSOptions = ctx.opts
    w = _acquire(ctx, bool(args["first"]), o)
    return Reply({}, _train_and_pass(ctx, w, bool(args["eval"]), o))


def _train_and_pass(ctx: NodeContext, w: Bundle, evaluate: bool, o: FedCHSOptions,
                    post_round: int | None = None) -> dict[str, Scalar]:
    """Round t at this ES from w^t: its K interactions, the evaluation if due, and w^{t+1} passed on (posted
    for round ``post_round`` in the exact flow); returns the round's report."""
    w, train_loss, uploads = cluster_round(ctx, w, o)
    scalars: dict[str, Scalar] = {"train_loss": train_loss, "uploads": uploads,
                                  VISITS: ctx.public.get(VISITS, 0)}
    if evaluate:
        scalars.update(ctx.evaluate(w))
    scalars["next"] = pass_model(ctx, w, post_round=post_round)
    return scalars


def pass_model(ctx: NodeContext, w: Bundle, avoid: frozenset[NodeId] = frozenset(),
               post_round: int | None = None) -> NodeId:
    """Hand w^{t+1} to m(t+1) chosen by the two-step rule among the neighbours that answer describe: a
    ``hand_off``, or (exact flow, ``post_round`` given) a post of ``fedchs.round`` that makes m(t+1) run round
    ``post_round``.

    A neighbour that cannot take the model is ruled out and the rule applied again (docs/design.md section 7:
    rerouted, never lost); with no neighbour reachable (or none at all: one cluster) the model stays here and
    this edge is m(t+1). Both are outside the paper, which assumes reliable links. ``avoid``: neighbours
    ruled out from the start (an edge that failed the round this model was handed to it for).
    """
    st: EdgeState = ctx.state
    peers = [m for m in ctx.neighbours if m not in avoid]
    facts = ctx.comm.describe(peers) if peers else {}
    candidates = [(m, int(f.get(VISITS, 0)), int(f["data_size"])) for m, f in facts.items()]
    while candidates:
        nxt = choose_next(candidates)
        try:
            if post_round is None:
                ctx.comm.hand_off(nxt, "model", w)
            else:
                ctx.comm.post(nxt, "fedchs.round", w, {"flow": "exact"}, round=post_round)
            st.sent = w  # kept until this edge next receives a model: the redo copy
            return nxt
        except HandOffError:  # a PostError too
            candidates = [c for c in candidates if c[0] != nxt]
    st.held = w
    return ctx.node_id


# -- the exact flow (flow = "exact"): no PS message during training -------------------------------------------
REPORT = "fedchs.report"  # an ES's round report to the PS (scalars only: a control message)


def _posted_round(ctx: NodeContext, w: Bundle) -> Reply:
    """The ES that received w^t (a post of round t = ``ctx.round``) runs round t and reports it; a model posted
    for round T (after the last round) is kept for the PS to collect."""
    st: EdgeState = ctx.state
    st.sent = None  # this edge received a model: the copy of the last one it passed on is no longer needed
    if ctx.round >= ctx.spec.rounds:
        st.held = w
        return Reply()
    ctx.public[VISITS] = int(ctx.public.get(VISITS, 0)) + 1  # Alg. 1 line 18: c(m(t+1)) += 1
    _run_and_report(ctx, w)
    return Reply()


def _run_and_report(ctx: NodeContext, w: Bundle) -> None:
    o: FedCHSOptions = ctx.opts
    report = _train_and_pass(ctx, w, ctx.should_eval(), o, post_round=ctx.round + 1)
    ctx.comm.post(ctx.topology.server, REPORT, None, report)


@task("fedchs.go")
def edge_go(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """Exact flow, from the PS (control): run round t = ``ctx.round`` here with w^0 (``first``: m(0), or the
    edge a failed m(0)'s round moved to) or with the model this edge kept (the walk stayed here: an edge does
    not post to itself), and report it like a posted round."""
    o: FedCHSOptions = ctx.opts
    _run_and_report(ctx, _acquire(ctx, bool(args["first"]), o))
    return Reply()


def exact_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """PS, exact flow: round t is the report that m(t) posts. The PS sends a message only to start m(0), to tell
    an edge that kept the model (the walk stayed) to go on, and after a fault: when m(t)'s report does not come
    (``transport.round_deadline_s``), the previous holder posts its copy again (``fedchs.resend``), as in the
    driven flow, and the report of the edge that redoes the round is awaited."""
    o: FedCHSOptions = ctx.opts
    t, active, redo = ctx.round, s.active, ""
    if s.first or s.previous == s.active:
        ctx.comm.scatter([active], "fedchs.go", None, {"first": s.first})
    got = ctx.comm.receive(REPORT, sender=active, round=t)
    if got is None:
        redo = active  # receive logged it as missing
        active = _redo_at(ctx, s, exact=True)
        if s.first or active == s.previous:
            ctx.comm.scatter([active], "fedchs.go", None, {"first": s.first})
        got = ctx.comm.receive(REPORT, sender=active, round=t)
        if got is None:
            raise RuntimeError(f"Fed-CHS round {t + 1}: neither {s.active} nor {active} (the redo) reported the "
                               "round")
    return _reported(ctx, s, active, got.scalars, redo, o)


def _reported(ctx: NodeContext, s: ServerState, active: NodeId, r: dict[str, Scalar], redo: str,
              o: FedCHSOptions) -> ServerState:
    """Report round t from m(t)'s scalars; the state of round t + 1."""
    steps = s.steps + int(r["uploads"]) * o.E
    metrics: dict[str, Scalar] = {"edge": active, "train_loss": r["train_loss"], "client_steps": steps}
    if redo:
        metrics["redo"] = f"{redo} failed"
    if ctx.should_eval():
        metrics.update({k: r[k] for k in ("loss", "accuracy") if k in r})
    ctx.report(**metrics)
    return ServerState(str(r["next"]), active, False, steps)


@task("fedchs.resend")
def edge_resend(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """Previous holder, after the edge it handed the model to failed its round: hand its copy again, to
    another neighbour by the two-step rule (or keep it); replies with the new m(t). In the exact flow the copy
    is posted for round t = ``ctx.round`` (the receiver redoes it)."""
    st: EdgeState = ctx.state
    if st.sent is None:
        raise RuntimeError(f"{ctx.node_id}: asked to hand its copy of the model again but keeps none")
    w, st.sent = st.sent, None
    post_round = ctx.round if args.get("flow") == "exact" else None
    return Reply({}, {"next": pass_model(ctx, w, frozenset({str(args["avoid"])}), post_round=post_round)})


@task("fedchs.collect")
def edge_collect(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """The edge holding w^T gives it to the PS at the end of the run (not part of the paper's traffic)."""
    if "model" in ctx.inbox:
        w, _ = ctx.take("model")
        return Reply(w)
    if ctx.state.held is not None:
        return Reply(ctx.state.held)
    raise RuntimeError(f"{ctx.node_id}: asked for the final Fed-CHS model but holds none")


@dataclass
class ServerState:
    """The PS's control state: the active edge m(t), the edge that handed it the model, whether w^0 is still
    to be built (round 0), and the client steps so far."""

    active: NodeId
    previous: NodeId | None = None
    first: bool = True
    steps: int = 0


def init(ctx: NodeContext) -> ServerState:
    """m(0) uniform at random."""
    edges = ctx.topology.edges
    return ServerState(edges[int(ctx.np_rng("fedchs.m0").integers(len(edges)))])


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """PS (control plane only): one ``fedchs.round`` at the active edge; it names m(t+1). With ``flow =
    "exact"``: :func:`exact_round`."""
    o: FedCHSOptions = ctx.opts
    if o.flow == "exact":
        return exact_round(ctx, s)
    ev = ctx.should_eval()
    active, redo = s.active, ""
    replies = ctx.comm.scatter([active], "fedchs.round", None, {"first": s.first, "eval": ev})
    if active not in replies:
        redo = active
        active = _redo_at(ctx, s)
        replies = ctx.comm.scatter([active], "fedchs.round", None, {"first": s.first, "eval": ev})
        if active not in replies:
            raise RuntimeError(f"Fed-CHS round {ctx.round + 1}: neither {s.active} nor {active} (the redo) "
                               "finished the round")
    return _reported(ctx, s, active, replies[active].scalars, redo, o)


def _redo_at(ctx: NodeContext, s: ServerState, *, exact: bool = False) -> NodeId:
    """Where the failed round is redone: w^0 is rebuilt at the next edge in canonical order (round 0), else
    the previous holder hands its copy again (or keeps it and is the new m(t))."""
    if s.first:
        edges = list(ctx.topology.edges)
        return edges[(edges.index(s.active) + 1) % len(edges)]
    assert s.previous is not None
    args: dict[str, Scalar] = {"avoid": s.active, **({"flow": "exact"} if exact else {})}
    got = ctx.comm.scatter([s.previous], "fedchs.resend", None, args)
    if s.previous not in got:
        raise RuntimeError(f"Fed-CHS round {ctx.round + 1}: {s.active} failed and {s.previous}, which holds "
                           "the only copy of the model, does not answer")
    return str(got[s.previous].scalars["next"])


def final(ctx: NodeContext, s: ServerState) -> Bundle:
    """After the last round the PS fetches w^T from the edge that holds it."""
    got = ctx.comm.scatter([s.active], "fedchs.collect", None, {}, expect=ctx.initial_params())
    if s.active not in got:
        raise RuntimeError(f"Fed-CHS: could not collect the final model from {s.active}")
    return got[s.active].bundle


register(Algorithm("fedchs", FedCHSOptions, init, server_round, final=final, node_state=node_state,
                   needs_edges=True,
                   handoff_slots=("model",)))
