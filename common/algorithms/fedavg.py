"""FedAvg (McMahan et al. 2017) and hierarchical FedAvg, HierFAVG (Liu et al. 2020, "Client-Edge-Cloud
Hierarchical Federated Learning", Algorithm 1).

FedAvg, one round t:   w^{t+1} = sum_{k in S_t} (n_k / sum_{j in S_t} n_j) * LocalSGD_k(w^t, E steps)
HierFAVG, one round:   every edge l repeats kappa2 times  w_l <- sum_{k in C_l} (n_k / n_l) LocalSGD_k(w_l, kappa1)
                       then the cloud sets w <- sum_l (n_l / n) w_l.
With edges in the topology, FedAvg is HierFAVG with kappa2 = 1 (edges relay and pre-aggregate; the result is
the same weighted average). Participants missing at the deadline are left out of the weights.

FedAvg + QSGD (Fed-CHS Fig. 2 baseline, docs/specs/fedchs.md section 5 item 1: "clients upload QSGD-quantised
updates"; the quantiser of item 4, ``qsgd.py``): with ``upload_levels = s > 0`` client k uploads
Q_s(w_k - w) instead of w_k (int8 levels + one float32 norm per tensor: d + 4P bytes for P tensors, against 4d)
and the aggregator adds the decoded updates:

    w^{t+1} = w^t + sum_{k in S_t} (n_k / sum_{j in S_t} n_j) Q_s(LocalSGD_k(w^t, E steps) - w^t)

The model goes down uncompressed. s is [UNSPECIFIED] in the paper; 127 (the int8 maximum) matches the spec's
bit accounting ``32 + d (1 + ceil(log2(s + 1)))`` exactly. Through edges only the client -> edge uploads are
quantised (each edge adds its clients' decoded updates); edge -> cloud models travel uncompressed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.algorithms.local import local_train, solver_for
from fedhop.common.algorithms.participation import ParticipationState, participants
from fedhop.common.algorithms.qsgd import add_quantized, encode, encoded_template
from fedhop.common.engine.api import Algorithm, LinkKind, NodeContext, Reply, Scalar, register, task
from fedhop.common.options.fedavg import FedAvgOptions, HierFAVGOptions, solver_of  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, sub, weighted_mean

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec
    from fedhop.common.topology import Topology


def sample_participants(ctx: NodeContext, pool: tuple[str, ...], fraction: float, stream: int = 0) -> list[str]:
    """max(1, round(fraction * |pool|)) nodes drawn without replacement (all of them at fraction 1)."""
    if fraction >= 1.0:
        return list(pool)
    k = max(1, round(fraction * len(pool)))
    idx = ctx.np_rng("participants", ctx.round, stream).choice(len(pool), size=k, replace=False)
    return ctx.topology.sort(pool[int(i)] for i in idx)


def average_replies(ctx: NodeContext, replies: dict[str, Reply], weighting: str) -> tuple[Bundle, int]:
    """Weighted average of the replies' bundles, in canonical order; returns it and its total weight: the whole-reply
    average that the streamed folds (:func:`streaming_mean`, :func:`edge_mean`) reproduce bit for bit when every
    target reports its known size (their reference in tests)."""
    weights = {n: int(r.scalars["n"]) if "n" in r.scalars else ctx.data_size(n) for n, r in replies.items()}
    avg = weighted_mean(((weights[n] if weighting == "data_size" else 1.0), r.bundle) for n, r in replies.items())
    return avg, sum(weights.values())


def cluster_rounds(ctx: NodeContext, params: Bundle, edge_rounds: int, process: ParticipationState | None = None
                   ) -> tuple[Bundle, int]:
    """kappa2 times: the node's children train locally and the node averages them (HierFAVG inner loop).

    S is a uniform fraction of the children (``participation`` a float), or drawn by a participation model
    whose process is kept in ``process`` (server + clients only). Local step s * steps + j of the round uses
    the step size of ``lr_schedule_K``'s schedule (task args ``stream``, ``step_offset``: what varies per call).
    """
    o: FedAvgOptions = ctx.opts
    steps = o.local_solver(ctx.topology).steps
    weight = 0
    for s in range(edge_rounds):
        chosen = (sample_participants(ctx, ctx.children, o.participation, s) if isinstance(o.participation, float)
                  else participants(ctx, o.participation, process))
        args = {"stream": s, "step_offset": s * steps}
        if o.upload_levels:
            replies = ctx.comm.scatter(chosen, "fedavg.train_qsgd", params, args, expect=encoded_template(params))
            if replies:
                n = {c: int(r.scalars["n"]) for c, r in replies.items()}
                alpha = {c: float(n[c]) if o.weighting == "data_size" else 1.0 for c in replies}
                params, weight = add_quantized(params, replies, alpha, o.upload_levels), sum(n.values())
            continue
        mean = streaming_mean(ctx, chosen, o.weighting)
        replies = ctx.comm.scatter(chosen, "local.train", params, args, expect=params, fold=mean)
        if replies:
            params, weight = mean.result(), sum(_weight(ctx, c, r) for c, r in replies.items())
    return params, weight


def _weight(ctx: NodeContext, node: str, r: Reply) -> int:
    return int(r.scalars["n"]) if "n" in r.scalars else ctx.data_size(node)


def streaming_mean(ctx: NodeContext, targets: list[str] | tuple[str, ...], weighting: str) -> WeightedMean:
    """The fold of :func:`average_replies`: the same average, accumulated while the replies arrive (bit-identical
    to it when every target replies); normalised while folding by the targets' known data sizes."""
    if weighting == "uniform":
        return WeightedMean(lambda n, r: 1.0, max(len(targets), 1))
    expected = sum(ctx.sizes.get(t, 0) for t in targets)
    return WeightedMean(lambda n, r: _weight(ctx, n, r), expected if expected > 0 else 1)


def edge_mean(ctx: NodeContext, edges: list[str] | tuple[str, ...]) -> WeightedMean:
    """The cloud's fold of its edges' models (HierFAVG: w <- sum_l (n_l / n) w_l), taken chunk by chunk while the
    replies arrive (issue 19: the PS holds the aggregate and a chunk, not every edge's model).

    An edge's weight is the ``n`` it reports (the samples of its clients that trained); an edge reporting 0 (none
    of its clients trained) is not folded: no reply, as before. The weights are normalised while folding by the
    edges' subtree sizes (``ctx.sizes``), which is their total when every client of every edge trained: then the
    result is :func:`average_replies`'s bit for bit. When an edge reports less (a client missing, participation
    below 1) or an edge is missing, :class:`WeightedMean` rescales the sum by expected / actual total at the end:
    the same weighted mean to rounding, and the same bits in every engine (the rescale is deterministic). A single
    edge is weighted 1 (its model is the mean, ``w * 1.0``, whatever weight it reports), so FedAvg through one
    edge stays FedCluster with M = 1 bit for bit under any participation."""
    if len(edges) == 1:
        return WeightedMean(lambda n, r: 1.0 if _weight(ctx, n, r) > 0 else 0.0, 1.0)
    return streaming_mean(ctx, edges, "data_size")


def cloud_round(ctx: NodeContext, params: Bundle) -> Bundle:
    """The cloud's step of a round through edges: every edge runs ``hier.edge_round`` from ``params`` and its
    reply is folded into :func:`edge_mean` as it arrives; ``params`` unchanged when no edge's clients trained."""
    mean = edge_mean(ctx, ctx.children)
    ctx.comm.scatter(ctx.children, "hier.edge_round", params, {}, expect=params, fold=mean)
    return params if mean.empty else mean.result()


@task("fedavg.train_qsgd")
def train_qsgd(ctx: NodeContext, params: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: the local training of ``local.train`` (same RNG stream), then uploads Q_s(w_k - w)."""
    stream = args.get("stream", 0)
    w, loss = local_train(ctx.ws, params, ctx.data, solver_for(ctx, args), ctx.rng("local.train", ctx.round, stream))
    enc = encode(sub(w, params), ctx.opts.upload_levels, ctx.rng("fedavg.qsgd", ctx.round, stream))
    return Reply(enc, {"loss": loss, "n": len(ctx.data)})


@task("hier.edge_round")
def edge_round(ctx: NodeContext, params: Bundle, args: dict[str, Scalar]) -> Reply:
    """Edge: kappa2 client rounds from the cloud's model; replies with the edge model and its weight."""
    w, n = cluster_rounds(ctx, params, getattr(ctx.opts, "edge_rounds", 1))
    return Reply(w, {"n": n})


@dataclass
class ServerState:
    model: Bundle  # w^t
    participation: ParticipationState = field(default_factory=ParticipationState)


def init(ctx: NodeContext) -> ServerState:
    o: FedAvgOptions = ctx.opts
    if not isinstance(o.participation, float) and ctx.topology.edges:
        raise ValueError("participation models need topology.edges = 0; use a fraction with edges")
    return ServerState(ctx.initial_params())


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """Round t: w^{t+1} = the weighted average of the participants' (or edges') models."""
    o: FedAvgOptions = ctx.opts
    w = s.model
    if ctx.topology.edges:
        w = cloud_round(ctx, w)
    else:
        w, _ = cluster_rounds(ctx, w, o.syncs_per_round, s.participation)
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(w))
    return ServerState(w, s.participation)


def payload_per_round(spec: RunSpec, topo: Topology, model_bytes: int) -> dict[LinkKind, int] | None:
    """The declared payload formula (README "Bytes on the wire"): every participant receives the model and
    returns its own, 2 d per participant per average; without edges ``syncs_per_round`` averages a round, with
    edges the PS <-> edge exchange once and each edge averages its clients ``edge_rounds`` times (HierFAVG's
    kappa2; 1 for FedAvg). Covers full participation with plain uploads only (None otherwise: who takes part is
    drawn, and QSGD's uploads are smaller)."""
    o: FedAvgOptions = spec.options()  # type: ignore[assignment]
    if o.upload_levels or not isinstance(o.participation, float) or o.participation != 1.0:
        return None
    out: dict[LinkKind, int] = {}

    def exchange(parent: str, child: str, kind: str, times: int) -> None:
        out[(parent, child, kind)] = out.get((parent, child, kind), 0) + times * model_bytes
        out[(child, parent, kind)] = out.get((child, parent, kind), 0) + times * model_bytes

    if topo.edges:
        for e in topo.edges:
            exchange(topo.server, e, "hier.edge_round", 1)
            for c in topo.children(e):
                exchange(e, c, "local.train", getattr(o, "edge_rounds", 1))
    else:
        for c in topo.children(topo.server):
            exchange(topo.server, c, "local.train", o.syncs_per_round)
    return out


register(Algorithm("fedavg", FedAvgOptions, init, server_round,
                   round_replaces_tensors=True, payload_per_round=payload_per_round))
register(Algorithm("hierfavg", HierFAVGOptions, init, server_round,
                   needs_edges=True,
                   round_replaces_tensors=True, payload_per_round=payload_per_round))
