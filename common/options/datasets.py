"""The option models of the built-in datasets (``[data.options]``); the builders live in ``fedhop.common.data``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SyntheticOptions(BaseModel):
    """Gaussian mixture: class means ``mu_c ~ N(0, sep^2 I)``, ``x = mu_y + noise * N(0, I)``, balanced
    labels (docs/specs/fedcluster.md 8.2 E1 uses dim 20, 10 classes, sep 0.5)."""

    model_config = ConfigDict(extra="forbid")
    samples: int = Field(2000, ge=4, le=10_000_000, description="train + test samples")
    dim: int = Field(20, ge=1, le=100_000)
    classes: int = Field(10, ge=2, le=10_000)
    sep: float = Field(1.0, gt=0.0)
    noise: float = Field(1.0, gt=0.0)


class RegressionOptions(BaseModel):
    """Linear model ``y = x . w* + noise * N(0, 1)`` with ``x, w* ~ N(0, I)``."""

    model_config = ConfigDict(extra="forbid")
    samples: int = Field(2000, ge=4, le=10_000_000)
    dim: int = Field(20, ge=1, le=100_000)
    noise: float = Field(0.1, ge=0.0)


class GaussLabelSkewOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dim: int = Field(20, ge=1, le=100_000, description="feature dimension d (spec E1: 20)")
    classes: int = Field(10, ge=2, le=1000, description="C (spec E1: 10, like CIFAR-10/MNIST)")
    sep: float = Field(0.5, gt=0.0, description="class means ~ N(0, sep^2 I) (spec E1: 0.5)")
    noise: float = Field(1.0, gt=0.0, description="x = mu_y + noise * N(0, I)")
    test: Literal["fresh", "union"] = Field(
        "fresh", description="test set: fresh class-balanced samples, or the union of the device data "
        "(the spec's train-loss metric; subsample it with data.test_limit)")
    test_samples: int = Field(10_000, ge=1, description="size of the fresh test set")


class FGDROToyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dim: int = Field(10, ge=1, description="d")
    samples_per_client: int = Field(2000, ge=1, description="n")
    test_per_client: int = Field(200, ge=1)
    spread0: float = Field(0.3, ge=0, description="client optimum spread, client 0")
    spread_step: float = Field(0.15, ge=0, description="spread increase per client index")
    shift: float = Field(0.2, ge=0, description="feature-mean shift scale")
    noise: float = Field(0.1, ge=0, description="label noise std")


class FocusLsqOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dim: int = Field(50, ge=1, description="d")
    rows_per_client: int = Field(500, ge=1)
    noise: float = Field(0.1, ge=0)
    notebook_seed: int | None = Field(1234, ge=0, description="legacy np.random.seed of the notebook; None: "
                                      "use the run's data seed")
    hetero: float = Field(0.0, ge=0, description="std of per-client x_o perturbation (0: the notebook)")


class LeafOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alpha: float = Field(1.0, ge=0.0, description="spread of client models")
    beta: float = Field(1.0, ge=0.0, description="spread of client feature means")
    iid: bool = False
    dim: int = Field(60, ge=1, le=100_000)
    classes: int = Field(10, ge=2, le=10_000)
    size_log_mean: float = Field(4.0, description="mean of log(sample count)")
    size_log_sigma: float = Field(2.0, ge=0.0, description="std of log(sample count)")
    min_samples: int = Field(50, ge=2, description="added to every client's count")
    max_samples: int | None = Field(None, ge=2, description="cap per client (none in FedProx)")
