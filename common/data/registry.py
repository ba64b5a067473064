"""The dataset registry.

A dataset is a function ``build(spec, n_clients, seed) -> CentralData | FederatedData`` registered under a
name, with an optional pydantic model for its own options (``DataSpec.options``). Returning
:class:`CentralData` lets ``DataSpec.partition`` split the training pool; returning :class:`FederatedData`
means the dataset has its own natural partition (e.g. LEAF synthetic generates data client by client).

A paper-specific generator lives in its own module and adds one import line to ``common/data/__init__.py``::

    class LsqOptions(BaseModel):
        model_config = ConfigDict(extra="forbid")
        dim: int = Field(50, ge=1)

    @register_dataset("focus-lsq", options=LsqOptions, description="FOCUS Fig. 4 least squares")
    def focus_lsq(spec: DataSpec, n_clients: int, seed: int) -> FederatedData:
        opts = spec.dataset_options()          # a validated LsqOptions
        rng = make_rng(seed, "focus-lsq")
        ...

The builder must be a pure function of its arguments (every process calls it independently).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from fedhop.common import catalog
from fedhop.common.data.base import CentralData, FederatedData
from fedhop.common.validation import NoOptions

if TYPE_CHECKING:
    from fedhop.common.data_spec import DataSpec

Builder = Callable[["DataSpec", int, int], CentralData | FederatedData]


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    build: Builder
    options: type[BaseModel]
    file_backed: bool
    description: str


DATASETS: dict[str, DatasetEntry] = {}


def register_dataset(name: str, *, options: type[BaseModel] = NoOptions, file_backed: bool = False,
                     description: str = "") -> Callable[[Builder], Builder]:
    """Decorator: register ``build`` under ``name``. ``file_backed`` datasets require ``DataSpec.path``."""

    def deco(fn: Builder) -> Builder:
        if name in DATASETS and DATASETS[name].build is not fn:
            raise ValueError(f"dataset {name!r} is already registered")
        catalog.add_dataset(name, options, file_backed)
        desc = description or (fn.__doc__ or "").strip()
        DATASETS[name] = DatasetEntry(name, fn, options, file_backed, desc)
        return fn

    return deco


def get_dataset(name: str) -> DatasetEntry:
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(sorted(DATASETS))}") from None


def validate_options(name: str, options: dict[str, Any]) -> BaseModel:
    return get_dataset(name).options.model_validate(options)
