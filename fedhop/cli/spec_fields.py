"""The spec on the command line: ``--set key=value`` overrides and ``fedhop spec --explain``.

Both walk the pydantic models of :mod:`fedhop.common.spec` (and the algorithm's options model), so the keys,
types, defaults and descriptions shown and accepted are the models' own.
"""

from __future__ import annotations

import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fedhop.cli.suggest import did_you_mean
from fedhop.common.spec import RunSpec, SpecError


def read_raw(path: Path) -> dict[str, Any]:
    """The TOML table of a spec file, unvalidated (``--set`` is applied before validation)."""
    if not path.is_file():
        raise SpecError(f"spec file not found: {path}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML: {e}") from None


def parse_value(text: str) -> Any:
    """A ``--set`` value read as a TOML value (5, 0.1, true, "x", [1, 2], {k = 1}); anything else is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (also through ``X | None``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        m = _model_of(arg)
        if m is not None:
            return m
    return None


def _check_key(raw: dict[str, Any], parts: list[str], item: str) -> None:
    """Raise a SpecError naming the first part of ``parts`` that is no field of the spec's models."""
    from fedhop.common.catalog import algorithm as get_algorithm

    model: type[BaseModel] | None = RunSpec
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "the spec"
        if model is None:
            return  # a free-form table (data.options, model.options): its owner validates it
        if part not in model.model_fields:
            raise SpecError(f"--set {item}: unknown key {part!r} in {where}; known: {', '.join(model.model_fields)}"
                            f"{did_you_mean(part, model.model_fields)}")
        if parts[:i + 1] == ["algorithm", "options"]:
            name = raw.get("algorithm", {}).get("name", RunSpec.model_fields["algorithm"].get_default(
                call_default_factory=True).name)
            try:
                model = get_algorithm(str(name)).options
            except ValueError as e:
                raise SpecError(f"--set {item}: {e}") from None
            continue
        annotation = model.model_fields[part].annotation
        model = _model_of(annotation)
        if model is None and i < len(parts) - 1 and typing.get_origin(annotation) is not dict:
            raise SpecError(f"--set {item}: {'.'.join(parts[:i + 1])} is a value, not a table")


def apply_sets(raw: dict[str, Any], sets: list[str]) -> dict[str, Any]:
    """``raw`` with each ``KEY=VALUE`` of ``sets`` applied in order (dotted keys reach into tables); every key
    is checked against the models before anything runs, and the whole spec is validated afterwards."""
    out = json.loads(json.dumps(raw, default=str))
    for item in sets:
        key, sep, value = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise SpecError(f"--set {item!r}: expected KEY=VALUE, e.g. rounds=5 or algorithm.options.lr=0.1")
        target = out
        for part in parts[:-1]:
            nxt = target.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise SpecError(f"--set {item}: {part} is a value, not a table")
            target = nxt
        target[parts[-1]] = parse_value(value.strip())
        _check_key(out, parts, item)
    return out


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join("none" if a is type(None) else _type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(info: FieldInfo) -> str:
    signs = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    out = [f"{signs[k]} {getattr(m, k)}" for m in info.metadata for k in signs if hasattr(m, k)]
    return f" ({', '.join(out)})" if out else ""


def _default(info: FieldInfo) -> Any:
    if info.default is PydanticUndefined and info.default_factory is None:
        return PydanticUndefined
    return info.get_default(call_default_factory=True)


def _show(value: Any) -> str:
    if value is PydanticUndefined:
        return "(required)"
    if value is None:
        return "(none)"
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return json.dumps(value, default=str)


def _rows(model: type[BaseModel], prefix: str, algorithm: str) -> list[tuple[str, str, str, str]]:
    from fedhop.common.catalog import algorithm as get_algorithm

    rows = []
    for name, info in model.model_fields.items():
        key = prefix + name
        if key == "algorithm.options":
            rows += _rows(get_algorithm(algorithm).options, key + ".", algorithm)
            continue
        default = algorithm if key == "algorithm.name" else _default(info)
        sub = _model_of(info.annotation)
        if sub is not None and isinstance(default, BaseModel):
            rows += _rows(sub, key + ".", algorithm)
            continue
        rows.append((key, _type_name(info.annotation) + _bounds(info), _show(default), info.description or ""))
    return rows


def explain(algorithm: str) -> str:
    """Every field of a RunSpec running ``algorithm``: key, type, default, description."""
    from fedhop.common.catalog import algorithm as get_algorithm

    try:
        algo = get_algorithm(algorithm)
    except ValueError as e:
        raise SpecError(str(e)) from None
    rows = _rows(RunSpec, "", algorithm)
    wk = max(len(r[0]) for r in rows)
    wt = min(34, max(len(r[1]) for r in rows))
    lines = [f"RunSpec fields for algorithm {algorithm!r} ({algo.summary}).",
             "Set any in the spec's TOML or with --set KEY=VALUE; data.options and model.options depend on "
             "the dataset and model.", ""]
    lines.append(f"{'key':<{wk}}  {'type':<{wt}}  default  —  description")
    for key, typ, default, desc in rows:
        lines.append(f"{key:<{wk}}  {typ:<{wt}}  {default}" + (f"  —  {desc}" if desc else ""))
    return "\n".join(lines)
