"""Options of ``dr_dsgd`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.dr_dsgd``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DRDSGDOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(0.01, gt=0, description="eta")
    mu: float = Field(2.0, gt=0, description="KL regulariser (theory assumes mu > 1) [UNSPECIFIED]")
    local_steps: int = Field(32, ge=1, description="I, local steps between averagings")
    batch_size: int = Field(32, ge=0)
    exp_shift: float = Field(0.0, description="c in exp((l - c)/mu); rescales the step by exp(-c/mu)")
