"""ProxSkip / Scaffnew (Mishchenko, Malinovsky, Stich, Richtarik 2022, "ProxSkip: Yes! Local Gradient Steps
Provably Lead to Communication Acceleration! Finally!", Algorithm 1 = ProxSkip, Algorithm 2 = Scaffnew), the
FOCUS Figure 4 baseline as specified in docs/specs/focus.md section 6 item 4 (the authors' notebook variant).

ProxSkip, client i, local step t (control variate h_i, init 0; probability of communicating p):

    xhat_{i,t+1} = x_{i,t} - gamma (grad f_i(x_{i,t}) - h_{i,t})                      (Alg. 1 line 3)
    if communicating:  x_{t+1} = prox_{(gamma/p) psi}(xhat_{t+1} - (gamma/p) h_t)      (Alg. 1 line 6;
                       Scaffnew: psi = consensus indicator, prox = average over clients,  Alg. 2 line 6)
    else:              x_{i,t+1} = xhat_{i,t+1}
    h_{i,t+1} = h_{i,t} + (p/gamma) (x_{i,t+1} - xhat_{i,t+1})                         (Alg. 1 line 9)

As in the FOCUS notebook (spec 6.4), communication is deterministic every tau local steps, p = 1/tau, so one
round with participating set S is:

    server -> i in S:  x                                                               (d floats)
    client i:          x_last_i = its own last local model (x^0 before its first round);
                       h_i <- h_i + (x - x_last_i) / (gamma tau)                       (line 9, deferred to the pull)
                       y <- x;  tau times:  y <- y - gamma (g_i(y) - h_i)               (line 3)
                       x_last_i <- y
    client -> server:  y                       (``average = "model"``, the notebook: "the server averages the x_i")
                       y - gamma tau h_i       (``average = "shifted"``, Alg. 2 line 6's argument)      (d floats)
    server:            x <- (1/|S|) sum_{i in S} upload_i                              (line 6: the prox = mean)

Under full participation sum_i h_i = 0 stays exact, the two averages coincide, and ProxSkip equals SCAFFOLD's
fixed point iteration (FOCUS Fig. 4: "SCAFFOLD and ProxSkip ... theoretical equivalence"). Under partial
participation x_last_i is stale, so the h update of line 9 uses a model from many rounds ago: ProxSkip is "not
designed for these conditions" and diverges (Fig. 4). Both options are kept so that this can be checked.

g_i is a mini-batch gradient (``batch_size`` > 0, fresh batch per step) or the full local gradient (0). A
participant whose reply is lost counts as absent: its (h_i, x_last_i) are rolled back at its next task
(participation.ClientLedger), as if it had not been sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedhop.common.algorithms.local import loss_and_grad, sample_batch
from fedhop.common.algorithms.participation import (
    ClientLedger,
    LedgerSnapshot,
    ParticipationState,
    ServerLedger,
    participants,
)
from fedhop.common.engine.api import Algorithm, NodeContext, Reply, Scalar, register, task
from fedhop.common.options.proxskip import ProxSkipOptions  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, weighted_mean, zeros_like


@dataclass
class ClientState:
    """Client i: h_i (None = 0), its last local model x_last_i (None = x^0) and the ledger."""

    h: Bundle | None = None
    x_last: Bundle | None = None
    ledger: LedgerSnapshot | None = None


def node_state(role: str) -> ClientState | None:
    return ClientState() if role == "client" else None


@task("proxskip.local")
def proxskip_local(ctx: NodeContext, x: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: line 9 with the pulled x (deferred from the last round), tau steps of line 3, upload."""
    ClientLedger.begin(ctx, args, ("h", "x_last"))
    st: ClientState = ctx.state
    o: ProxSkipOptions = ctx.opts
    eta, tau = o.lr, o.local_steps
    x_last = st.x_last if st.x_last is not None else ctx.initial_params()
    h = st.h if st.h is not None else zeros_like(x)
    h = {k: h[k] + (x[k] - x_last[k]) / (eta * tau) for k in h}
    gen = ctx.rng("proxskip.local", ctx.round)
    y = {k: v.clone() for k, v in x.items()}
    for _ in range(tau):
        xb, yb = sample_batch(ctx.data, o.batch_size, gen)
        _, g = loss_and_grad(ctx.ws, y, xb, yb)
        y = {k: y[k] - eta * (g[k] - h[k]) for k in y}
    st.h, st.x_last = h, y
    up = y if o.average == "model" else {k: y[k] - eta * tau * h[k] for k in y}
    return Reply(up)


@dataclass
class ServerState:
    model: Bundle  # x
    participation: ParticipationState = field(default_factory=ParticipationState)
    ledger: ServerLedger = field(default_factory=ServerLedger)


def init(ctx: NodeContext) -> ServerState:
    return ServerState(ctx.initial_params())


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """Round r: pull x to S_r, x <- the uniform mean of the uploads (x unchanged if none arrives)."""
    o: ProxSkipOptions = ctx.opts
    x = s.model
    chosen = participants(ctx, o.participation, s.participation)
    replies = ctx.comm.scatter(chosen, "proxskip.local", x, s.ledger.args_for(chosen), expect=x)
    s.ledger.settle(ctx.round, chosen, replies)
    if replies:
        x = weighted_mean((1.0, r.bundle) for r in replies.values())
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(x), participants=len(chosen))
    return ServerState(x, s.participation, s.ledger)


register(Algorithm("proxskip", ProxSkipOptions, init, server_round, node_state=node_state,
                   needs_edges=False))
