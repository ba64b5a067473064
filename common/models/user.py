"""User models: ``[model] name = "pkg.module:build"`` (README "Bring your own").

The contract::

    def build(input_shape: tuple[int, ...], num_classes: int, seed: int, **options) -> torch.nn.Module

``input_shape`` is the shape of one sample (``x.shape[1:]`` of the data), ``num_classes`` the number of
classes (the model outputs logits ``[n, num_classes]``) or 0 for regression (the model outputs ``[n]``),
``options`` the ``[model.options]`` table. fedhop calls it with PyTorch's global RNG seeded from ``seed``
(and restored afterwards), so PyTorch's default initialisation gives the same parameters on every node;
a builder may also draw from its own ``torch.Generator().manual_seed(seed)``. ``model.init = "zeros"``
zeroes every parameter afterwards, ``model.dtype`` casts them.

The module must hold parameters only (no buffers such as BatchNorm's running statistics): algorithms see a
model through ``named_parameters()`` and ``torch.func.functional_call``, and only parameters travel.
"""

from __future__ import annotations

import torch
from torch import nn

from fedhop.common.model_spec import ModelSpec
from fedhop.common.user_code import UserCodeError, load_callable

FIELD = "model.name"


def build_user_model(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    fn = load_callable(spec.name, FIELD)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = fn(tuple(input_shape), int(num_classes), int(seed), **spec.options)
        except Exception as e:
            raise UserCodeError(f"{FIELD}: {spec.name}({tuple(input_shape)}, {num_classes}, {seed}"
                                f"{', **model.options' if spec.options else ''}) failed: {type(e).__name__}: {e}"
                                ) from e
    if not isinstance(model, nn.Module):
        raise UserCodeError(f"{FIELD}: {spec.name} returned {type(model).__name__}, not a torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise UserCodeError(f"{FIELD}: the model {spec.name} built has no parameters")
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:
        raise UserCodeError(f"{FIELD}: the model {spec.name} built has buffers {buffers[:5]}; fedhop models must "
                            "hold parameters only (use GroupNorm/LayerNorm instead of BatchNorm)")
    if spec.init == "zeros":
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    return model.cpu()
