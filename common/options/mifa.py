"""Options of ``mifa`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.mifa``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedhop.common.options.participation import FullParticipation, Participation
from fedhop.common.options.solver import LocalSolver

if TYPE_CHECKING:
    from fedhop.common.topology import Topology


class MifaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(0.1, gt=0, description="eta_l: local step size")
    server_lr: float = Field(1.0, gt=0, description="eta_g: global step size")
    local_steps: int = Field(3, ge=1, description="tau: local steps per round")
    batch_size: int = Field(0, ge=0, description="mini-batch size; 0 = full local batch")
    participation: Participation = Field(default_factory=FullParticipation)
    empty_round: Literal["skip", "step"] = "skip"

    def local_solver(self, topology: Topology) -> LocalSolver:
        """The clients' local SGD (tau steps), read from the RunSpec each client holds."""
        return LocalSolver(steps=self.local_steps, lr=self.lr, batch_size=self.batch_size)
