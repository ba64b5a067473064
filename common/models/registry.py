"""The model registry: a name, a constructor and the pydantic model of the constructor's own options.

A constructor ``make(spec, input_shape, num_classes) -> nn.Module`` only builds the architecture; it runs
on PyTorch's meta device, and :func:`fedhop.common.models.build_model` then allocates and initialises the
parameters from a local ``torch.Generator``. Modules with parameters other than Linear / Conv / norm
layers define ``fedhop_init_(generator)`` to initialise their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel
from torch import nn

from fedhop.common import catalog
from fedhop.common.validation import NoOptions

if TYPE_CHECKING:
    from fedhop.common.model_spec import ModelSpec

Maker = Callable[["ModelSpec", tuple[int, ...], int], nn.Module]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    make: Maker
    options: type[BaseModel]
    description: str


MODELS: dict[str, ModelEntry] = {}


def register_model(name: str, *, options: type[BaseModel] = NoOptions, description: str = "",
                   ) -> Callable[[Maker], Maker]:
    def deco(fn: Maker) -> Maker:
        if name in MODELS and MODELS[name].make is not fn:
            raise ValueError(f"model {name!r} is already registered")
        catalog.add_model(name, options)
        MODELS[name] = ModelEntry(name, fn, options, description or (fn.__doc__ or "").strip())
        return fn

    return deco


def get_model(name: str) -> ModelEntry:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}") from None
