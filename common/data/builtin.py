"""Datasets that need no files: scikit-learn's bundled digits and generated Gaussian data."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from fedhop.common.data.base import CentralData, holdout_split, make_rng, to_dataset
from fedhop.common.data.registry import register_dataset
from fedhop.common.options.datasets import RegressionOptions, SyntheticOptions  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from fedhop.common.data_spec import DataSpec


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
