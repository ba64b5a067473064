"""Centralized SGD: FedCluster's non-federated baseline (Chen et al., "FedCluster: Boosting the Convergence of
Federated Learning via Cluster-Cycling", sec. IV-A; docs/specs/fedcluster.md sections 2.4, 4.6 and 5 item 2).

One learning round j of plain mini-batch SGD on the pooled data D (spec 2.4 ``centralized_sgd``):

    repeat ``iters_per_round`` times:   B ~ uniform batch of ``batch_size`` distinct samples of D
                                        W <- W - lr * (1/|B|) sum_{xi in B} grad f(W; xi)

Paper settings (sec. IV-A, spec 4.6): 1000 iterations per round, batch 60 (60k samples per round, the same as
FedAvg's and FedCluster's), lr 0.01 (CIFAR-10) or 0.005 (MNIST), no decay. The sampling pool is
[UNSPECIFIED]; the spec's default is the union of the device data, which ``data.union_of = N`` builds (the
partition of N devices, concatenated); without it the one client holds the dataset as built for one client
(the original training set). Batches are uniform with distinct samples inside a batch ([UNSPECIFIED]; as
FedCluster's device batches, spec 9), drawn in O(batch) by :func:`distinct_indices` rather than by a permutation
of the whole pool (500k samples in E1), which would dominate the step.

What runs where: the topology is one client that holds the whole pool and does all the training; the PS only
holds the model between rounds for evaluation. Each round the PS sends W to the trainer and gets it back (d
floats each way): that traffic belongs to the testbed, not to the baseline, which has no communication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedhop.common.algorithms.local import loss_and_grad
from fedhop.common.engine.api import Algorithm, NodeContext, Reply, Scalar, register, task
from fedhop.common.options.centralized import TRAINER_ONLY, CentralizedSGDOptions, check_spec  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle

if TYPE_CHECKING:
    pass


def distinct_indices(n: int, b: int, gen: torch.Generator) -> torch.Tensor:
    """``b`` distinct indices uniform in 0..n-1: ``randint(n, (b,))``, then, until no value repeats, the positions
    whose value occurs at an earlier position are redrawn in one ``randint(n, (k,))`` call (in position order).
    The law is invariant under relabelling 0..n-1, so every b-subset is equally likely."""
    idx = torch.randint(n, (b,), generator=gen)
    while True:
        dup = (idx[:, None] == idx[None, :]).triu(1).any(0)
        k = int(dup.sum())
        if k == 0:
            return idx
        idx[dup] = torch.randint(n, (k,), generator=gen)


@task("centralized.train")
def train(ctx: NodeContext, params: Bundle, args: dict[str, Scalar]) -> Reply:
    """The trainer: one round of ``iters_per_round`` SGD steps on its whole pool."""
    o: CentralizedSGDOptions = ctx.opts
    data, gen = ctx.data, ctx.rng("centralized.sgd", ctx.round)
    n = len(data)
    full = o.batch_size <= 0 or o.batch_size >= n
    w = {k: v.detach().clone() for k, v in params.items()}
    total = 0.0
    for _ in range(o.iters_per_round):
        if full:
            loss, g = loss_and_grad(ctx.ws, w, data.x, data.y)
        else:
            idx = distinct_indices(n, o.batch_size, gen)
            loss, g = loss_and_grad(ctx.ws, w, data.x[idx], data.y[idx])
        w = {k: w[k] - o.lr * g[k] for k in w}
        total += loss
    return Reply(w, {"loss": total / o.iters_per_round, "n": n})


@dataclass
class ServerState:
    model: Bundle  # W


def init(ctx: NodeContext) -> ServerState:
    return ServerState(ctx.initial_params())


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """Round j: the trainer runs one round of SGD from W; W is unchanged if its reply is lost."""
    w = s.model
    replies = ctx.comm.scatter(list(ctx.children), "centralized.train", w, {}, expect=w)
    if replies:
        w = next(iter(replies.values())).bundle
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(w))
    return ServerState(w)


register(Algorithm("centralized-sgd", CentralizedSGDOptions, init, server_round,
                   needs_edges=False, check=check_spec))
