"""MIFA (Gu et al. 2021, "Fast Federated Learning in the Presence of Arbitrary Device Unavailability"),
the CORRECT version of docs/specs/focus.md section 6.5 (not the FOCUS repository notebook's, which pushes
x_prev - x with the client's old local model and diverges under partial participation).

Server memory U_i (one d-vector per client, init 0). One round with participating set S_r:

    server -> i in S_r:  x                                        (d floats)
    client i:            tau local GD/SGD steps from x  ->  x_tau,i  (FedAvg's local routine, local.train)
    client -> server:    x_tau,i                                  (d floats; the server forms U_i = x - x_tau,i)
    server:              U_i <- x - x_tau,i for i in S_r (absent clients keep their stale U_i)
                         x <- x - eta_g (1/N) sum_{i=1}^N U_i

With tau = 1 this is SAG-type incremental aggregated gradient, identical to FOCUS with tau = 1 when
eta_l eta_g / N = eta (spec 3.4.3). ``empty_round="skip"`` leaves the server untouched when S_r is empty (as
FOCUS does); ``"step"`` re-applies the stale average. A lost reply leaves that client's U_i as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedhop.common.algorithms.participation import (
    ParticipationState,
    participants,
)
from fedhop.common.engine.api import Algorithm, NodeContext, register
from fedhop.common.options.mifa import MifaOptions  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, sub, weighted_sum, zeros_like


@dataclass
class ServerState:
    model: Bundle  # x
    updates: dict[str, Bundle]  # U_i: each client's latest update (stale for absent clients)
    participation: ParticipationState = field(default_factory=ParticipationState)


def init(ctx: NodeContext) -> ServerState:
    x = ctx.initial_params()
    return ServerState(x, {c: zeros_like(x) for c in ctx.topology.sort(ctx.children)})


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    o: MifaOptions = ctx.opts
    x, updates = s.model, s.updates
    clients = ctx.topology.sort(ctx.children)
    chosen = participants(ctx, o.participation, s.participation)
    if chosen or o.empty_round == "step":
        replies = ctx.comm.scatter(chosen, "local.train", x, {}, expect=x)
        for c, r in replies.items():
            updates[c] = sub(x, r.bundle)  # U_i = x - x_tau,i
        total = weighted_sum((1.0, updates[c]) for c in clients)
        x = {k: x[k] - (o.server_lr / len(clients)) * total[k] for k in x}
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(x), participants=len(chosen))
    return ServerState(x, updates, s.participation)


register(Algorithm("mifa", MifaOptions, init, server_round, needs_edges=False))
