"""FedAsync (Xie et al. 2019, "Asynchronous Federated Optimization", Alg. 1 with the polynomial staleness
function).

The PS keeps C clients training at once (``concurrency``). A client given x^tau runs Q local steps (with the
proximal term rho/2 ||y - x^tau||^2 if ``prox_mu`` > 0, eq. 2) and sends back x_new. The PS mixes each update in
as it arrives:

    alpha_t = alpha * s(t - tau),  s(t - tau) = (t - tau + 1)^(-a)                  (Sec. 5.2, "Polynomial")
    x^{t+1} = (1 - alpha_t) x^t + alpha_t x_new                                       (Alg. 1, updater)

then hands the current model to an idle client. One round of the run = one update mixed in, so ``rounds`` = T
updates; the staleness of each is recorded (``arrivals`` and ``staleness_mean`` / ``staleness_max``). Order
matters: over the network the arrival order is recorded and ``fedhop simulate --replay RUN_DIR`` reproduces the
model from it. Unspecified: the scheduler (an idle client drawn uniformly at random, async_pool.py); a round in
which no usable update came (deadline) leaves x unchanged.
"""

from __future__ import annotations

from fedhop.common.algorithms.async_pool import ServerState, keep_busy, mean_staleness, staleness_of
from fedhop.common.engine.api import Algorithm, NodeContext, Scalar, register
from fedhop.common.options.asynchronous import FedAsyncOptions, check_spec
from fedhop.common.wire.bundle import axpy


def init(ctx: NodeContext) -> ServerState:
    """x^0 = the initial model; no task handed out yet (registered here: the module the catalogue names)."""
    return ServerState(ctx.initial_params())


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """One update: x^{t+1} = (1 - alpha_t) x^t + alpha_t x_new, alpha_t = alpha (t - tau + 1)^-a."""
    o: FedAsyncOptions = ctx.opts
    x = s.model
    keep_busy(ctx, s.pool, o.concurrency, x, "async.model", 0)
    got = ctx.comm.collect(1)
    metrics: dict[str, Scalar] = {"updates": len(got)}
    if got:
        _, r, tau = got[0]
        st = staleness_of(ctx, tau)
        a_t = o.alpha * (st + 1.0) ** (-o.staleness_exponent)
        x = axpy(a_t, r.bundle, {k: (1.0 - a_t) * v for k, v in x.items()})  # (1 - a_t) x + a_t x_new
        metrics.update({"train_loss": float(r.scalars["loss"]), "alpha_t": a_t, **mean_staleness([st])})
    if ctx.should_eval():
        metrics.update(ctx.evaluate(x))
    ctx.report(**metrics)
    return ServerState(x, s.pool)


register(Algorithm("fedasync", FedAsyncOptions, init, server_round, needs_edges=False, check=check_spec))
