"""User code for the bring-your-own tests, named in specs as ``tests.unit.byo_fixtures:NAME``."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

CALLS: list[tuple[str, int | None]] = []  # every (split, client) a source was asked for, in order


def _arrays(seed: int, key: int, rows: int, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, key])
    return rng.standard_normal((rows, 3)).astype(dtype), rng.integers(0, 3, size=rows)


def source(req):
    """Three classes, 3 features, float64; client k has 5 + k rows."""
    CALLS.append((req.split, req.client))
    if req.split == "test":
        return _arrays(req.seed, 1000, 12)
    return _arrays(req.seed, req.client, 5 + req.client)


def source_regression(req):
    rng = np.random.default_rng([req.seed, 99 if req.client is None else req.client])
    x = rng.standard_normal((8, 2))
    return x, x @ np.array([1.0, -2.0])


def source_not_pair(req):
    return {"x": np.zeros((2, 3))}


def source_list(req):
    return [[0.0, 1.0]], [0]


def source_client1_wide(req):
    """Client 1 has 4 features, everybody else 3."""
    x, y = _arrays(req.seed, 0 if req.client is None else req.client, 6)
    return (np.hstack([x, x[:, :1]]) if req.client == 1 else x), y


def source_client2_float32(req):
    x, y = _arrays(req.seed, 0 if req.client is None else req.client, 6)
    return (x.astype(np.float32) if req.client == 2 else x), y


def source_bad_labels(req):
    x, y = _arrays(req.seed, 0, 6)
    return x, y + 5


def source_int_x(req):
    return np.zeros((4, 3), dtype=np.uint8), np.zeros(4, dtype=np.int64)


def source_raises(req):
    raise FileNotFoundError("no such file: /nowhere/x.npy")


def build(input_shape, num_classes, seed, hidden: int = 4):
    return nn.Sequential(nn.Linear(input_shape[0], hidden), nn.Tanh(), nn.Linear(hidden, max(num_classes, 1)))


def build_regression(input_shape, num_classes, seed):
    return nn.Sequential(nn.Linear(input_shape[0], 1), nn.Flatten(0))


def build_not_module(input_shape, num_classes, seed):
    return "a string"


def build_batchnorm(input_shape, num_classes, seed):
    return nn.Sequential(nn.Linear(input_shape[0], 4), nn.BatchNorm1d(4), nn.Linear(4, num_classes))


def build_wrong_width(input_shape, num_classes, seed):
    return nn.Linear(input_shape[0], num_classes + 1)


def loss(outputs, y):
    return torch.nn.functional.cross_entropy(outputs, y, label_smoothing=0.1)


def loss_per_sample(outputs, y):
    return torch.nn.functional.cross_entropy(outputs, y, reduction="none")


def accuracy_of_class0(outputs, y):
    sel = y == 0
    return float((outputs.argmax(1)[sel] == 0).float().mean()) if bool(sel.any()) else 0.0


def mean_margin(outputs, y):
    return outputs.gather(1, y[:, None]).mean()


def metric_vector(outputs, y):
    return outputs.argmax(1)


NOT_CALLABLE = 3
