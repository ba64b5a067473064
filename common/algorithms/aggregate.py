"""Aggregation that streams: a weighted mean folded reply by reply while a scatter's replies arrive.

``Comm.scatter(..., fold=mean)`` hands each usable reply to the fold in canonical order as soon as it and the
replies before it are in, so a node holds the running sum and the replies not yet folded instead of every
reply (issue 11: the PS of a 4-client FedAvg round held 4 replies, the old model, the new one and more).
"""

from __future__ import annotations

from collections.abc import Callable

from fedhop.common.engine.api import NodeId, Reply
from fedhop.common.wire.bundle import Bundle


class WeightedMean:
    """sum_i (w_i / W) b_i over the folded replies i, accumulated in the order they are folded.

    The weights are normalised by ``expected_total`` while folding (the total weight of every node the scatter
    went to); when every reply came and ``expected_total`` is their total, the result is bit-identical to
    ``bundle.weighted_mean`` over the same replies (same products, same additions, same order). When some did
    not (a node missing, an edge that reports the weight of the clients that answered it), the sum is rescaled
    by ``expected_total / actual total`` at the end: deterministic, so both engines still agree bit for bit.
    A reply of weight 0 is not folded. Each folded reply's tensors are reused in place (the fold owns them).
    """

    def __init__(self, weight: Callable[[NodeId, Reply], float], expected_total: float) -> None:
        if not expected_total > 0:
            raise ValueError(f"WeightedMean needs a positive expected total weight, got {expected_total}")
        self.weight = weight
        self.expected = float(expected_total)
        self.total = 0.0
        self.nodes: list[NodeId] = []
        self._acc: Bundle | None = None

    def __call__(self, node: NodeId, reply: Reply) -> None:
        w = self.weight(node, reply)
        if w == 0:
            return
        a = w / self.expected
        self.total += w
        self.nodes.append(node)
        if self._acc is None:
            self._acc = {k: v.detach().mul_(a) for k, v in reply.bundle.items()}
            return
        if reply.bundle.keys() != self._acc.keys():
            raise ValueError(f"bundles disagree on tensor names: {sorted(self._acc)} vs {sorted(reply.bundle)}")
        for k, v in reply.bundle.items():
            self._acc[k].add_(v, alpha=a)

    @property
    def empty(self) -> bool:
        return self._acc is None

    def result(self) -> Bundle:
        """The mean of the folded replies (raises ValueError when none was folded)."""
        if self._acc is None:
            raise ValueError("weighted mean of no replies")
        if self.total != self.expected:
            scale = self.expected / self.total
            for v in self._acc.values():
                v.mul_(scale)
            self.expected = self.total
        return self._acc
