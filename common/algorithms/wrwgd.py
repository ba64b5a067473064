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

Routing on the engine (the engine has no client-to-client link): the parameter server acts as the router of
the walk. Each round it sends the model to the visited client only (``scatter`` to one client, which reuses
the shared ``local.train`` task) and receives the updated model back, so one hop of the walk costs 2 d floats
on the meter (client -> PS -> next client) where a direct client-to-client hop would cost d. The PS draws the
next client (it knows the graph, which is a pure function of the seed, and every client's D_i). A visited
client that does not reply leaves the model unchanged; the walk moves on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhop.common.engine.api import Algorithm, NodeContext, register
from fedhop.common.engine.workspace import derive_seed
from fedhop.common.options.wrwgd import WRWGDOptions  # noqa: F401  (re-exported)
from fedhop.common.topology import edge_graph
from fedhop.common.wire.bundle import Bundle


def client_graph(n: int, max_degree: int, seed: int) -> list[set[int]]:
    """The walk's random connected client graph (same generator as the ES graph, its own seed stream)."""
    return edge_graph(n, "random", max_degree, derive_seed(seed, "wrwgd.graph"))


def mh_row(i: int, adj: list[set[int]], pi: np.ndarray) -> np.ndarray:
    """Row i of the Metropolis-Hastings transition matrix with stationary law ``pi`` on graph ``adj``."""
    p = np.zeros(len(adj))
    deg_i = len(adj[i])
    for j in sorted(adj[i]):
        p[j] = min(1.0, (pi[j] * deg_i) / (pi[i] * len(adj[j]))) / deg_i
    p[i] = max(0.0, 1.0 - p.sum())
    return p


@dataclass
class ServerState:
    model: Bundle  # w
    at: int  # index of the client the walk visits this round
    walk: np.random.Generator  # the walk's stream (its position in it is state too)


def _walk_law(ctx: NodeContext) -> tuple[list[set[int]], np.ndarray, np.ndarray]:
    o: WRWGDOptions = ctx.opts
    clients = ctx.topology.clients
    n = len(clients)
    sizes = np.array([float(ctx.data_size(c)) for c in clients])
    gamma = sizes / sizes.sum()
    pi = gamma if o.stationary == "data_size" else np.full(n, 1.0 / n)
    return client_graph(n, o.max_degree, ctx.spec.seed), gamma, pi


def init(ctx: NodeContext) -> ServerState:
    walk = ctx.np_rng("wrwgd.walk")
    return ServerState(ctx.initial_params(), int(walk.integers(len(ctx.topology.clients))), walk)


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """The visited client i runs K local steps from w (scaled by gamma_i / pi_i); the walk moves on."""
    o: WRWGDOptions = ctx.opts
    clients = ctx.topology.clients
    adj, gamma, pi = _walk_law(ctx)
    i, w = s.at, s.model
    scale = float(gamma[i] / pi[i]) if o.importance_weighting else 1.0
    replies = ctx.comm.scatter([clients[i]], "local.train", w, {"lr_scale": scale}, expect=w)
    if clients[i] in replies:
        w = replies[clients[i]].bundle
    metrics: dict[str, float | int | str] = {"client": clients[i]}
    if ctx.should_eval():
        metrics.update(ctx.evaluate(w))
    ctx.report(**metrics)
    return ServerState(w, int(s.walk.choice(len(clients), p=mh_row(i, adj, pi))), s.walk)


register(Algorithm("wrwgd", WRWGDOptions, init, server_round,
                   needs_edges=False))
