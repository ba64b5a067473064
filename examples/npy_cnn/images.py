"""A small CNN on your own image files: every client reads only its own ``client_<k>_x.npy`` /
``client_<k>_y.npy`` from its data path; the parameter server reads ``test_x.npy`` / ``test_y.npy``.

``python images.py prepare DIR`` writes those files (synthetic 1x12x12 uint8 images of four shapes, label-
skewed across clients), standing in for your own data; nothing is downloaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

SIZE, CLASSES = 12, 4


def _draw(label: int, rng: np.random.Generator) -> np.ndarray:
    img = np.zeros((SIZE, SIZE))
    r, c = rng.integers(2, SIZE - 2, size=2)
    if label == 0:
        img[r, :] = 1.0  # horizontal bar
    elif label == 1:
        img[:, c] = 1.0  # vertical bar
    elif label == 2:
        np.fill_diagonal(img, 1.0)  # diagonal
    else:
        img[r - 2:r + 2, c - 2:c + 2] = 1.0  # square
    img += 0.3 * rng.standard_normal(img.shape)
    return (np.clip(img, 0.0, 1.0) * 255).astype(np.uint8)[None]


def _write(folder: Path, name: str, labels: np.ndarray, rng: np.random.Generator) -> None:
    np.save(folder / f"{name}_x.npy", np.stack([_draw(int(y), rng) for y in labels]))
    np.save(folder / f"{name}_y.npy", labels.astype(np.int64))


def prepare(folder: Path, clients: int = 4, per_client: int = 96, test: int = 256, seed: int = 0) -> None:
    """Write every client's files and the test set under ``folder``; client k sees mostly classes k, k+1."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for k in range(clients):
        p = np.full(CLASSES, 0.1 / (CLASSES - 2))
        p[[k % CLASSES, (k + 1) % CLASSES]] = 0.45
        _write(folder, f"client_{k}", rng.choice(CLASSES, size=per_client, p=p), rng)
    _write(folder, "test", rng.permutation(np.arange(test) % CLASSES), rng)


def source(req):
    """fedhop's data.source contract: read this node's own files from req.path (data.path or --data-path)."""
    if req.path is None:
        raise ValueError("set data.path (or --data-path) to the folder written by `python images.py prepare`")
    name = f"client_{req.client}" if req.split == "train" else "test"
    x = np.load(Path(req.path) / f"{name}_x.npy")
    y = np.load(Path(req.path) / f"{name}_y.npy")
    return x.astype(np.float32) / 255.0, y


def build(input_shape, num_classes, seed, channels: int = 8):
    """conv(3x3) - relu - maxpool(2) - conv(3x3) - relu - global average - linear."""
    c, _, _ = input_shape
    return nn.Sequential(
        nn.Conv2d(c, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * channels, num_classes))


def macro_f1(outputs: torch.Tensor, y: torch.Tensor) -> float:
    """Unweighted mean over classes of the F1 score."""
    pred = outputs.argmax(1)
    scores = []
    for c in range(outputs.shape[1]):
        tp = int(((pred == c) & (y == c)).sum())
        fp = int(((pred == c) & (y != c)).sum())
        fn = int(((pred != c) & (y == c)).sum())
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0)
    return sum(scores) / len(scores)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "prepare":
        sys.exit("usage: python images.py prepare DIR")
    prepare(Path(sys.argv[2]))
    print(f"wrote the clients' and the test set's .npy files under {sys.argv[2]}")
