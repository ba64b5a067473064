"""FedCluster (Chen, Chen, Zhou, Kailkhura, "FedCluster: Boosting the Convergence of Federated Learning via
Cluster-Cycling", IEEE BigData 2020, arXiv:2009.10748), Algorithm 1; engineering spec docs/specs/fedcluster.md.

The n devices are partitioned once into M fixed clusters S_1..S_M (sec. II; here: the clients of each edge
server, so M = topology.edges). Each learning round j runs M *cycles*; cycle K uses cluster c = order_j[K]
(a fresh random permutation sigma_j per round, as in the analysis, App. A, or the fixed order of
Algorithm 1) and makes one global update (Alg. 1, with the spec's sec. 2.2 "Implement instead" fix of
[INCONSISTENT] (a)-(c): the same cluster for sampling and aggregation, weights normalised over the
sampled devices):

    A_K          = participation x |S_c| devices of S_c, uniformly without replacement
    w^(k)        = LocalSolver_k(W_{jM+K}, E steps)                    for k in A_K   (Alg. 1 inner loop)
    W_{jM+K+1}   = sum_{k in A_K} (p_k / sum_{i in A_K} p_i) w^(k)                   (Alg. 1 last line)

FedAvg is the special case M = 1 (sec. II): the cycle is FedAvg's sampling
(:func:`fedavg.sample_participants`), local training (task ``local.train``) and weighted average
(:func:`fedavg.average_replies`), shared through :func:`fedavg.cluster_rounds`, so FedCluster with one edge is
bit-identical to ``fedavg`` through one edge.

Roles and where the model is (the PS is control plane only, docs/design.md: "cluster c trains from the model
cluster c-1 produced: ES->ES hand-off"):

* The run's first cluster builds W_0 itself, from the spec's seed (``ctx.initial_params()``, the same pure
  function of the spec in every process, as Fed-CHS's edges do), so the PS never sends model bytes.
* Between cycles the model sits at the edge that ran the last successful cycle (its *holder*). Before
  cycle K the PS asks the holder to hand it to cluster order_j[K] (``fedcluster.pass``: an edge -> edge
  ``hand_off`` of d floats), then asks that edge to run its cycle (``fedcluster.cycle``). At a round
  boundary the model goes straight from the last cluster of round j to the first of round j+1; when they
  are the same edge there is no hand-off.
* At round end the model W_{(j+1)M} sits at the round's last cluster; the PS asks it to evaluate
  (``fedcluster.evaluate``, scalars only). After the last round the PS collects it (``fedcluster.collect``,
  d floats, once per run).

Payload per round (sec. 2.3): device downloads + uploads = sum_K |A_K| * 2 * d floats, the same as FedAvg
with the same number of participants; plus one d-float edge -> edge hand-off per change of holder. On PS
links: none but the final collect (d floats, once per run).

Missing nodes: a client missing at the deadline is left out of its cycle's average (FedAvg's rule); a
cycle with no replies leaves the model unchanged. A cluster whose edge does not answer (or cannot be
reached by a hand-off) is skipped for the round; the model stays with the holder. Every edge keeps its
own last output, so if the holder itself disappears the PS rolls back to the most recent earlier holder
that answers (losing the cycles after it); only when no edge that ever held the model answers is the
run aborted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fedhop.common.algorithms.fedavg import cluster_rounds
from fedhop.common.algorithms.local import full_gradient
from fedhop.common.data import Dataset
from fedhop.common.engine.api import Algorithm, NodeContext, NodeId, Reply, Scalar, register, task
from fedhop.common.engine.base import HandOffError
from fedhop.common.engine.workspace import Workspace
from fedhop.common.options.fedcluster import FedClusterOptions, check_spec, check_topology, required_links, step_size  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, flat

SLOT = "fedcluster.model"  # inbox slot of a handed-off model


def cycle_order(ctx: NodeContext, round_idx: int, order: str) -> list[NodeId]:
    """order_j: the clusters of round j in visiting order; ``reshuffle`` draws sigma_j (App. A) from the PS's
    own stream, ``fixed`` is Algorithm 1's S_1, ..., S_M."""
    edges = list(ctx.topology.edges)
    if order == "fixed":
        return edges
    perm = ctx.np_rng("fedcluster.order", round_idx).permutation(len(edges))
    return [edges[int(i)] for i in perm]


# -- edge tasks --------------------------------------------------------------------------------------------

@dataclass
class EdgeState:
    """An edge: its last output W_{jM+K+1} (kept as the fallback of a later roll-back)."""

    model: Bundle | None = None


def node_state(role: str) -> EdgeState | None:
    return EdgeState() if role == "edge" else None


def _output(ctx: NodeContext) -> Bundle:
    if ctx.state.model is None:
        raise RuntimeError(f"{ctx.node_id}: holds no FedCluster model")
    return ctx.state.model


@task("fedcluster.cycle")
def cycle_task(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Edge c, cycle K of round j: W_{jM+K} from where the PS says it is, one FedAvg step on the cluster
    (sample A_K, local training, normalised weighted average), keep W_{jM+K+1} as this edge's output."""
    source = str(args["source"])
    if source == "init":  # the run's first cycle: W_0 built here from the seed (the PS sends no model)
        w = ctx.initial_params()
    elif source == "inbox":  # handed off by the previous cluster
        w, _ = ctx.take(SLOT)
    elif source == "self":  # this edge ran the previous cycle (round boundary)
        w = _output(ctx)
    else:
        raise ValueError(f"unknown model source {source!r}")
    w, n = cluster_rounds(ctx, w, 1)
    ctx.state.model = w
    return Reply({}, {"n": n})


@task("fedcluster.pass")
def pass_task(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Holder edge: hand its model to the next cluster's edge (acknowledged); keeps its own copy as the
    fallback of a later roll-back."""
    try:
        ctx.comm.hand_off(str(args["to"]), SLOT, _output(ctx))
    except HandOffError:
        return Reply({}, {"delivered": False})
    return Reply({}, {"delivered": True})


@task("fedcluster.evaluate")
def evaluate_task(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Holder edge: test metrics of the model it holds (scalars only; the model does not move)."""
    return Reply({}, dict(ctx.evaluate(_output(ctx))))


@task("fedcluster.collect")
def collect_task(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Holder edge, after the last round: send the final model W_{TM} to the PS."""
    return Reply(_output(ctx), {})


# -- the PS: control plane ---------------------------------------------------------------------------------

@dataclass
class Holders:
    """Which edges hold which model: ``history`` lists the edges that produced each model, oldest first.
    Walking back, the first occurrence of an edge is its latest output, still in its state. This is the PS's
    whole state: the model itself lives at the edges."""

    history: list[NodeId] = field(default_factory=list)
    dead: set[NodeId] = field(default_factory=set)

    @property
    def current(self) -> NodeId | None:
        return self.history[-1] if self.history else None

    def produced(self, edge: NodeId) -> None:
        self.dead.discard(edge)
        self.history.append(edge)

    def lost(self, edge: NodeId) -> None:
        """``edge`` did not answer: roll back to the latest model of an earlier holder."""
        self.dead.add(edge)
        while self.history and self.history[-1] in self.dead:
            gone = self.history.pop()
            self.history = [e for e in self.history if e != gone]
        if not self.history:
            raise RuntimeError(f"fedcluster: {edge} held the model and no edge that held an earlier one "
                               "answers; the model is lost")


def _ask_holder(ctx: NodeContext, holders: Holders, task_name: str, args: dict[str, Scalar],
                expect: Bundle | None = None) -> tuple[NodeId, Reply]:
    """Send ``task_name`` to the holder, rolling back to earlier holders while they do not answer."""
    while True:
        h = holders.current
        assert h is not None
        got = ctx.comm.scatter([h], task_name, None, args, expect=expect)
        if h in got:
            return h, got[h]
        holders.lost(h)


def init(ctx: NodeContext) -> Holders:
    check_topology(ctx.topology, ctx.opts.order)
    return Holders()


def server_round(ctx: NodeContext, holders: Holders) -> Holders:
    """Learning round j of Algorithm 1: M cycles, the model moving edge -> edge (the PS is control plane)."""
    o: FedClusterOptions = ctx.opts
    topo = ctx.topology
    visited: list[NodeId] = []
    skipped = 0
    for c in cycle_order(ctx, ctx.round, o.order):
        h = holders.current
        if h is None:
            source, bundle = "init", {}
        elif h == c:
            source, bundle = "self", {}
        else:
            if c not in topo.neighbours[h]:  # only after a skipped cluster under a ring
                skipped += 1
                continue
            h, moved = _ask_holder(ctx, holders, "fedcluster.pass", {"to": c})
            if h == c:
                source, bundle = "self", {}
            elif not bool(moved.scalars.get("delivered")):
                skipped += 1
                continue
            else:
                source, bundle = "inbox", {}
        got = ctx.comm.scatter([c], "fedcluster.cycle", bundle, {"source": source})
        if c not in got:
            skipped += 1
            continue
        holders.produced(c)
        visited.append(c)
    metrics: dict[str, Scalar] = {"order": ",".join(visited), "cycles": len(visited), "skipped": skipped}
    if ctx.should_eval() and holders.current is not None:
        _, ev = _ask_holder(ctx, holders, "fedcluster.evaluate", {})
        metrics.update(ev.scalars)
    elif ctx.should_eval():
        metrics.update(ctx.evaluate(ctx.initial_params()))
    ctx.report(**metrics)
    return holders


def final(ctx: NodeContext, holders: Holders) -> Bundle:
    """After the last round the PS collects W_{TM} from its holder (d floats, once per run)."""
    w0 = ctx.initial_params()
    if holders.current is None:
        return w0
    _, got = _ask_holder(ctx, holders, "fedcluster.collect", {}, expect=w0)
    return got.bundle


register(Algorithm("fedcluster", FedClusterOptions, init, server_round, final=final, node_state=node_state,
                   needs_edges=True, check=check_spec, handoff_slots=(SLOT,)))


# -- heterogeneity (Eq. 2): a measurement, not part of the algorithm --------------------------------------

def device_gradients(ws: Workspace, params: Bundle, devices: Sequence[Dataset]) -> list[torch.Tensor]:
    """grad f(w; D^(k)) of every device (full local batch), flattened to float64."""
    return [flat(full_gradient(ws, params, d)[1]) for d in devices]


def heterogeneity(grads: Sequence[torch.Tensor], sizes: Sequence[int],
                  groups: Sequence[Sequence[int]]) -> float:
    """H = sum_K q_K ||grad f(w; D^(S_K)) - grad f(w)||^2 at one w (Eq. 2 without the sup), where
    p_k = |D^(k)| / |D|, q_K = sum_{k in S_K} p_k and the cluster gradient is the p-weighted device mean.
    ``groups = [[k] for k in range(n)]`` gives H_device; the clusters give H_cluster <= H_device (Jensen)."""
    total = float(sum(sizes))
    p = torch.tensor([s / total for s in sizes], dtype=torch.float64)
    g = torch.stack(list(grads))
    g_all = (p[:, None] * g).sum(0)
    h = 0.0
    for members in groups:
        idx = torch.tensor(list(members), dtype=torch.long)
        q = float(p[idx].sum())
        g_c = (p[idx, None] * g[idx]).sum(0) / q
        h += q * float(((g_c - g_all) ** 2).sum())
    return h
