"""The spec on the command line: ``--set key=value`` overrides and ``fedhop spec --explain``.

Both walk the pydantic models of :mod:`fedhop.common.spec` (and the algorithm's options model), so the keys,
types, defaults and descriptions shown and accepted are the models' own.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from fedhop.cli.suggest import did_you_mean
from fedhop.common.spec import RunSpec, SpecError, resolve_paths, tagged_members
from fedhop.common.user_code import is_ref


def read_raw(path: Path) -> dict[str, Any]:
    """The TOML table of a spec file, unvalidated (``--set`` is applied before validation), its relative paths
    made the file's folder's (:func:`fedhop.common.spec.resolve_paths`); when it names user code, that folder
    is put on ``sys.path`` and ``PYTHONPATH`` (:func:`_importable`), so its modules import from anywhere."""
    if not path.is_file():
        raise SpecError(f"spec file not found: {path}")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML: {e}") from None
    folder = path.resolve().parent
    if names_user_code(raw):
        _importable(folder)
    return resolve_paths(raw, folder)


def _importable(folder: Path) -> None:
    """Put ``folder`` on this process's ``sys.path`` and on the ``PYTHONPATH`` of the processes it starts
    (``launch --exec-children``), after what is there: the spec's user modules import from it."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(folder) not in entries:
        os.environ["PYTHONPATH"] = os.pathsep.join([*entries, str(folder)])


def names_user_code(raw: dict[str, Any]) -> bool:
    """Whether a spec table names user code (``package.module:attribute`` in algorithm.name, model.name,
    model.loss, data.source or metrics)."""
    def table(key: str) -> dict[str, Any]:
        v = raw.get(key)
        return v if isinstance(v, dict) else {}

    refs = [table("algorithm").get("name"), table("model").get("name"), table("model").get("loss"),
            table("data").get("source"), *(raw.get("metrics") or [])]
    return any(isinstance(r, str) and is_ref(r) for r in refs)


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
    is checked against the models before anything runs, and the whole spec is validated afterwards. A relative
    path set here (data.path, a trace's path) is the working directory's, made absolute so the run folder's
    spec names the same file from anywhere (a spec file's own are its folder's: :func:`read_raw`)."""
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
    return resolve_paths(out, Path.cwd())  # a path given here is the working directory's: absolute in the run


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
    return json.dumps(to_jsonable_python(value), default=str)


def _accepts_number(annotation: Any) -> bool:
    """Whether a field also takes a plain number (FedAvg's participation fraction besides the models)."""
    if annotation in (int, float):
        return True
    return any(_accepts_number(a) for a in typing.get_args(annotation) if not isinstance(a, str | int | float))


Row = tuple[str, str, str, str]


def _rows(model: type[BaseModel], value: BaseModel | None, prefix: str, spec: RunSpec) -> list[Row]:
    """A row per field of ``model`` (nested models: per field of theirs): key, type, the value ``value`` holds
    (``(if omitted: D)`` after it where the field's default D differs), description."""
    rows = []
    for name, info in model.model_fields.items():
        key = prefix + name
        default = _default(info)
        current = getattr(value, name) if value is not None else default
        if key == "algorithm.options":
            rows += _rows(type(spec.options()), spec.options(), key + ".", spec)
            continue
        sub = _model_of(info.annotation)
        if sub is not None and not tagged_members(info.annotation) and isinstance(current, BaseModel):
            rows += _rows(type(current), current, key + ".", spec)
            continue
        shown = _show(current)
        if default is not PydanticUndefined and _show(default) != shown:
            shown += f" (if omitted: {_show(default)})"
        typ = _type_name(info.annotation) + _bounds(info)
        members = tagged_members(info.annotation)
        if members:
            typ = ("fraction | " if _accepts_number(info.annotation) else "") + "{kind = ...}"
        rows.append((key, typ, shown, info.description or ""))
    return rows


# one line per participation model (common/algorithms/participation.py says how each draws S_r)
KIND_SUMMARY = {
    "full": "every client in every round",
    "uniform": "m of the N clients, drawn uniformly without replacement each round",
    "bernoulli": "active participation: client i joins each round with probability p_i (p given, one value or "
                 "one per client; else drawn once per client from `groups`); a round may have no client",
    "weighted": "passive participation: m clients drawn without replacement with the normalised weights q_i",
    "markov": "a two-state Markov chain per client: present again with p_stay, joins with p_join_i",
    "cyclic": "blocks of m consecutive clients in turn: round r takes clients r*m .. r*m+m-1 (mod N)",
    "trace": "a recorded rounds x clients 0/1 table (CSV or .npy) replayed row by row; a relative path is the "
             "spec file's folder's",
}


def _member_rows(model: type[BaseModel], prefix: str) -> list[Row]:
    """A row per field of a union member (and of the models its list fields hold, as ``field[].x``)."""
    rows = []
    for name, info in model.model_fields.items():
        if name == "kind":
            continue
        sub = _model_of(info.annotation)
        rows.append((prefix + name, _type_name(info.annotation) + _bounds(info), _show(_default(info)),
                     info.description or ""))
        if sub is not None:
            rows += [(f"{prefix}{name}[].{n}", _type_name(i.annotation) + _bounds(i), _show(_default(i)),
                      i.description or "") for n, i in sub.model_fields.items()]
    return rows


def _union_sections(spec: RunSpec) -> list[str]:
    """For each option that is a tagged union (participation): every model it may be, with its fields."""
    options = type(spec.options())
    out: list[str] = []
    for name, info in options.model_fields.items():
        members = tagged_members(info.annotation)
        if not members:
            continue
        key = f"algorithm.options.{name}"
        out += ["", f"{key}: one of these models, written {name} = {{kind = \"KIND\", FIELD = VALUE, ...}}"
                + (", or a fraction f in (0, 1]: m = max(1, round(f N)) clients drawn uniformly each round"
                   if _accepts_number(info.annotation) else "") + ":"]
        rows: list[Row] = []
        for kind, model in members.items():
            doc = (model.__doc__ or "").strip().split("\n")[0]
            out_line = f"kind = {json.dumps(kind)}: {KIND_SUMMARY.get(kind) or doc}"
            member = _member_rows(model, f"{name}.")
            rows.append((out_line, "", "", ""))
            rows += member or [("  (no other field)", "", "", "")]
        wk = max(len(r[0]) for r in rows if r[1])
        wt = min(34, max(len(r[1]) for r in rows if r[1]))
        for key_, typ, default, desc in rows:
            if not typ:
                out.append(f"  {key_}")
            else:
                out.append(f"    {key_:<{wk}}  {typ:<{wt}}  {default}" + (f"  —  {desc}" if desc else ""))
    return out


def explain(spec: RunSpec, what: str) -> str:
    """Every field of ``spec`` (the run ``what`` names): key, type, the value the run uses (and the field's
    default where it differs), description; then every model of each tagged-union option (participation)."""
    from fedhop.common.catalog import algorithm as get_algorithm

    algo = get_algorithm(spec.algorithm.name)
    rows = _rows(RunSpec, spec, "", spec)
    wk = max(len(r[0]) for r in rows)
    wt = min(34, max(len(r[1]) for r in rows))
    lines = [f"RunSpec fields of {what}: algorithm {spec.algorithm.name!r} ({algo.summary}).",
             "value: what this run uses; (if omitted: X): what a spec that leaves the field out gets. Set any "
             "in the spec's TOML or with --set KEY=VALUE; data.options and model.options depend on the dataset "
             "and model.", ""]
    lines.append(f"{'key':<{wk}}  {'type':<{wt}}  value  —  description")
    for key, typ, value, desc in rows:
        lines.append(f"{key:<{wk}}  {typ:<{wt}}  {value}" + (f"  —  {desc}" if desc else ""))
    return "\n".join(lines + _union_sections(spec))
