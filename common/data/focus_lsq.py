"""FOCUS Figure 4 least squares (docs/specs/focus.md section 5.1, "as actually coded in the notebook").

Notebook generator (``np.random.seed(1234)``, legacy ``RandomState`` stream, in this order):

    r = (rand(n_tot) + 1) / 2;  A = r[:, None] * randn(n_tot, d);  x_o = randn(d, 1);
    b = A x_o + noise * randn(n_tot, 1);   client i gets rows i::N (interleaved, an IID split)

with n_tot = rows_per_client * N, d = 50, noise = 0.1, N = 16. The paper's local loss is
f_i(x) = 0.5 ||A_i x - b_i||^2 (a SUM, no ridge); fedhop's regression loss is the mean
0.5 mean_k (a_k^T x - b_k)^2 = f_i / rows_per_client, so a step size eta of the paper is
eta * rows_per_client here (every client holds the same number of rows). Use model ``linear`` with
``bias = false`` and ``init = "zeros"`` (x0 = 0).

Differences from the notebook, by construction: features and targets are stored as float32 (the
``Dataset`` contract), so the problem is the float32-rounded one; :func:`lsq_solution` solves THAT problem
exactly (in float64), so relative errors still reach the float64 floor. ``hetero > 0`` gives every client
its own x_o,i = x_o + hetero * N(0, I) (spec 7.3's heterogeneous variant). The test set is the pooled
training data (its loss is F / rows_per_client). ``notebook_seed = None`` draws from the run's data seed
instead of the legacy stream.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedhop.common.data.base import Dataset, FederatedData, make_rng, to_dataset
from fedhop.common.data.registry import register_dataset
from fedhop.common.data_spec import DataSpec
from fedhop.common.options.datasets import FocusLsqOptions  # noqa: F401  (re-exported)


def generate(o: FocusLsqOptions, n_clients: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The pooled (A, b) in float64, rows in notebook order (client i = rows i::n_clients)."""
    n_tot = o.rows_per_client * n_clients
    rand: Callable[..., np.ndarray]
    randn: Callable[..., np.ndarray]
    if o.notebook_seed is not None:
        rs = np.random.RandomState(o.notebook_seed)
        rand, randn = rs.rand, rs.randn
    else:
        g = make_rng(seed, "focus-lsq")
        rand = g.random

        def randn(*shape: int) -> np.ndarray:
            return g.standard_normal(shape)

    r = (rand(n_tot) + 1) / 2
    a = r[:, None] * randn(n_tot, o.dim)
    xo = randn(o.dim, 1)
    b = a @ xo + o.noise * randn(n_tot, 1)
    if o.hetero > 0:
        shift = o.hetero * make_rng(seed, "focus-lsq", "hetero").standard_normal((n_clients, o.dim))
        owner = np.arange(n_tot) % n_clients
        b = b + np.einsum("kd,kd->k", a, shift[owner])[:, None]
    return a, b[:, 0]


@register_dataset("focus-lsq", options=FocusLsqOptions, description="FOCUS Fig. 4 least squares (notebook)")
def focus_lsq(spec: DataSpec, n_clients: int, seed: int) -> FederatedData:
    o: FocusLsqOptions = spec.dataset_options()
    a, b = generate(o, n_clients, seed)
    clients = [to_dataset(a[i::n_clients], b[i::n_clients], "regression") for i in range(n_clients)]
    return FederatedData(clients=clients, test=Dataset.concat(clients), input_shape=(o.dim,), num_classes=0,
                         task="regression")


def lsq_solution(fed: FederatedData, refinements: int = 4) -> np.ndarray:
    """x* = argmin sum_i ||A_i x - b_i||^2 of the STORED (float32) data, as float64.

    A plain float64 solve is only accurate to ~1e-15 relative here (``lstsq`` and the normal equations
    differ by 3e-15), which would hide FOCUS's ~3e-16 floor; so the least-squares solution is refined on
    the normal equations with residuals A^T (b - A x) accumulated in extended precision (``np.longdouble``).
    """
    a = np.concatenate([c.x.double().numpy() for c in fed.clients])
    b = np.concatenate([c.y.double().numpy() for c in fed.clients])
    al, bl = a.astype(np.longdouble), b.astype(np.longdouble)
    gram = a.T @ a
    x = np.linalg.lstsq(a, b, rcond=None)[0].astype(np.longdouble)
    for _ in range(refinements):
        r = al.T @ (bl - al @ x)
        x = x + np.linalg.solve(gram, r.astype(np.float64)).astype(np.longdouble)
    return x.astype(np.float64)
