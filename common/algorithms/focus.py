"""FOCUS and SG-FOCUS: Federated Optimization with exact Convergence via pUsh-pull Strategy.

B. Ying, Z. Li, H. Yang, "Exact and Linear Convergence for Federated Learning under Arbitrary Client
Participation is Attainable", arXiv 2503.20117 (NeurIPS 2025); specs/focus.md sections 3.3 and 3.5.

Algorithm 1 (client/server form), one round r with participating set S_r:

    server -> i in S_r:  PULL x_r                              (d floats; the tracker y is never pulled)
    client i:            x_0 = x_r, y_0 = 0
                         for t = 0..tau-1:
                             x_t = x_{t-1} - eta y_t            (t >= 1: tau-1 effective local moves)
                             y_{t+1} = y_t + grad f_i(x_t) - grad f_i(x_{t-1})
                                                               (grad f_i(x_{-1}) := g_i, the stored LAST
                                                                gradient, persistent across rounds, init 0)
                         g_i <- grad f_i(x_{tau-1})
    client i -> server:  PUSH y_tau                            (d floats)
    server:              y_{r+1} = y_r + sum_{i in S_r} y_tau,i (a SUM, never an average: spec pitfall 7)
                         x_{r+1} = x_r - eta y_{r+1}

The server needs no participation statistics. Invariant (spec 3.4.1): y = sum_i g_i after every round. The
local direction grad f_i(x_t) - g_i vanishes at the fixed point x*, g_i = grad f_i(x*) (spec 3.4.6).

SG-FOCUS (App. E, Alg. 2): every gradient is a stochastic gradient on a fresh mini-batch, and the "previous"
gradient is the STORED one, never re-evaluated on the new batch (spec pitfall 8). Here: ``batch_size > 0``.

Choices the paper leaves open (options, spec defaults):
- ``empty_round``: a round with S_r empty is skipped ("the code skips such rounds", spec 4): no messages,
  server state unchanged, the round counter still advances (the round is reported with the same model).
  ``"step"`` instead applies Algorithm 1 literally (x -= eta y with the unchanged y), which is what the matrix
  form (spec 3.2) does.
- ``init``: ``"zero"`` is Algorithm 1's own init (g_i = 0, y = 0), used in the experiments. ``"matched"`` is
  the matrix form's init (spec 3.4.5): a virtual full round with tau = 1 before round 0, i.e. every client
  computes g_i = grad f_i(x0), y = sum_i g_i and x = x0 - eta y: the engine's set-up step, whose messages are
  counted under round index SETUP_ROUND (-1).
- A participant whose push does not arrive is treated as a non-participant: its g_i is rolled back at its
  next pull (participation.ServerLedger / ClientLedger), which keeps y = sum_i g_i exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from fedhop.common.algorithms.local import loss_and_grad, sample_batch
from fedhop.common.algorithms.participation import (
    ClientLedger,
    FullParticipation,
    LedgerSnapshot,
    Participation,
    ParticipationState,
    ServerLedger,
    participants,
)
from fedhop.common.engine.api import Algorithm, NodeContext, Reply, Scalar, register, task
from fedhop.common.wire.bundle import Bundle, axpy, clone, weighted_sum, zeros_like


class FocusOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(1e-3, gt=0, description="eta: the ONE step size of local moves and of the server step")
    local_steps: int = Field(3, ge=1, description="tau: gradient evaluations per round (tau-1 local moves)")
    batch_size: int = Field(0, ge=0, description="0: full local gradient (FOCUS); > 0: SG-FOCUS mini-batch")
    participation: Participation = Field(default_factory=FullParticipation)
    empty_round: Literal["skip", "step"] = "skip"
    init: Literal["zero", "matched"] = "zero"


class SGFocusOptions(FocusOptions):
    batch_size: int = Field(32, ge=1, description="SG-FOCUS mini-batch size (a fresh batch per gradient)")


def local_tracker(ctx: NodeContext, x: Bundle, g_prev: Bundle, tau: int, eta: float, batch_size: int,
                  gen: torch.Generator) -> tuple[Bundle, Bundle]:
    """The client's tau-step routine (Alg. 1 lines 6-10); returns y_tau and the last gradient computed."""
    xt = clone(x)
    y = zeros_like(x)
    for t in range(tau):
        if t > 0:
            xt = axpy(-eta, y, xt)  # x_t = x_{t-1} - eta y_t
        xb, yb = sample_batch(ctx.data, batch_size, gen)
        _, g = loss_and_grad(ctx.ws, xt, xb, yb)
        y = {k: y[k] + g[k] - g_prev[k] for k in y}  # y_{t+1} = y_t + grad f_i(x_t) - grad f_i(x_{t-1})
        g_prev = g
    return y, g_prev


@dataclass
class ClientState:
    """Client i: g_i, the last gradient it computed (None = 0 before its first round), and the ledger."""

    g: Bundle | None = None
    ledger: LedgerSnapshot | None = None


def node_state(role: str) -> ClientState | None:
    return ClientState() if role == "client" else None


@task("focus.local")
def focus_local(ctx: NodeContext, x: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: PULL received x (the request); the reply is the PUSH of y_tau."""
    ClientLedger.begin(ctx, args, ("g",))
    st: ClientState = ctx.state
    g_prev = st.g if st.g is not None else zeros_like(x)
    gen = ctx.rng("focus.local", ctx.round)
    o: FocusOptions = ctx.opts
    y, st.g = local_tracker(ctx, x, g_prev, int(args["local_steps"]), o.lr, o.batch_size, gen)
    return Reply(y)


@dataclass
class ServerState:
    """x_r, the tracker y_r (= sum_i g_i after every round, spec 3.4.1), the participation process and the
    ledger of lost pushes."""

    model: Bundle
    y: Bundle
    participation: ParticipationState = field(default_factory=ParticipationState)
    ledger: ServerLedger = field(default_factory=ServerLedger)


def init(ctx: NodeContext) -> ServerState:
    """Algorithm 1's init: x_0, y_0 = 0 (and g_i = 0 on every client)."""
    x = ctx.initial_params()
    return ServerState(x, zeros_like(x))


def setup(ctx: NodeContext, s: ServerState) -> ServerState:
    """Set-up step: with ``init = "matched"`` (spec 3.4.5) a virtual full round with tau = 1 before round 0."""
    if ctx.opts.init != "matched":
        return s
    return _pull_push(ctx, list(ctx.children), s, local_steps=1)


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """Round r (Alg. 1): draw S_r, pull x_r, push y_tau, sum, step."""
    o: FocusOptions = ctx.opts
    chosen = participants(ctx, o.participation, s.participation)
    if chosen or o.empty_round == "step":
        s = _pull_push(ctx, chosen, s, o.local_steps)
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(s.model), participants=len(chosen))
    return s


def _pull_push(ctx: NodeContext, chosen: list[str], s: ServerState, local_steps: int) -> ServerState:
    o: FocusOptions = ctx.opts
    x, y, eta = s.model, s.y, o.lr
    args: dict[str, Scalar] = {"local_steps": local_steps, **s.ledger.args_for(chosen)}
    replies = ctx.comm.scatter(chosen, "focus.local", x, args, expect=x)
    s.ledger.settle(ctx.round, chosen, replies)
    if replies:
        push = weighted_sum((1.0, r.bundle) for r in replies.values())  # canonical order; a SUM
        y = {k: y[k] + push[k] for k in y}  # y_{r+1} = y_r + sum_{i in S_r} y_tau,i
    x = axpy(-eta, y, x)  # x_{r+1} = x_r - eta y_{r+1}
    return ServerState(x, y, s.participation, s.ledger)


register(Algorithm("focus", FocusOptions, init, server_round, setup=setup, node_state=node_state,
                   summary="FOCUS (Ying et al. 2025, Alg. 1): push-pull, exact under arbitrary participation",
                   needs_edges=False))
register(Algorithm("sg-focus", SGFocusOptions, init, server_round, setup=setup,
                   node_state=node_state, summary="SG-FOCUS (Ying et al. 2025, Alg. 2): stochastic FOCUS",
                   needs_edges=False))
