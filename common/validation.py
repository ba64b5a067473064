"""Validation helpers shared by the spec models (run, data, model, algorithm options)."""

from __future__ import annotations

import difflib
import typing

from pydantic import BaseModel, ConfigDict, ValidationError


class NoOptions(BaseModel):
    """The options model of a dataset or model that takes none: its ``options`` table must be empty."""

    model_config = ConfigDict(extra="forbid")


def check_options(kind: str, name: str, model: type[BaseModel], options: dict) -> None:
    """Validate a registry entry's ``options`` table; the error names the entry and every failing field."""
    try:
        model.model_validate(options)
    except ValidationError as e:
        raise ValueError(f"bad options for {kind} {name!r}: {flat_errors(e, model)}") from None


def flat_errors(e: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line naming each failing field: ``loc.of.field: message; ...``; with ``model`` (the one validated), an
    unknown key gets the closest known one: ``roundz: Extra inputs are not permitted (did you mean 'rounds'?)``."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        hint = closest_field(model, err["loc"]) if err["type"] == "extra_forbidden" and model is not None else None
        parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}"
                     + (f" (did you mean {hint!r}?)" if hint else ""))
    return "; ".join(parts)


def closest_field(model: type[BaseModel], loc: tuple[int | str, ...]) -> str | None:
    """The field of the model at ``loc[:-1]`` (walked from ``model``) closest to the unknown key ``loc[-1]``."""
    for part in loc[:-1]:
        info = model.model_fields.get(str(part))
        sub = _model_of(info.annotation) if info is not None else None
        if sub is None:
            return None
        model = sub
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return close[0] if close else None


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_of, typing.get_args(annotation)) if m is not None), None)
