"""D-PSGD, decentralized parallel SGD (Lian et al. 2017, "Can decentralized algorithms outperform centralized
algorithms? A case study for decentralized parallel stochastic gradient descent", Algorithm 1).

n clients on a peer graph (``topology.peer_graph``: a ring by default, or random / complete) each keep their own
model x_i (x_i^0 = the initial model w^0, the same on every client). There is no parameter server in the model
path: models travel only client -> client, one model of d floats per directed peer link per round. Round t:

    y_i = x_i^t after ``local_steps`` SGD steps on client i's data      (Alg. 1: sample xi, gradient, update)
    client i sends s_i to every peer j ~ i                                (Alg. 1: "fetching ... from neighbors")
    x_i^{t+1} = sum_j W_ij s_j  (+ y_i - x_i^t for ``order = "paper"``)    (Alg. 1: the neighbourhood average)

with, by ``order``:

* ``step_then_mix`` (default): s_i = y_i (the half-step model x_i^{t+1/2}), so x^{t+1} = W (x^t - gamma g^t)
  row by row: every client first steps, then averages the stepped models (adapt-then-combine);
* ``paper``: s_i = x_i^t, so x_i^{t+1} = sum_j W_ij x_j^t - gamma g_i(x_i^t): Algorithm 1 as written (the
  average of the neighbours' current models, then the own gradient step), in the paper's matrix form
  X_{k+1} = X_k W - gamma dF(X_k; xi_k) (for ``local_steps = 1``; with K > 1 the
  local update is the sum of K steps).

W is the Metropolis-Hastings matrix of the peer graph (Xiao & Boyd 2004; the paper asks only for a symmetric
doubly stochastic W, its choice is [UNSPECIFIED]):

    W_ij = 1 / (1 + max(deg_i, deg_j))  for j ~ i,     W_ii = 1 - sum_{j ~ i} W_ij,     W_ij = 0 otherwise.

Choices the paper leaves open, named here:

* step size: constant gamma (``lr``), mini-batch size ``batch_size``; ``local_steps`` (default 1 = Alg. 1);
* control plane: the PS (outside the model path) runs two phases per round, both messages without tensors:
  ``dpsgd.step`` to every client (train, hand s_i to every peer, into the per-sender slot ``gossip/<i>``),
  then ``dpsgd.mix`` (mix what arrived). Every hand-off of round t is acknowledged before client i answers its
  step, so at mix time the inbox is complete whatever the arrival order: the run is order-free and
  bit-identical across engines;
* a missing peer (the hand-off i -> j failed, or j's model for this round is absent when i mixes): i adds
  W_ij to its own weight W_ii (its row still sums to 1; W may then be asymmetric for that round). A client
  that missed its step mixes x_i^t as its own s_i (no local progress); one that misses the mix keeps x_i^t
  (its step is lost). A hand-off carries its round, so a stale model from an earlier round is never mixed;
* evaluation: every ``eval_every`` rounds (and the last) each client evaluates its own x_i on the global
  test set and answers with the scalars; the PS reports their mean over the clients that answered (``loss``,
  ``accuracy``, ...) and the spread (``accuracy_min`` / ``accuracy_max``, ``loss_min`` / ``loss_max``), not the
  accuracy of the average model (which would need every x_i at the PS every eval round);
* the output (Alg. 1's output: (1/n) sum_i x_i): after the last round the PS collects every x_i
  (``dpsgd.collect``, d floats per client, once per run, outside the per-round traffic) and averages them
  with equal weights, in canonical order, over the clients that answer.

Payload per round (``payload_per_round``, checked by ``fedhop check``): d floats on every directed peer link
(kind ``handoff``), nothing on the PS's links.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedhop.common.algorithms.local import local_train, solver_for
from fedhop.common.engine.api import Algorithm, LinkKind, NodeContext, NodeId, Reply, Scalar, register, task
from fedhop.common.engine.base import HandOffError
from fedhop.common.options.dpsgd import DPSGDOptions
from fedhop.common.wire.bundle import Bundle, weighted_mean, weighted_sum

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec
    from fedhop.common.topology import Topology

SLOT = "gossip/"  # per sender: client j's model lands in client i's inbox under "gossip/<j>"


def mh_weight(deg_i: int, deg_j: int) -> float:
    """W_ij of the Metropolis-Hastings matrix for a link i ~ j."""
    return 1.0 / (1 + max(deg_i, deg_j))


def mixing_matrix(adj: Sequence[set[int]]) -> np.ndarray:
    """The whole n x n Metropolis-Hastings matrix W of the graph ``adj`` (symmetric and doubly stochastic)."""
    n = len(adj)
    w = np.zeros((n, n))
    for i in range(n):
        for j in adj[i]:
            w[i, j] = mh_weight(len(adj[i]), len(adj[j]))
        w[i, i] = 1.0 - w[i].sum()
    return w


def mixing_row(me: NodeId, neighbours: Mapping[NodeId, Sequence[NodeId]], present: set[NodeId]
               ) -> list[tuple[NodeId, float]]:
    """Row ``me`` of W as (node, weight) pairs, ``me`` first and then its peers in canonical order, with the
    missing-peer rule: the weight of a peer not in ``present`` goes to W_ii (and the peer is left out)."""
    peers = neighbours.get(me, ())
    row = [(j, mh_weight(len(peers), len(neighbours.get(j, ())))) for j in peers]
    kept = [(j, w) for j, w in row if j in present]
    own = 1.0 - sum(w for _, w in kept)
    return [(me, own), *kept]


@dataclass
class PeerState:
    """A client: its model x_i (None until it first mixes: x_i^0 = w^0) and, between its step and its mix, what
    it sent to its peers (s_i) and its model after the local steps (y_i)."""

    x: Bundle | None = None
    sent: Bundle | None = None
    stepped: Bundle | None = None
    round: int = -1  # the round of ``sent`` / ``stepped``


def node_state(role: str) -> PeerState | None:
    return PeerState() if role == "client" else None


@dataclass
class ServerState:
    """The PS is control plane only: it keeps no model, just how many rounds are done."""

    rounds_done: int = 0


def init(ctx: NodeContext) -> ServerState:
    return ServerState()


def _model(ctx: NodeContext) -> Bundle:
    st: PeerState = ctx.state
    return st.x if st.x is not None else ctx.initial_params()


@task("dpsgd.step")
def step(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client i: y_i = ``local_steps`` SGD steps from x_i^t, then s_i (y_i, or x_i^t for ``order = "paper"``)
    to every peer (a failed hand-off is skipped: that peer mixes without it)."""
    o: DPSGDOptions = ctx.opts
    st: PeerState = ctx.state
    x = _model(ctx)
    y, loss = local_train(ctx.ws, x, ctx.data, solver_for(ctx, args), ctx.rng("dpsgd.step", ctx.round))
    s = y if o.order == "step_then_mix" else x
    reached = 0
    for peer in ctx.neighbours:
        try:
            ctx.comm.hand_off(peer, SLOT, s, {"round": ctx.round})
            reached += 1
        except HandOffError:
            pass  # the peer gives W_ji to itself (the missing-peer rule, applied where it mixes)
    st.sent, st.stepped, st.round = s, y, ctx.round
    return Reply({}, {"loss": loss, "reached": reached})


@task("dpsgd.mix")
def mix(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client i: x_i^{t+1} = sum_j W_ij s_j over the peers whose s_j of this round arrived (+ its own local
    update for ``order = "paper"``); every gossip slot is emptied (stale ones dropped unread)."""
    o: DPSGDOptions = ctx.opts
    st: PeerState = ctx.state
    got: dict[NodeId, Bundle] = {}
    for key in [k for k in ctx.inbox if k.startswith(SLOT)]:
        bundle, scalars = ctx.inbox.pop(key)
        if int(scalars.get("round", -1)) == ctx.round:
            got[key[len(SLOT):]] = bundle
    x = _model(ctx)
    fresh = st.round == ctx.round and st.sent is not None and st.stepped is not None
    own = st.sent if fresh else x
    row = mixing_row(ctx.node_id, ctx.topology.neighbours, set(got))
    mixed = weighted_sum((w, own if j == ctx.node_id else got[j]) for j, w in row)
    if o.order == "paper" and fresh:
        assert st.stepped is not None
        mixed = {k: mixed[k] + (st.stepped[k] - x[k]) for k in mixed}
    st.x, st.sent, st.stepped = mixed, None, None
    scalars: dict[str, Scalar] = {"mixed": len(row) - 1}
    if bool(args.get("eval", False)):
        scalars.update(ctx.evaluate(mixed))
    return Reply({}, scalars)


@task("dpsgd.collect")
def collect(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client i gives x_i to the PS after the last round (Alg. 1's output, the average, is taken there)."""
    return Reply(_model(ctx))


def _spread(replies: Sequence[Mapping[str, Scalar]]) -> dict[str, Scalar]:
    """Mean over the clients of every evaluation scalar, and min / max of loss and accuracy."""
    out: dict[str, Scalar] = {}
    keys = [k for k in replies[0] if k != "mixed"] if replies else []
    for k in keys:
        vals = [float(r[k]) for r in replies if k in r]
        out[k] = float(np.mean(vals))
        if k in ("loss", "accuracy"):
            out[f"{k}_min"], out[f"{k}_max"] = min(vals), max(vals)
    return out


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """Control plane: every client steps and gossips (``dpsgd.step``), then every client mixes
    (``dpsgd.mix``); neither message carries a tensor."""
    clients = list(ctx.topology.clients)
    stepped = ctx.comm.scatter(clients, "dpsgd.step", None, {})
    ev = ctx.should_eval()
    mixed = ctx.comm.scatter(clients, "dpsgd.mix", None, {"eval": ev})
    metrics: dict[str, Scalar] = {}
    if stepped:
        metrics["train_loss"] = float(np.mean([float(r.scalars["loss"]) for r in stepped.values()]))
    metrics["stepped"], metrics["mixed"] = len(stepped), len(mixed)
    if ev and mixed:
        metrics.update(_spread([r.scalars for r in mixed.values()]))
    ctx.report(**metrics)
    return ServerState(s.rounds_done + 1)


def final(ctx: NodeContext, s: ServerState) -> Bundle:
    """The average of every client's model (Alg. 1's output), collected once after the last round."""
    if s.rounds_done == 0:
        return ctx.initial_params()
    got = ctx.comm.scatter(list(ctx.topology.clients), "dpsgd.collect", None, {}, expect=ctx.initial_params())
    if not got:
        raise RuntimeError("D-PSGD: no client gave its model for the final average")
    return weighted_mean((1.0, r.bundle) for r in got.values())


def payload_per_round(spec: RunSpec, topo: Topology, model_bytes: int) -> dict[LinkKind, int]:
    """d floats (``model_bytes``) on every directed peer link per round, nothing on the PS's links."""
    return {(i, j, "handoff"): model_bytes for i in topo.clients for j in topo.neighbours.get(i, ())}


register(Algorithm("dpsgd", DPSGDOptions, init, server_round, final=final, node_state=node_state,
                   needs_edges=False, handoff_slots=(SLOT,), payload_per_round=payload_per_round, peers="ring"))
