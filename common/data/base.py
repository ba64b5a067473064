"""Core data containers (docs/design.md section 10) and the seeded RNG helper every data module uses.

All randomness in ``fedhop.common.data`` comes from :func:`make_rng`, a numpy ``Generator`` keyed by
``(seed, *tags)`` through a ``SeedSequence``. Tags are hashed with CRC32, never with Python's ``hash()``
(which is salted per process), so every OS process of a run derives the same streams.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

Task = Literal["classification", "regression"]


def make_rng(seed: int, *tags: str | int) -> np.random.Generator:
    """A numpy Generator that depends only on ``seed`` and the ``tags`` (stable across processes)."""
    words = [int(seed) & 0xFFFFFFFF, (int(seed) >> 32) & 0xFFFFFFFF]
    for t in tags:
        words.append(zlib.crc32(t.encode()) if isinstance(t, str) else int(t) & 0xFFFFFFFF)
    return np.random.default_rng(np.random.SeedSequence(words))


def _index(idx: torch.Tensor | Sequence[int] | np.ndarray) -> torch.Tensor:
    if isinstance(idx, torch.Tensor):
        return idx.to(torch.long)
    return torch.as_tensor(np.asarray(idx, dtype=np.int64))


@dataclass(frozen=True, eq=False)  # tensors: identity equality, hash by id
class Dataset:
    """Features ``x`` (float32, or float64 from a user ``data.source``; ``[n, *input_shape]``) and labels ``y``.

    ``y`` is int64 class ids ``[n]`` for classification and float targets ``[n]`` for regression.
    """

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"Dataset: x has {self.x.shape[0]} rows but y has {self.y.shape[0]}")
        if self.x.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"Dataset: x must be float32 or float64, got {self.x.dtype}")
        if self.y.dtype not in (torch.int64, torch.float32, torch.float64) or self.y.dim() != 1:
            raise ValueError(f"Dataset: y must be a 1-D int64, float32 or float64 tensor, got {self.y.dtype} "
                             f"with shape {tuple(self.y.shape)}")

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def subset(self, idx: torch.Tensor | Sequence[int]) -> Dataset:
        """The rows ``idx`` (in that order), copied."""
        i = _index(idx)
        return Dataset(self.x[i], self.y[i])

    @staticmethod
    def concat(parts: Sequence[Dataset]) -> Dataset:
        if not parts:
            raise ValueError("Dataset.concat needs at least one part")
        return Dataset(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))


@dataclass(frozen=True, eq=False)  # tensors: identity equality, hash by id
class FederatedData:
    """What every node of a run sees: all clients' local data (index = client ordinal) and the test set.

    A process normally uses only its own client(s); building everything is what makes the partition
    identical in every process.
    """

    clients: list[Dataset]
    test: Dataset
    input_shape: tuple[int, ...]
    num_classes: int
    task: Task

    def __post_init__(self) -> None:
        if self.task == "classification" and self.num_classes < 2:
            raise ValueError(f"classification needs num_classes >= 2, got {self.num_classes}")
        if self.task == "regression" and self.num_classes != 0:
            raise ValueError(f"regression data must have num_classes == 0, got {self.num_classes}")

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    @property
    def client_sizes(self) -> list[int]:
        return [len(c) for c in self.clients]

    def union(self) -> Dataset:
        """All clients' data stacked in client order (duplicates stay where clients share samples)."""
        return Dataset.concat(self.clients)

    def label_counts(self) -> torch.Tensor:
        """``[n_clients, num_classes]`` int64 label histogram (classification only)."""
        if self.task != "classification":
            raise ValueError("label_counts is defined for classification data only")
        return torch.stack([torch.bincount(c.y, minlength=self.num_classes) for c in self.clients])


@dataclass(frozen=True, eq=False)  # tensors: identity equality, hash by id
class CentralData:
    """A dataset before partitioning: one training pool plus the global test set.

    Dataset builders registered with :func:`fedhop.common.data.registry.register_dataset` return this
    (then ``DataSpec.partition`` splits ``train``) or a ready :class:`FederatedData` (natural partition).
    """

    train: Dataset
    test: Dataset
    input_shape: tuple[int, ...]
    num_classes: int
    task: Task


def holdout_split(x: np.ndarray, y: np.ndarray, test_fraction: float, rng: np.random.Generator,
                  ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Random train/test split of numpy arrays; the test part has ``round(n * test_fraction)`` rows (>= 1)."""
    n = len(y)
    n_test = min(max(1, int(round(n * test_fraction))), n - 1)
    perm = rng.permutation(n)
    te, tr = perm[:n_test], perm[n_test:]
    return (x[tr], y[tr]), (x[te], y[te])


def to_dataset(x: np.ndarray, y: np.ndarray, task: Task) -> Dataset:
    # "W": a read-only (cached) array is copied, so no tensor aliases a cache
    xt = torch.from_numpy(np.require(x, dtype=np.float32, requirements=["C", "W"]))
    ydt = np.int64 if task == "classification" else np.float32
    yt = torch.from_numpy(np.require(y, dtype=ydt, requirements=["C", "W"]))
    return Dataset(xt, yt)
