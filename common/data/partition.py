"""Partitioners: pure functions ``(labels, n_clients, rng, options) -> list of index tensors``.

``labels`` is a 1-D integer array (numpy or torch); ``rng`` a numpy Generator (see ``base.make_rng``).
Each returns one int64 tensor of row indices per client, sorted ascending. All partitions except
``major_class`` are disjoint; ``imbalanced`` covers only the kept rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

Parts = list[torch.Tensor]


def _labels(labels: np.ndarray | torch.Tensor) -> np.ndarray:
    a = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError("partitioning by label needs a 1-D integer label array (classification data)")
    return a.astype(np.int64, copy=False)


def _out(parts: Sequence[np.ndarray]) -> Parts:
    return [torch.from_numpy(np.sort(np.asarray(p, dtype=np.int64))) for p in parts]


def _need(n: int, n_clients: int, per: int = 1) -> None:
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if n < n_clients * per:
        raise ValueError(f"cannot give {n_clients} clients at least {per} sample(s) each from {n} samples")


def iid(labels: np.ndarray | torch.Tensor, n_clients: int, rng: np.random.Generator) -> Parts:
    """Uniformly random split into ``n_clients`` parts whose sizes differ by at most one."""
    n = len(labels)
    _need(n, n_clients)
    return _out(np.array_split(rng.permutation(n), n_clients))


def even_sizes(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` near-equal parts of ``n``: the first ``n % parts`` are one larger."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def dirichlet(labels: np.ndarray | torch.Tensor, n_clients: int, rng: np.random.Generator, lam: float,
              min_size: int = 1) -> Parts:
    """Per-class Dirichlet label skew (Hsu, Qi, Brown 2019; the common reading of Fed-CHS App. A).

    For each class c (ascending), ``p_c ~ Dir(lam * 1_N)`` and class c's samples (shuffled) are cut into
    ``N`` consecutive pieces of sizes ``floor(cumsum(p_c) * n_c)`` differences. Smaller ``lam`` gives more
    skew.

    Guarantee of ``min_size`` (default 1) samples per client, without resampling loops: after the draw,
    while some client has fewer than ``min_size``, it takes one random sample from the currently largest
    client (ties: lowest id). Each move raises the smallest client and lowers one that has more than
    ``min_size``, so it ends after at most ``N * min_size`` moves; it needs ``n >= N * min_size``.
    """
    y = _labels(labels)
    _need(len(y), n_clients, min_size)
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        p = rng.dirichlet(np.full(n_clients, lam))
        cuts = np.floor(np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
        for k, piece in enumerate(np.split(idx, cuts)):
            parts[k].extend(piece.tolist())
    sizes = np.array([len(p) for p in parts])
    while sizes.min() < min_size:
        small = int(np.argmin(sizes))
        big = int(np.argmax(sizes))
        j = int(rng.integers(len(parts[big])))
        parts[small].append(parts[big].pop(j))
        sizes[small] += 1
        sizes[big] -= 1
    return _out([np.array(p, dtype=np.int64) for p in parts])


def dirichlet_per_client(labels: np.ndarray | torch.Tensor, n_clients: int, rng: np.random.Generator,
                         lam: float, prior_scaled: bool = False, sizes: Sequence[int] | None = None) -> Parts:
    """Per-client Dirichlet with equal client sizes (Shen et al. 2021 code, used by FGDRO App. G; FOCUS).

    Client k (in id order) gets ``sizes[k]`` samples (default: ``n`` split as evenly as possible) with
    class proportions ``q_k ~ Dir(lam * 1_C)``, or ``Dir(lam * prior)`` with the empirical class prior when
    ``prior_scaled`` (the FOCUS code). Samples are drawn without replacement from shuffled class pools;
    when a pool runs dry, ``q_k`` is renormalised over the classes that remain, as in Shen et al.'s loop.
    Every sample is used when ``sizes`` sum to ``n``.
    """
    y = _labels(labels)
    n = len(y)
    _need(n, n_clients)
    sizes = even_sizes(n, n_clients) if sizes is None else list(sizes)
    if len(sizes) != n_clients or sum(sizes) > n:
        raise ValueError("dirichlet_per_client: sizes must have n_clients entries summing to at most n")
    classes = np.unique(y)
    pools = [list(rng.permutation(np.flatnonzero(y == c))) for c in classes]
    left = np.array([len(p) for p in pools], dtype=np.int64)
    conc = np.full(len(classes), lam) if not prior_scaled else lam * left / left.sum()
    parts = []
    for k in range(n_clients):
        q = rng.dirichlet(conc)
        need = sizes[k]
        mine: list[int] = []
        while need > 0:
            w = np.where(left > 0, q, 0.0)
            if w.sum() <= 0.0:  # all of q's mass sits on exhausted classes: fall back to the pool sizes
                w = left.astype(np.float64)
            draw = rng.multinomial(need, w / w.sum())
            take = np.minimum(draw, left)
            for ci in np.flatnonzero(take):
                t = int(take[ci])
                mine.extend(pools[ci][:t])
                del pools[ci][:t]
            left -= take
            need -= int(take.sum())
        parts.append(np.array(mine, dtype=np.int64))
    return _out(parts)


def shards(labels: np.ndarray | torch.Tensor, n_clients: int, rng: np.random.Generator,
           shards_per_client: int = 2) -> Parts:
    """McMahan et al. 2017 pathological non-IID: sort by label (ties in random order), cut into
    ``n_clients * shards_per_client`` near-equal shards, give each client ``shards_per_client`` random
    ones."""
    y = _labels(labels)
    n_shards = n_clients * shards_per_client
    _need(len(y), n_shards)
    perm = rng.permutation(len(y))
    order = perm[np.argsort(y[perm], kind="stable")]
    pieces = np.array_split(order, n_shards)
    deal = rng.permutation(n_shards).reshape(n_clients, shards_per_client)
    return _out([np.concatenate([pieces[s] for s in row]) for row in deal])


def imbalanced(labels: np.ndarray | torch.Tensor, n_clients: int, rng: np.random.Generator, lam: float,
               minority: Sequence[int], keep: float) -> Parts:
    """FGDRO App. G imbalanced split: "reducing the data of 5 classes by 80% and then distributed the data
    across 100 clients according to ... Dirichlet", with the code of Shen et al. 2021 [59].

    Keeps ``floor(keep * n_c)`` (at least 1) random samples of each minority class c, then applies
    :func:`dirichlet_per_client` to the kept rows. [59] keeps the first ``int(keep * total)`` rows of the
    minority classes pooled; per-class rounding is this file's choice.
    """
    y = _labels(labels)
    present = set(np.unique(y).tolist())
    bad = [c for c in minority if c not in present]
    if bad:
        raise ValueError(f"imbalance_classes {bad} do not occur in the training labels")
    kept = []
    for c in sorted(present):
        idx = np.flatnonzero(y == c)
        if c in minority:
            idx = np.sort(rng.choice(idx, size=max(1, math.floor(keep * len(idx))), replace=False))
        kept.append(idx)
    rows = np.concatenate(kept)
    sub = dirichlet_per_client(y[rows], n_clients, rng, lam)
    return _out([rows[p.numpy()] for p in sub])


def default_minority(num_classes: int) -> list[int]:
    """Every other class, 0, 2, 4, ...: [59]'s ``n_minority=5`` choice (0, 2, 4, 6, 8) for 10 classes."""
    return list(range(0, num_classes, 2))


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5 + 1e-9))


def cluster_major_matrix(cluster_sizes: Sequence[int], num_classes: int, rho_cluster: float) -> np.ndarray:
    """FedCluster sec. IV-E (docs/specs/fedcluster.md 4.5): ``N[c][c']`` = devices of cluster c whose major class
    is c'. Cluster c's own major class is ``c mod C``; it holds ``round(S_c * rho_cluster)`` such devices;
    the other ``S_c - diag`` are spread as ``base = rest // (C-1)`` per other class plus one for the
    circulant classes ``c+1 .. c+r (mod C)``, ``r = rest % (C-1)``. For 10 clusters of 100 and 10 classes,
    every row and column sums to 100."""
    C = num_classes
    out = np.zeros((len(cluster_sizes), C), dtype=np.int64)
    for c, S in enumerate(cluster_sizes):
        major = c % C
        diag = min(S, round_half_up(S * rho_cluster))
        rest = S - diag
        base, r = divmod(rest, C - 1)
        out[c, :] = base
        out[c, major] = diag
        for j in range(1, r + 1):
            out[c, (major + j) % C] += 1
    return out


def assign_majors(n_clients: int, num_classes: int, rng: np.random.Generator,
                  cluster_sizes: Sequence[int] | None = None, rho_cluster: float | None = None) -> np.ndarray:
    """The major class of every device (FedCluster sec. IV-A).

    Without ``rho_cluster``: device k's class is ``k * C // N`` (each class the major class of ``N/C``
    devices, "100 devices" each in the paper), randomly permuted over devices, so the contiguous clusters
    of the topology are uniformly random clusters, as in the paper's default. With ``rho_cluster``: the
    devices of cluster c (a contiguous id range of ``cluster_sizes``) get the major classes of row c of
    :func:`cluster_major_matrix`, in random order within the cluster.
    """
    if rho_cluster is None:
        return rng.permutation(np.arange(n_clients, dtype=np.int64) * num_classes // n_clients)
    if cluster_sizes is None or sum(cluster_sizes) != n_clients:
        raise ValueError(f"cluster sizes {cluster_sizes} must sum to n_clients={n_clients}")
    mat = cluster_major_matrix(cluster_sizes, num_classes, rho_cluster)
    return np.concatenate([rng.permutation(np.repeat(np.arange(num_classes), row)) for row in mat])


def major_class_counts(samples: int, rho_device: float, num_classes: int, major: int,
                       rng: np.random.Generator) -> np.ndarray:
    """Per-class sample counts of one device (docs/specs/fedcluster.md 4.3): ``round(samples * rho)`` from the
    major class, the rest split evenly over the other classes with the remainder +1 to random ones."""
    counts = np.zeros(num_classes, dtype=np.int64)
    n_major = min(samples, round_half_up(samples * rho_device))
    base, r = divmod(samples - n_major, num_classes - 1)
    others = np.array([c for c in range(num_classes) if c != major])
    counts[others] = base
    counts[rng.choice(others, size=r, replace=False)] += 1
    counts[major] = n_major
    return counts


def major_class(labels: np.ndarray | torch.Tensor, n_clients: int, rng: np.random.Generator,
                rho_device: float, num_classes: int, samples_per_client: int | None = None,
                cluster_sizes: Sequence[int] | None = None, rho_cluster: float | None = None) -> Parts:
    """FedCluster device data (sec. IV-A): device k draws ``samples_per_client`` samples, ``rho_device`` of
    them from its major class and ``(1 - rho_device)/(C-1)`` from each other class, without replacement
    within the device and independently across devices (so devices overlap; docs/specs/fedcluster.md 4.3)."""
    y = _labels(labels)
    if num_classes < 2:
        raise ValueError("major_class needs at least two classes")
    m = samples_per_client if samples_per_client is not None else len(y) // n_clients
    _need(len(y), 1)
    if m < 1:
        raise ValueError(f"major_class: {len(y)} samples cannot give {n_clients} clients a sample each")
    pools = [np.flatnonzero(y == c) for c in range(num_classes)]
    majors = assign_majors(n_clients, num_classes, rng, cluster_sizes, rho_cluster)
    parts = []
    for k in range(n_clients):
        counts = major_class_counts(m, rho_device, num_classes, int(majors[k]), rng)
        mine = []
        for c in range(num_classes):
            if counts[c] > len(pools[c]):
                raise ValueError(f"major_class: client {k} needs {counts[c]} samples of class {c} but the "
                                 f"training pool has {len(pools[c])}; lower samples_per_client or rho_device")
            if counts[c]:
                mine.append(rng.choice(pools[c], size=int(counts[c]), replace=False))
        parts.append(np.concatenate(mine))
    return _out(parts)


def per_cluster(n: int, cluster_sizes: Sequence[int], rng: np.random.Generator,
                inner: Callable[[np.ndarray, int, np.random.Generator], Parts]) -> Parts:
    """Fed-CHS partial heterogeneity (Fig. 4; docs/specs/fedchs.md sec. 4): split the rows IID over the clusters
    in proportion to their sizes, then ``inner(rows, clients_in_cluster, rng)`` partitions each cluster's
    rows (it returns positions into ``rows``). Clusters are contiguous client id ranges."""
    total = sum(cluster_sizes)
    _need(n, total)
    perm = rng.permutation(n)
    shares = [n * s // total for s in cluster_sizes]
    for i in range(n - sum(shares)):
        shares[i % len(shares)] += 1
    out: Parts = []
    start = 0
    for size, share in zip(cluster_sizes, shares, strict=True):
        rows = np.sort(perm[start:start + share])
        start += share
        out.extend(torch.from_numpy(np.sort(rows[p.numpy()])) for p in inner(rows, size, rng))
    return out
