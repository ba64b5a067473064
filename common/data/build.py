"""``build_federated_data``: the one entry point roles call to get their data (docs/design.md section 10)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedhop.common.data import partition as P
from fedhop.common.data.base import CentralData, Dataset, FederatedData, Task, make_rng
from fedhop.common.data.registry import get_dataset
from fedhop.common.data.source import source_client, source_federated, source_test
from fedhop.common.data_spec import DataSpec


def cluster_sizes(spec: DataSpec, n_clients: int) -> list[int] | None:
    """The contiguous cluster sizes the partition assumes (None without clusters)."""
    if spec.cluster_sizes is not None:
        if sum(spec.cluster_sizes) != n_clients:
            raise ValueError(f"data.cluster_sizes sums to {sum(spec.cluster_sizes)}, but there are "
                             f"{n_clients} clients")
        return list(spec.cluster_sizes)
    if spec.n_clusters == 0:
        return None
    if spec.n_clusters > n_clients:
        raise ValueError(f"data.n_clusters ({spec.n_clusters}) exceeds the number of clients ({n_clients})")
    return P.even_sizes(n_clients, spec.n_clusters)


def _limit(ds: Dataset, limit: int | None, rng: np.random.Generator) -> Dataset:
    if limit is None or limit >= len(ds):
        return ds
    return ds.subset(np.sort(rng.choice(len(ds), size=limit, replace=False)))


def _standardizer(train: Dataset) -> Callable[[Dataset], Dataset]:
    """Zero mean, unit variance with ``train``'s statistics: an elementwise map, applied to any rows."""
    x = train.x.double()
    dims = [0, *range(2, x.dim())] if x.dim() >= 3 else [0]  # per channel for images, per feature if flat
    mean = x.mean(dim=dims, keepdim=True)
    std = x.std(dim=dims, keepdim=True, unbiased=False)
    std = torch.where(std > 1e-8, std, torch.ones_like(std))

    def f(d: Dataset) -> Dataset:
        return Dataset(((d.x.double() - mean[0]) / std[0]).float(), d.y)

    return f


def partition_indices(spec: DataSpec, labels: torch.Tensor, n_clients: int, num_classes: int,
                      rng: np.random.Generator) -> list[torch.Tensor]:
    """Row indices of every client in ``labels`` for ``spec.partition``."""
    if spec.partition != "iid" and labels.dtype != torch.int64:
        raise ValueError(f"partition {spec.partition!r} needs class labels; this dataset is a regression "
                         "task, use partition='iid'")
    sizes = cluster_sizes(spec, n_clients)
    y = labels.numpy()

    def inner(lab: np.ndarray, n: int, r: np.random.Generator) -> list[torch.Tensor]:
        match spec.partition:
            case "iid":
                return P.iid(lab, n, r)
            case "dirichlet" if spec.dirichlet_mode == "per_client":
                return P.dirichlet_per_client(lab, n, r, spec.dirichlet_lambda, spec.dirichlet_prior_scaled)
            case "dirichlet":
                return P.dirichlet(lab, n, r, spec.dirichlet_lambda, spec.min_samples_per_client)
            case "shards":
                return P.shards(lab, n, r, spec.shards_per_client)
            case "imbalanced":
                minority = spec.imbalance_classes or P.default_minority(num_classes)
                return P.imbalanced(lab, n, r, spec.dirichlet_lambda, minority, spec.imbalance_keep)
        raise AssertionError(spec.partition)

    if spec.partition == "major_class":
        return P.major_class(y, n_clients, rng, spec.rho_device, num_classes, spec.samples_per_client,
                             sizes, spec.rho_cluster)
    if spec.cluster_iid:
        assert sizes is not None
        return P.per_cluster(len(y), sizes, rng, lambda rows, n, r: inner(y[rows], n, r))
    return inner(y, n_clients, rng)


@dataclass(frozen=True)
class DataMeta:
    """What a node needs to build the model: the shape of one sample, the classes (0: regression), the task."""

    input_shape: tuple[int, ...]
    num_classes: int
    task: Task


@dataclass(frozen=True, eq=False)
class _Prepared:
    """A built dataset before any client's samples are materialised: either a training pool with every
    client's row indices (a global assignment, computed from the labels) or the clients a dataset built itself.
    ``scale`` is the standardisation (elementwise, so applying it before or after taking rows is the same)."""

    meta: DataMeta
    test: Dataset
    pool: Dataset | None = None
    parts: list[torch.Tensor] | None = None
    clients: list[Dataset] | None = None
    scale: Callable[[Dataset], Dataset] | None = None

    def client(self, k: int) -> Dataset:
        d = self.pool.subset(self.parts[k]) if self.pool is not None else self.clients[k]
        return self.scale(d) if self.scale is not None else d

    def test_set(self) -> Dataset:
        return self.scale(self.test) if self.scale is not None else self.test


def _prepare(spec: DataSpec, n_clients: int, seed: int) -> _Prepared:
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if spec.union_of is not None:
        if n_clients != 1:
            raise ValueError(f"data.union_of = {spec.union_of} gives ONE client the union of that many clients' "
                             f"data; topology.clients must be 1, not {n_clients}")
        fed = build_federated_data(spec.model_copy(update={"union_of": None}), spec.union_of, seed)
        return _Prepared(DataMeta(fed.input_shape, fed.num_classes, fed.task), fed.test,
                         clients=[Dataset.concat(fed.clients)])
    s = spec.effective_seed(seed)
    out = get_dataset(spec.dataset).build(spec, n_clients, s)
    if isinstance(out, FederatedData):
        if out.n_clients != n_clients:
            raise ValueError(f"dataset {spec.dataset!r} built {out.n_clients} clients, expected {n_clients}")
        clients = [_limit(c, spec.train_limit, make_rng(s, "train_limit", k))
                   for k, c in enumerate(out.clients)]
        test = _limit(out.test, spec.test_limit, make_rng(s, "test_limit"))
        scale = _standardizer(Dataset.concat(clients)) if spec.standardize else None
        return _Prepared(DataMeta(out.input_shape, out.num_classes, out.task), test, clients=clients, scale=scale)
    if not isinstance(out, CentralData):
        raise TypeError(f"dataset {spec.dataset!r} returned {type(out).__name__}, "
                        "not CentralData or FederatedData")
    train = _limit(out.train, spec.train_limit, make_rng(s, "train_limit"))
    test = _limit(out.test, spec.test_limit, make_rng(s, "test_limit"))
    scale = _standardizer(train) if spec.standardize else None
    parts = partition_indices(spec, train.y, n_clients, out.num_classes, make_rng(s, "partition",
                                                                                     spec.partition))
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ValueError(f"partition {spec.partition!r} left clients {empty[:10]} without data; "
                         f"use fewer clients or a larger dataset")
    return _Prepared(DataMeta(out.input_shape, out.num_classes, out.task), test, pool=train, parts=parts,
                     scale=scale)


def build_federated_data(spec: DataSpec, n_clients: int, seed: int) -> FederatedData:
    """Load or generate the data and split it over ``n_clients`` clients: every client's partition and the
    test set (the in-process engine's view; a networked node asks for its own part only, see
    :func:`build_client_data` and :func:`build_test_data`).

    A pure function of ``(spec, n_clients, seed)``: every process of a run calls it and gets identical
    tensors. ``spec.split_seed``, when set, replaces ``seed`` (same data and partition across run seeds).
    """
    if spec.source is not None:
        return source_federated(spec, n_clients, seed)
    p = _prepare(spec, n_clients, seed)
    m = p.meta
    return FederatedData([p.client(k) for k in range(n_clients)], p.test_set(), m.input_shape, m.num_classes,
                         m.task)


def build_client_data(spec: DataSpec, n_clients: int, seed: int, k: int) -> tuple[Dataset, DataMeta]:
    """Client ``k``'s partition alone, bit-identical to ``build_federated_data(...).clients[k]``.

    A partitioner's assignment is global, so the dataset is still built and every client's row indices
    computed (from the labels), but only client ``k``'s samples are copied out and kept; with a
    ``data.source``, only client ``k``'s request is made."""
    if not 0 <= k < n_clients:
        raise ValueError(f"client index {k} out of range for {n_clients} clients")
    if spec.source is not None:
        return source_client(spec, n_clients, seed, k)
    p = _prepare(spec, n_clients, seed)
    return p.client(k), p.meta


def build_clients_data(spec: DataSpec, n_clients: int, seed: int,
                       ks: list[int]) -> tuple[dict[int, Dataset], DataMeta]:
    """Clients ``ks``' partitions (a client host's), each bit-identical to ``build_client_data(..., k)``: the
    dataset is built and the global assignment computed once for all of them, and only their samples are
    copied out; with a ``data.source``, one request per client in ``ks``."""
    if not ks:
        raise ValueError("no client indices given")
    bad = [k for k in ks if not 0 <= k < n_clients]
    if bad:
        raise ValueError(f"client index {bad[0]} out of range for {n_clients} clients")
    if spec.source is not None:
        got = {k: source_client(spec, n_clients, seed, k) for k in ks}
        return {k: d for k, (d, _) in got.items()}, got[ks[0]][1]
    p = _prepare(spec, n_clients, seed)
    return {k: p.client(k) for k in ks}, p.meta


def build_test_data(spec: DataSpec, n_clients: int, seed: int) -> tuple[Dataset, DataMeta]:
    """The test set alone (what the parameter server evaluates on), as ``build_federated_data`` gives it."""
    if spec.source is not None:
        return source_test(spec, n_clients, seed)
    p = _prepare(spec, n_clients, seed)
    return p.test_set(), p.meta
