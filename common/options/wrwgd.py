"""Options of ``wrwgd`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.wrwgd``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedhop.common.options.solver import LocalSolver

if TYPE_CHECKING:
    from fedhop.common.topology import Topology


class WRWGDOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    K: int = Field(20, ge=1, description="local SGD steps at each visited client (App. B.1: 20)")
    lr: float = Field(1.0, gt=0, description="scale c of eta_k = c / (K sqrt(k+1))")
    batch_size: int = Field(32, ge=0, description="mini-batch size; 0 = full local batch")
    stationary: Literal["data_size", "uniform"] = Field(
        "data_size", description="pi_i of the walk: proportional to D_i (L_i proxy) or uniform")
    importance_weighting: bool = Field(True, description="scale the steps at client i by gamma_i / pi_i")

    def local_solver(self, topology: Topology) -> LocalSolver:
        """K steps of eta_k = c / (K sqrt(k+1)); the visited client's importance weight comes per call."""
        return LocalSolver(steps=self.K, lr=self.lr, batch_size=self.batch_size, lr_K=self.K)
