"""Options of ``scaffold`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.scaffold``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedhop.common.options.participation import FullParticipation, Participation


class ScaffoldOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(0.1, gt=0, description="eta_l: local step size")
    local_steps: int = Field(5, ge=1, description="tau (K in the paper): local steps per round")
    batch_size: int = Field(32, ge=0, description="mini-batch size; 0 = full local batch")
    server_lr: float = Field(1.0, gt=0, description="eta_g: global step size")
    weight_decay: float = Field(0.0, ge=0)
    participation: Participation = Field(default_factory=FullParticipation)
