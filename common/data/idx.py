"""MNIST and Fashion-MNIST from their standard IDX files (optionally gzipped), without torchvision.

IDX format (LeCun's MNIST page): two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B int16,
0x0C int32, 0x0D float32, 0x0E float64), the number of dimensions, then each dimension as a big-endian
uint32, then the data, big-endian, row-major. A gzipped file is recognised by its magic bytes, not its name.

``DataSpec.path`` is a directory holding ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (each optionally ``.gz``), directly or in
``raw/``, ``MNIST/raw/`` or ``FashionMNIST/raw/`` (torchvision's layout).
"""

from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedhop.common.data.base import CentralData, to_dataset
from fedhop.common.data.registry import register_dataset

if TYPE_CHECKING:
    from fedhop.common.data_spec import DataSpec

_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_CODES = {np.dtype(v).newbyteorder(">").str: k for k, v in _DTYPES.items()}
MAX_BYTES = 4 << 30


class DataFileError(ValueError):
    """A dataset file that is missing, truncated or not in the expected format; the message names it."""


def _read_bytes(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head == b"\x1f\x8b":
                with gzip.open(f) as g:
                    data = g.read(MAX_BYTES + 1)
            else:
                data = f.read(MAX_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataFileError(f"cannot read {path}: {e}") from None
    if len(data) > MAX_BYTES:
        raise DataFileError(f"{path} is larger than {MAX_BYTES} bytes")
    return data


def parse_idx(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """Decode one IDX file's bytes into a native-endian numpy array."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
        raise DataFileError(f"{source} is not an IDX file (bad magic number {data[:4].hex() or 'empty'})")
    ndim = data[3]
    if ndim < 1 or len(data) < 4 + 4 * ndim:
        raise DataFileError(f"{source}: truncated IDX header")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dt = np.dtype(_DTYPES[data[2]])
    expected = 4 + 4 * ndim + int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if len(data) != expected:
        raise DataFileError(f"{source}: IDX header promises shape {shape} ({expected} bytes) but the file "
                            f"has {len(data)} bytes (truncated or corrupt)")
    arr = np.frombuffer(data, dtype=dt, offset=4 + 4 * ndim).reshape(shape)
    return arr.astype(dt.newbyteorder("="))


def write_idx(path: Path, arr: np.ndarray, compress: bool = False) -> None:
    """Write ``arr`` as an IDX file (used by tests and by tools that export data)."""
    be = np.ascontiguousarray(arr).astype(np.dtype(arr.dtype).newbyteorder(">"))
    code = _CODES.get(be.dtype.str)
    if code is None:
        raise ValueError(f"IDX cannot store dtype {arr.dtype}")
    dims = b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    blob = bytes([0, 0, code, arr.ndim]) + dims + be.tobytes()
    path.write_bytes(gzip.compress(blob, mtime=0) if compress else blob)


def read_idx(path: Path) -> np.ndarray:
    return parse_idx(_read_bytes(path), str(path))


_FILES = {
    "train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte",
}


def find_file(root: Path, name: str, subdirs: tuple[str, ...]) -> Path:
    tried = []
    for sub in ("", *subdirs):
        for suffix in ("", ".gz"):
            p = root / sub / (name + suffix)
            tried.append(p)
            if p.is_file():
                return p
    raise DataFileError(f"dataset file {name}[.gz] not found under {root} (looked for: "
                        f"{', '.join(str(t) for t in tried)})")


@lru_cache(maxsize=2)
def _load_idx_set(root: str, subdirs: tuple[str, ...], stamp: tuple[int, ...],
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    out = []
    for key in ("train_x", "train_y", "test_x", "test_y"):
        arr = read_idx(find_file(Path(root), _FILES[key], subdirs))
        arr.flags.writeable = False  # cached: shared by later calls
        out.append(arr)
    return out[0], out[1], out[2], out[3]


def _stamp(root: Path, subdirs: tuple[str, ...]) -> tuple[int, ...]:
    st = []
    for name in _FILES.values():
        s = find_file(root, name, subdirs).stat()
        st += [s.st_mtime_ns, s.st_size]
    return tuple(st)


def load_idx_dataset(root: Path, subdirs: tuple[str, ...], num_classes: int) -> CentralData:
    if not root.exists():
        raise DataFileError(f"data path {root} does not exist")
    if not root.is_dir():
        raise DataFileError(f"data path {root} must be a directory holding the IDX files")
    xtr, ytr, xte, yte = _load_idx_set(str(root.resolve()), subdirs, _stamp(root, subdirs))
    for x, y, split in ((xtr, ytr, "train"), (xte, yte, "t10k")):
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise DataFileError(f"{root}: {split} images {x.shape} and labels {y.shape} do not match "
                                "([n, rows, cols] and [n])")
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise DataFileError(f"{root}: {split} labels outside 0..{num_classes - 1}")
    if xtr.shape[1:] != xte.shape[1:]:
        raise DataFileError(f"{root}: train images {xtr.shape[1:]} and test images {xte.shape[1:]} differ")
    scale = 255.0 if xtr.dtype == np.uint8 else 1.0
    shape = (1, *xtr.shape[1:])
    return CentralData(to_dataset(xtr.reshape(-1, *shape) / np.float32(scale), ytr, "classification"),
                       to_dataset(xte.reshape(-1, *shape) / np.float32(scale), yte, "classification"),
                       shape, num_classes, "classification")


@register_dataset("mnist", file_backed=True, description="MNIST from IDX files under data.path")
def mnist(spec: DataSpec, n_clients: int, seed: int) -> CentralData:
    assert spec.path is not None
    return load_idx_dataset(spec.path, ("raw", "MNIST/raw"), 10)


@register_dataset("fashion-mnist", file_backed=True,
                  description="Fashion-MNIST from IDX files under data.path")
def fashion_mnist(spec: DataSpec, n_clients: int, seed: int) -> CentralData:
    assert spec.path is not None
    return load_idx_dataset(spec.path, ("raw", "FashionMNIST/raw"), 10)
