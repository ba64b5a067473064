"""Options of ``proxskip`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.proxskip``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedhop.common.options.participation import FullParticipation, Participation


class ProxSkipOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(0.1, gt=0, description="gamma: local step size")
    local_steps: int = Field(5, ge=1, description="tau: local steps per round; communication every tau steps, "
                             "p = 1/tau (spec 6.4: deterministic, as the notebook)")
    batch_size: int = Field(32, ge=0, description="mini-batch size; 0 = full local gradient")
    average: Literal["model", "shifted"] = Field(
        "model", description="what the server averages: model = the clients' local models (the notebook, spec "
        "6.4); shifted = xhat - gamma tau h_i (Scaffnew Alg. 2 line 6). Equal under full participation")
    participation: Participation = Field(default_factory=FullParticipation)
