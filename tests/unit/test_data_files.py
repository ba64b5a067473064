"""File-backed datasets: IDX (MNIST / Fashion-MNIST) and CIFAR pickle batches, written here in the exact
on-disk formats (IDX magic numbers, CIFAR dict keys), plus corrupt, missing and hostile files."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhop.common.data import DataSpec, build_federated_data
from fedhop.common.data.cifar import safe_unpickle
from fedhop.common.data.idx import DataFileError, parse_idx, read_idx, write_idx


def idx_bytes(arr: np.ndarray) -> bytes:
    """An independent IDX encoder (uint8 only), written from the format description."""
    assert arr.dtype == np.uint8
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    return header + arr.tobytes()


def make_mnist(root: Path, n_train: int = 30, n_test: int = 12, gz: bool = False, seed: int = 0,
               ) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    xtr = rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8)
    ytr = (np.arange(n_train) % 10).astype(np.uint8)
    xte = rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8)
    yte = (np.arange(n_test) % 10).astype(np.uint8)
    root.mkdir(parents=True, exist_ok=True)
    for name, arr in [("train-images-idx3-ubyte", xtr), ("train-labels-idx1-ubyte", ytr),
                      ("t10k-images-idx3-ubyte", xte), ("t10k-labels-idx1-ubyte", yte)]:
        blob = idx_bytes(arr)
        if gz:
            (root / (name + ".gz")).write_bytes(gzip.compress(blob))
        else:
            (root / name).write_bytes(blob)
    return xtr, ytr, xte, yte


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_roundtrip(tmp_path: Path, gz: bool) -> None:
    xtr, ytr, xte, yte = make_mnist(tmp_path, gz=gz)
    fd = build_federated_data(DataSpec(dataset="mnist", path=tmp_path, partition="iid"), 3, 0)
    assert fd.input_shape == (1, 28, 28) and fd.num_classes == 10
    assert torch.equal(fd.test.x, torch.from_numpy(xte).float().div(255).unsqueeze(1))
    assert fd.test.y.tolist() == yte.tolist()
    u = fd.union()
    assert len(u) == len(ytr)
    # each client row is one of the file's images, with its own label
    flat = torch.from_numpy(xtr).float().div(255).reshape(len(xtr), -1)
    for row, lab in zip(u.x.reshape(len(u), -1), u.y, strict=True):
        j = int(torch.nonzero((flat == row).all(1))[0])
        assert int(ytr[j]) == int(lab)


def test_fashion_mnist_torchvision_layout(tmp_path: Path) -> None:
    make_mnist(tmp_path / "FashionMNIST" / "raw", gz=True, seed=1)
    fd = build_federated_data(DataSpec(dataset="fashion-mnist", path=tmp_path, partition="iid"), 2, 0)
    assert sum(fd.client_sizes) == 30 and len(fd.test) == 12


def test_idx_writer_and_parser_agree(tmp_path: Path) -> None:
    for arr in [np.arange(24, dtype=np.uint8).reshape(2, 3, 4), np.array([-1.5, 2.0], dtype=np.float32),
                np.array([[1, -2], [3, 70000]], dtype=np.int32)]:
        p = tmp_path / "a.idx"
        write_idx(p, arr, compress=arr.dtype == np.float32)
        back = read_idx(p)
        assert back.dtype == arr.dtype and np.array_equal(back, arr)
    assert np.array_equal(parse_idx(idx_bytes(np.ones((2, 2), np.uint8))), np.ones((2, 2), np.uint8))


@pytest.mark.parametrize("blob, msg", [
    (b"\x00\x00\x08", "not an IDX"),
    (b"\x08\x03\x00\x00" + b"\x00" * 20, "bad magic"),
    (b"\x00\x00\x77\x01\x00\x00\x00\x01\x00", "bad magic"),
    (b"\x00\x00\x08\x03\x00\x00", "truncated"),
    (idx_bytes(np.zeros((4, 5), np.uint8))[:-3], "truncated or corrupt"),
    (idx_bytes(np.zeros((4, 5), np.uint8)) + b"\x00", "truncated or corrupt"),
])
def test_corrupt_idx(blob: bytes, msg: str) -> None:
    with pytest.raises(DataFileError, match=msg):
        parse_idx(blob, "x")


def test_corrupt_file_names_the_path(tmp_path: Path) -> None:
    make_mnist(tmp_path)
    bad = tmp_path / "t10k-labels-idx1-ubyte"
    bad.write_bytes(bad.read_bytes()[:-1])
    with pytest.raises(DataFileError, match="t10k-labels-idx1-ubyte"):
        build_federated_data(DataSpec(dataset="mnist", path=tmp_path), 2, 0)


def test_bad_gzip(tmp_path: Path) -> None:
    make_mnist(tmp_path, gz=True)
    p = tmp_path / "train-images-idx3-ubyte.gz"
    p.write_bytes(p.read_bytes()[:40])
    with pytest.raises(DataFileError, match="train-images"):
        build_federated_data(DataSpec(dataset="mnist", path=tmp_path), 2, 0)


def test_missing_files_and_paths(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=str(tmp_path / "nope")):
        build_federated_data(DataSpec(dataset="mnist", path=tmp_path / "nope"), 2, 0)
    make_mnist(tmp_path)
    (tmp_path / "t10k-images-idx3-ubyte").unlink()
    with pytest.raises(DataFileError, match="t10k-images-idx3-ubyte.*not found"):
        build_federated_data(DataSpec(dataset="mnist", path=tmp_path), 2, 0)


def test_label_out_of_range(tmp_path: Path) -> None:
    make_mnist(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.full(30, 12, np.uint8)))
    with pytest.raises(DataFileError, match="labels outside"):
        build_federated_data(DataSpec(dataset="mnist", path=tmp_path), 2, 0)


def test_mismatched_counts(tmp_path: Path) -> None:
    make_mnist(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(29, np.uint8)))
    with pytest.raises(DataFileError, match="do not match"):
        build_federated_data(DataSpec(dataset="mnist", path=tmp_path), 2, 0)


# ---- CIFAR ------------------------------------------------------------------------------------------

def cifar_batch(n: int, rng: np.random.Generator, label_key: bytes, classes: int) -> dict:
    d = {b"batch_label": b"training batch", b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
         label_key: [int(v) for v in rng.integers(0, classes, n)],
         b"filenames": [b"f%d.png" % i for i in range(n)]}
    if label_key == b"fine_labels":
        d[b"coarse_labels"] = [int(v) for v in rng.integers(0, 20, n)]
    return d


def make_cifar10(root: Path, protocol: int = 2) -> list[dict]:
    rng = np.random.default_rng(0)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        b = cifar_batch(4, rng, b"labels", 10)
        (folder / name).write_bytes(pickle.dumps(b, protocol=protocol))
        batches.append(b)
    return batches


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_roundtrip_and_pixel_layout(tmp_path: Path, protocol: int) -> None:
    batches = make_cifar10(tmp_path, protocol)
    fd = build_federated_data(DataSpec(dataset="cifar10", path=tmp_path, partition="iid"), 2, 0)
    assert fd.input_shape == (3, 32, 32) and fd.num_classes == 10
    assert sum(fd.client_sizes) == 20 and len(fd.test) == 4
    raw = batches[-1][b"data"]
    k, ch, r, c = 2, 1, 5, 17  # CIFAR rows: 1024 red, 1024 green, 1024 blue, each 32x32 row-major
    assert fd.test.x[k, ch, r, c].item() == pytest.approx(raw[k, ch * 1024 + r * 32 + c] / 255.0)
    assert fd.test.y.tolist() == batches[-1][b"labels"]
    # the parent directory and the batch directory itself are both accepted
    again = build_federated_data(DataSpec(dataset="cifar10", path=tmp_path / "cifar-10-batches-py",
                                          partition="iid"), 2, 0)
    assert torch.equal(again.test.x, fd.test.x)


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    tr, te = cifar_batch(10, rng, b"fine_labels", 100), cifar_batch(5, rng, b"fine_labels", 100)
    (folder / "train").write_bytes(pickle.dumps(tr, protocol=2))
    (folder / "test").write_bytes(pickle.dumps(te, protocol=2))
    fd = build_federated_data(DataSpec(dataset="cifar100", path=tmp_path, partition="iid"), 2, 0)
    assert fd.num_classes == 100
    assert fd.test.y.tolist() == te[b"fine_labels"]
    assert sorted(fd.union().y.tolist()) == sorted(tr[b"fine_labels"])


class Evil:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):  # noqa: ANN204
        return (os.mkdir, (self.target,))


def test_hostile_pickle_is_refused_without_side_effects(tmp_path: Path) -> None:
    make_cifar10(tmp_path)
    marker = tmp_path / "pwned"
    evil = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [Evil(str(marker))]}
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(DataFileError, match=r"test_batch.*refusing to unpickle global (posix|os|nt)\.mkdir"):
        build_federated_data(DataSpec(dataset="cifar10", path=tmp_path), 2, 0)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [
    pickle.dumps(eval, protocol=2),
    b"cbuiltins\neval\n(S'1+1'\ntR.",
    b"c_codecs\nencode\n(X\x01\x00\x00\x00aX\x0a\x00\x00\x00zlib_codectR.",  # a codec other than latin-1
])
def test_unpickler_allows_only_numpy(payload: bytes) -> None:
    with pytest.raises(DataFileError, match="refusing"):
        safe_unpickle(payload, "mem")


def test_object_arrays_and_bad_structure_are_rejected(tmp_path: Path) -> None:
    make_cifar10(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((1, 3072), dtype=object),
                                                      b"labels": [0]}, protocol=2))
    with pytest.raises(DataFileError, match="uint8"):
        build_federated_data(DataSpec(dataset="cifar10", path=tmp_path), 2, 0)
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((1, 3072), np.uint8)}, protocol=2))
    with pytest.raises(DataFileError, match="b'labels'"):
        build_federated_data(DataSpec(dataset="cifar10", path=tmp_path), 2, 0)
    good = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0]}, protocol=2)
    (folder / "test_batch").write_bytes(good[: len(good) // 2])
    with pytest.raises(DataFileError, match="test_batch"):
        build_federated_data(DataSpec(dataset="cifar10", path=tmp_path), 2, 0)


def test_cifar_missing_batch_named(tmp_path: Path) -> None:
    make_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataFileError, match="data_batch_3"):
        build_federated_data(DataSpec(dataset="cifar10", path=tmp_path), 2, 0)


def test_loaded_tensors_do_not_alias_the_cache(tmp_path: Path) -> None:
    _, ytr, xte, _ = make_mnist(tmp_path)
    spec = DataSpec(dataset="mnist", path=tmp_path, partition="iid")
    fd = build_federated_data(spec, 2, 0)
    fd.test.x.fill_(7.0)
    fd.test.y.fill_(3)
    again = build_federated_data(spec, 2, 0)
    assert torch.equal(again.test.x, torch.from_numpy(xte).float().div(255).unsqueeze(1))
    assert sorted(again.union().y.tolist()) == sorted(ytr.tolist())
