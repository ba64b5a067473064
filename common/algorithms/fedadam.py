"""FedAdam (Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2 with the Adam server update).

A baseline of FGDRO (spec fgdro.md section 5). Clients run I local SGD steps from wbar (the FedAvg client
step, shared with :mod:`fedavg`); the server treats the mean change as a pseudo-gradient and takes an Adam
step:

    delta = mean_i (w_i - wbar)
    m <- b1 m + (1 - b1) delta ;  v <- b2 v + (1 - b2) delta^2 ;  wbar <- wbar + eta_g m / (sqrt(v) + tau)

with m_{-1} = 0 and v_{-1} = tau^2 (Reddi: v_{-1} >= tau^2), no bias correction. Adaptivity lives only on the
server, which is the contrast the FGDRO paper draws with LocalAdam / FGDRO-KL-Adam. Payload: d floats each
way.
Clients missing at the deadline are left out of the mean; with nobody present the model is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedhop.common.algorithms.fedavg import cluster_rounds
from fedhop.common.algorithms.participation import ParticipationState
from fedhop.common.engine.api import Algorithm, NodeContext, register
from fedhop.common.options.fedadam import FedAdamOptions  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, sub


@dataclass
class ServerState:
    model: Bundle  # w
    m: Bundle  # server first moment
    v: Bundle  # server second moment
    participation: ParticipationState = field(default_factory=ParticipationState)


def init(ctx: NodeContext) -> ServerState:
    o: FedAdamOptions = ctx.opts
    w = ctx.initial_params()
    return ServerState(w, {k: v.new_zeros(v.shape) for k, v in w.items()},
                       {k: v.new_full(v.shape, o.server_tau ** 2) for k, v in w.items()})


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """One FedAvg cycle; then Adam on the server with the mean update as the (negated) pseudo-gradient."""
    o: FedAdamOptions = ctx.opts
    w, m, v2 = s.model, s.m, s.v
    avg, weight = cluster_rounds(ctx, w, 1, s.participation)
    if weight > 0:
        delta = sub(avg, w)                                            # pseudo-gradient (negated)
        for k in w:
            m[k] = o.server_beta1 * m[k] + (1 - o.server_beta1) * delta[k]
            v2[k] = o.server_beta2 * v2[k] + (1 - o.server_beta2) * delta[k] * delta[k]
            w[k] = w[k] + o.server_lr * m[k] / (v2[k].sqrt() + o.server_tau)
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(w))
    return ServerState(w, m, v2, s.participation)


register(Algorithm("fedadam", FedAdamOptions, init, server_round,
                   needs_edges=False))
