"""An edge's Comm: :class:`~fedhop.transport.netcomm.NetComm`, whose scatters give their model's pages back once
its requests are out (issue 19: an edge's peak <= 2x the model above idle, as the PS's).

An edge's round is a task handler (e.g. HierFAVG's ``hier.edge_round``): it receives the model from its parent,
decoded into memory of its own, sends it to its clients and folds their replies into an aggregate. Without
this, the edge holds that model beside the aggregate for the whole round (the handler's locals, the request
message, each client's call, kept for a resend). Like the PS's round loop (``common/engine/loop.py``), the edge
moves the model's bytes into a file mapping (``common/engine/spill.py``) and drops its pages when the first reply
streams into the fold (``BaseComm.model_sent``); a resend, a round without a usable reply or a re-read for the
reply to the parent reads the same bytes back from the page cache.

The spill happens at :meth:`EdgeComm.scatter`, before the scatter sends its model: the first point where the
edge's engine code sees the model (the request is decoded by then, and no send reads its memory yet), and one
where the task handler's thread, which called the scatter, is the only reader of the tensors (``Tensor.set_``
must not swap a storage under another thread's raw view). So HierFAVG's later client rounds of one task
(``edge_rounds`` > 1), which send the edge's last aggregate, give that one back the same way. Only for an
algorithm that declares ``round_replaces_tensors`` and a model of at least ``transport.spill_model_bytes``
(``spill.spiller``); a spill that cannot be written leaves the model where it was (logged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedhop.common.engine.api import NodeId, Reply, Scalar
from fedhop.common.engine.spill import Spiller, dropping
from fedhop.common.wire.bundle import Bundle
from fedhop.transport.netcomm import NetComm


class EdgeComm(NetComm):
    """An edge's NetComm whose scatters spill their model (see the module's docstring); ``spills``: the edge's
    :class:`~fedhop.common.engine.spill.Spiller` (``spill.spiller(algorithm, transport.spill_model_bytes)``)."""

    def __init__(self, *args: Any, spills: Spiller, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.spills = spills

    def scatter(self, to: Sequence[NodeId], task: str, bundle: Bundle | None = None,
                args: Mapping[str, Scalar] | None = None, **kw: Any) -> dict[NodeId, Reply]:
        """``NetComm.scatter``, with ``bundle``'s tensors moved into a file mapping first and its pages dropped once
        the requests are out."""
        spilled = self.spills.spill(bundle) if bundle else None
        with dropping(self, spilled):
            return super().scatter(to, task, bundle, args, **kw)
