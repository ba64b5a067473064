"""Options of ``fgdro`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.fgdro``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    local_steps: int = Field(32, ge=1, description="I, the communication interval (paper: I = 32)")
    batch_size: int = Field(32, ge=0, description="local mini-batch size (paper: 32); 0 = full local batch")


class FGDROCVaROptions(_Common):
    lr: float = Field(0.01, gt=0, description="eta1, model step size (paper tunes in 1e-4..1e-1)")
    lr_s: float | None = Field(None, gt=0, description="eta2, threshold step [UNSPECIFIED; spec: = eta1]")
    beta1: float = Field(0.1, gt=0, le=1, description="loss MA rate [UNSPECIFIED; spec toy 0.1]")
    K: float = Field(1.0, gt=0, description="top-K of the CVaR (K <= N; 1 = worst client) [UNSPECIFIED]")
    s_init: float = Field(0.0, description="sbar^1 (Alg.1 box: 0)")
    u_init: float = Field(0.0, description="u_i^0 (Alg.1 box: 0)")


class FGDROKLOptions(_Common):
    lr: float = Field(0.01, gt=0, description="eta (paper tunes in 1e-4..1e-1)")
    lam: float = Field(1.0, gt=0, description="lambda, KL temperature [UNSPECIFIED; spec: 0.1, 1, 10]")
    beta1: float = Field(0.1, gt=0, le=1, description="loss moving-average rate")
    beta2: float = Field(0.01, gt=0, le=1,
                         description="global-statistic MA rate; keep <~ 1/I or KL -> FedAvg (spec 9)")
    beta3: float = Field(0.1, gt=0, le=1, description="gradient momentum rate")
    u_init: Literal["first_batch", "zero"] = Field(
        "first_batch", description="u_i^0 [UNSPECIFIED]: the first minibatch loss at wbar^1 (spec 9) or 0")
    v_init: Literal["mean_exp_u", "one"] = Field(
        "mean_exp_u", description="vbar^1 [UNSPECIFIED]: mean_i exp(u_i^0/lambda) (one extra scalar up per "
                                  "client, spec 9) or exp(0/lambda) = 1")
    exp_shift: float = Field(
        0.0, description="c in exp((u - c)/lambda) (spec 9, overflow safety): a FIXED constant, e.g. an "
                         "upper bound of the loss; the weight exp(u/lambda)/v does not depend on it")
    weight_clip: float | None = Field(
        None, gt=0, description="clip exp(u/lambda)/v at weight_clip * N [S, not in paper; spec 9]")


class FGDROKLAdamOptions(FGDROKLOptions):
    lr: float = Field(0.001, gt=0, description="eta")
    beta4: float = Field(0.01, gt=0, le=1, description="2nd-moment rate [UNSPECIFIED; spec 0.001-0.01]")
    tau: float = Field(1e-3, gt=0, description="floor in sqrt(q) + tau [UNSPECIFIED; spec 1e-8..1e-3]")


class LocalAdamOptions(_Common):
    lr: float = Field(0.001, gt=0, description="eta")
    beta3: float = Field(0.1, gt=0, le=1, description="first-moment rate (m <- (1-beta3) m + beta3 g)")
    beta4: float = Field(0.01, gt=0, le=1, description="second-moment rate")
    tau: float = Field(1e-3, gt=0, description="denominator floor in sqrt(q) + tau")
