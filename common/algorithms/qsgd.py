"""QSGD (Alistarh et al. 2017) and Hier-Local-QSGD (Liu, Zhang, Song, Letaief 2023, IEEE TWC 22(1):2-18), the
Fed-CHS baseline of docs/specs/fedchs.md section 5 item 3.

QSGD, s levels, per coordinate of v (one "bucket" per named tensor):

    Q_s(v_i) = ||v||_2 * sign(v_i) * xi_i / s,   l = floor(s |v_i| / ||v||),
    xi_i = l + 1 with probability s |v_i| / ||v|| - l, else l.                  (unbiased: E Q_s(v) = v)

On the wire a quantised tensor is its signed levels ``sign(v_i) * xi_i`` as **int8** plus its norm as one
float32, so the payload of a d-parameter bundle of P tensors is ``d + 4 P`` bytes instead of ``4 d``. int8
holds levels up to 127, hence ``s <= 127``; with s = 127 this equals the spec's simple accounting
``32 + d (1 + ceil(log2(s + 1)))`` bits per tensor exactly. Smaller s still travels as int8 (no bit packing).

Hier-Local-QSGD, one global round t (client-edge-cloud, all clusters in parallel):

    every edge m:  u_m <- w;  repeat tau2 times:
                       every client n in N_m: x_n <- tau1 local SGD steps from u_m
                       u_m <- u_m + sum_n (D_n / D_{A,m}) Q1(x_n - u_m)
    cloud:         w <- w + sum_m (D_{A,m} / D_A) Q2(u_m - w);   broadcast w

Paper settings (Fed-CHS App. B.1): tau1 = 5 local iterations, tau2 = 20 / 5 = 4 edge aggregations, and step
``eta_k = 1/(K sqrt(k+1))`` with K = 20, k = a * tau1 + j counting the local iterations of the round.
Downlinks (cloud -> edge, edge -> client) carry the model uncompressed (d float32). Participants missing at
the deadline are left out and the weights renormalised over those that replied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fedhop.common.algorithms.local import local_train, solver_for
from fedhop.common.engine.api import Algorithm, NodeContext, Reply, Scalar, register, task
from fedhop.common.options.qsgd import MAX_LEVELS, HierLocalQSGDOptions  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, sub, weighted_sum

LEVEL_DTYPE = torch.int8


def quantize(v: torch.Tensor, s: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """QSGD: (norm as a float32 tensor of shape [1], signed levels as int8 with the shape of ``v``)."""
    if not 1 <= s <= MAX_LEVELS:
        raise ValueError(f"QSGD levels s must be in 1..{MAX_LEVELS} (int8 on the wire), got {s}")
    x = v.detach().to(torch.float32)
    norm = torch.linalg.vector_norm(x).reshape(1)
    if float(norm) == 0.0:
        return norm, torch.zeros(x.shape, dtype=LEVEL_DTYPE, device=x.device)
    r = (s * x.abs() / norm).clamp_(max=s)
    low = torch.floor(r)
    u = torch.rand(x.shape, generator=gen).to(x.device)
    xi = (low + (u < (r - low)).to(low.dtype)).clamp_(max=s)
    return norm, (torch.sign(x) * xi).to(LEVEL_DTYPE)


def dequantize(norm: torch.Tensor, levels: torch.Tensor, s: int) -> torch.Tensor:
    return norm.to(torch.float32) * levels.to(torch.float32) / s


def encode(bundle: Mapping[str, torch.Tensor], s: int, gen: torch.Generator) -> Bundle:
    """Quantise every tensor of ``bundle``: ``{name}.q`` (int8 levels) then ``{name}.norm`` (float32 [1])."""
    out: Bundle = {}
    for k, v in bundle.items():
        norm, levels = quantize(v, s, gen)
        out[f"{k}.q"] = levels
        out[f"{k}.norm"] = norm
    return out


def decode(enc: Mapping[str, torch.Tensor], names: Mapping[str, torch.Tensor], s: int) -> Bundle:
    """Inverse of :func:`encode` (in expectation): float32 tensors named like ``names``."""
    return {k: dequantize(enc[f"{k}.norm"], enc[f"{k}.q"], s).to(names[k].dtype) for k in names}


def encoded_template(bundle: Mapping[str, torch.Tensor]) -> Bundle:
    """Names, shapes and dtypes of ``encode(bundle)`` (for ``scatter(expect=...)``)."""
    out: Bundle = {}
    for k, v in bundle.items():
        out[f"{k}.q"] = torch.zeros(v.shape, dtype=LEVEL_DTYPE)
        out[f"{k}.norm"] = torch.zeros(1, dtype=torch.float32)
    return out


def encoded_bytes(bundle: Mapping[str, torch.Tensor]) -> int:
    """Payload bytes of the QSGD encoding of ``bundle``: 1 byte per coordinate + 4 per tensor."""
    return sum(v.numel() + 4 for v in bundle.values())


def add_quantized(base: Bundle, replies: Mapping[str, Reply], weights: Mapping[str, float], s: int) -> Bundle:
    """base + sum_i (w_i / sum_j w_j) * decode(reply_i), in canonical (reply) order."""
    total = float(sum(weights[n] for n in replies))
    delta = weighted_sum((weights[n] / total, decode(r.bundle, base, s)) for n, r in replies.items())
    return {k: base[k] + delta[k] for k in base}


@task("hlqsgd.local")
def client_local(ctx: NodeContext, u: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: tau1 local steps from the edge model u; uploads Q1(x_n - u)."""
    x, loss = local_train(ctx.ws, u, ctx.data, solver_for(ctx, args),
                          ctx.rng("hlqsgd.local", ctx.round, args["stream"]))
    enc = encode(sub(x, u), ctx.opts.levels, ctx.rng("hlqsgd.q1", ctx.round, args["stream"]))
    return Reply(enc, {"loss": loss, "n": len(ctx.data)})


@task("hlqsgd.edge_round")
def edge_round(ctx: NodeContext, w: Bundle, args: dict[str, Scalar]) -> Reply:
    """Edge: tau2 quantised client aggregations from the cloud model; uploads Q2(u_m - w)."""
    o: HierLocalQSGDOptions = ctx.opts
    u = w
    expect = encoded_template(w)
    for a in range(o.edge_rounds):
        replies = ctx.comm.scatter(ctx.children, "hlqsgd.local", u, {"stream": a, "step_offset": a * o.local_steps},
                                   expect=expect)
        if replies:
            u = add_quantized(u, replies, {n: float(ctx.data_size(n)) for n in replies}, o.levels)
    enc = encode(sub(u, w), o.cloud_levels, ctx.rng("hlqsgd.q2", ctx.round))
    return Reply(enc, {"n": ctx.data_size()})


@dataclass
class ServerState:
    model: Bundle  # the cloud model w


def init(ctx: NodeContext) -> ServerState:
    return ServerState(ctx.initial_params())


def cloud_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """Every edge runs tau2 quantised aggregations from w; the cloud adds the D-weighted Q2 uploads."""
    o: HierLocalQSGDOptions = ctx.opts
    w = s.model
    replies = ctx.comm.scatter(ctx.children, "hlqsgd.edge_round", w, {}, expect=encoded_template(w))
    if replies:
        w = add_quantized(w, replies, {e: float(ctx.data_size(e)) for e in replies}, o.cloud_levels)
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(w))
    return ServerState(w)


register(Algorithm("hier-local-qsgd", HierLocalQSGDOptions, init, cloud_round,
                   needs_edges=True))
