"""Client-side building blocks every algorithm shares: mini-batches, gradients, local solvers.

Parameters travel as bundles; the model architecture is the workspace's template, applied with
``torch.func.functional_call`` so that the same code serves every algorithm and both engines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from fedhop.common.data import Dataset
from fedhop.common.engine.api import NodeContext, Reply, Scalar, task
from fedhop.common.engine.workspace import Workspace
from fedhop.common.options.solver import LocalSolver  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle


def sample_batch(data: Dataset, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A uniform mini-batch without replacement inside the batch (the whole set if it is smaller)."""
    n = len(data)
    if batch_size <= 0 or batch_size >= n:
        return data.x, data.y
    idx = torch.randperm(n, generator=gen)[:batch_size]
    return data.x[idx], data.y[idx]


def loss_and_grad(ws: Workspace, params: Bundle, x: torch.Tensor, y: torch.Tensor) -> tuple[float, Bundle]:
    """Mean mini-batch loss f(w, xi) and its gradient with respect to every parameter."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    loss = ws.loss(ws.forward(leaves, x), y)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return float(loss.detach()), {k: g.detach() for k, g in zip(leaves, grads, strict=True)}


def full_gradient(ws: Workspace, params: Bundle, data: Dataset) -> tuple[float, Bundle]:
    """Gradient of the mean loss over the whole local dataset (deterministic)."""
    return loss_and_grad(ws, params, data.x, data.y)


def solver_for(ctx: NodeContext, args: Mapping[str, Scalar]) -> LocalSolver:
    """This client's local solver: its algorithm's options (``local_solver(topology)``, read from the RunSpec
    the node holds) with what varies per call from the task's args: ``step_offset`` and ``lr_scale``."""
    base: LocalSolver = ctx.opts.local_solver(ctx.topology)
    lr = base.lr * float(args["lr_scale"]) if "lr_scale" in args else base.lr
    return replace(base, lr=lr, step_offset=int(args.get("step_offset", 0)))


def _shared_storage(grads: Bundle) -> set[int]:
    """Storages that back more than one gradient (autograd may hand the same tensor to two parameters)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for g in grads.values():
        p = g.untyped_storage().data_ptr()
        (shared if p in seen else seen).add(p)
    return shared


def local_train(ws: Workspace, params: Bundle, data: Dataset, cfg: LocalSolver,
                gen: torch.Generator, *, consume: bool = False) -> tuple[Bundle, float]:
    """Run ``cfg.steps`` local steps from ``params``; returns the new parameters and the mean batch loss.

    ``consume``: ``params`` is the caller's to give away (a received bundle nobody reads again): without a
    FedProx anchor to keep, training happens in its tensors instead of a copy. Plain SGD updates in place
    (``w -= lr * d`` computed as ``d *= lr; w -= d``: the same floats as ``w - lr * d``); optimizer buffers are
    allocated only for the solvers that use them, so a client holds about the model, its gradient and the
    received bundle (issue 11)."""
    if consume and not cfg.prox_mu:
        w = {k: v.detach() for k, v in params.items()}
    else:
        w = {k: v.detach().clone() for k, v in params.items()}
    anchor = params
    m = {k: torch.zeros_like(v) for k, v in w.items()} if cfg.solver in ("momentum", "adam") else {}
    v2 = {k: torch.zeros_like(v) for k, v in w.items()} if cfg.solver == "adam" else {}
    losses = 0.0
    for t in range(cfg.steps):
        x, y = sample_batch(data, cfg.batch_size, gen)
        loss, g = loss_and_grad(ws, w, x, y)
        losses += loss
        lr = cfg.lr_at(t)
        shared = _shared_storage(g)
        for k in w:
            d = g.pop(k)  # each gradient is freed as soon as it is used
            if cfg.weight_decay:
                d = d + cfg.weight_decay * w[k]
            if cfg.prox_mu:
                d = d + cfg.prox_mu * (w[k] - anchor[k])
            if cfg.solver == "sgd":
                w[k].sub_(d.mul_(lr) if d._base is None and d.untyped_storage().data_ptr() not in shared
                          else lr * d)
            elif cfg.solver == "momentum":
                m[k] = cfg.momentum * m[k] + d
                w[k] = w[k] - lr * m[k]
            elif cfg.solver == "adam":
                m[k] = cfg.beta1 * m[k] + (1 - cfg.beta1) * d
                v2[k] = cfg.beta2 * v2[k] + (1 - cfg.beta2) * d * d
                mh = m[k] / (1 - cfg.beta1 ** (t + 1))
                vh = v2[k] / (1 - cfg.beta2 ** (t + 1))
                w[k] = w[k] - lr * mh / (vh.sqrt() + cfg.eps)
            else:
                raise ValueError(f"unknown local solver {cfg.solver!r}; use sgd, momentum or adam")
            del d
        del g, x, y
    return w, losses / max(cfg.steps, 1)


@task("local.train")
def train_task(ctx: NodeContext, params: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: local training from the received model; replies with the local model and its data size."""
    cfg = solver_for(ctx, args)
    gen = ctx.rng("local.train", ctx.round, args.get("stream", 0))
    w, loss = local_train(ctx.ws, params, ctx.data, cfg, gen, consume=True)  # the received model is ours
    return Reply(w, {"loss": loss, "n": len(ctx.data)})
