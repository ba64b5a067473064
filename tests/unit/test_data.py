"""DataSpec validation and build_federated_data (determinism, built-in datasets, options)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from fedhop.common import catalog
from fedhop.common.data import (
    DATASETS,
    CentralData,
    Dataset,
    DataSpec,
    FederatedData,
    build_federated_data,
    get_dataset,
    make_rng,
    register_dataset,
)

PARTITIONS = ["iid", "dirichlet", "shards", "major_class", "imbalanced"]


def digest(fd: FederatedData) -> str:
    h = hashlib.sha256()
    for d in [*fd.clients, fd.test]:
        h.update(d.x.numpy().tobytes())
        h.update(d.y.numpy().tobytes())
    return h.hexdigest()


def same(a: FederatedData, b: FederatedData) -> bool:
    pairs = zip(a.clients, b.clients, strict=True) if len(a.clients) == len(b.clients) else []
    return (len(a.clients) == len(b.clients)
            and all(torch.equal(x.x, y.x) and torch.equal(x.y, y.y) for x, y in pairs)
            and torch.equal(a.test.x, b.test.x) and torch.equal(a.test.y, b.test.y))


@pytest.mark.parametrize("partition", PARTITIONS)
def test_build_is_deterministic_and_seed_sensitive(partition: str) -> None:
    spec = DataSpec(partition=partition)
    a = build_federated_data(spec, 10, 3)
    b = build_federated_data(DataSpec.model_validate(spec.model_dump()), 10, 3)
    assert same(a, b)
    c = build_federated_data(spec, 10, 4)
    assert not same(a, c)


def test_split_seed_pins_data_across_run_seeds() -> None:
    spec = DataSpec(split_seed=66)
    assert same(build_federated_data(spec, 8, 0), build_federated_data(spec, 8, 1))


def sorted_rows(x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    a = np.concatenate([x.reshape(len(x), -1).numpy(), y.numpy()[:, None].astype(np.float32)], axis=1)
    return a[np.lexsort(a.T[::-1])]


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "shards"])
def test_clients_partition_the_training_pool(partition: str) -> None:
    spec = DataSpec(partition=partition)
    pool = get_dataset("digits").build(spec, 9, 0)
    assert isinstance(pool, CentralData)
    fd = build_federated_data(spec, 9, 0)
    assert min(fd.client_sizes) >= 1
    u = fd.union()
    assert np.array_equal(sorted_rows(u.x, u.y), sorted_rows(pool.train.x, pool.train.y))
    assert torch.equal(fd.test.x, pool.test.x)
    assert len(pool.train) + len(pool.test) == 1797


def test_digits_and_digits_img() -> None:
    flat = build_federated_data(DataSpec(dataset="digits", partition="iid"), 4, 0)
    img = build_federated_data(DataSpec(dataset="digits-img", partition="iid"), 4, 0)
    assert flat.input_shape == (64,) and img.input_shape == (1, 8, 8)
    assert flat.num_classes == 10 and flat.task == "classification"
    assert flat.clients[0].x.dtype == torch.float32 and flat.clients[0].y.dtype == torch.int64
    for c in flat.clients:
        assert c.x.min() >= 0.0 and c.x.max() <= 1.0
    assert flat.union().x.max() == 1.0
    assert torch.equal(img.clients[2].x.reshape(-1, 64), flat.clients[2].x)
    assert len(flat.test) == round(1797 * 0.2)


def test_synthetic_options() -> None:
    spec = DataSpec(dataset="synthetic", partition="iid", test_fraction=0.25,
                    options={"samples": 400, "dim": 7, "classes": 4})
    fd = build_federated_data(spec, 5, 0)
    assert fd.input_shape == (7,) and fd.num_classes == 4
    assert len(fd.test) == 100 and sum(fd.client_sizes) == 300
    assert fd.label_counts().sum(0).tolist() != [0, 0, 0, 0]
    assert set(torch.cat([c.y for c in fd.clients]).unique().tolist()) == {0, 1, 2, 3}


def test_synthetic_is_learnable_signal() -> None:
    """Class means separate the classes: a nearest-mean classifier beats chance by far at sep=3."""
    fd = build_federated_data(DataSpec(dataset="synthetic", partition="iid",
                                       options={"samples": 1000, "sep": 3.0}), 2, 0)
    tr = fd.union()
    means = torch.stack([tr.x[tr.y == c].mean(0) for c in range(10)])
    pred = torch.cdist(fd.test.x, means).argmin(1)
    assert (pred == fd.test.y).float().mean() > 0.8


def test_regression_dataset_and_label_partitions() -> None:
    fd = build_federated_data(DataSpec(dataset="synthetic-regression", partition="iid"), 4, 0)
    assert fd.task == "regression" and fd.num_classes == 0
    assert fd.clients[0].y.dtype == torch.float32
    with pytest.raises(ValueError, match="regression"):
        build_federated_data(DataSpec(dataset="synthetic-regression", partition="dirichlet"), 4, 0)


def test_leaf_synthetic_natural_partition() -> None:
    spec = DataSpec(dataset="leaf-synthetic", options={"alpha": 0.5, "beta": 0.5, "max_samples": 300})
    fd = build_federated_data(spec, 12, 0)
    assert fd.n_clients == 12 and fd.input_shape == (60,) and fd.num_classes == 10
    assert all(40 <= n <= 300 for n in fd.client_sizes)  # >= 50 samples before the 20% test split
    assert same(fd, build_federated_data(spec, 12, 0))
    # non-IID: per-client feature means differ far more than in the IID variant (where v_k = 0)
    iid = build_federated_data(DataSpec(dataset="leaf-synthetic", options={"iid": True, "max_samples": 300}),
                               12, 0)

    def spread(f: FederatedData) -> float:
        return float(torch.stack([c.x.mean(0) for c in f.clients]).std(0).mean())

    assert spread(fd) > 3 * spread(iid)


def test_limits_and_standardize() -> None:
    spec = DataSpec(partition="iid", train_limit=300, test_limit=50, standardize=True)
    fd = build_federated_data(spec, 3, 0)
    assert sum(fd.client_sizes) == 300 and len(fd.test) == 50
    x = fd.union().x
    live = x.std(0) > 0
    assert torch.allclose(x.mean(0), torch.zeros(64), atol=1e-5)
    assert torch.allclose(x.std(0, unbiased=False)[live], torch.ones(int(live.sum())), atol=1e-4)


def test_major_class_through_spec_and_clusters() -> None:
    spec = DataSpec(dataset="synthetic", partition="major_class", rho_device=0.5, rho_cluster=0.9,
                    n_clusters=10, samples_per_client=60, options={"samples": 5000})
    fd = build_federated_data(spec, 100, 0)
    counts = fd.label_counts().numpy()
    majors = counts.argmax(1)
    assert (counts.max(1) == 30).all()  # rho_device * 60
    for c in range(10):
        assert (majors[c * 10:(c + 1) * 10] == c).sum() == 9  # rho_cluster * 10 devices per cluster


def test_cluster_iid_dirichlet() -> None:
    spec = DataSpec(partition="dirichlet", dirichlet_lambda=0.3, n_clusters=3, cluster_iid=True)
    fd = build_federated_data(spec, 9, 0)
    assert fd.n_clients == 9 and min(fd.client_sizes) >= 1


def test_too_many_clients_is_clear() -> None:
    with pytest.raises(ValueError, match="clients"):
        build_federated_data(DataSpec(dataset="synthetic", partition="iid", options={"samples": 20}), 50, 0)


# ---- DataSpec validation ----------------------------------------------------------------------------

def test_bad_dataset_name_lists_valid_names() -> None:
    with pytest.raises(ValidationError) as e:
        DataSpec(dataset="imagenet")
    msg = str(e.value)
    assert "imagenet" in msg and "digits" in msg and "cifar10" in msg and "leaf-synthetic" in msg


@pytest.mark.parametrize("bad, field", [
    ({"dirichlet_lambda": 0.0}, "dirichlet_lambda"),
    ({"partition": "zipf"}, "partition"),
    ({"test_fraction": 1.0}, "test_fraction"),
    ({"rho_device": 1.5}, "rho_device"),
    ({"colour": "red"}, "colour"),
    ({"dataset": "synthetic", "options": {"dimm": 3}}, "dimm"),
    ({"dataset": "synthetic", "options": {"classes": 1}}, "classes"),
    ({"dataset": "digits", "options": {"x": 1}}, "options"),
    ({"dataset": "mnist"}, "path"),
    ({"rho_cluster": 0.5, "partition": "major_class"}, "n_clusters"),
    ({"rho_cluster": 0.5, "partition": "iid", "n_clusters": 2}, "major_class"),
    ({"n_clusters": 2, "cluster_sizes": [1, 2, 3]}, "cluster_sizes"),
    ({"imbalance_classes": [1, 1]}, "imbalance_classes"),
])
def test_spec_errors_name_the_field(bad: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        DataSpec.model_validate(bad)
    assert field in str(e.value)


def test_spec_json_roundtrip() -> None:
    spec = DataSpec(dataset="leaf-synthetic", options={"alpha": 0.5}, path="/tmp/x", split_seed=3)
    again = DataSpec.model_validate(spec.model_dump(mode="json", exclude_none=True))
    assert again == spec
    assert again.dataset_options().alpha == 0.5


def test_runspec_toml_roundtrip_keeps_data_and_model() -> None:
    from fedhop.common.spec import RunSpec

    raw = {"data": {"dataset": "leaf-synthetic", "options": {"alpha": 0.5}, "path": "/tmp/x",
                    "partition": "major_class", "rho_cluster": 0.5, "cluster_sizes": [3, 7],
                    "imbalance_classes": [1, 3]},
           "topology": {"clients": 10, "edges": 2, "clients_per_edge": [3, 7]},
           "model": {"name": "lenet", "options": {"variant": "mnist"}}}
    spec = RunSpec.parse(raw)
    again = RunSpec.from_toml(spec.to_toml())
    assert again.data == spec.data and again.model == spec.model


def test_register_dataset_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    # the catalogue records the registration too: on a copy, so that no later test (test_catalog's, which every
    # name it lists must match a registered dataset) sees it (make test runs the files in any order, -n 2)
    monkeypatch.setattr(catalog, "DATASETS", dict(catalog.DATASETS))

    class Opts(BaseModel):
        model_config = ConfigDict(extra="forbid")
        rows: int = 40

    @register_dataset("test-ext", options=Opts)
    def ext(spec: DataSpec, n_clients: int, seed: int) -> CentralData:
        o = spec.dataset_options()
        rng = make_rng(seed, "test-ext")
        x = rng.standard_normal((o.rows, 3)).astype(np.float32)
        y = (np.arange(o.rows) % 2).astype(np.int64)
        d = Dataset(torch.from_numpy(x), torch.from_numpy(y))
        return CentralData(d, d.subset([0, 1]), (3,), 2, "classification")

    try:
        fd = build_federated_data(DataSpec(dataset="test-ext", partition="iid", options={"rows": 30}), 3, 0)
        assert sum(fd.client_sizes) == 30
        with pytest.raises(ValidationError, match="rows"):
            DataSpec(dataset="test-ext", options={"rows": "many"})
    finally:
        del DATASETS["test-ext"]


def test_dataset_container_checks() -> None:
    with pytest.raises(ValueError, match="rows"):
        Dataset(torch.zeros(3, 2), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="float32 or float64"):
        Dataset(torch.zeros(3, 2, dtype=torch.float16), torch.zeros(3, dtype=torch.int64))
    assert Dataset(torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, dtype=torch.int64)).x.dtype == torch.float64
    d = Dataset(torch.arange(6, dtype=torch.float32).reshape(3, 2), torch.tensor([0, 1, 2]))
    assert len(d) == 3
    s = d.subset([2, 0])
    assert s.y.tolist() == [2, 0] and s.x[0].tolist() == [4.0, 5.0]
    s.x[0, 0] = -1
    assert d.x[2, 0] == 4.0  # subset copies
