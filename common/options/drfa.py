"""Options of ``drfa`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.drfa``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class DRFAOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(0.01, gt=0, description="local SGD step size")
    local_steps: int = Field(32, ge=1, description="I, local steps per round")
    batch_size: int = Field(32, ge=0)
    gamma: float = Field(0.01, gt=0, description="step size of the lambda ascent [UNSPECIFIED]")
    gamma_decay: float = Field(1.0, gt=0, le=1, description="gamma *= decay per round (FedTorch 0.9)")
    clients_per_round: int | None = Field(None, ge=1, description="m; None = N [UNSPECIFIED]")
    lambda_init: Literal["uniform", "data_size"] = Field("data_size", description="FedTorch: n_i / n")
    lambda_floor: float = Field(1e-3, ge=0, description="FedTorch floors lambda at 1e-3 and renormalises")
    aggregation: Literal["draws", "lambda"] = Field(
        "draws", description="draws: mean over the m draws (paper); lambda: weight by lambda_i (FedTorch)")


class DRFAProxOptions(DRFAOptions):
    reg: float = Field(1.0, gt=0, description="tau: weight of the regulariser tau KL(lambda || 1/N) "
                       "[UNSPECIFIED]; FGDRO-KL's lambda gives the same objective")
    prox: Literal["euclidean", "entropic"] = Field(
        "euclidean", description="geometry of the lambda prox step: euclidean (DRFA Alg. 2) or entropic (KL "
        "to the current lambda; closed form)")
    loss_at: Literal["final", "snapshot"] = Field(
        "final", description="where U evaluates f_i: the new average model (Alg. 2; D uploads d) or DRFA's "
        "random snapshot w^(t') (D uploads 2d)")
    lambda_floor: float = Field(0.0, ge=0, description="floor lambda then renormalise (0: none; KL keeps it > 0)")
