"""ModelSpec: which model a run trains (the ``[model]`` table of a run spec)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from fedhop.common import catalog
from fedhop.common.user_code import check_ref, is_ref
from fedhop.common.validation import check_options


class ModelSpec(BaseModel):
    """Model name plus options. ``hidden`` is used by ``mlp``; model-specific options go in ``options``
    (validated by that model's options model, e.g. ``{variant = "mnist"}`` for ``lenet``).

    ``name = "package.module:function"`` names a user builder (``common/models/user.py``): it gets
    ``options`` as keyword arguments; ``hidden`` and ``bias`` do not apply, ``init``, ``dtype`` and ``loss`` do."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("mlp", description="registered model name, or a user builder 'package.module:function' "
                      "(common/models/user.py)")
    hidden: list[int] = Field(default_factory=lambda: [64], description="mlp hidden widths")
    bias: bool = True
    init: Literal["default", "zeros"] = Field(
        "default", description="default: PyTorch's Linear/Conv rule U(+-1/sqrt(fan_in)) from a seeded "
        "generator; zeros: every parameter 0 (convex models, e.g. FedCluster's softmax regression)")
    options: dict[str, Any] = Field(default_factory=dict, description="the model's own options")
    loss: str | None = Field(None, description="user training loss 'package.module:function', "
                             "loss(outputs, y) -> 0-dim tensor (batch mean); default: cross-entropy for "
                             "classification, 0.5 * mean squared error for regression")
    dtype: Literal["float32", "float64"] = Field(
        "float32", description="parameter dtype; the workspace casts float inputs to it (float64: exact "
        "arithmetic, e.g. FOCUS's 1e-16 least-squares floor)")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if is_ref(v):
            return check_ref(v, "")
        catalog.model(v)  # raises with the list of valid names
        return v

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, v: list[int]) -> list[int]:
        if any(h < 1 for h in v):
            raise ValueError("hidden widths must be positive")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("name")
        if name is None or name not in catalog.MODELS:  # a user builder gets its options as keyword arguments
            return v
        check_options("model", name, catalog.model(name).options, v)
        return v

    @field_validator("loss")
    @classmethod
    def _loss(cls, v: str | None) -> str | None:
        return v if v is None else check_ref(v, "")

    @model_validator(mode="after")
    def _user_builder(self) -> ModelSpec:
        fields = type(self).model_fields
        stray = [f for f in ("hidden", "bias")
                 if is_ref(self.name) and getattr(self, f) != fields[f].get_default(call_default_factory=True)]
        if stray:
            raise ValueError(f"{', '.join(stray)}: applies to the built-in models only; pass a user builder's own "
                             "arguments in model.options")
        return self

    def model_options(self) -> Any:
        """``options`` validated into the model's own options model (a user builder's: the plain dict)."""
        if is_ref(self.name):
            return dict(self.options)
        return catalog.model(self.name).options.model_validate(self.options)
