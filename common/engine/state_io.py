"""Algorithm state as data: a tree of dataclasses, dicts, lists, tensors and scalars <-> (JSON, tensors).

Checkpoints (``checkpoint.py``) store every node's explicit state through the tensor codec, never pickle. A
state value may be built from:

* ``None``, ``bool``, ``int``, ``float``, ``str``;
* ``torch.Tensor`` (stored through the codec), ``numpy.ndarray`` (stored as a tensor), ``torch.Generator``
  (its byte state) and ``numpy.random.Generator`` (its bit generator's state, JSON);
* ``dict`` (any scalar keys), ``list``, ``tuple``, ``set``;
* dataclasses and pydantic models defined in a ``fedhop.`` module, or in the package of a user algorithm the
  run names (``algorithm.name = "package.module:NAME"``: :func:`trust_module`), restored by their import path;
  a checkpoint names no other code, so loading one runs no code the run did not already import.

:func:`to_tree` raises :class:`StateError` naming the path of anything else, so an algorithm that keeps a
value the engine cannot save fails in its first round, not when the run is resumed.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

ALLOWED_PREFIX = "fedhop."
_TRUSTED: set[str] = set()  # packages of the user algorithms this process runs (trust_module)


def trust_module(module: str) -> None:
    """Let the state classes of user algorithm module ``module`` (and of the package that holds it) be saved
    and restored: the run names that module, every node imports it and checks its code digest."""
    _TRUSTED.add(module.rpartition(".")[0] or module)


def trusted(module: str) -> bool:
    """Whether classes of ``module`` may appear in a checkpoint."""
    return module.startswith(ALLOWED_PREFIX) or any(module == p or module.startswith(p + ".") for p in _TRUSTED)


def _not_savable_class(path: str, value: Any, what: str) -> StateError:
    return StateError(f"{path}: {type(value).__name__} is a {what} of module {type(value).__module__!r}, which is "
                      "neither fedhop's nor the package of the run's algorithm (algorithm.name); define the state "
                      "classes in the algorithm's module or its package")


class StateError(ValueError):
    """A state value that cannot be saved, or a saved tree that cannot be restored."""


def _class_path(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _import_class(path: str) -> type:
    module, _, qual = path.partition(":")
    if not trusted(module):
        raise StateError(f"checkpoint names class {path!r} outside {ALLOWED_PREFIX}* and the run's algorithm "
                         "package; refusing to import it")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise StateError(f"checkpoint names class {path!r}, which does not exist in this version of fedhop")
    if not isinstance(obj, type):
        raise StateError(f"checkpoint names {path!r}, which is not a class")
    return obj


def to_tree(value: Any, tensors: dict[str, torch.Tensor], path: str = "state") -> Any:
    """A JSON-able tree for ``value``; tensors are moved into ``tensors`` under generated keys."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = value.detach()
        return {"$t": key}
    if isinstance(value, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(value))
        return {"$nd": key}
    if isinstance(value, np.integer | np.floating | np.bool_):
        return value.item()
    if isinstance(value, torch.Generator):
        key = f"t{len(tensors)}"
        tensors[key] = value.get_state()
        return {"$tg": key}
    if isinstance(value, np.random.Generator):
        return {"$npg": type(value.bit_generator).__name__, "s": value.bit_generator.state}
    if isinstance(value, BaseModel):
        module = type(value).__module__
        if module.startswith(ALLOWED_PREFIX):
            return {"$pm": _class_path(value), "v": value.model_dump(mode="json")}
        if not trusted(module):
            raise _not_savable_class(path, value, "pydantic model")
        # a user model: field by field (its fields may be tensors), restored without validation
        return {"$pf": _class_path(value),
                "f": {k: to_tree(getattr(value, k), tensors, f"{path}.{k}") for k in type(value).model_fields}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if not trusted(type(value).__module__):
            raise _not_savable_class(path, value, "dataclass")
        return {"$dc": _class_path(value),
                "f": {f.name: to_tree(getattr(value, f.name), tensors, f"{path}.{f.name}")
                      for f in dataclasses.fields(value)}}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {"$d": {k: to_tree(v, tensors, f"{path}[{k!r}]") for k, v in value.items()}}
        return {"$dl": [[to_tree(k, tensors, f"{path}.key"), to_tree(v, tensors, f"{path}[{k!r}]")]
                        for k, v in value.items()]}
    if isinstance(value, list):
        return {"$l": [to_tree(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, tuple):
        return {"$tu": [to_tree(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, set | frozenset):
        return {"$s": [to_tree(v, tensors, f"{path}.item") for v in sorted(value)]}
    raise StateError(f"{path}: a {type(value).__name__} cannot be saved in a checkpoint (state must be tensors, "
                     "scalars, containers, and dataclasses or pydantic models of those)")


def check_savable(value: Any, what: str) -> None:
    """Raise a :class:`StateError` naming the field of ``value`` that a checkpoint cannot hold (``what``: whose
    state it is, e.g. ``"algorithm 'pkg.mod:NAME': the parameter server's state"``)."""
    try:
        to_tree(value, {})
    except StateError as e:
        raise StateError(f"{what} cannot be saved in a checkpoint: {e}") from None


def from_tree(tree: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The inverse of :func:`to_tree`."""
    if tree is None or isinstance(tree, bool | int | float | str):
        return tree
    if isinstance(tree, list):
        raise StateError("malformed state tree: a bare list")
    if not isinstance(tree, dict) or len(tree) not in (1, 2):
        raise StateError(f"malformed state tree node: {str(tree)[:80]}")
    if "$t" in tree:
        return _tensor(tensors, tree["$t"])
    if "$nd" in tree:
        return _tensor(tensors, tree["$nd"]).numpy().copy()
    if "$tg" in tree:
        g = torch.Generator()
        g.set_state(_tensor(tensors, tree["$tg"]))
        return g
    if "$npg" in tree:
        bit_gen = getattr(np.random, str(tree["$npg"]), None)
        if bit_gen is None:
            raise StateError(f"unknown numpy bit generator {tree['$npg']!r}")
        bg = bit_gen()
        bg.state = tree["s"]
        return np.random.Generator(bg)
    if "$pm" in tree:
        return _import_class(tree["$pm"]).model_validate(tree["v"])
    if "$pf" in tree:
        model = _import_class(tree["$pf"])
        return model.model_construct(**{k: from_tree(v, tensors) for k, v in tree["f"].items()})  # type: ignore
    if "$dc" in tree:
        cls = _import_class(tree["$dc"])
        fields = {k: from_tree(v, tensors) for k, v in tree["f"].items()}
        obj = cls.__new__(cls)
        known = {f.name for f in dataclasses.fields(cls)}
        if set(fields) != known:
            raise StateError(f"checkpoint fields of {tree['$dc']} ({sorted(fields)}) differ from this version's "
                             f"({sorted(known)})")
        for k, v in fields.items():
            object.__setattr__(obj, k, v)
        return obj
    if "$d" in tree:
        return {k: from_tree(v, tensors) for k, v in tree["$d"].items()}
    if "$dl" in tree:
        return {from_tree(k, tensors): from_tree(v, tensors) for k, v in tree["$dl"]}
    if "$l" in tree:
        return [from_tree(v, tensors) for v in tree["$l"]]
    if "$tu" in tree:
        return tuple(from_tree(v, tensors) for v in tree["$tu"])
    if "$s" in tree:
        return {from_tree(v, tensors) for v in tree["$s"]}
    raise StateError(f"malformed state tree node with keys {sorted(tree)}")


def _tensor(tensors: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in tensors:
        raise StateError(f"state tree refers to tensor {key!r}, which the checkpoint does not hold")
    return tensors[key]


def _shared_keys(tree: Any) -> list[str]:
    """The keys of the torch tensors ({"$t": key}) in a state tree."""
    out: list[str] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "$t" in node and len(node) == 1:
                out.append(node["$t"])
                continue
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


@dataclass(frozen=True)
class StateSnapshot:
    """A state value kept to start over from (the round loop's retry copy): see :func:`snapshot_state`."""

    tree: Any
    tensors: dict[str, torch.Tensor]
    versions: dict[str, int]  # the shared tensors' version counters when the snapshot was taken

    def restore(self) -> Any:
        """A fresh state equal to the snapshot; its shared tensors are the very tensors of the snapshot."""
        changed = [k for k, v in self.versions.items() if self.tensors[k]._version != v]
        if changed:
            raise StateError(f"{len(changed)} tensor(s) of the state were changed in place since the snapshot was "
                             "taken without copying them; this algorithm must not declare "
                             "round_replaces_tensors")
        return from_tree(self.tree, {k: v.clone() if k not in self.versions else v for k, v in self.tensors.items()})


def snapshot_state(value: Any, *, share_tensors: bool = False) -> StateSnapshot:
    """Keep ``value`` to start over from. ``share_tensors``: its torch tensors are kept by reference (no copy)
    with their version counters, for a caller that promises not to change them in place (the snapshot refuses
    to restore if one was); everything else (numpy arrays, generators, containers, scalars) is copied."""
    tensors: dict[str, torch.Tensor] = {}
    tree = to_tree(value, tensors)
    shared = set(_shared_keys(tree)) if share_tensors else set()
    kept = {k: v if k in shared else v.clone() for k, v in tensors.items()}
    return StateSnapshot(tree, kept, {k: kept[k]._version for k in shared})


def copy_state(value: Any) -> Any:
    """A deep copy of a state value through the same tree a checkpoint uses (tensors cloned)."""
    tensors: dict[str, torch.Tensor] = {}
    tree = to_tree(value, tensors)
    return from_tree(tree, {k: v.clone() for k, v in tensors.items()})
