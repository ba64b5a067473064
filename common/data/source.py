"""User data: ``[data] source = "pkg.module:function"`` (README "Bring your own").

The contract. fedhop calls the function with one :class:`DataRequest` and expects ``(x, y)`` back:

- ``request.split == "train"``: the training partition of client ``request.client`` (0-based ordinal in
  ``0 .. num_clients - 1``; client ``client-k`` of the topology has ordinal ``k``);
- ``request.split == "test"``: the global test set (``request.client`` is None), evaluated by the parameter
  server (and, for Fed-CHS / FedCluster, the edge that holds the model).

``x``: a numpy array or torch tensor of shape ``[n, *input_shape]``, float32 or float64 (float64 data trains
a ``model.dtype = "float64"`` model exactly). ``y``: shape ``[n]``; integer class ids in
``0 .. data.num_classes - 1`` for classification, or float targets when ``data.num_classes = 0``
(regression). ``request.path`` is ``data.path``, or the node's own ``--data-path`` on a separate machine,
``request.options`` is ``data.options`` and ``request.seed`` is ``data.split_seed`` (default: the run seed).

Every node calls the function only for what it needs: a client process for its own partition, the parameter
server for the test set; the in-process engine (``fedhop simulate``) and the checks before a run asks for
all of them. The function must therefore be a pure function of the request (same request, same arrays):
that is what makes the in-process and networked runs agree bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from fedhop.common.data.base import Dataset, FederatedData
from fedhop.common.user_code import UserCodeError, load_callable

if TYPE_CHECKING:
    from fedhop.common.data.build import DataMeta
    from fedhop.common.data_spec import DataSpec

FIELD = "data.source"


@dataclass(frozen=True)
class DataRequest:
    """What a ``data.source`` function is asked for (see the module docstring)."""

    split: Literal["train", "test"]
    client: int | None
    num_clients: int
    seed: int
    path: Path | None
    options: dict[str, Any]


def _tensor(v: Any, what: str) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().contiguous()
    if isinstance(v, np.ndarray):
        return torch.from_numpy(np.require(v, requirements=["C", "W"]))
    raise UserCodeError(f"{FIELD}: {what} is a {type(v).__name__}; return numpy arrays or torch tensors")


def as_dataset(out: Any, num_classes: int, what: str) -> Dataset:
    """Check one ``(x, y)`` a source returned and make it a Dataset (errors name ``data.source`` and ``what``)."""
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise UserCodeError(f"{FIELD}: {what}: returned {type(out).__name__}, expected a pair (x, y)")
    x, y = _tensor(out[0], f"{what}: x"), _tensor(out[1], f"{what}: y")
    if x.dtype not in (torch.float32, torch.float64):
        raise UserCodeError(f"{FIELD}: {what}: x is {x.dtype}; it must be float32 or float64 (convert, e.g. "
                            "uint8 images with x.astype('float32') / 255)")
    if x.dim() < 2:
        raise UserCodeError(f"{FIELD}: {what}: x has shape {tuple(x.shape)}; it must be [n, *input_shape]")
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise UserCodeError(f"{FIELD}: {what}: y has shape {tuple(y.shape)}; it must be [n] with n = {x.shape[0]} "
                            "(the rows of x)")
    if x.shape[0] == 0:
        raise UserCodeError(f"{FIELD}: {what}: no samples")
    if num_classes == 0:
        if y.dtype not in (torch.float32, torch.float64):
            raise UserCodeError(f"{FIELD}: {what}: data.num_classes = 0 (regression) needs float targets y, "
                                f"got {y.dtype}")
    else:
        if y.is_floating_point() or y.dtype == torch.bool or y.is_complex():
            raise UserCodeError(f"{FIELD}: {what}: y is {y.dtype}; classification (data.num_classes = "
                                f"{num_classes}) needs integer class ids")
        y = y.to(torch.int64)
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= num_classes:
            raise UserCodeError(f"{FIELD}: {what}: labels span {lo}..{hi}, outside 0..{num_classes - 1} "
                                "(data.num_classes)")
    if not bool(torch.isfinite(x).all()):
        raise UserCodeError(f"{FIELD}: {what}: x holds NaN or infinite values")
    return Dataset(x, y)


def _num_classes(spec: DataSpec) -> int:
    if spec.num_classes is None:  # the spec validator requires it; guard direct callers
        raise UserCodeError("data.num_classes: required with data.source (0 for regression)")
    return spec.num_classes


def _call(spec: DataSpec, split: Literal["train", "test"], client: int | None, n_clients: int,
          seed: int) -> Dataset:
    fn = load_callable(spec.source or "", FIELD)
    req = DataRequest(split, client, n_clients, spec.effective_seed(seed), spec.path, dict(spec.options))
    what = f"client {client}'s partition" if split == "train" else "the test set"
    try:
        out = fn(req)
    except UserCodeError:
        raise
    except Exception as e:
        raise UserCodeError(f"{FIELD}: {spec.source} failed for {what}: {type(e).__name__}: {e}") from e
    return as_dataset(out, _num_classes(spec), what)


def _meta(spec: DataSpec, d: Dataset) -> DataMeta:
    from fedhop.common.data.build import DataMeta

    n = _num_classes(spec)
    return DataMeta(tuple(int(s) for s in d.x.shape[1:]), n, "regression" if n == 0 else "classification")


def source_client(spec: DataSpec, n_clients: int, seed: int, k: int) -> tuple[Dataset, DataMeta]:
    d = _call(spec, "train", k, n_clients, seed)
    return d, _meta(spec, d)


def source_test(spec: DataSpec, n_clients: int, seed: int) -> tuple[Dataset, DataMeta]:
    d = _call(spec, "test", None, n_clients, seed)
    return d, _meta(spec, d)


def check_client(test: Dataset, k: int, data: Dataset) -> None:
    """Client ``k``'s x has the test set's sample shape and dtype and its y the test set's dtype."""
    for name, a, b in (("x", data.x, test.x), ("y", data.y, test.y)):
        if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
            raise UserCodeError(f"{FIELD}: client {k}'s {name} is {a.dtype} with samples of shape "
                                f"{tuple(a.shape[1:])}, the test set's {name} is {b.dtype} with samples of shape "
                                f"{tuple(b.shape[1:])}; every split must agree")


def source_federated(spec: DataSpec, n_clients: int, seed: int) -> FederatedData:
    test, meta = source_test(spec, n_clients, seed)
    clients = [_call(spec, "train", k, n_clients, seed) for k in range(n_clients)]
    for k, c in enumerate(clients):
        check_client(test, k, c)
    return FederatedData(clients, test, meta.input_shape, meta.num_classes, meta.task)
