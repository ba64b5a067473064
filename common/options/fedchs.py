"""Options of ``fedchs`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.fedchs``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedhop.common.options.qsgd import MAX_LEVELS


class FedCHSOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    K: int = Field(20, ge=1, description="local iterations per round inside the active cluster (paper: 20)")
    E: int = Field(1, ge=1, description="local steps per interaction (spec 3.6); K / E interactions a round")
    lr: float = Field(1.0, gt=0, description="scale c of eta_k = c / (K sqrt(k+1)) (App. B.1: c = 1)")
    lr_schedule: Literal["sqrt", "constant"] = Field(
        "sqrt", description="sqrt: eta_k = lr / (K sqrt(k+1)) restarting every round; constant: eta_k = lr")
    batch_size: int = Field(32, ge=0, description="mini-batch size of xi_{n,k} [UNSPECIFIED]; 0 = full batch")
    weighting: Literal["data_size", "uniform"] = Field(
        "data_size", description="gamma_n^m: D_n / D_{A,m} (default) or 1 / |N_m| [UNSPECIFIED]")
    count_initial_es: bool = Field(
        False, description="increment c(m(0)) at start (not in Alg. 1; False = literal)")
    e_lr_index: Literal["interaction", "local_step"] = Field(
        "interaction", description="E > 1: local step j of interaction k uses eta_k or eta_{kE+j}")
    upload_levels: int = Field(0, ge=0, le=MAX_LEVELS, description="0: uploads uncompressed (Alg. 1); s > 0: "
                               "QSGD with s levels on every upload (Fig. 2 'with compression')")
    flow: Literal["driven", "exact"] = Field(
        "driven", description="driven: the PS calls fedchs.round on the active edge every round; exact: the "
        "paper's flow, no PS message during training (the edge that receives the model runs the next round "
        "and posts its report to the PS)")

    @model_validator(mode="after")
    def _divisible(self) -> FedCHSOptions:
        if self.K % self.E:
            raise ValueError(f"K ({self.K}) must be a multiple of E ({self.E}): K / E interactions per round")
        return self
