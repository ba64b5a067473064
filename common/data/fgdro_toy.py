"""The FGDRO spec's linear-regression toy (docs/specs/fgdro.md section 8 and Appendix A; not from the paper).

N clients with growing heterogeneity: w* ~ N(0, I_d); client i has features x = e + shift_i with
e ~ N(0, I_d), shift_i = 0.2 * N(0, I_d), its own optimum W_i = w* + (0.3 + 0.15 i) * N(0, I_d) and targets
y = x . W_i + 0.1 * N(0, 1). The draws follow the spec's numpy code call for call, so with
``data.split_seed = 0`` (or run seed 0) and the default options the training data are exactly the spec's (up
to float32). A test set of ``test_per_client`` rows per client, from the same client distributions, is
drawn afterwards (the spec's toy uses the exact training losses g_i(w); the test set only serves the
engine's per-round evaluation).
"""

from __future__ import annotations

import numpy as np

from fedhop.common.data.base import FederatedData, to_dataset
from fedhop.common.data.registry import register_dataset
from fedhop.common.data_spec import DataSpec
from fedhop.common.options.datasets import FGDROToyOptions  # noqa: F401  (re-exported)


def toy_arrays(o: FGDROToyOptions, n_clients: int, seed: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X [N,n,d], Y [N,n], X_test [N,m,d], Y_test [N,m], W_clients [N,d]), float64, spec App. A order."""
    d, n = o.dim, o.samples_per_client
    rng = np.random.default_rng(seed)
    wstar = rng.normal(size=d)
    xs, shifts = [], []
    for _ in range(n_clients):
        e = rng.normal(size=(n, d))                 # spec: rng.normal(size=(n, d)) + 0.2 * rng.normal(size=d)
        sh = o.shift * rng.normal(size=d)
        xs.append(e + sh)
        shifts.append(sh)
    X = np.stack(xs)
    Wt = np.stack([wstar + rng.normal(size=d) * (o.spread0 + o.spread_step * i) for i in range(n_clients)])
    Y = np.einsum("ind,id->in", X, Wt) + o.noise * rng.normal(size=(n_clients, n))
    m = o.test_per_client
    Xte = np.stack([rng.normal(size=(m, d)) + shifts[i] for i in range(n_clients)])
    Yte = np.einsum("ind,id->in", Xte, Wt) + o.noise * rng.normal(size=(n_clients, m))
    return X, Y, Xte, Yte, Wt


@register_dataset("fgdro-toy", options=FGDROToyOptions,
                  description="FGDRO spec section 8 linear-regression toy (natural partition)")
def fgdro_toy(spec: DataSpec, n_clients: int, seed: int) -> FederatedData:
    o: FGDROToyOptions = spec.dataset_options()
    X, Y, Xte, Yte, _ = toy_arrays(o, n_clients, seed)
    clients = [to_dataset(X[i], Y[i], "regression") for i in range(n_clients)]
    test = to_dataset(Xte.reshape(-1, o.dim), Yte.reshape(-1), "regression")
    return FederatedData(clients, test, (o.dim,), 0, "regression")
