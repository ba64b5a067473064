"""Options of ``fedavg`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.fedavg``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedhop.common.options.participation import Participation
from fedhop.common.options.qsgd import MAX_LEVELS
from fedhop.common.options.solver import LocalSolver

if TYPE_CHECKING:
    from fedhop.common.topology import Topology


class FedAvgOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(0.1, gt=0, description="local learning rate")
    local_steps: int = Field(5, ge=1, description="local SGD steps per round (kappa1 in HierFAVG)")
    batch_size: int = Field(32, ge=0, description="mini-batch size; 0 = full local batch")
    solver: Literal["sgd", "momentum", "adam"] = "sgd"
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    prox_mu: float = Field(0.0, ge=0, description="FedProx proximal weight (0 = plain FedAvg)")
    participation: Participation = Field(1.0, description="fraction of clients sampled per round (per edge), or "
                                         "a participation model (participation.py; server + clients only)")
    weighting: Literal["data_size", "uniform"] = "data_size"
    lr_schedule_K: int = Field(0, ge=0, description="0: constant lr; K > 0: local step k of a round (counted "
                               "across its syncs) uses lr/(K*sqrt(k+1)) (Fed-CHS App. B.1)")
    syncs_per_round: int = Field(1, ge=1, description="server + clients only: local-train/average cycles per "
                                 "round (Fed-CHS spec sec. 5, FedAvg reading A: local_steps=1, syncs=20)")
    upload_levels: int = Field(0, ge=0, le=MAX_LEVELS, description="0: clients upload their models; s > 0: "
                               "they upload QSGD_s(w_k - w) (Fed-CHS Fig. 2 'FedAvg compressed by QSGD'; s "
                               "[UNSPECIFIED], 127 = int8 levels)")

    def local_solver(self, topology: Topology) -> LocalSolver:
        """The clients' local solver, read by each client from the RunSpec it holds (not sent per task)."""
        return solver_of(self)


class HierFAVGOptions(FedAvgOptions):
    edge_rounds: int = Field(2, ge=1, description="kappa2: edge aggregations per cloud aggregation")


def solver_of(o: FedAvgOptions) -> LocalSolver:
    return LocalSolver(steps=o.local_steps, lr=o.lr, batch_size=o.batch_size, solver=o.solver,
                       momentum=o.momentum, weight_decay=o.weight_decay, prox_mu=o.prox_mu,
                       lr_K=o.lr_schedule_K)
