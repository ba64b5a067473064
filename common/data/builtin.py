"""Datasets that need no files: scikit-learn's bundled digits and generated Gaussian data."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedhop.common.data.base import CentralData, holdout_split, make_rng, to_dataset
from fedhop.common.data.registry import register_dataset

if TYPE_CHECKING:
    from fedhop.common.data.spec import DataSpec


@lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (np.asarray(d.data, dtype=np.float32) / 16.0)  # pixel values are 0..16
    y = np.asarray(d.target, dtype=np.int64)
    x.flags.writeable = False
    return x, y


def _digits_central(spec: DataSpec, seed: int, shape: tuple[int, ...]) -> CentralData:
    x, y = _digits()
    (xtr, ytr), (xte, yte) = holdout_split(x, y, spec.test_fraction, make_rng(seed, "digits", "split"))
    return CentralData(to_dataset(xtr.reshape(-1, *shape), ytr, "classification"),
                       to_dataset(xte.reshape(-1, *shape), yte, "classification"),
                       shape, 10, "classification")


@register_dataset("digits", description="scikit-learn 8x8 digits (1,797 images, 10 classes), flat 64 "
                  "features scaled to [0, 1]")
def digits(spec: DataSpec, n_clients: int, seed: int) -> CentralData:
    return _digits_central(spec, seed, (64,))


@register_dataset("digits-img", description="scikit-learn digits as [1, 8, 8] images for CNNs")
def digits_img(spec: DataSpec, n_clients: int, seed: int) -> CentralData:
    return _digits_central(spec, seed, (1, 8, 8))


class SyntheticOptions(BaseModel):
    """Gaussian mixture: class means ``mu_c ~ N(0, sep^2 I)``, ``x = mu_y + noise * N(0, I)``, balanced
    labels (specs/fedcluster.md 8.2 E1 uses dim 20, 10 classes, sep 0.5)."""

    model_config = ConfigDict(extra="forbid")
    samples: int = Field(2000, ge=4, le=10_000_000, description="train + test samples")
    dim: int = Field(20, ge=1, le=100_000)
    classes: int = Field(10, ge=2, le=10_000)
    sep: float = Field(1.0, gt=0.0)
    noise: float = Field(1.0, gt=0.0)


@register_dataset("synthetic", options=SyntheticOptions,
                  description="Gaussian-mixture classification (options: samples, dim, classes, sep, noise)")
def synthetic(spec: DataSpec, n_clients: int, seed: int) -> CentralData:
    o: SyntheticOptions = spec.dataset_options()
    rng = make_rng(seed, "synthetic")
    means = rng.normal(0.0, o.sep, size=(o.classes, o.dim))
    y = rng.permutation(np.arange(o.samples) % o.classes)
    x = means[y] + o.noise * rng.standard_normal((o.samples, o.dim))
    (xtr, ytr), (xte, yte) = holdout_split(x, y, spec.test_fraction, make_rng(seed, "synthetic", "split"))
    return CentralData(to_dataset(xtr, ytr, "classification"), to_dataset(xte, yte, "classification"),
                       (o.dim,), o.classes, "classification")


class RegressionOptions(BaseModel):
    """Linear model ``y = x . w* + noise * N(0, 1)`` with ``x, w* ~ N(0, I)``."""

    model_config = ConfigDict(extra="forbid")
    samples: int = Field(2000, ge=4, le=10_000_000)
    dim: int = Field(20, ge=1, le=100_000)
    noise: float = Field(0.1, ge=0.0)


@register_dataset("synthetic-regression", options=RegressionOptions,
                  description="linear-regression data (options: samples, dim, noise); use partition='iid'")
def synthetic_regression(spec: DataSpec, n_clients: int, seed: int) -> CentralData:
    o: RegressionOptions = spec.dataset_options()
    rng = make_rng(seed, "synthetic-regression")
    w = rng.standard_normal(o.dim)
    x = rng.standard_normal((o.samples, o.dim))
    y = x @ w + o.noise * rng.standard_normal(o.samples)
    split_rng = make_rng(seed, "synthetic-regression", "split")
    (xtr, ytr), (xte, yte) = holdout_split(x, y, spec.test_fraction, split_rng)
    return CentralData(to_dataset(xtr, ytr, "regression"), to_dataset(xte, yte, "regression"),
                       (o.dim,), 0, "regression")
