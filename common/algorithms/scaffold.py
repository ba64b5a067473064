"""SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning",
Algorithm 1 with option II), as specified in docs/specs/focus.md section 6.3 and docs/specs/fgdro.md section 5.

One round with participating set S (server control variate c, client control variates c_i, init 0):

    server -> i in S:  x, c                                          (2d floats)
    client i:          y = x;  tau times:  y <- y - eta_l (g_i(y) - c_i + c)        (Alg. 1 line 10)
                       c_i+ = c_i - c + (x - y) / (tau eta_l)                        (option II, line 12)
    client -> server:  dy_i = y - x,  dc_i = c_i+ - c_i;  c_i <- c_i+                (2d floats)
    server:            x <- x + eta_g (1/|S|) sum_{i in S} dy_i                      (line 16)
                       c <- c + (1/N) sum_{i in S} dc_i                              (line 17)

g_i is a mini-batch gradient (``batch_size`` > 0, fresh batch per step) or the full local gradient (0).
A participant whose reply is lost counts as absent: its c_i is rolled back at its next task
(participation.ClientLedger), so c = (1/N) sum_i c_i stays exact. ``weight_decay`` adds wd * y to g_i.
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
from fedhop.common.options.scaffold import ScaffoldOptions  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, prefixed, unprefixed, weighted_mean, weighted_sum, zeros_like


@dataclass
class ClientState:
    """Client i: its control variate c_i (None = 0 before its first round) and the ledger."""

    c: Bundle | None = None
    ledger: LedgerSnapshot | None = None


def node_state(role: str) -> ClientState | None:
    return ClientState() if role == "client" else None


@task("scaffold.local")
def scaffold_local(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: tau corrected local steps from x; replies (dy, dc) and keeps c_i+ (option II)."""
    ClientLedger.begin(ctx, args, ("c",))
    st: ClientState = ctx.state
    x, c = unprefixed("x.", bundle), unprefixed("c.", bundle)
    ci = st.c if st.c is not None else zeros_like(c)
    o: ScaffoldOptions = ctx.opts
    eta, tau, wd = o.lr, o.local_steps, o.weight_decay
    gen = ctx.rng("scaffold.local", ctx.round)
    y = {k: v.clone() for k, v in x.items()}
    for _ in range(tau):
        xb, yb = sample_batch(ctx.data, o.batch_size, gen)
        _, g = loss_and_grad(ctx.ws, y, xb, yb)
        y = {k: y[k] - eta * (g[k] + wd * y[k] - ci[k] + c[k]) for k in y}
    ci_new = {k: ci[k] - c[k] + (x[k] - y[k]) / (tau * eta) for k in ci}
    st.c = ci_new
    dy = {k: y[k] - x[k] for k in y}
    dc = {k: ci_new[k] - ci[k] for k in ci}
    return Reply({**prefixed("dy.", dy), **prefixed("dc.", dc)})


@dataclass
class ServerState:
    model: Bundle  # x
    c: Bundle  # the server control variate
    participation: ParticipationState = field(default_factory=ParticipationState)
    ledger: ServerLedger = field(default_factory=ServerLedger)


def init(ctx: NodeContext) -> ServerState:
    x = ctx.initial_params()
    return ServerState(x, zeros_like(x))


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    o: ScaffoldOptions = ctx.opts
    x, c = s.model, s.c
    n = len(ctx.children)
    expect = {**prefixed("dy.", x), **prefixed("dc.", x)}
    chosen = participants(ctx, o.participation, s.participation)
    replies = ctx.comm.scatter(chosen, "scaffold.local", {**prefixed("x.", x), **prefixed("c.", c)},
                               s.ledger.args_for(chosen), expect=expect)
    s.ledger.settle(ctx.round, chosen, replies)
    if replies:
        dy = weighted_mean((1.0, unprefixed("dy.", r.bundle)) for r in replies.values())
        dc = weighted_sum((1.0, unprefixed("dc.", r.bundle)) for r in replies.values())
        x = {k: x[k] + o.server_lr * dy[k] for k in x}
        c = {k: c[k] + dc[k] / n for k in c}
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(x), participants=len(chosen))
    return ServerState(x, c, s.participation, s.ledger)


register(Algorithm("scaffold", ScaffoldOptions, init, server_round, node_state=node_state,
                   needs_edges=False))
