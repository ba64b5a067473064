"""CIFAR-10 and CIFAR-100 from their "python version" pickle batches, without torchvision.

A data file is untrusted input, so it is read with :class:`NumpyOnlyUnpickler`, which resolves only the
globals needed to rebuild numpy arrays (``_reconstruct``, ``ndarray``, ``dtype``, ``_frombuffer`` and a
latin-1-only ``_codecs.encode`` that Python 3 protocol-2 pickles use for raw bytes). Any other global
(``os.system``, ``builtins.eval`` ...) fails before anything is called.

Layouts accepted under ``DataSpec.path`` (the directory itself or its parent):

- CIFAR-10: ``cifar-10-batches-py/data_batch_1..5`` and ``test_batch``; dict keys ``b'data'`` (uint8
  ``[n, 3072]``, 1024 red then green then blue values per image, row-major 32x32) and ``b'labels'``.
- CIFAR-100: ``cifar-100-python/train`` and ``test``; keys ``b'data'`` and ``b'fine_labels'``.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedhop.common.data.base import CentralData, to_dataset
from fedhop.common.data.idx import MAX_BYTES, DataFileError
from fedhop.common.data.registry import register_dataset

if TYPE_CHECKING:
    from fedhop.common.data_spec import DataSpec


def _latin1_encode(obj: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    if encoding.lower().replace("-", "").replace("_", "") not in ("latin1", "iso88591"):
        raise pickle.UnpicklingError(f"refusing _codecs.encode with codec {encoding!r}")
    if not isinstance(obj, str):
        raise pickle.UnpicklingError("refusing _codecs.encode of a non-string")
    return obj.encode("latin-1", errors)


def _numpy_attr(modules: tuple[str, ...], name: str) -> Any:
    import importlib

    for m in modules:  # fixed, trusted module names only: never a name taken from the file
        try:
            return getattr(importlib.import_module(m), name)
        except (ImportError, AttributeError):
            continue
    raise pickle.UnpicklingError(f"this numpy has no {name}")


_MULTIARRAY = ("numpy._core.multiarray", "numpy.core.multiarray")
_NUMERIC = ("numpy._core.numeric", "numpy.core.numeric")

_ALLOWED: dict[tuple[str, str], Callable[[], Any]] = {
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    ("_codecs", "encode"): lambda: _latin1_encode,
}
for _m in _MULTIARRAY:
    _ALLOWED[(_m, "_reconstruct")] = lambda: _numpy_attr(_MULTIARRAY, "_reconstruct")
for _m in _NUMERIC:
    _ALLOWED[(_m, "_frombuffer")] = lambda: _numpy_attr(_NUMERIC, "_frombuffer")


class NumpyOnlyUnpickler(pickle.Unpickler):
    """An Unpickler that can rebuild dicts, lists, numbers, bytes and numpy arrays, and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        make = _ALLOWED.get((module, name))
        if make is None:
            raise pickle.UnpicklingError(f"refusing to unpickle global {module}.{name}: only numpy arrays "
                                         "are allowed in a data file")
        return make()

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refusing persistent ids in a data file")


def safe_unpickle(data: bytes, source: str = "<bytes>") -> Any:
    try:
        obj = NumpyOnlyUnpickler(io.BytesIO(data), encoding="bytes").load()
    except pickle.UnpicklingError as e:
        raise DataFileError(f"{source}: {e}") from None
    except Exception as e:  # a corrupt pickle raises many different types
        raise DataFileError(f"{source}: not a readable CIFAR pickle batch "
                            f"({type(e).__name__}: {e})") from None
    return obj


def read_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR batch file -> ``(uint8 images [n, 3, 32, 32], int64 labels [n])``."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise DataFileError(f"{path} is larger than {MAX_BYTES} bytes")
        raw = path.read_bytes()
    except OSError as e:
        raise DataFileError(f"cannot read {path}: {e}") from None
    d = safe_unpickle(raw, str(path))
    if not isinstance(d, dict):
        raise DataFileError(f"{path}: expected a dict batch, got {type(d).__name__}")
    d = {(k.encode() if isinstance(k, str) else k): v for k, v in d.items()}
    if b"data" not in d or label_key not in d:
        raise DataFileError(f"{path}: batch lacks key b'data' or {label_key!r} (has {sorted(map(repr, d))})")
    data, labels = d[b"data"], d[label_key]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        desc = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataFileError(f"{path}: b'data' must be a uint8 array [n, 3072], got {desc}")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError) as e:
        raise DataFileError(f"{path}: labels are not integers ({e})") from None
    if y.ndim != 1 or len(y) != len(data):
        raise DataFileError(f"{path}: {len(data)} images but labels of shape {y.shape}")
    return data.reshape(-1, 3, 32, 32), y


def _resolve(root: Path, folder: str, names: tuple[str, ...]) -> list[Path]:
    if not root.exists():
        raise DataFileError(f"data path {root} does not exist")
    for base in (root, root / folder):
        if all((base / n).is_file() for n in names):
            return [base / n for n in names]
    missing = [str(root / folder / n) for n in names if not (root / folder / n).is_file()]
    raise DataFileError(f"CIFAR files not found under {root}: missing {', '.join(missing)}")


@lru_cache(maxsize=2)
def _load(root: str, folder: str, train: tuple[str, ...], test: tuple[str, ...], label_key: bytes,
          stamp: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    paths = _resolve(Path(root), folder, train + test)
    parts = [read_batch(p, label_key) for p in paths]
    tr, te = parts[: len(train)], parts[len(train):]
    out = (np.concatenate([p[0] for p in tr]), np.concatenate([p[1] for p in tr]),
           np.concatenate([p[0] for p in te]), np.concatenate([p[1] for p in te]))
    for a in out:
        a.flags.writeable = False
    return out


def load_cifar(root: Path, folder: str, train: tuple[str, ...], test: tuple[str, ...], label_key: bytes,
               num_classes: int) -> CentralData:
    stamp = tuple(x for p in _resolve(root, folder, train + test)
                  for x in (p.stat().st_mtime_ns, p.stat().st_size))
    xtr, ytr, xte, yte = _load(str(root.resolve()), folder, train, test, label_key, stamp)
    for y, split in ((ytr, "train"), (yte, "test")):
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise DataFileError(f"{root}: {split} labels outside 0..{num_classes - 1}")
    shape = (3, 32, 32)
    return CentralData(to_dataset(xtr / np.float32(255.0), ytr, "classification"),
                       to_dataset(xte / np.float32(255.0), yte, "classification"), shape, num_classes,
                       "classification")


CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))


@register_dataset("cifar10", file_backed=True, description="CIFAR-10 python batches under data.path")
def cifar10(spec: DataSpec, n_clients: int, seed: int) -> CentralData:
    assert spec.path is not None
    return load_cifar(spec.path, "cifar-10-batches-py", CIFAR10_TRAIN, ("test_batch",), b"labels", 10)


@register_dataset("cifar100", file_backed=True, description="CIFAR-100 python batches (fine labels) under "
                  "data.path")
def cifar100(spec: DataSpec, n_clients: int, seed: int) -> CentralData:
    assert spec.path is not None
    return load_cifar(spec.path, "cifar-100-python", ("train",), ("test",), b"fine_labels", 100)
