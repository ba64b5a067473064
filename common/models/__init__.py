"""Small models for the papers' experiments and ``build_model`` (docs/design.md section 2)."""

from __future__ import annotations

import zlib

import torch
from torch import nn

from fedhop.common.model_spec import ModelSpec
from fedhop.common.models import nets  # noqa: F401  (registers the built-in models)
from fedhop.common.models.registry import MODELS, get_model, register_model
from fedhop.common.user_code import is_ref

__all__ = ["MODELS", "ModelSpec", "build_model", "get_model", "init_parameters", "register_model"]


def init_parameters(model: nn.Module, generator: torch.Generator, mode: str = "default") -> None:
    """Initialise every parameter in place from ``generator`` (module order, then parameter order).

    ``default`` reproduces PyTorch's distribution for Linear and Conv layers (weight and bias
    ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, which is what ``kaiming_uniform_(a=sqrt(5))`` gives), norm
    layers get weight 1 and bias 0, and a module with other parameters must define
    ``fedhop_init_(generator)``. ``zeros`` sets every parameter to 0.
    """
    with torch.no_grad():
        if mode == "zeros":
            for p in model.parameters():
                p.zero_()
            return
        for name, mod in model.named_modules():
            own = dict(mod.named_parameters(recurse=False))
            if not own:
                continue
            if hasattr(mod, "fedhop_init_"):
                mod.fedhop_init_(generator)
            elif isinstance(mod, nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d):
                bound = 1.0 / float(mod.weight[0].numel()) ** 0.5
                for p in own.values():
                    p.uniform_(-bound, bound, generator=generator)
            elif isinstance(mod, nn.LayerNorm | nn.GroupNorm):
                for pname, p in own.items():
                    p.fill_(1.0 if pname == "weight" else 0.0)
            else:
                raise TypeError(f"no initialisation rule for module {name!r} ({type(mod).__name__}); "
                                "define fedhop_init_(generator) on it")


def _materialize(model: nn.Module) -> None:
    """Replace meta parameters by uninitialised CPU ones (``Module.to_empty`` would route through
    PyTorch's Python reference kernels, which import sympy: seconds on the first call). Tied parameters
    stay tied."""
    memo: dict[int, nn.Parameter] = {}
    for mod in model.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            if id(p) not in memo:
                memo[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cpu"),
                                           requires_grad=p.requires_grad)
            mod.register_parameter(name, memo[id(p)])


def build_model(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    """Build ``spec.name`` for ``input_shape`` / ``num_classes`` (0 = regression, output ``[n]``), with
    parameters drawn from a local generator seeded by ``seed``: same arguments, bit-identical model.
    The global RNG state is neither read nor changed (the architecture is built on the meta device)."""
    if is_ref(spec.name):
        from fedhop.common.models.user import build_user_model

        return build_user_model(spec, tuple(int(d) for d in input_shape), int(num_classes), seed)
    entry = get_model(spec.name)
    with torch.device("meta"):
        model = entry.make(spec, tuple(int(d) for d in input_shape), int(num_classes))
    _materialize(model)
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:
        raise TypeError(f"model {spec.name!r} has buffers {buffers}; fedhop models must hold parameters only")
    g = torch.Generator().manual_seed((int(seed) * 0x9E3779B1 + zlib.crc32(b"model")) % (1 << 63))
    init_parameters(model, g, spec.init)
    return model
