"""Options of ``centralized`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.centralized``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec


TRAINER_ONLY = "centralized-sgd trains on one process: set topology.clients = 1 (and data.union_of = N to pool " \
               "the data of N devices)"


class CentralizedSGDOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(0.01, gt=0, description="step size (FedCluster: 0.01 CIFAR-10, 0.005 MNIST)")
    iters_per_round: int = Field(1000, ge=1, description="SGD iterations per learning round (FedCluster: 1000)")
    batch_size: int = Field(60, ge=0, description="mini-batch size (FedCluster: 60); 0 = full-batch GD")


def check_spec(spec: RunSpec, o: CentralizedSGDOptions) -> None:
    if spec.topology.clients != 1:
        raise ValueError(f"topology.clients = {spec.topology.clients}: {TRAINER_ONLY}")
