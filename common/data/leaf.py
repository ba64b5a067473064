"""LEAF-style Synthetic(alpha, beta) (Li et al., "Federated Optimization in Heterogeneous Networks"
(FedProx), sec. 5.1; the generator used by LEAF-based benchmarks). Each client is generated on its own,
so the dataset comes with its natural partition and ignores ``DataSpec.partition``.

For client k (FedProx's ``generate_synthetic``):

- ``u_k ~ N(0, alpha^2)``, ``B_k ~ N(0, beta^2)`` (FedProx's code passes alpha, beta as the std);
- ``W_k ~ N(u_k, 1)`` of shape ``[dim, classes]``, ``b_k ~ N(u_k, 1)``;
- ``v_k ~ N(B_k, 1)`` of shape ``[dim]``, ``x ~ N(v_k, Sigma)``, ``Sigma = diag(j^-1.2)``, j = 1..dim;
- ``y = argmax softmax(x W_k + b_k)``;
- sample count ``n_k = floor(LogNormal(4, 2)) + 50``.

With ``iid=true`` all clients share one ``(W, b)`` drawn from ``N(0, 1)`` and ``v_k = 0``
(FedProx's Synthetic-IID). Each client's samples are split ``test_fraction`` into the global test set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedhop.common.data.base import Dataset, FederatedData, make_rng, to_dataset
from fedhop.common.data.registry import register_dataset
from fedhop.common.options.datasets import LeafOptions  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from fedhop.common.data_spec import DataSpec


def _softmax_argmax(z: np.ndarray) -> np.ndarray:
    return np.argmax(z, axis=1)  # softmax is monotone: argmax of the logits


@register_dataset("leaf-synthetic", options=LeafOptions,
                  description="LEAF/FedProx Synthetic(alpha, beta), generated client by client "
                  "(natural partition; options: alpha, beta, iid, dim, classes, ...)")
def leaf_synthetic(spec: DataSpec, n_clients: int, seed: int) -> FederatedData:
    o: LeafOptions = spec.dataset_options()
    rng = make_rng(seed, "leaf-synthetic")
    sizes = rng.lognormal(o.size_log_mean, o.size_log_sigma, n_clients).astype(np.int64) + o.min_samples
    if o.max_samples is not None:
        sizes = np.minimum(sizes, o.max_samples)
    u = rng.normal(0.0, o.alpha, n_clients)
    big_b = rng.normal(0.0, o.beta, n_clients)
    sd = np.arange(1, o.dim + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2
    w_g = rng.normal(0.0, 1.0, (o.dim, o.classes))
    b_g = rng.normal(0.0, 1.0, o.classes)
    clients, tests = [], []
    for k in range(n_clients):
        v = np.zeros(o.dim) if o.iid else rng.normal(big_b[k], 1.0, o.dim)
        if o.iid:
            w, b = w_g, b_g
        else:
            w = rng.normal(u[k], 1.0, (o.dim, o.classes))
            b = rng.normal(u[k], 1.0, o.classes)
        x = v + sd * rng.standard_normal((int(sizes[k]), o.dim))
        y = _softmax_argmax(x @ w + b)
        n_test = min(max(1, int(round(len(y) * spec.test_fraction))), len(y) - 1)
        perm = rng.permutation(len(y))
        te, tr = perm[:n_test], np.sort(perm[n_test:])
        clients.append(to_dataset(x[tr], y[tr], "classification"))
        tests.append(to_dataset(x[np.sort(te)], y[np.sort(te)], "classification"))
    return FederatedData(clients, Dataset.concat(tests), (o.dim,), o.classes, "classification")
