"""Aggregation that streams: a weighted mean folded reply by reply while a scatter's replies arrive.

``Comm.scatter(..., fold=mean)`` hands each usable reply to the fold in canonical order as soon as it and the
replies before it are in, so a node holds the running sum and the replies not yet folded instead of every
reply (issue 11: the PS of a 4-client FedAvg round held 4 replies, the old model, the new one and more).

In the networked engine a reply is folded chunk by chunk while it arrives (:meth:`WeightedMean.sink`,
``common/wire/fold.py``; issue 19): the node then holds the aggregate and a chunk, never a whole reply.
``FEDHOP_FOLD_STREAM=0`` in a node's environment turns that off (each reply is decoded whole, then folded: the
same bits; an ablation for ``tests/bench/bench_memory.py --compare``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from fedhop.common.engine.api import NodeId, Reply, Scalar
from fedhop.common.wire.bundle import Bundle
from fedhop.common.wire.codec import DTYPES, CodecError, Layout, bundle_layout
from fedhop.common.wire.fold import AxpySink, FoldedBundle, FoldPlan, UndoLog
from fedhop.v1 import fedhop_pb2 as pb

STREAM_ENV = "FEDHOP_FOLD_STREAM"  # "0": replies are decoded whole before they are folded (an ablation)


class WeightedMean:
    """sum_i (w_i / W) b_i over the folded replies i, accumulated in the order they are folded.

    The weights are normalised by ``expected_total`` while folding (the total weight of every node the scatter
    went to); when every reply came and ``expected_total`` is their total, the result is bit-identical to
    ``bundle.weighted_mean`` over the same replies (same products, same additions, same order). When some did
    not (a node missing, an edge that reports the weight of the clients that answered it), the sum is rescaled
    by ``expected_total / actual total`` at the end: deterministic, so both engines still agree bit for bit.
    A reply of weight 0 is not folded. Each folded reply's tensors are reused in place (the fold owns them).

    :meth:`sink` folds a reply chunk by chunk as it arrives instead (same arithmetic, same bits); the engine
    then calls the fold with a :class:`~fedhop.common.wire.fold.FoldedBundle`, which commits it.
    """

    def __init__(self, weight: Callable[[NodeId, Reply], float], expected_total: float) -> None:
        if not expected_total > 0:
            raise ValueError(f"WeightedMean needs a positive expected total weight, got {expected_total}")
        self.weight = weight
        self.expected = float(expected_total)
        self.total = 0.0
        self.nodes: list[NodeId] = []
        self._acc: Bundle | None = None
        self._sinks: dict[int, tuple[NodeId, float]] = {}  # id(sink) -> its node and weight, until committed
        self.undo = UndoLog()  # the aggregate's bytes a streamed reply changes, until it is committed
        # the last reply's layout and aggregate (its tensors' ids) and the plan made for them (``_plan``)
        self._last_plan: tuple[tuple[Layout, tuple[int, ...] | None], FoldPlan | None] | None = None

    def sink(self, node: NodeId, scalars: Mapping[str, Scalar], header: pb.BundleHeader) -> AxpySink | None:
        """Fold ``node``'s reply chunk by chunk as its bundle arrives (the engine asks when its header comes and
        it is the next reply to fold); None when it must come whole (a weight of 0, a tensor that is not
        floating point, a layout other than the aggregate's: the plain path then says what is wrong)."""
        if os.environ.get(STREAM_ENV, "1") == "0":
            return None
        w = self.weight(node, Reply({}, dict(scalars)))
        if w == 0:
            return None
        try:
            layout = bundle_layout(header)  # the codec's cached object: the same one for a scatter's replies
        except CodecError:
            return None
        plan = self._plan(layout)
        if plan is None:
            return None
        s = AxpySink(header, w / self.expected, self._acc, self.undo if self._acc is not None else None, plan)
        self._sinks[id(s)] = (node, w)
        return s

    def _plan(self, layout: Layout) -> FoldPlan | None:
        """The fold plan of ``layout`` into the current aggregate (None: the reply must come whole), kept for the
        next reply: a scatter's replies share their layout object (``bundle_layout`` caches it) and go into the
        same aggregate tensors, so this is decided and built once per scatter, not once per reply."""
        acc = self._acc
        key = (layout, None if acc is None else tuple(map(id, acc.values())))  # the plan holds those tensors
        last = self._last_plan
        if last is not None and last[0][0] is key[0] and last[0][1] == key[1]:
            return last[1]
        plan: FoldPlan | None = None
        if not all(DTYPES[s.dtype].is_floating_point for s in layout.slots):
            pass
        elif acc is None:
            plan = FoldPlan.of(layout)
        elif [(k, v.dtype, tuple(v.shape)) for k, v in acc.items()] == \
                [(s.name, DTYPES[s.dtype], s.shape) for s in layout.slots] \
                and all(v.device.type == "cpu" and v.is_contiguous() for v in acc.values()):
            plan = FoldPlan.of(layout, acc)
        self._last_plan = (key, plan)
        return plan

    def __call__(self, node: NodeId, reply: Reply) -> None:
        if isinstance(reply.bundle, FoldedBundle):
            self._commit(node, reply)
            return
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

    def _commit(self, node: NodeId, reply: Reply) -> None:
        bundle = reply.bundle
        assert isinstance(bundle, FoldedBundle)
        mine = self._sinks.pop(id(bundle.sink), None)
        if mine is None or mine[0] != node:
            raise ValueError(f"a reply of {node} folded by another fold's sink")
        w = self.weight(node, reply)
        if w != mine[1]:
            raise ValueError(f"{node}'s weight changed while its reply was folded: {mine[1]} then {w}")
        tensors = bundle.sink.commit()
        if self._acc is None:
            self._acc = tensors
        self.total += w
        self.nodes.append(node)

    @property
    def empty(self) -> bool:
        return self._acc is None

    def result(self) -> Bundle:
        """The mean of the folded replies (raises ValueError when none was folded)."""
        self.undo.close()
        self._last_plan = None  # its views of the aggregate go with it
        if self._acc is None:
            raise ValueError("weighted mean of no replies")
        if self.total != self.expected:
            scale = self.expected / self.total
            for v in self._acc.values():
                v.mul_(scale)
            self.expected = self.total
        return self._acc
