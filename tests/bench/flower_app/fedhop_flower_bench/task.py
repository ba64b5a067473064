"""Model and data shared by the ServerApp and the ClientApp: the same job as fedhop's spec in the benchmark.

Data: scikit-learn's digits (pixels / 16), a seeded 80/20 train/test split, the training set split IID into
``num-partitions`` near-equal parts. Model: MLP 64-h-h-10 with ReLU.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn


def make_model(hidden: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def split(seed: int, test_fraction: float) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    d = load_digits()
    x = np.asarray(d.data, dtype=np.float32) / 16.0
    y = np.asarray(d.target, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = round(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def partition(seed: int, test_fraction: float, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``k`` of ``n``'s part of the training set (IID)."""
    (x, y), _ = split(seed, test_fraction)
    parts = np.array_split(np.random.default_rng(seed + 1).permutation(len(x)), n)
    return x[parts[k]], y[parts[k]]


def train_epochs(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, batch: int, lr: float,
                 seed: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    g = torch.Generator().manual_seed(seed)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(xt), generator=g)
        for i in range(0, len(xt), batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            loss_fn(model(xt[idx]), yt[idx]).backward()
            opt.step()


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    model.eval()
    out = model(torch.from_numpy(x))
    loss = nn.functional.cross_entropy(out, torch.from_numpy(y)).item()
    return loss, (out.argmax(1) == torch.from_numpy(y)).float().mean().item()
