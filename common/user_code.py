"""User code named in a RunSpec: importing ``pkg.module:function`` references, and a digest of their source.

A run spec may name Python callables instead of built-in registry entries (README "Bring your own"):

===================  ================================================================================
spec field           contract (see the module that calls it)
===================  ================================================================================
``model.name``       ``build(input_shape, num_classes, seed, **model.options) -> nn.Module``
                     (``fedhop.common.models.user``)
``model.loss``       ``loss(outputs, y) -> 0-dim tensor`` (the training objective, a batch mean)
``data.source``      ``source(request) -> (x, y)`` for one client's partition or the test set
                     (``fedhop.common.data.source``)
``metrics[i]``       ``metric(outputs, y) -> float`` over the whole test set, reported under the
                     function's name every ``eval_every`` rounds
``algorithm.name``   an ``fedhop.api.Algorithm`` record (not a function): the protocol's options model,
                     its steps and its task handlers (``docs/protocols.md``)
===================  ================================================================================

A reference is ``module.path:attribute`` (the attribute may be dotted: ``pkg.mod:Class.method``). Modules are
imported with the current working directory on ``sys.path`` (as uvicorn and gunicorn do for ``module:app``),
besides ``PYTHONPATH``; every node of a networked run must be able to import the same modules, and
:func:`code_digest` lets the parameter server check that every node runs the same version of them.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec

REF = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# names a metric may not take: they are already columns of rounds.csv
RESERVED_METRICS = frozenset({"round", "loss", "accuracy", "payload_bytes", "message_bytes", "participants",
                              "present"})


class UserCodeError(ValueError):
    """User code named in a spec cannot be imported or does not keep its contract; the message names the field."""


def is_ref(value: str) -> bool:
    """Whether ``value`` is a ``module:attribute`` reference (registry names never contain a colon)."""
    return ":" in value


def check_ref(value: str, field: str, attribute: str = "function") -> str:
    """``value`` if it is a well-formed reference, else a UserCodeError naming ``field`` (``attribute``: what the
    reference's attribute is called in the message, e.g. ``NAME`` for an algorithm record)."""
    if not REF.fullmatch(value):
        where = f"{field}: " if field else ""
        raise UserCodeError(f"{where}{value!r} is not a Python reference of the form 'package.module:{attribute}'")
    return value


def _import(module: str, field: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            raise UserCodeError(f"{field}: cannot import module {module!r} ({e}); put the folder that holds it on "
                                f"PYTHONPATH or run from that folder (working directory: {cwd})") from None
        raise UserCodeError(f"{field}: importing {module!r} failed: {type(e).__name__}: {e}") from None
    except Exception as e:  # any error inside the user's module body
        raise UserCodeError(f"{field}: importing {module!r} failed: {type(e).__name__}: {e}") from None


def load_object(ref: str, field: str) -> Any:
    """Import ``module:attribute`` and return the attribute (any object)."""
    module, attr = check_ref(ref, field).split(":")
    obj: Any = _import(module, field)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserCodeError(f"{field}: module {module!r} has no attribute {attr!r}") from None
    return obj


# what makes an object an algorithm record (fedhop.api.Algorithm); checked by shape, since this core module may
# not import the engine that defines the class
ALGORITHM_STEPS = ("init", "round", "final", "node_state")


def load_algorithm(ref: str, field: str = "algorithm.name") -> Any:
    """Import ``module:NAME`` and return it, which must be a ``fedhop.api.Algorithm`` record (a UserCodeError
    names ``field`` otherwise)."""
    from pydantic import BaseModel

    obj = load_object(ref, field)
    cls = type(obj)
    if cls.__name__ != "Algorithm" or not all(callable(getattr(obj, s, None)) for s in ALGORITHM_STEPS):
        kind = "class" if isinstance(obj, type) else cls.__name__
        raise UserCodeError(f"{field}: {ref} is a {kind}, not a fedhop.api.Algorithm record "
                            "(write NAME = Algorithm(name=..., options=..., init=..., round=...))")
    if not (isinstance(obj.options, type) and issubclass(obj.options, BaseModel)):
        raise UserCodeError(f"{field}: {ref}.options is {obj.options!r}, not a pydantic model class "
                            "(use fedhop.api.NoOptions for an algorithm without options)")
    return obj


def load_callable(ref: str, field: str) -> Callable[..., Any]:
    """Import ``module:attribute`` and return the attribute, which must be callable."""
    obj = load_object(ref, field)
    if not callable(obj):
        raise UserCodeError(f"{field}: {ref} is a {type(obj).__name__}, not a function")
    return obj


def metric_name(ref: str) -> str:
    """The column a metric is reported under: the last part of its attribute (``pkg.m:f1_score`` -> ``f1_score``)."""
    return ref.split(":")[1].split(".")[-1]


def references(spec: RunSpec) -> dict[str, str]:
    """Every user reference in ``spec``, keyed by the spec field that names it."""
    out: dict[str, str] = {}
    if is_ref(spec.algorithm.name):
        out["algorithm.name"] = spec.algorithm.name
    if is_ref(spec.model.name):
        out["model.name"] = spec.model.name
    if spec.model.loss is not None:
        out["model.loss"] = spec.model.loss
    if spec.data.source is not None:
        out["data.source"] = spec.data.source
    for i, m in enumerate(spec.metrics):
        out[f"metrics[{i}]"] = m
    return out


def check_imports(spec: RunSpec) -> None:
    """Import every reference of ``spec`` (a UserCodeError names the first that fails)."""
    for field, ref in references(spec).items():
        if field == "algorithm.name":
            load_algorithm(ref, field)
        else:
            load_callable(ref, field)


def code_digest(spec: RunSpec) -> str:
    """SHA-256 over the source files of the modules the spec names ("" when it names none).

    Each named module contributes its name and the bytes of its file (for a package, its ``__init__.py``);
    helpers those modules import are not covered. Two nodes with equal digests run the same version of the
    user's code; the parameter server compares the digest each node reports when it joins with its own.
    """
    modules = sorted({ref.split(":")[0] for ref in references(spec).values()})
    if not modules:
        return ""
    h = hashlib.sha256()
    for name in modules:
        mod = _import(name, f"module {name}")
        path = getattr(mod, "__file__", None)
        h.update(name.encode() + b"\0")
        if path is not None and Path(path).is_file():
            h.update(Path(path).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


CODE_DIGEST = "code_digest"  # the Welcome.info entry with the parameter server's code digest


def check_parent_code(spec: RunSpec, welcome_info: Mapping[str, object], node: str) -> None:
    """A joining node's check (client or edge): the digest of its own copy of the modules ``spec`` names must
    equal the parameter server's, which every Welcome carries under :data:`CODE_DIGEST` (an edge forwards the
    PS's digest to its clients). A UserCodeError says which node differs."""
    ps = welcome_info.get(CODE_DIGEST, "")
    check_same_code(ps if isinstance(ps, str) else "", code_digest(spec), node)


def check_same_code(own: str, reported: str, node: str) -> None:
    """The parameter server's check of a joining node's digest (raise = refuse the node)."""
    if own != reported:
        raise UserCodeError(f"{node} runs different user code than the parameter server (code digest "
                            f"{reported[:12] or 'none'} != {own[:12] or 'none'}): deploy the same version of the "
                            "modules the spec names (algorithm.name, model.name, model.loss, data.source, metrics) "
                            "on every node")
