"""Validation helpers shared by the spec models (run, data, model, algorithm options)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class NoOptions(BaseModel):
    """The options model of a dataset or model that takes none: its ``options`` table must be empty."""

    model_config = ConfigDict(extra="forbid")


def check_options(kind: str, name: str, model: type[BaseModel], options: dict) -> None:
    """Validate a registry entry's ``options`` table; the error names the entry and every failing field."""
    try:
        model.model_validate(options)
    except ValidationError as e:
        raise ValueError(f"bad options for {kind} {name!r}: {flat_errors(e)}") from None


def flat_errors(e: ValidationError) -> str:
    """One line naming each failing field: ``loc.of.field: message; ...``."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)
