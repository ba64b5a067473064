"""Options of ``fedadam`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.fedadam``."""

from __future__ import annotations

from pydantic import Field

from fedhop.common.options.fedavg import FedAvgOptions


class FedAdamOptions(FedAvgOptions):
    server_lr: float = Field(0.01, gt=0, description="eta_g [UNSPECIFIED in FGDRO; Reddi tunes it]")
    server_beta1: float = Field(0.9, ge=0, lt=1, description="Reddi default 0.9")
    server_beta2: float = Field(0.99, ge=0, lt=1, description="Reddi default 0.99")
    server_tau: float = Field(1e-3, gt=0, description="adaptivity floor tau (Reddi ~1e-3)")
