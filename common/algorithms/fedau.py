"""FedAU (Wang & Ji 2023, "A Lightweight Method for Tackling Unknown Participation Statistics in Federated
Averaging"), as specified in docs/specs/focus.md section 6.2.

Each client's aggregation weight w_i estimates 1/p_i online: the mean of its observed participation
intervals, each interval capped at K_cut. Bookkeeping every round for every client: interval += 1; if the
client participated (its reply arrived) or interval == K_cut, record the interval (w_i = mean of the
recorded ones) and reset it to 0. Before the first record w_i = 1. The server keeps this bookkeeping (it
knows S_r; the clients would compute the same from the round numbers).

    server -> i in S_r:  x                  client: tau local steps (local.train) -> x_tau,i      (d floats each way)
    variant "original" (IBM/fedau):  x <- x + eta_g (1/N) sum_{i in S_r} w_i (x_tau,i - x), with the weights
                                     recorded BEFORE round r; the bookkeeping of round r comes after.
    variant "notebook" (the FOCUS Fig. 4 notebook): bookkeeping first (the current interval counts), then
                                     x <- x + sum_{i in S_r} w_i (x_tau,i - x) / sum_{i in S_r} w_i.

Under full participation every interval is 1, w_i = 1, and both variants equal FedAvg (Fig. 4 caption).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedhop.common.algorithms.participation import (
    ParticipationState,
    participants,
)
from fedhop.common.engine.api import Algorithm, NodeContext, register
from fedhop.common.options.fedau import FedAUOptions  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, sub, weighted_sum


@dataclass
class IntervalWeights:
    """Online estimate of 1/p_i from capped participation intervals (FedAU, Alg. 1 lines 'w_n')."""

    k_cut: int
    interval: np.ndarray
    total: np.ndarray
    count: np.ndarray

    @classmethod
    def new(cls, n: int, k_cut: int) -> IntervalWeights:
        return cls(k_cut, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64))

    def weights(self) -> np.ndarray:
        return np.where(self.count > 0, self.total / np.maximum(self.count, 1), 1.0)

    def update(self, participated: np.ndarray) -> None:
        self.interval += 1
        rec = participated | (self.interval == self.k_cut)
        self.total[rec] += self.interval[rec]
        self.count[rec] += 1
        self.interval[rec] = 0


@dataclass
class ServerState:
    model: Bundle  # x
    book: IntervalWeights  # the online interval estimates of 1/p_i
    participation: ParticipationState = field(default_factory=ParticipationState)


def init(ctx: NodeContext) -> ServerState:
    o: FedAUOptions = ctx.opts
    return ServerState(ctx.initial_params(), IntervalWeights.new(len(ctx.children), o.k_cut))


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    o: FedAUOptions = ctx.opts
    x, book = s.model, s.book
    clients = ctx.topology.sort(ctx.children)
    index = {c: i for i, c in enumerate(clients)}
    chosen = participants(ctx, o.participation, s.participation)
    replies = ctx.comm.scatter(chosen, "local.train", x, {}, expect=x)
    took = np.zeros(len(clients), dtype=bool)
    took[[index[c] for c in replies]] = True
    if o.variant == "original":
        w = book.weights()
        if replies:
            delta = weighted_sum((float(w[index[c]]), sub(r.bundle, x)) for c, r in replies.items())
            x = {k: x[k] + (o.server_lr / len(clients)) * delta[k] for k in x}
        book.update(took)
    else:
        book.update(took)
        w = book.weights()
        if replies:
            norm = float(sum(w[index[c]] for c in replies))
            delta = weighted_sum((float(w[index[c]]) / norm, sub(r.bundle, x)) for c, r in replies.items())
            x = {k: x[k] + delta[k] for k in x}
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(x), participants=len(chosen))
    return ServerState(x, book, s.participation)


register(Algorithm("fedau", FedAUOptions, init, server_round,
                   needs_edges=False))
