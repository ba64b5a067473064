"""DRFA: Distributionally Robust Federated Averaging (Deng, Kamani, Mahdavi, NeurIPS 2020, Algorithm 1).

A baseline of FGDRO (spec fgdro.md section 5): min_w max_{lambda in simplex} sum_i lambda_i f_i(w), i.e. the
CVaR objective with K = 1. The server keeps the mixing weights lambda; one round s:

1. draw ``clients_per_round`` = m clients D ~ lambda (with replacement) and t' ~ Unif{1..I}; send w (and t');
2. each client in D runs I local SGD steps from w, replying its final model and its snapshot w^(t') (2d up);
3. the server averages the finals into the new w and the snapshots into w^(t') (each drawn client counted
   as often as it was drawn, so the mean is an unbiased estimate of sum_i lambda_i w_i);
4. m clients U drawn uniformly without replacement get w^(t') (d down) and reply their minibatch loss
   f_i(w^(t'); z) as one float;
5. v_i = (N/|U|) f_i for i in U, 0 otherwise, and lambda <- Proj_simplex(lambda + I * gamma * v).

lambda changes only at communication rounds, which is what the FGDRO paper blames for DRFA's O(1/eps^12)
communication. Options from the authors' FedTorch code [R] are exposed: ``lambda_init`` = data_size (n_i/n),
``lambda_floor`` (floor lambda then renormalise), ``gamma_decay`` (FedTorch multiplies gamma by 0.9 every
round; the default here, 1.0, keeps gamma fixed as in the paper's analysis) and ``aggregation`` = "lambda"
(FedTorch weights the replies by lambda_i instead of by draw counts).

Missing clients: a D client that does not reply is left out of the means; a U client that does not reply
contributes v_i = 0 and the scale is N / (number of U replies). If no D client replies, w is unchanged.

DRFA-Prox (the same paper, Algorithm 2; spec fgdro.md section 5: "replaces (5) with a prox/ascent step on
sum_i lambda_i f_i - reg(lambda)"), ``drfa-prox``: the regularised game

    min_w max_{lambda in simplex}  sum_i lambda_i f_i(w) - tau KL(lambda || 1/N),
    KL(lambda || 1/N) = sum_i lambda_i log(N lambda_i),

whose value is tau log((1/N) sum_i exp(f_i(w) / tau)), FGDRO's KL objective (FGDRO eq. (5)) with tau = its
lambda. Steps 1-4 as above, except that with ``loss_at = "final"`` (Algorithm 2) the clients in D return only
their final model (d up) and U evaluates f_i at the new average w; step 5 becomes

    lambda <- prox_{I gamma g}(lambda + I gamma v),   g(lambda) = tau KL(lambda || 1/N)

with ``prox = "euclidean"`` (the paper's: argmin_{u in simplex} 1/2 ||u - y||^2 + I gamma tau KL(u || 1/N); KKT
gives u_i = c W((y_i - nu - c)/c - log N - log c) with c = I gamma tau, W the Wright omega function, and nu the
root of sum_i u_i = 1) or ``prox = "entropic"`` (the same step with the KL divergence to lambda in place of
1/2 ||u - y||^2, in closed form: u_i proportional to (lambda_i exp(I gamma v_i))^(1 / (1 + I gamma tau))). The
KL term keeps lambda > 0, so the default ``lambda_floor`` is 0. The spec leaves tau, the prox geometry and
where f_i is evaluated open: ``reg``, ``prox`` and ``loss_at`` are the named options.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import wrightomega

from fedhop.common.algorithms.fgdro import scalar_tensor
from fedhop.common.algorithms.local import LocalSolver, local_train, loss_and_grad, sample_batch
from fedhop.common.engine.api import Algorithm, NodeContext, Reply, Scalar, register, task
from fedhop.common.options.drfa import DRFAOptions, DRFAProxOptions  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, prefixed, unprefixed, weighted_mean

W, SNAP = "w.", "snap."


def project_simplex(y: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {p >= 0, sum p = 1} (sort-based, Held et al. 1974 / Duchi et al. 2008)."""
    u = np.sort(y)[::-1]
    css = np.cumsum(u) - 1.0
    ks = np.arange(1, len(y) + 1)
    rho = int(np.nonzero(u - css / ks > 0)[0][-1])
    return np.maximum(y - css[rho] / (rho + 1), 0.0)


@task("drfa.train")
def drfa_train(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client in D: I local SGD steps from w; reply the final model and the snapshot after t' steps."""
    o: DRFAOptions = ctx.opts
    steps, t_snap = o.local_steps, int(args["t_snap"])
    gen = ctx.rng("drfa.train", ctx.round)
    first = LocalSolver(steps=t_snap, lr=o.lr, batch_size=o.batch_size)
    snap, _ = local_train(ctx.ws, bundle, ctx.data, first, gen)
    rest = LocalSolver(steps=steps - t_snap, lr=o.lr, batch_size=o.batch_size)
    final, _ = local_train(ctx.ws, snap, ctx.data, rest, gen) if steps > t_snap else (dict(snap), 0.0)
    return Reply({**prefixed(W, final), **prefixed(SNAP, snap)})


@task("drfa.loss")
def drfa_loss(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client in U: the minibatch loss f_i(w^(t'); z), one float up."""
    x, y = sample_batch(ctx.data, ctx.opts.batch_size, ctx.rng("drfa.loss", ctx.round))
    loss, _ = loss_and_grad(ctx.ws, bundle, x, y)
    return Reply({"loss": scalar_tensor(loss, bundle)})


@dataclass
class ServerState:
    model: Bundle  # w
    lam: np.ndarray  # lambda, the mixing weights over clients
    gamma: float  # the current ascent step size


def init(ctx: NodeContext) -> ServerState:
    o: DRFAOptions = ctx.opts
    clients = ctx.children
    n = len(clients)
    sizes = np.array([ctx.data_size(c) for c in clients], dtype=float)
    lam = sizes / sizes.sum() if o.lambda_init == "data_size" else np.full(n, 1.0 / n)
    return ServerState(ctx.initial_params(), lam, o.gamma)


def draw_clients(ctx: NodeContext, o: DRFAOptions, lam: np.ndarray) -> tuple[np.random.Generator, np.ndarray, int]:
    """Step 1 (DRFA and DRFA-Prox): m draws with replacement from lambda on the round's stream; returns the
    stream (later steps draw from it too), how often each client was drawn, and m."""
    n = len(ctx.children)
    m = min(o.clients_per_round or n, n)
    rng = ctx.np_rng("drfa", ctx.round)
    return rng, np.bincount(rng.choice(n, size=m, replace=True, p=lam), minlength=n), m


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """Steps 1-5 of DRFA's round r."""
    o: DRFAOptions = ctx.opts
    clients = ctx.children
    n = len(clients)
    w, lam, gamma = s.model, s.lam, s.gamma
    rng, draws, m = draw_clients(ctx, o, lam)                                            # step 1
    t_snap = int(rng.integers(1, o.local_steps + 1))
    chosen = [clients[i] for i in range(n) if draws[i] > 0]
    replies = ctx.comm.scatter(chosen, "drfa.train", w, {"t_snap": t_snap},            # step 2
                               expect={**prefixed(W, w), **prefixed(SNAP, w)})
    if replies:                                                                          # step 3
        idx = {c: i for i, c in enumerate(clients)}
        wt = {c: float(draws[idx[c]] if o.aggregation == "draws" else lam[idx[c]]) for c in replies}
        avg = weighted_mean((wt[c], rep.bundle) for c, rep in replies.items())
        w, w_snap = unprefixed(W, avg), unprefixed(SNAP, avg)
        picked = sorted(rng.choice(n, size=m, replace=False).tolist())                   # step 4
        losses = ctx.comm.scatter([clients[i] for i in picked], "drfa.loss", w_snap, {},
                                  expect={"loss": scalar_tensor(0.0, w)})
        if losses:                                                                       # step 5
            v = np.zeros(n)
            for c, rep in losses.items():
                v[idx[c]] = n / len(losses) * float(rep.bundle["loss"])
            lam = project_simplex(lam + o.local_steps * gamma * v)
            if o.lambda_floor > 0:
                lam = np.maximum(lam, o.lambda_floor)
                lam = lam / lam.sum()
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(w), lambda_max=float(lam.max()), lambda_argmax=int(lam.argmax()))
    return ServerState(w, lam, gamma * o.gamma_decay)


register(Algorithm("drfa", DRFAOptions, init, server_round,
                   needs_edges=False))


# ---------------------------------------------------------------------------------------------------------
# DRFA-Prox: the KL-regularised variant (Algorithm 2)
# ---------------------------------------------------------------------------------------------------------


def kl_prox_euclidean(y: np.ndarray, c: float) -> np.ndarray:
    """argmin_{u in simplex} 1/2 ||u - y||^2 + c sum_i u_i log(N u_i), c > 0.

    Stationarity: u_i + c log u_i = y_i - nu - c - c log N, i.e. u_i = c * omega((y_i - nu - c)/c - log N -
    log c) with omega the Wright omega function (omega + log omega = z); nu is the root of sum_i u_i = 1."""
    n = len(y)

    def u_of(nu: float) -> np.ndarray:
        return c * np.real(wrightomega((y - nu - c) / c - np.log(n) - np.log(c)))

    lo, hi = float(y.min()) - 1.0, float(y.max()) + 1.0
    while u_of(lo).sum() < 1.0:
        lo -= 2.0 * (hi - lo)
    while u_of(hi).sum() > 1.0:
        hi += 2.0 * (hi - lo)
    nu = brentq(lambda t: u_of(t).sum() - 1.0, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    u = u_of(nu)
    return u / u.sum()


def kl_prox_entropic(lam: np.ndarray, step: float, v: np.ndarray, reg: float) -> np.ndarray:
    """argmax_{u in simplex} step <v, u> - step reg KL(u || 1/N) - KL(u || lam):
    u_i proportional to exp((log lam_i + step v_i) / (1 + step reg))."""
    z = (np.log(lam) + step * v) / (1.0 + step * reg)
    e = np.exp(z - z.max())
    return e / e.sum()


@task("drfa_prox.train")
def drfa_prox_train(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client in D (Algorithm 2): I local SGD steps from w; replies the final model only (d up)."""
    o: DRFAProxOptions = ctx.opts
    final, _ = local_train(ctx.ws, bundle, ctx.data, LocalSolver(steps=o.local_steps, lr=o.lr,
                                                                  batch_size=o.batch_size),
                           ctx.rng("drfa.train", ctx.round))
    return Reply(final)


def prox_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """DRFA-Prox round s: steps 1-4 of DRFA (f_i at the new model with ``loss_at = "final"``), then the prox step."""
    o: DRFAProxOptions = ctx.opts
    clients = ctx.children
    n = len(clients)
    w, lam, gamma = s.model, s.lam, s.gamma
    rng, draws, m = draw_clients(ctx, o, lam)                                            # step 1
    chosen = [clients[i] for i in range(n) if draws[i] > 0]
    snapshot = o.loss_at == "snapshot"
    if snapshot:                                                                         # step 2
        t_snap = int(rng.integers(1, o.local_steps + 1))
        replies = ctx.comm.scatter(chosen, "drfa.train", w, {"t_snap": t_snap},
                                   expect={**prefixed(W, w), **prefixed(SNAP, w)})
    else:
        replies = ctx.comm.scatter(chosen, "drfa_prox.train", w, {}, expect=w)
    if replies:                                                                          # step 3
        idx = {c: i for i, c in enumerate(clients)}
        wt = {c: float(draws[idx[c]] if o.aggregation == "draws" else lam[idx[c]]) for c in replies}
        avg = weighted_mean((wt[c], rep.bundle) for c, rep in replies.items())
        w, w_eval = (unprefixed(W, avg), unprefixed(SNAP, avg)) if snapshot else (avg, avg)
        picked = sorted(rng.choice(n, size=m, replace=False).tolist())                   # step 4
        losses = ctx.comm.scatter([clients[i] for i in picked], "drfa.loss", w_eval, {},
                                  expect={"loss": scalar_tensor(0.0, w)})
        if losses:                                                                       # step 5 (prox)
            v = np.zeros(n)
            for c, rep in losses.items():
                v[idx[c]] = n / len(losses) * float(rep.bundle["loss"])
            step = o.local_steps * gamma
            lam = (kl_prox_euclidean(lam + step * v, step * o.reg) if o.prox == "euclidean"
                   else kl_prox_entropic(lam, step, v, o.reg))
            if o.lambda_floor > 0:
                lam = np.maximum(lam, o.lambda_floor)
                lam = lam / lam.sum()
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(w), lambda_max=float(lam.max()), lambda_argmax=int(lam.argmax()))
    return ServerState(w, lam, gamma * o.gamma_decay)


register(Algorithm("drfa-prox", DRFAProxOptions, init, prox_round,
                   needs_edges=False))
