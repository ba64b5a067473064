"""Partitioners (common/data/partition.py): coverage, disjointness, skew, FedCluster and FGDRO recipes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedhop.common.data import partition as P
from fedhop.common.data.base import make_rng


def balanced_labels(classes: int, per_class: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class))


def assert_disjoint_cover(parts: list[torch.Tensor], n: int) -> None:
    allidx = torch.cat(parts).numpy()
    assert len(allidx) == n, "partition must cover every row exactly once"
    assert np.array_equal(np.sort(allidx), np.arange(n))
    for p in parts:
        assert p.dtype == torch.int64
        assert torch.all(p[1:] > p[:-1]), "indices are sorted and unique within a client"


def mean_label_entropy(parts: list[torch.Tensor], labels: np.ndarray, classes: int) -> float:
    ents = []
    for p in parts:
        cnt = np.bincount(labels[p.numpy()], minlength=classes).astype(float)
        q = cnt[cnt > 0] / cnt.sum()
        ents.append(float(-(q * np.log(q)).sum()))
    return float(np.mean(ents))


def test_iid_covers_and_balances() -> None:
    y = balanced_labels(10, 101)
    parts = P.iid(y, 7, make_rng(1, "t"))
    assert_disjoint_cover(parts, len(y))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("lam", [0.01, 0.1, 1.0, 100.0])
def test_dirichlet_covers_and_every_client_nonempty(lam: float) -> None:
    y = balanced_labels(10, 30)  # 300 samples, 60 clients: a tiny lambda leaves clients empty before repair
    parts = P.dirichlet(y, 60, make_rng(3, "t"), lam)
    assert_disjoint_cover(parts, len(y))
    assert min(len(p) for p in parts) >= 1


def test_dirichlet_min_size_floor() -> None:
    y = balanced_labels(10, 50)
    parts = P.dirichlet(y, 40, make_rng(0, "t"), 0.05, min_size=5)
    assert_disjoint_cover(parts, len(y))
    assert min(len(p) for p in parts) >= 5


def test_dirichlet_skew_grows_as_lambda_falls() -> None:
    y = balanced_labels(10, 200)
    ents = [mean_label_entropy(P.dirichlet(y, 20, make_rng(7, "t"), lam), y, 10) for lam in (100.0, 1.0, 0.1)]
    assert ents[0] > ents[1] > ents[2]
    assert ents[0] > 0.95 * math.log(10)  # near uniform
    assert ents[2] < 0.5 * math.log(10)  # strongly skewed


def test_dirichlet_per_client_equal_sizes_and_skew() -> None:
    y = balanced_labels(10, 200)
    parts = P.dirichlet_per_client(y, 16, make_rng(2, "t"), 0.1)
    assert_disjoint_cover(parts, len(y))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    hi = mean_label_entropy(P.dirichlet_per_client(y, 16, make_rng(2, "t"), 100.0), y, 10)
    lo = mean_label_entropy(parts, y, 10)
    assert hi > 0.95 * math.log(10) and lo < 0.6 * hi


def test_dirichlet_per_client_survives_exhausted_classes() -> None:
    # one class holds 90% of the data: small-lambda clients keep asking for the rare classes
    y = np.concatenate([np.zeros(900, dtype=np.int64), np.repeat(np.arange(1, 10), 11)])
    parts = P.dirichlet_per_client(y, 25, make_rng(4, "t"), 0.05, prior_scaled=True)
    assert_disjoint_cover(parts, len(y))


def test_shards_give_at_most_k_classes() -> None:
    y = balanced_labels(10, 100)  # 20 shards of 50: each shard is one class
    parts = P.shards(y, 10, make_rng(5, "t"), 2)
    assert_disjoint_cover(parts, len(y))
    for p in parts:
        assert len(np.unique(y[p.numpy()])) <= 2
        assert len(p) == 100


def test_partition_refuses_more_clients_than_samples() -> None:
    with pytest.raises(ValueError, match="at least"):
        P.iid(np.arange(5), 6, make_rng(0))
    with pytest.raises(ValueError, match="at least"):
        P.dirichlet(np.zeros(5, dtype=np.int64), 6, make_rng(0), 1.0)


# ---- FedCluster (docs/specs/fedcluster.md 4.3-4.5) -------------------------------------------------------

@pytest.mark.parametrize("rho", [0.1, 0.4, 0.5, 0.7, 0.9])
def test_major_class_device_recipe(rho: float) -> None:
    C, N, m = 10, 100, 500
    y = balanced_labels(C, 600)
    parts = P.major_class(y, N, make_rng(11, "t"), rho, C, samples_per_client=m)
    n_major = int(math.floor(rho * m + 0.5))
    base = (m - n_major) // (C - 1)
    majors = []
    for p in parts:
        idx = p.numpy()
        assert len(idx) == m and len(np.unique(idx)) == m  # no repeats inside a device
        cnt = np.bincount(y[idx], minlength=C)
        major = int(np.argmax(cnt))
        majors.append(major)
        assert cnt[major] == n_major, "the major class holds the fraction rho of the device's data"
        others = np.delete(cnt, major)
        assert others.min() >= base and others.max() <= base + 1
    if rho > 1 / C:  # at rho = 1/C every class is "major": argmax is not identifying
        assert np.bincount(majors, minlength=C).tolist() == [N // C] * C  # each class major of N/C devices


def test_major_class_rho_01_is_iid_50_each() -> None:
    y = balanced_labels(10, 600)
    for p in P.major_class(y, 20, make_rng(0, "t"), 0.1, 10, samples_per_client=500):
        assert np.bincount(y[p.numpy()], minlength=10).tolist() == [50] * 10


def test_major_class_pool_too_small_is_a_clear_error() -> None:
    y = balanced_labels(10, 20)
    with pytest.raises(ValueError, match="samples_per_client"):
        P.major_class(y, 2, make_rng(0), 0.9, 10, samples_per_client=100)


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9])
def test_rho_cluster_matrix(rho: float) -> None:
    mat = P.cluster_major_matrix([100] * 10, 10, rho)
    assert mat.sum(axis=1).tolist() == [100] * 10
    assert mat.sum(axis=0).tolist() == [100] * 10
    assert np.diag(mat).tolist() == [int(math.floor(100 * rho + 0.5))] * 10
    if rho == 0.1:
        assert (mat == 10).all()  # perfectly homogeneous clusters


def test_rho_cluster_assigns_cluster_majors() -> None:
    sizes = [100] * 10
    majors = P.assign_majors(1000, 10, make_rng(0, "t"), sizes, 0.9)
    for c in range(10):
        block = majors[c * 100:(c + 1) * 100]
        assert (block == c).sum() == 90
        assert np.bincount(block, minlength=10).sum() == 100
    assert np.bincount(majors, minlength=10).tolist() == [100] * 10


def test_random_majors_are_spread_over_contiguous_clusters() -> None:
    majors = P.assign_majors(1000, 10, make_rng(0, "t"))
    assert np.bincount(majors, minlength=10).tolist() == [100] * 10
    # default clustering must be random: no contiguous block of 100 is dominated by one class
    for c in range(10):
        assert np.bincount(majors[c * 100:(c + 1) * 100], minlength=10).max() < 30


# ---- FGDRO imbalanced (docs/specs/fgdro.md 4.1) ----------------------------------------------------------

def test_imbalanced_cuts_minority_classes() -> None:
    y = balanced_labels(10, 500)
    minority = P.default_minority(10)
    assert minority == [0, 2, 4, 6, 8]
    parts = P.imbalanced(y, 100, make_rng(9, "t"), 0.3, minority, 0.2)
    allidx = torch.cat(parts).numpy()
    assert len(np.unique(allidx)) == len(allidx)  # disjoint
    cnt = np.bincount(y[allidx], minlength=10)
    for c in range(10):
        assert cnt[c] == (100 if c in minority else 500)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_imbalanced_rejects_unknown_class() -> None:
    with pytest.raises(ValueError, match="imbalance_classes"):
        P.imbalanced(balanced_labels(3, 10), 2, make_rng(0), 1.0, [5], 0.2)


# ---- Fed-CHS partial heterogeneity --------------------------------------------------------------------

def test_per_cluster_iid_between_clusters() -> None:
    y = balanced_labels(10, 400)
    sizes = [4, 3, 3]

    def inner(rows: np.ndarray, n: int, r: np.random.Generator) -> list[torch.Tensor]:
        return P.dirichlet(y[rows], n, r, 0.1)

    parts = P.per_cluster(len(y), sizes, make_rng(1, "t"), inner)
    assert len(parts) == 10
    assert_disjoint_cover(parts, len(y))
    starts = np.cumsum([0, *sizes])
    glob = np.bincount(y, minlength=10) / len(y)
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        rows = torch.cat(parts[a:b]).numpy()
        share = np.bincount(y[rows], minlength=10) / len(rows)
        assert np.abs(share - glob).max() < 0.05  # each cluster's union is close to the global mix
