"""WRWGD, weighted random-walk gradient descent (Ayache & El Rouayheb 2019), the Fed-CHS baseline of
docs/specs/fedchs.md section 5 item 2.

A single model walks over a random client graph (max degree 3; no edge servers). At the visited client i it
takes K local SGD steps with eta_k = c / (K sqrt(k+1)) (Fed-CHS App. B.1, K = 20), scaled by the importance
weight gamma_i / pi_i, then moves to a neighbour by a Metropolis-Hastings chain with stationary law pi:

    P_ij = (1 / deg_i) * min(1, (pi_j deg_i) / (pi_i deg_j))  for j ~ i,     P_ii = 1 - sum_{j != i} P_ij.

pi_i is proportional to the local smoothness L_i in the cited work; L_i of a neural network is [UNSPECIFIED]
in Fed-CHS, so the default is the spec's fallback pi_i proportional to D_i (option ``stationary``). The
importance weight makes the expected step the gradient of F = sum_i gamma_i f_i with gamma_i = D_i / D_A:
gamma_i / pi_i (= 1 for pi proportional to D; the cited 1 / (N pi_i) is the case gamma_i = 1 / N).
One round = one visit (spec default; T rounds = T visits).

Routing (issue 16: exact on the wire): the model walks from client to client over the peer graph
(``topology.peer_graph``, random by default, at most ``topology.peer_max_degree`` peers per client), one hop costing
d floats on the client -> client link, never through the PS. The PS is the walk's control plane only: it knows the
graph (a pure function of the seed) and every D_i, draws the next client j and tells the visited client i, in a
message without tensors, to train and hand the model to j (``wrwgd.visit``); the client replies with its
metrics (loss and, every eval_every rounds, the accuracy of the model it hands on, evaluated where the model is).
At the end the PS collects the model from the client that holds it (d once, not part of the paper's traffic).

Faults (outside the paper, which assumes reliable links): a client that hands the model on keeps a copy
(``sent``) until it next receives one. When j cannot take the model, it stays at i (the walk stays; P_ii's move).
When the visited client fails, the model is unchanged (as in the relay version) and the walk steps back: the client
that handed it the model takes its copy back and is visited next (the failed client's draw of j is dropped: j
need not be a peer of the client that holds the copy). With no copy anywhere (the first visit, or a visited client
that held the model since its last visit), the next visit, at j, starts again from w^0 (reported as a restart).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhop.common.algorithms.local import local_train, solver_for
from fedhop.common.engine.api import Algorithm, NodeContext, NodeId, Reply, Scalar, register, task
from fedhop.common.engine.base import HandOffError
from fedhop.common.options.wrwgd import WRWGDOptions  # noqa: F401  (re-exported)
from fedhop.common.topology import peer_graph
from fedhop.common.wire.bundle import Bundle

SLOT = "walk"


def client_graph(n: int, max_degree: int, seed: int) -> list[set[int]]:
    """The walk's random connected client graph: the random peer graph (``topology.peer_graph = "random"``)."""
    return peer_graph(n, "random", max_degree, seed)


def mh_row(i: int, adj: list[set[int]], pi: np.ndarray) -> np.ndarray:
    """Row i of the Metropolis-Hastings transition matrix with stationary law ``pi`` on graph ``adj``."""
    p = np.zeros(len(adj))
    deg_i = len(adj[i])
    for j in sorted(adj[i]):
        p[j] = min(1.0, (pi[j] * deg_i) / (pi[i] * len(adj[j]))) / deg_i
    p[i] = max(0.0, 1.0 - p.sum())
    return p


@dataclass
class WalkerState:
    """A client: the model when the walk stays here (``held``) and its copy of the last model it handed on
    (``sent``, dropped when it next receives one)."""

    held: Bundle | None = None
    sent: Bundle | None = None


def node_state(role: str) -> WalkerState | None:
    return WalkerState() if role == "client" else None


@dataclass
class ServerState:
    """The PS's control state: the client the walk visits this round, the client that handed it the model (it
    keeps a copy), whether the model is still w^0 (nobody trained it yet), and the walk's random stream."""

    at: int
    walk: np.random.Generator  # the walk's stream (its position in it is state too)
    previous: NodeId | None = None
    fresh: bool = True


def _walk_law(ctx: NodeContext) -> tuple[list[set[int]], np.ndarray, np.ndarray]:
    o: WRWGDOptions = ctx.opts
    clients = ctx.topology.clients
    n = len(clients)
    sizes = np.array([float(ctx.data_size(c)) for c in clients])
    gamma = sizes / sizes.sum()
    pi = gamma if o.stationary == "data_size" else np.full(n, 1.0 / n)
    adj = [{clients.index(p) for p in ctx.topology.neighbours.get(c, ())} for c in clients]
    return adj, gamma, pi


def init(ctx: NodeContext) -> ServerState:
    walk = ctx.np_rng("wrwgd.walk")
    return ServerState(int(walk.integers(len(ctx.topology.clients))), walk)


def _pass_on(ctx: NodeContext, w: Bundle, nxt: NodeId) -> NodeId:
    """Hand ``w`` to ``nxt`` (keeping a copy), or keep it when ``nxt`` is this client or cannot take it."""
    st: WalkerState = ctx.state
    if nxt != ctx.node_id:
        try:
            ctx.comm.hand_off(nxt, SLOT, w)
            st.sent = w
            return nxt
        except HandOffError:
            pass
    st.held = w
    return ctx.node_id


@task("wrwgd.visit")
def visit(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """Visited client i: K local steps from w (scaled by gamma_i / pi_i), then the model moves to ``next``."""
    st: WalkerState = ctx.state
    if bool(args["fresh"]):
        w = ctx.initial_params()
    elif SLOT in ctx.inbox:
        w, _ = ctx.take(SLOT)
    elif st.held is not None:
        w, st.held = st.held, None
    else:
        raise RuntimeError(f"{ctx.node_id}: visited by the walk but holds no model")
    st.sent = None  # it holds the newest model now
    gen = ctx.rng("local.train", ctx.round, 0)  # the stream the relay version's local.train drew from
    w, loss = local_train(ctx.ws, w, ctx.data, solver_for(ctx, args), gen, consume=True)
    scalars: dict[str, Scalar] = {"loss": loss}
    if bool(args["eval"]):
        scalars.update(ctx.evaluate(w))
    scalars["next"] = _pass_on(ctx, w, str(args["next"]))
    return Reply({}, scalars)


@task("wrwgd.take_back")
def take_back(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """The client that handed the model to a visited client that failed: its copy is the walk's model again."""
    st: WalkerState = ctx.state
    if st.sent is None:
        raise RuntimeError(f"{ctx.node_id}: asked to take back the walk's model but keeps no copy")
    st.held, st.sent = st.sent, None
    return Reply({}, dict(ctx.evaluate(st.held)) if bool(args["eval"]) else {})


@task("wrwgd.collect")
def collect(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """The client holding the model gives it to the PS at the end of the run (not part of the paper's traffic)."""
    st: WalkerState = ctx.state
    if SLOT in ctx.inbox:
        return Reply(ctx.inbox[SLOT][0])
    if st.held is not None:
        return Reply(st.held)
    raise RuntimeError(f"{ctx.node_id}: asked for the walk's final model but holds none")


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """Control plane: client i takes K steps (scaled by gamma_i / pi_i) and hands the model to j ~ P_i."""
    o: WRWGDOptions = ctx.opts
    clients = ctx.topology.clients
    adj, gamma, pi = _walk_law(ctx)
    i = s.at
    j = int(s.walk.choice(len(clients), p=mh_row(i, adj, pi)))
    scale = float(gamma[i] / pi[i]) if o.importance_weighting else 1.0
    ev = ctx.should_eval()
    args: dict[str, Scalar] = {"lr_scale": scale, "next": clients[j], "fresh": s.fresh, "eval": ev}
    replies = ctx.comm.scatter([clients[i]], "wrwgd.visit", None, args)
    metrics: dict[str, Scalar] = {"client": clients[i]}
    if clients[i] in replies:
        r = replies[clients[i]].scalars
        holder, previous, fresh = str(r["next"]), (clients[i] if r["next"] != clients[i] else s.previous), False
    elif s.fresh or s.previous is None:  # nobody trained the model yet, or its only copy was at i
        r, holder, previous, fresh = {}, clients[j], None, True
        metrics["restart"] = f"{clients[i]} failed holding the only copy; the walk starts again from w^0"
    else:  # the model is unchanged (the copy at the client that handed it to i); the walk steps back there
        got = ctx.comm.scatter([s.previous], "wrwgd.take_back", None, {"eval": ev})
        if s.previous not in got:
            raise RuntimeError(f"WRWGD round {ctx.round + 1}: {clients[i]} failed and {s.previous}, which keeps the "
                               "only other copy of the walk's model, does not answer")
        r, holder, previous, fresh = got[s.previous].scalars, s.previous, None, False
    if ev:
        metrics.update({k: r[k] for k in ("loss", "accuracy") if k in r})
    ctx.report(**metrics)
    return ServerState(clients.index(holder), s.walk, previous, fresh)


def final(ctx: NodeContext, s: ServerState) -> Bundle:
    """After the last round the PS fetches the model from the client that holds it (w^0 if nobody trained)."""
    if s.fresh:
        return ctx.initial_params()
    holder = ctx.topology.clients[s.at]
    got = ctx.comm.scatter([holder], "wrwgd.collect", None, {}, expect=ctx.initial_params())
    if holder not in got:
        raise RuntimeError(f"WRWGD: could not collect the final model from {holder}")
    return got[holder].bundle


register(Algorithm("wrwgd", WRWGDOptions, init, server_round, final=final, node_state=node_state,
                   needs_edges=False, handoff_slots=(SLOT,), peers="random"))
