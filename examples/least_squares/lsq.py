"""Least squares on your own arrays: each client k holds (A_k, b_k) with b_k = A_k x*_k, where the x*_k differ
around a common x* (heterogeneous clients), so no client's own minimiser is the global one.

Everything a fedhop spec can name lives here: the data source, the model builder, the loss and a metric.
Every array is float64 and generated from (seed, client) alone, so a client process builds only its own.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def _options(options: dict) -> tuple[int, int, float]:
    return int(options.get("dim", 10)), int(options.get("rows", 20)), float(options.get("spread", 1.0))


def _client_arrays(seed: int, k: int, dim: int, rows: int, spread: float) -> tuple[np.ndarray, np.ndarray]:
    x_star = np.random.default_rng([seed, 0]).standard_normal(dim)
    rng = np.random.default_rng([seed, 1, k])
    a = rng.standard_normal((rows, dim))
    x_k = x_star + spread * rng.standard_normal(dim)
    return a, a @ x_k


def source(req):
    """fedhop's data.source contract: (x, y) for client req.client, or the test set.

    The test set is every client's rows together, so the test loss is the global objective
    f(x) = mean over clients of 0.5 * mean_rows (A_k x - b_k)^2 (equal rows per client)."""
    dim, rows, spread = _options(req.options)
    if req.split == "train":
        return _client_arrays(req.seed, req.client, dim, rows, spread)
    parts = [_client_arrays(req.seed, k, dim, rows, spread) for k in range(req.num_clients)]
    return np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])


def build(input_shape, num_classes, seed):
    """A linear model x -> <w, x> without bias; output [n] (regression: num_classes is 0)."""
    assert num_classes == 0, "least squares is a regression task (data.num_classes = 0)"
    return nn.Sequential(nn.Linear(input_shape[0], 1, bias=False), nn.Flatten(0))


def half_mse(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """0.5 * mean squared residual of a batch."""
    return 0.5 * torch.mean((outputs - y) ** 2)


def max_residual(outputs: torch.Tensor, y: torch.Tensor) -> float:
    """The largest absolute residual on the test set."""
    return float((outputs - y).abs().max())
