"""DR-DSGD (Issaid, Elgabli, Bennis 2022, "DR-DSGD: A Distributionally Robust Decentralized Learning
Algorithm over Graphs"), used by FGDRO as a baseline with periodic server averaging (spec fgdro.md section 5).

It solves the KL-regularised DRO problem in the form min_w (1/N) sum_i E exp(l_i(w)/mu) (the same
minimisers as mu log mean exp), with the biased plug-in local step

    w <- w - eta (1/mu) exp(l(w; z)/mu) grad l(w; z)

where l(w; z) is the minibatch loss. The original algorithm gossips over a graph; as in the FGDRO experiments
the clients here average through the server every I local steps (uniform mean, d floats each way). The
optional ``exp_shift`` c computes exp((l - c)/mu), which only rescales the step by exp(-c/mu) (overflow
safety, as in FGDRO spec section 9). Clients missing at the deadline are left out of the mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedhop.common.algorithms.fgdro import local_batches, uniform_mean
from fedhop.common.engine.api import Algorithm, NodeContext, Reply, Scalar, register, task
from fedhop.common.options.dr_dsgd import DRDSGDOptions  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle


@task("dr_dsgd.round")
def client_round(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: I local steps w -= eta/mu * exp(l/mu) * grad l from the server's model."""
    w = dict(bundle)
    o: DRDSGDOptions = ctx.opts
    lr, mu, c = o.lr, o.mu, o.exp_shift
    for loss, g in local_batches(ctx, w, o.local_steps, o.batch_size, "dr_dsgd"):
        scale = lr / mu * math.exp((loss - c) / mu)
        for k in w:
            w[k] = w[k] - scale * g[k]
    return Reply(w)


@dataclass
class ServerState:
    model: Bundle  # w


def init(ctx: NodeContext) -> ServerState:
    return ServerState(ctx.initial_params())


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    replies = ctx.comm.scatter(ctx.children, "dr_dsgd.round", s.model, {}, expect=s.model)
    w = uniform_mean(replies) if replies else s.model
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(w))
    return ServerState(w)


register(Algorithm("dr-dsgd", DRDSGDOptions, init, server_round,
                   needs_edges=False))
