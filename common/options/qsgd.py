"""Options of ``qsgd`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.qsgd``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from fedhop.common.options.solver import LocalSolver

if TYPE_CHECKING:
    from fedhop.common.topology import Topology


MAX_LEVELS = 127


class HierLocalQSGDOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(1.0, gt=0, description="scale c of eta_k = c / (K sqrt(k+1)) (paper: 1)")
    K: int = Field(20, ge=1, description="denominator of the step schedule: local iterations per round")
    local_steps: int = Field(5, ge=1, description="tau1: local SGD steps per edge aggregation")
    edge_rounds: int = Field(4, ge=1, description="tau2: edge aggregations per cloud aggregation")
    batch_size: int = Field(32, ge=0, description="mini-batch size; 0 = full local batch")
    levels: int = Field(MAX_LEVELS, ge=1, le=MAX_LEVELS, description="s of Q1 (client -> edge) [UNSPECIFIED]")
    cloud_levels: int = Field(MAX_LEVELS, ge=1, le=MAX_LEVELS, description="s of Q2 (edge -> cloud)")

    def local_solver(self, topology: Topology) -> LocalSolver:
        """tau1 local SGD steps of eta_k = c / (K sqrt(k+1)), k counted across the round's edge aggregations."""
        return LocalSolver(steps=self.local_steps, lr=self.lr, batch_size=self.batch_size, lr_K=self.K)
