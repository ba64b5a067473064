"""Per-process, read-mostly facts of a run: spec, topology, data, model architecture, RNG derivation.

Every process of a run (or the single in-process engine) builds one Workspace from the same RunSpec; since
everything here is a pure function of the spec, all processes agree on it without talking.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from fedhop.common.data import Dataset, FederatedData, build_federated_data
from fedhop.common.engine.topology import Topology, build_topology
from fedhop.common.models import build_model
from fedhop.common.spec import RunSpec
from fedhop.common.wire.bundle import Bundle


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any tuple of ints/strings, stable across processes and Python versions."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1


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
    def __init__(self, spec: RunSpec, device: str | None = None, data_path_override: str | None = None) -> None:
        self.spec = spec
        self.options = spec.options()
        self.topology: Topology = build_topology(spec.topology, spec.seed)
        self.device = resolve_device(device or spec.device)
        self._data_path_override = data_path_override

    # -- data ---------------------------------------------------------------------------------------------
    @cached_property
    def fed(self) -> FederatedData:
        data_spec = self.spec.data
        if self._data_path_override:
            # re-validated, not model_copy(update=...): the override must become a Path like the spec's own
            data_spec = type(data_spec).model_validate({**data_spec.model_dump(), "path": self._data_path_override})
        return build_federated_data(data_spec, self.spec.topology.clients, self.spec.seed)

    def client_data(self, node: str) -> Dataset:
        return self.fed.clients[self.topology.ordinal(node)]

    def client_sizes(self) -> dict[str, int]:
        return {c: len(self.client_data(c)) for c in self.topology.clients}

    @cached_property
    def test(self) -> Dataset:
        return self.fed.test

    # -- model --------------------------------------------------------------------------------------------
    @cached_property
    def model(self) -> torch.nn.Module:
        """The architecture (a template: algorithms pass parameters explicitly via functional_call)."""
        return build_model(self.spec.model, self.fed.input_shape, self.fed.num_classes, self.spec.seed).to(
            device=self.device, dtype=getattr(torch, self.spec.model.dtype))

    def initial_params(self) -> Bundle:
        return {k: v.detach().clone() for k, v in self.model.named_parameters()}

    def forward(self, params: Bundle, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device)
        if x.is_floating_point():  # inputs follow the parameter dtype (ModelSpec.dtype)
            x = x.to(getattr(torch, self.spec.model.dtype))
        return functional_call(self.model, params, (x,))

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y = y.to(self.device)
        if self.fed.task == "classification":
            return torch.nn.functional.cross_entropy(out, y)
        return 0.5 * torch.mean((out - y) ** 2)

    @torch.no_grad()
    def evaluate(self, params: Bundle, data: Dataset | None = None, batch: int = 4096) -> dict[str, float]:
        data = data or self.test
        n = len(data)
        total_loss, correct = 0.0, 0
        for i in range(0, n, batch):
            x, y = data.x[i:i + batch], data.y[i:i + batch].to(self.device)
            out = self.forward(params, x)
            total_loss += float(self.loss(out, y)) * len(y)
            if self.fed.task == "classification":
                correct += int((out.argmax(1) == y).sum())
        out_d = {"loss": total_loss / max(n, 1)}
        if self.fed.task == "classification":
            out_d["accuracy"] = correct / max(n, 1)
        return out_d

    # -- randomness ---------------------------------------------------------------------------------------
    def torch_rng(self, node: str, *keys: int | str) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(derive_seed(self.spec.seed, node, *keys))
        return g

    def np_rng(self, node: str, *keys: int | str) -> np.random.Generator:
        return np.random.default_rng(derive_seed(self.spec.seed, node, *keys))
