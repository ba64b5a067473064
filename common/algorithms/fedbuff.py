"""FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation", Alg. 1).

The PS keeps C clients training at once (``concurrency``); each runs Q local SGD steps from the model it was
given, x^{tau_i}, and sends back its update Delta_i = x^{tau_i} - y_i^Q. The PS takes updates as they arrive and
buffers them, each weighted by its staleness s = t - tau_i (the paper's 1/sqrt(1 + s)):

    Delta_bar += Delta_i / sqrt(1 + t - tau_i)                            (Alg. 1 line 6, with the weight)
    after K updates:  x^{t+1} = x^t - eta_g Delta_bar / K,  Delta_bar = 0  (Alg. 1 lines 7-8)

and, after every update it takes, hands the current model to an idle client (the pool stays at C). One round of
the run = one server step (K updates), so ``rounds`` = T server steps. The staleness of every update is recorded
(the round's ``arrivals`` column: ``node:round submitted``; and ``staleness_mean`` / ``staleness_max``).

Which updates fill a buffer depends on arrival order: over the network that order is real and recorded;
``fedhop simulate --replay RUN_DIR`` reproduces the networked model bit for bit from it (the in-process engine
alone orders by a virtual clock, ``[network.nodes.<id>] compute``). Unspecified: the buffer is summed in arrival
order; an update that fails validation or never comes is not counted (the buffer waits for K usable ones, each
collect up to ``transport.round_deadline_s``; a round that gets none is redone per ``transport.min_participants``).
"""

from __future__ import annotations

import math

from fedhop.common.algorithms.async_pool import ServerState, keep_busy, mean_staleness, staleness_of
from fedhop.common.engine.api import Algorithm, NodeContext, Scalar, register
from fedhop.common.options.asynchronous import FedBuffOptions, check_spec
from fedhop.common.wire.bundle import axpy, zeros_like


def init(ctx: NodeContext) -> ServerState:
    """x^0 = the initial model; no task handed out yet (registered here: the module the catalogue names)."""
    return ServerState(ctx.initial_params())


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """One server step: K staleness-weighted updates buffered, then x^{t+1} = x^t - eta_g Delta_bar / K."""
    o: FedBuffOptions = ctx.opts
    x = s.model
    buf = zeros_like(x)
    stale: list[int] = []
    losses: list[float] = []
    for k in range(o.buffer):
        keep_busy(ctx, s.pool, o.concurrency, x, "async.delta", k)
        got = ctx.comm.collect(1)
        if not got:
            break
        _, r, tau = got[0]
        st = staleness_of(ctx, tau)
        weight = 1.0 / math.sqrt(1.0 + st) if o.staleness == "sqrt" else 1.0
        buf = axpy(weight, r.bundle, buf)  # Delta_bar += s(t - tau) Delta_i
        stale.append(st)
        losses.append(float(r.scalars["loss"]))
    if stale:
        x = axpy(-o.server_lr / o.buffer, buf, x)  # x^{t+1} = x^t - eta_g Delta_bar / K
    metrics: dict[str, Scalar] = {"updates": len(stale), **mean_staleness(stale)}
    if losses:
        metrics["train_loss"] = sum(losses) / len(losses)
    if ctx.should_eval():
        metrics.update(ctx.evaluate(x))
    ctx.report(**metrics)
    return ServerState(x, s.pool)


register(Algorithm("fedbuff", FedBuffOptions, init, server_round, needs_edges=False, check=check_spec))
