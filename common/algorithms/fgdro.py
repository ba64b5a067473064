"""FGDRO-CVaR, FGDRO-KL, FGDRO-KL-Adam and the LocalAdam ablation.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization", NeurIPS 2024
(spec: docs/specs/fgdro.md). The server only AVERAGES (uniformly, 1/N) what the clients send; all robustness
is computed on the clients from a client-held moving average u_i of the client's own loss, which persists in
the client's ``ctx.state`` and is never sent.

* FGDRO-CVaR (Alg. 1) minimises eq. (2), F(w, s) = (1/N) sum_i (g_i(w) - s)_+ + (K/N) s, whose minimum over s
  is (K/N) * mean of the top-K client losses. Per local step:
      u <- (1-beta1) u + beta1 l(w; z)                               (Alg.1 line 6)
      a = 1[u > s];  s <- s - eta2 (-a + K/N)                        (line 7)
      w <- w - eta1 a grad l(w; z)                                   (line 8)
  and the server averages (w, s): d + 1 floats each way per client per round (line 10).
* FGDRO-KL (Alg. 2) minimises eq. (5), lambda log mean_i exp(l_i(w)/lambda), with gradient eq. (6):
      u <- (1-beta1) u + beta1 l(w; z);  v <- (1-beta2) v + beta2 exp(u/lambda)      (line 6)
      h = exp(u/lambda)/v grad l(w; z);  m <- (1-beta3) m + beta3 h                   (line 7)
      w <- w - eta m                                                                  (line 8)
  and the server averages (w, m, v): 2d + 1 floats (line 10).
* FGDRO-KL-Adam (Alg. 3) adds q <- (1-beta4) q + beta4 h^2 and w <- w - eta m / (sqrt(q) + tau), no bias
  correction; the server averages (w, m, q, v): 3d + 1 floats.
* LocalAdam (App. D, Alg. 4) is Alg. 3 with h = grad l and no u, v: 3d floats.

Errata fixed as the spec's section 10 says: (1) Alg.1 line 3 ``u^{r-1}_{0,I}`` -> ``u^{r-1}_{i,I}`` (u
persists per client); (2) Alg.2/3 line 7 ``exp(u)/v`` -> ``exp(u/lambda)/v``; (3) Sec.6
``q = (1-b4) m + b4 h`` -> Alg.3's ``q = (1-b4) q + b4 h^2``; (4) Alg.3 line 11 ``q^{r+1}`` is the server
average ``qbar^{r+1}``; (6) m (and q) are averaged as the boxes say, not only w and v as the prose says.

Participation: the paper has every client in every round. A client missing at the deadline is left out of
that round's averages (the mean is over the clients present); its u_i simply does not advance. If nobody
replies the server state is unchanged. The output is the final averaged model wbar^{R+1} (spec [S]; the
paper's random iterate is not used in its experiments either).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedhop.common.algorithms.local import loss_and_grad, sample_batch
from fedhop.common.engine.api import Algorithm, LinkKind, NodeContext, PayloadFormula, Reply, Scalar, register, task
from fedhop.common.options.fgdro import FGDROCVaROptions, FGDROKLAdamOptions, FGDROKLOptions, LocalAdamOptions  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, prefixed, unprefixed, weighted_mean

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec
    from fedhop.common.topology import Topology

# What travels: the model under "w.", the momentum under "m.", the second moment under "q.", and the one
# scalar ("s" for CVaR, "v" for KL) as a 0-d tensor so that it is counted as payload. u_i has no wire name.
W, M, Q = "w.", "m.", "q."


# ----------------------------------------------------------------------------------------------------------
# options
# ----------------------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------------------
# the objectives (for evaluation; the algorithms never need them)
# ----------------------------------------------------------------------------------------------------------
def cvar_objective(losses: Sequence[float], K: float) -> float:
    """min_s F(w, s) of eq. (2) for client losses g_i(w): min_s (1/N) sum_i (g_i - s)_+ + (K/N) s.

    Convex and piecewise linear in s with slope (K - #{g_i > s})/N, so the minimum sits at one of the g_i.
    For integer K it equals (K/N) * mean of the K largest g_i (spec 1.2).
    """
    g = np.asarray(losses, dtype=np.float64)
    n = len(g)
    return float(min(np.maximum(g - s, 0.0).sum() / n + K / n * s for s in g))


def kl_objective(losses: Sequence[float], lam: float) -> float:
    """F(w) of eq. (5): lambda log((1/N) sum_i exp(g_i(w)/lambda)), computed with a max shift."""
    g = np.asarray(losses, dtype=np.float64)
    c = float(g.max())
    return float(lam * np.log(np.mean(np.exp((g - c) / lam))) + c)


# ----------------------------------------------------------------------------------------------------------
# shared client pieces
# ----------------------------------------------------------------------------------------------------------
def local_batches(ctx: NodeContext, w: Bundle, steps: int, batch_size: int, stream: str
                  ) -> Iterator[tuple[float, Bundle]]:
    """Yield (l(w; z), grad l(w; z)) for ``steps`` fresh minibatches z, each at the CURRENT ``w``.

    The caller updates ``w`` in place (reassigning its entries) between steps; one forward/backward per step
    and the same z for the loss and the gradient (spec 2.2 details).
    """
    gen = ctx.rng(stream, ctx.round)
    for _ in range(steps):
        x, y = sample_batch(ctx.data, batch_size, gen)
        yield loss_and_grad(ctx.ws, w, x, y)


def scalar_tensor(value: float, like: Bundle) -> torch.Tensor:
    """A 0-d tensor in the model's dtype: one float of payload."""
    ref = next(iter(like.values()))
    return torch.tensor(value, dtype=ref.dtype, device=ref.device)


def uniform_mean(replies: dict[str, Reply]) -> Bundle:
    """(1/|present|) sum_i bundle_i over the replies, in canonical order (Alg.1/2/3 line 10)."""
    return weighted_mean((1.0, r.bundle) for r in replies.values())


@dataclass
class ClientState:
    """Client i: its moving average u_i of the loss (never sent); None until its first round."""

    u: float | None = None


def node_state(role: str) -> ClientState | None:
    return ClientState() if role == "client" else None


def _client_u(ctx: NodeContext, default: float) -> float:
    u = ctx.state.u
    return float(default if u is None else u)


@dataclass
class ServerState:
    """The averaged bundle: wbar (under "w."), and sbar / mbar / qbar / vbar as the algorithm has them."""

    avg: Bundle

    @property
    def model(self) -> Bundle:
        return unprefixed(W, self.avg)


@dataclass(frozen=True)
class KLStep:
    """Hyperparameters of one FGDRO-KL / -KL-Adam / LocalAdam local step (Alg. 2/3/4 lines 6-8)."""

    lr: float
    beta1: float
    beta2: float
    beta3: float
    lam: float
    shift: float
    clip: float  # 0 = no clip, else the weight is clipped at clip (already multiplied by N)
    adam: bool
    beta4: float
    tau: float
    weighted: bool  # False: LocalAdam (h = grad l, no u, v)


def kl_weight(u: float, v: float, step: KLStep) -> float:
    """exp(u/lambda)/v with both numerator and v kept in the shifted scale exp((. - c)/lambda) (spec 9)."""
    wgt = math.exp((u - step.shift) / step.lam) / v
    return min(wgt, step.clip) if step.clip > 0 else wgt


def kl_client_round(ctx: NodeContext, w: Bundle, m: Bundle, q: Bundle, v: float, u: float, step: KLStep,
                    steps: int, batch_size: int) -> tuple[float, float]:
    """I local steps of Alg. 2 (or 3, or 4); updates w, m, q in place; returns the new (v, u)."""
    for loss, g in local_batches(ctx, w, steps, batch_size, "fgdro.kl"):
        wgt = 1.0
        if step.weighted:
            u = (1 - step.beta1) * u + step.beta1 * loss                              # line 6
            e = math.exp((u - step.shift) / step.lam)                        # erratum 2: exp(u/lambda)
            v = (1 - step.beta2) * v + step.beta2 * e                                 # line 6
            wgt = kl_weight(u, v, step)
        for k in w:
            h = wgt * g[k]                                                            # line 7
            m[k] = (1 - step.beta3) * m[k] + step.beta3 * h                           # line 7
            if step.adam:
                q[k] = (1 - step.beta4) * q[k] + step.beta4 * h * h         # Alg.3 line 8 (erratum 3)
                w[k] = w[k] - step.lr * m[k] / (q[k].sqrt() + step.tau)               # Alg.3 line 9
            else:
                w[k] = w[k] - step.lr * m[k]                                          # Alg.2 line 8
    return v, u


# ----------------------------------------------------------------------------------------------------------
# FGDRO-CVaR (Algorithm 1)
# ----------------------------------------------------------------------------------------------------------
@task("fgdro.cvar.round")
def cvar_client_round(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client i, one round of Alg. 1: from (wbar, sbar) run I local steps; reply (w_{i,I}, s_{i,I})."""
    w = unprefixed(W, bundle)
    s = float(bundle["s"])
    o: FGDROCVaROptions = ctx.opts
    u = _client_u(ctx, o.u_init)   # erratum 1: u^r_{i,0} = u^{r-1}_{i,I}, this client's own
    lr, lr_s, beta1 = o.lr, o.lr_s if o.lr_s is not None else o.lr, o.beta1
    k_over_n = o.K / len(ctx.topology.clients)
    for loss, g in local_batches(ctx, w, o.local_steps, o.batch_size, "fgdro.cvar"):
        u = (1 - beta1) * u + beta1 * loss                       # line 6
        a = 1.0 if u > s else 0.0                                # a in df(u - s), strict at the kink (spec 9)
        s = s - lr_s * (-a + k_over_n)                           # line 7
        if a:
            for k in w:
                w[k] = w[k] - lr * g[k]                          # line 8: w -= eta1 * a * grad l
    ctx.state.u = u
    return Reply({**prefixed(W, w), "s": scalar_tensor(s, w)})


def init_cvar(ctx: NodeContext) -> ServerState:
    o: FGDROCVaROptions = ctx.opts
    if len(ctx.children) < o.K:
        raise ValueError(f"fgdro-cvar: K = {o.K} exceeds the number of clients N = {len(ctx.children)}")
    w = ctx.initial_params()
    return ServerState({**prefixed(W, w), "s": scalar_tensor(o.s_init, w)})


def round_cvar(ctx: NodeContext, st: ServerState) -> ServerState:
    """Alg. 1, one round: every client runs I local steps from (wbar, sbar); the server averages."""
    replies = ctx.comm.scatter(ctx.children, "fgdro.cvar.round", st.avg, {}, expect=st.avg)
    if replies:
        st = ServerState(uniform_mean(replies))                  # line 10: wbar, sbar
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(st.model), s_bar=float(st.avg["s"]), present=len(replies))
    return st


# ----------------------------------------------------------------------------------------------------------
# FGDRO-KL, FGDRO-KL-Adam (Algorithms 2, 3) and LocalAdam (Algorithm 4)
# ----------------------------------------------------------------------------------------------------------
@task("fgdro.kl.init")
def kl_client_init(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: u_i^0 = l(wbar^1; z) on a first minibatch (spec 9); reply v_i^0 = exp((u_i^0 - c)/lambda).

    wbar^1 is the run's initial model, which every node builds identically from the spec, so nothing is sent
    down; one float goes up. u_i itself stays here.
    """
    w = ctx.initial_params()
    gen = ctx.rng("fgdro.kl.init")
    step = kl_step(ctx)
    x, y = sample_batch(ctx.data, ctx.opts.batch_size, gen)
    u, _ = loss_and_grad(ctx.ws, w, x, y)
    ctx.state.u = u
    return Reply({"v": scalar_tensor(math.exp((u - step.shift) / step.lam), w)})


@task("fgdro.kl.round")
def kl_client_round_task(ctx: NodeContext, bundle: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client i, one round of Alg. 2/3/4 from (wbar, mbar[, qbar], vbar); reply the same names."""
    step = kl_step(ctx)
    w, m, q = unprefixed(W, bundle), unprefixed(M, bundle), unprefixed(Q, bundle)
    v = float(bundle["v"]) if "v" in bundle else 0.0
    u = _client_u(ctx, 0.0)  # "zero" init; the "first_batch" init put u_i^0 in ctx.state already
    v, u = kl_client_round(ctx, w, m, q, v, u, step, ctx.opts.local_steps, ctx.opts.batch_size)
    out: Bundle = {**prefixed(W, w), **prefixed(M, m)}
    if step.adam:
        out.update(prefixed(Q, q))
    if step.weighted:
        ctx.state.u = u
        out["v"] = scalar_tensor(v, w)
    return Reply(out)


def kl_step(ctx: NodeContext) -> KLStep:
    """The local step's hyperparameters from the RunSpec (every node computes them; none is sent)."""
    o = ctx.opts
    n = len(ctx.topology.clients)
    weighted = not isinstance(o, LocalAdamOptions)
    adam = isinstance(o, FGDROKLAdamOptions | LocalAdamOptions)
    return KLStep(lr=o.lr, beta1=getattr(o, "beta1", 0.0), beta2=getattr(o, "beta2", 0.0), beta3=o.beta3,
                  lam=getattr(o, "lam", 1.0), shift=getattr(o, "exp_shift", 0.0),
                  clip=(o.weight_clip * n) if weighted and o.weight_clip else 0.0, adam=adam,
                  beta4=getattr(o, "beta4", 0.0), tau=getattr(o, "tau", 0.0), weighted=weighted)


def init_kl(ctx: NodeContext) -> ServerState:
    """wbar^1 = w0, mbar^1 = qbar^1 = 0 (spec 9), vbar^1 = exp(0 / lambda) (v_init "one", shifted scale)."""
    step = kl_step(ctx)
    w = ctx.initial_params()
    zeros = {k: torch.zeros_like(t) for k, t in w.items()}
    avg: Bundle = {**prefixed(W, w), **prefixed(M, zeros)}
    if step.adam:
        avg.update(prefixed(Q, zeros))
    if step.weighted:
        avg["v"] = scalar_tensor(math.exp((0.0 - step.shift) / step.lam), w)
    return ServerState(avg)


def setup_kl(ctx: NodeContext, st: ServerState) -> ServerState:
    """Set-up step, with ``u_init = "first_batch"``: every client sets u_i^0 on a first minibatch; with
    ``v_init = "mean_exp_u"`` vbar^1 = mean_i exp(u_i^0 / lambda)."""
    o = ctx.opts
    if not kl_step(ctx).weighted or o.u_init != "first_batch":
        return st
    init = ctx.comm.scatter(ctx.children, "fgdro.kl.init", {}, {})
    if init and o.v_init == "mean_exp_u":
        return ServerState({**st.avg, "v": scalar_tensor(float(uniform_mean(init)["v"]), st.model)})
    return st


def round_kl(ctx: NodeContext, st: ServerState) -> ServerState:
    """Alg. 2/3/4, one round: I local steps at every client from the averages; the server averages."""
    step = kl_step(ctx)
    replies = ctx.comm.scatter(ctx.children, "fgdro.kl.round", st.avg, {}, expect=st.avg)
    if replies:
        st = ServerState(uniform_mean(replies))                  # line 10 (Alg.3 line 11, erratum 4)
    if ctx.should_eval():
        extra = {"v_bar": float(st.avg["v"])} if step.weighted else {}
        ctx.report(**ctx.evaluate(st.model), **extra, present=len(replies))
    return st


def payload_formula(kind: str, vectors: int, scalar: bool) -> PayloadFormula:
    """FGDRO sec. 6's payload, declared for ``fedhop check``: every round each client receives and returns
    ``vectors`` d-vectors (model, momentum, second moment) and, with ``scalar``, one scalar in the model's
    dtype: d+1 (CVaR), 2d+1 (KL), 3d+1 (KL-Adam), 3d (LocalAdam). (KL's set-up step, u_i^0, is not a round.)"""
    def formula(spec: RunSpec, topo: Topology, model_bytes: int) -> dict[LinkKind, int]:
        size = vectors * model_bytes + ((8 if spec.model.dtype == "float64" else 4) if scalar else 0)
        return {k: size for c in topo.children(topo.server) for k in ((topo.server, c, kind), (c, topo.server, kind))}
    return formula


register(Algorithm("fgdro-cvar", FGDROCVaROptions, init_cvar, round_cvar, node_state=node_state,
                   needs_edges=False, payload_per_round=payload_formula("fgdro.cvar.round", 1, True)))
register(Algorithm("fgdro-kl", FGDROKLOptions, init_kl, round_kl, setup=setup_kl, node_state=node_state,
                   needs_edges=False, payload_per_round=payload_formula("fgdro.kl.round", 2, True)))
register(Algorithm("fgdro-kl-adam", FGDROKLAdamOptions, init_kl, round_kl, setup=setup_kl, node_state=node_state,
                   needs_edges=False, payload_per_round=payload_formula("fgdro.kl.round", 3, True)))
register(Algorithm("local-adam", LocalAdamOptions, init_kl, round_kl, setup=setup_kl, node_state=node_state,
                   needs_edges=False, payload_per_round=payload_formula("fgdro.kl.round", 3, False)))
