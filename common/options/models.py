"""The option models of the built-in models (``[model.options]``); the networks live in
``fedhop.common.models.nets``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class LeNetOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    variant: Literal["auto", "mnist", "cifar"] = Field(
        "auto", description="auto: 'mnist' for 1-channel input, 'cifar' otherwise")
    padding: Literal["valid", "same"] = Field("valid", description="5x5 conv padding (paper: unspecified)")


class AlexNetOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    crop: int = Field(28, ge=0, description="centre-crop larger inputs to crop x crop (0: no crop)")
    lrn: bool = Field(True, description="local response normalisation after each pooling")


class CNN2Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channels: list[int] = Field(default_factory=lambda: [32, 64], description="the two conv widths")
    fc: int = Field(512, ge=1, description="width of the hidden FC layer")
    kernel: int = Field(5, ge=1)
    padding: Literal["valid", "same"] = "same"

    @field_validator("channels")
    @classmethod
    def _two(cls, v: list[int]) -> list[int]:
        if len(v) != 2 or min(v) < 1:
            raise ValueError("channels must be two positive widths")
        return v
