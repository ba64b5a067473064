"""Options of ``dpsgd`` (``[algorithm.options]``): torch-free, read at validation; the algorithm itself lives in
``fedhop.common.algorithms.dpsgd``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedhop.common.options.solver import LocalSolver

if TYPE_CHECKING:
    from fedhop.common.topology import Topology


class DPSGDOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    local_steps: int = Field(1, ge=1, description="local SGD steps per round before the gossip (Alg. 1: 1)")
    lr: float = Field(0.05, gt=0, description="step length gamma")
    batch_size: int = Field(32, ge=0, description="mini-batch size; 0 = full local batch")
    order: Literal["step_then_mix", "paper"] = Field(
        "step_then_mix", description="step_then_mix: x_i <- sum_j W_ij (x_j after its local steps); paper "
        "(Algorithm 1): x_i <- sum_j W_ij x_j + (x_i's own local update)")

    def local_solver(self, topology: Topology) -> LocalSolver:
        """Plain SGD, ``local_steps`` steps of size ``lr`` from the client's own model."""
        return LocalSolver(steps=self.local_steps, lr=self.lr, batch_size=self.batch_size)
