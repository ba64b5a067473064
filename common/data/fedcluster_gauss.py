"""FedCluster E1 data (docs/specs/fedcluster.md sec. 8.2 E1): a Gaussian label-skew replica of the paper's
device-level heterogeneity (sec. IV-A; spec sec. 4.3) and cluster-level heterogeneity (sec. IV-E; spec 4.5).

``C`` Gaussian classes in ``R^dim``: class means ``mu_c ~ N(0, sep^2 I)`` and ``x = mu_y + noise * N(0, I)``.
Device k gets a major class (``partition.assign_majors``: each class the major class of n/C devices, randomly
permuted over devices so that the topology's contiguous clusters are uniformly random clusters; with
``DataSpec.rho_cluster``, cluster c's devices follow row c of the rho_cluster matrix) and the per-class counts
of ``partition.major_class_counts`` (``rho_device * m`` from the major class, the rest split evenly). Unlike
the image datasets, every device draws *fresh* samples, so no sample is reused across devices (spec 8.2).

The union of the device data is class-balanced for every rho_device (each class is drawn
``N/C * m * rho + (N - N/C) * m * (1 - rho)/(C-1)`` times). The spec's E1 metric is the global train loss
over that union; ``test = "union"`` makes the run's test set the union itself (``DataSpec.test_limit`` then
takes a fixed random subsample of it, e.g. 50k), ``"fresh"`` draws an independent class-balanced test set.

DataSpec fields used: ``rho_device``, ``samples_per_client`` (default 500, the paper's), ``rho_cluster`` with
``n_clusters`` / ``cluster_sizes`` (clusters = contiguous client ranges, as the topology's edges).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedhop.common.data import partition as P
from fedhop.common.data.base import Dataset, FederatedData, make_rng, to_dataset
from fedhop.common.data.registry import register_dataset
from fedhop.common.options.datasets import GaussLabelSkewOptions  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from fedhop.common.data_spec import DataSpec

DEFAULT_SAMPLES = 500  # "each device possesses 500 data samples" (sec. IV-A)


def device_labels(spec: DataSpec, n_clients: int, classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Every device's labels: ``samples_per_client`` labels with the rho_device class counts of its major
    class (major classes by ``assign_majors``, clusters contiguous as in the topology)."""
    m = spec.samples_per_client or DEFAULT_SAMPLES
    sizes = None
    if spec.rho_cluster is not None:
        sizes = spec.cluster_sizes or P.even_sizes(n_clients, spec.n_clusters)
    majors = P.assign_majors(n_clients, classes, rng, sizes, spec.rho_cluster)
    out = []
    for k in range(n_clients):
        counts = P.major_class_counts(m, spec.rho_device, classes, int(majors[k]), rng)
        out.append(rng.permutation(np.repeat(np.arange(classes), counts)))
    return out


@register_dataset("fedcluster-gauss", options=GaussLabelSkewOptions,
                  description="FedCluster E1: Gaussian classes, major-class label skew (rho_device, "
                  "rho_cluster), fresh samples per device")
def fedcluster_gauss(spec: DataSpec, n_clients: int, seed: int) -> FederatedData:
    o: GaussLabelSkewOptions = spec.dataset_options()
    rng = make_rng(seed, "fedcluster-gauss")
    means = rng.normal(0.0, o.sep, size=(o.classes, o.dim))

    def draw(y: np.ndarray, r: np.random.Generator) -> Dataset:
        return to_dataset(means[y] + o.noise * r.standard_normal((len(y), o.dim)), y, "classification")

    labels = device_labels(spec, n_clients, o.classes, make_rng(seed, "fedcluster-gauss", "labels"))
    clients = [draw(y, make_rng(seed, "fedcluster-gauss", "x", k)) for k, y in enumerate(labels)]
    if o.test == "union":
        test = Dataset.concat(clients)
    else:
        r = make_rng(seed, "fedcluster-gauss", "test")
        test = draw(r.permutation(np.arange(o.test_samples) % o.classes), r)
    return FederatedData(clients, test, (o.dim,), o.classes, "classification")
