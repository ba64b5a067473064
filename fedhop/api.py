"""fedhop's public protocol API: everything a protocol written outside fedhop needs, in one module.

A protocol is a Python module that defines task handlers and one :class:`Algorithm` record; a run spec names
the record with ``algorithm.name = "package.module:NAME"``. Every node of the run (the parameter server, each
edge, each client) imports the module, checks that its copy is the parameter server's (a code digest) and
registers the handlers the module declares with :func:`task`. ``docs/protocols.md`` is the tutorial and the
reference; ``fedhop new protocol NAME`` writes a runnable skeleton.

What is here:

* the record and its parts: :class:`Algorithm`, :data:`SETUP_ROUND`, :func:`final_model`, :class:`NoOptions`
  (the options model of a protocol that takes none), ``LinkKind`` (a ``(src, dst, kind)`` key of
  ``Algorithm.payload_per_round``), :class:`RunSpec` (the validated spec ``Algorithm.check`` and
  ``payload_per_round`` receive, ``ctx.spec``);
* tasks and replies: :func:`task` (register a handler), :class:`Reply`, :class:`NoAnswer`, ``Handler``;
* the node context: :class:`NodeContext` (``ctx.opts``, ``ctx.round``, ``ctx.rng``, ``ctx.children``,
  ``ctx.data``, ``ctx.state``, ...);
* the message primitives: :class:`Comm` (``ctx.comm.scatter``, ``ctx.comm.hand_off`` between neighbour edges
  or peer clients, ``ctx.comm.describe``; ``ctx.comm.submit`` / ``collect`` / ``in_flight`` for asynchronous
  protocols; ``ctx.comm.post`` / ``receive``, a message that makes its receiver act and the parent's mailbox),
  :class:`Post` (what ``receive`` returns), :class:`HandOffError`, :class:`PostError`;
* bundles (``dict[str, torch.Tensor]``, what travels): :data:`Bundle` and its helpers (:func:`clone`,
  :func:`zeros_like`, :func:`axpy`, :func:`sub`, :func:`weighted_sum`, :func:`weighted_mean`, :func:`flat`,
  :func:`payload_bytes`), :class:`WeightedMean` (a ``fold`` that averages while replies arrive);
* local training: :func:`sample_batch`, :func:`loss_and_grad`, :func:`local_sgd`.

Nothing a protocol imports from here is private; anything not here is fedhop's inside and may change.
"""

from __future__ import annotations

import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.algorithms.local import loss_and_grad, sample_batch
from fedhop.common.engine.api import (
    SETUP_ROUND,
    Algorithm,
    Comm,
    Handler,
    LinkKind,
    NoAnswer,
    NodeContext,
    NodeId,
    Post,
    Reply,
    Scalar,
    final_model,
    task,
)
from fedhop.common.engine.base import HandOffError, PostError
from fedhop.common.spec import RunSpec
from fedhop.common.validation import NoOptions
from fedhop.common.wire.bundle import (
    Bundle,
    axpy,
    clone,
    flat,
    payload_bytes,
    sub,
    weighted_mean,
    weighted_sum,
    zeros_like,
)

__all__ = [
    "SETUP_ROUND", "Algorithm", "Bundle", "Comm", "HandOffError", "Handler", "LinkKind", "NoAnswer", "NoOptions",
    "NodeContext", "NodeId", "Post", "PostError", "Reply", "RunSpec", "Scalar", "WeightedMean", "axpy", "clone",
    "final_model", "flat", "local_sgd", "loss_and_grad", "payload_bytes", "sample_batch", "sub", "task",
    "weighted_mean", "weighted_sum", "zeros_like",
]


def local_sgd(ctx: NodeContext, params: Bundle, *, steps: int, lr: float, batch_size: int,
              stream: int | str = 0, gen: torch.Generator | None = None) -> tuple[Bundle, float]:
    """``steps`` steps of plain mini-batch SGD on this client's data from ``params`` (not changed); returns the
    new parameters and the mean batch loss. The batches are drawn from the node's random stream
    ``ctx.rng("local_sgd", ctx.round, stream)``, so both engines draw the same ones; ``gen``, when given, is the
    stream instead (one of ``ctx.rng``'s: e.g. an asynchronous task's, named by its job rather than the round,
    as a client may get two tasks in one round)."""
    gen = ctx.rng("local_sgd", ctx.round, stream) if gen is None else gen
    w = {k: v.detach().clone() for k, v in params.items()}
    total = 0.0
    for _ in range(steps):
        x, y = sample_batch(ctx.data, batch_size, gen)
        loss, g = loss_and_grad(ctx.ws, w, x, y)
        total += loss
        with torch.no_grad():
            for k in w:
                w[k] = w[k] - lr * g[k]
    return w, total / max(steps, 1)
