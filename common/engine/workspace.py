"""Per-process, read-mostly facts of a run: spec, topology, data, model architecture, RNG derivation.

Every process of a run (or the single in-process engine) builds one Workspace from the same RunSpec; since
everything here is a pure function of the spec, all processes agree on it without talking.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from fedhop.common.data import Dataset, DataSpec, FederatedData, build_federated_data
from fedhop.common.data.build import DataMeta, build_client_data, build_clients_data, build_test_data
from fedhop.common.models import build_model
from fedhop.common.seeds import derive_seed  # noqa: F401  (re-exported: algorithms import it from here)
from fedhop.common.spec import RunSpec
from fedhop.common.topology import Topology, build_topology
from fedhop.common.user_code import UserCodeError, is_ref, load_callable, metric_name
from fedhop.common.wire.bundle import Bundle


class DeviceError(RuntimeError):
    """The requested device is not there (no CUDA, or fewer GPUs than the index)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device {name!r} requested but CUDA is not available (torch {torch.__version__})")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DeviceError(f"device {name!r} requested but only {torch.cuda.device_count()} GPU(s) are visible")
    return dev


class Workspace:
    """``own_clients``: the clients this process serves (a client host's ids); their partitions are built
    together, once, on the first ask for any of them."""

    def __init__(self, spec: RunSpec, device: str | None = None, data_path_override: str | None = None,
                 own_clients: Sequence[str] | None = None) -> None:
        self.spec = spec
        self.options = spec.options()
        self.topology: Topology = build_topology(spec.topology, spec.seed)
        self.device = resolve_device(device or spec.device)
        self._data_path_override = data_path_override
        self._own: tuple[int, Dataset] | None = None  # (ordinal, partition) of the one client loaded alone
        self._meta: DataMeta | None = None
        self._own_ids = frozenset(own_clients or ())
        self._own_many: dict[int, Dataset] | None = None  # the partitions of own_clients, by ordinal
        self._data_lock = threading.Lock()  # a host's sessions ask for their partitions from their own threads

    # -- data ---------------------------------------------------------------------------------------------
    # A Workspace loads only what its process asks for: a client process its own partition, the PS (and an
    # edge that evaluates) the test set. Asking for a second client's partition, as the in-process engine and
    # the tests do, builds every partition at once (``fed``); all three paths give bit-identical tensors.
    @cached_property
    def data_spec(self) -> DataSpec:
        """``spec.data`` with this node's ``--data-path`` in place of ``data.path``."""
        if not self._data_path_override:
            return self.spec.data
        # re-validated, not model_copy(update=...): the override must become a Path like the spec's own
        return type(self.spec.data).model_validate({**self.spec.data.model_dump(),
                                                     "path": self._data_path_override})

    @cached_property
    def fed(self) -> FederatedData:
        """Every client's partition and the test set."""
        fed = build_federated_data(self.data_spec, self.spec.topology.clients, self.spec.seed)
        self._meta = DataMeta(fed.input_shape, fed.num_classes, fed.task)
        return fed

    def client_data(self, node: str) -> Dataset:
        k = self.topology.ordinal(node)
        if "fed" in self.__dict__:
            return self.fed.clients[k]
        if node in self._own_ids:
            with self._data_lock:
                if self._own_many is None:
                    ks = sorted(self.topology.ordinal(c) for c in self._own_ids if c in self.topology.parent)
                    self._own_many, self._meta = build_clients_data(self.data_spec, self.spec.topology.clients,
                                                                    self.spec.seed, ks)
            return self._own_many[k]
        if self._own is None:
            data, self._meta = build_client_data(self.data_spec, self.spec.topology.clients, self.spec.seed, k)
            self._own = (k, data)
            return data
        if self._own[0] == k:
            return self._own[1]
        self._own = None
        return self.fed.clients[k]

    def client_sizes(self) -> dict[str, int]:
        return {c: len(self.fed.clients[self.topology.ordinal(c)]) for c in self.topology.clients}

    @cached_property
    def test(self) -> Dataset:
        if "fed" in self.__dict__:
            return self.fed.test
        data, self._meta = build_test_data(self.data_spec, self.spec.topology.clients, self.spec.seed)
        return data

    @property
    def meta(self) -> DataMeta:
        """Sample shape, classes and task: from whatever data this process loaded (the test set if none)."""
        if self._meta is None:
            self.test  # noqa: B018
        assert self._meta is not None
        return self._meta

    # -- model --------------------------------------------------------------------------------------------
    @cached_property
    def model(self) -> torch.nn.Module:
        """The architecture (a template: algorithms pass parameters explicitly via functional_call). A built-in
        model's template keeps its parameters on the meta device, so it holds no copy of the model (issue 11);
        a user's model keeps real ones (its forward may read its own parameters)."""
        m = self._build()
        return m if is_ref(self.spec.model.name) else m.to("meta")

    def _build(self) -> torch.nn.Module:
        m = self.meta
        return build_model(self.spec.model, m.input_shape, m.num_classes, self.spec.seed).to(
            device=self.device, dtype=getattr(torch, self.spec.model.dtype))

    def initial_params(self) -> Bundle:
        """The initial parameters (the caller's own tensors: built afresh, identical on every call)."""
        return {k: v.detach() for k, v in self._build().named_parameters()}

    def forward(self, params: Bundle, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device)
        if x.is_floating_point():  # inputs follow the parameter dtype (ModelSpec.dtype)
            x = x.to(getattr(torch, self.spec.model.dtype))
        return functional_call(self.model, params, (x,))

    @cached_property
    def _user_loss(self) -> Callable[..., Any] | None:
        ref = self.spec.model.loss
        return None if ref is None else load_callable(ref, "model.loss")

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y = y.to(self.device)
        if self._user_loss is not None:
            return self._user_loss(out, y)
        if self.meta.task == "classification":
            return torch.nn.functional.cross_entropy(out, y)
        return 0.5 * torch.mean((out - y) ** 2)

    @cached_property
    def _user_metrics(self) -> dict[str, Callable[..., Any]]:
        return {metric_name(ref): load_callable(ref, f"metrics[{i}]") for i, ref in enumerate(self.spec.metrics)}

    @torch.no_grad()
    def evaluate(self, params: Bundle, data: Dataset | None = None, batch: int = 4096) -> dict[str, float]:
        """Loss (and accuracy for classification) of ``params`` on ``data`` (default: the test set), plus every
        user metric of ``spec.metrics``, each called once with the outputs and labels of the whole set."""
        data = data or self.test
        n = len(data)
        total_loss, correct = 0.0, 0
        outs: list[torch.Tensor] = []
        classification = self.meta.task == "classification"
        for i in range(0, n, batch):
            x, y = data.x[i:i + batch], data.y[i:i + batch].to(self.device)
            out = self.forward(params, x)
            total_loss += float(self.loss(out, y)) * len(y)
            if classification:
                correct += int((out.argmax(1) == y).sum())
            if self._user_metrics:
                outs.append(out)
        out_d = {"loss": total_loss / max(n, 1)}
        if classification:
            out_d["accuracy"] = correct / max(n, 1)
        if self._user_metrics:
            everything, labels = torch.cat(outs), data.y.to(self.device)
            for name, fn in self._user_metrics.items():
                out_d[name] = _metric_value(name, fn(everything, labels))
        return out_d

    # -- randomness ---------------------------------------------------------------------------------------
    def torch_rng(self, node: str, *keys: int | str) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(derive_seed(self.spec.seed, node, *keys))
        return g

    def np_rng(self, node: str, *keys: int | str) -> np.random.Generator:
        return np.random.default_rng(derive_seed(self.spec.seed, node, *keys))


def _metric_value(name: str, v: Any) -> float:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, int | float | np.floating | np.integer):
        raise UserCodeError(f"metrics: {name} returned {type(v).__name__}; a metric returns one number")
    return float(v)
