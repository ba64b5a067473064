"""The "did you mean ...?" of the command line's mistakes: a misspelt command, option, choice, reproduction or
``--set`` key gets the closest known name (:mod:`difflib`), and an option that is really a spec field
(``launch --rounds 5``) gets the ``--set`` that says it (``--set rounds=5``).

Pure functions of the word and the names it could have meant; :class:`fedhop.cli.errors.UsageParser` calls
them from argparse's errors, ``cli/spec_fields.py`` for ``--set`` keys. The spec's own layer words its hints
the same way without importing the CLI: ``common/catalog.py`` (algorithm, dataset and model names) and
``common/validation.py`` (a misspelt key in a spec file). Importing this module imports no torch nor the spec:
the spec's keys are read (:func:`spec_keys`) only when a mistake needs them.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Sequence

CUTOFF = 0.6  # difflib's similarity ratio a name must reach to be suggested


def closest(word: str, names: Iterable[str], cutoff: float = CUTOFF) -> str | None:
    """The known name most like ``word`` (difflib ratio >= ``cutoff``), or None."""
    found = difflib.get_close_matches(word, list(dict.fromkeys(names)), n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(word: str, names: Iterable[str], cutoff: float = CUTOFF) -> str:
    """``"; did you mean 'x'?"`` for the closest name, or ``""`` when none is close: appended to an error."""
    best = closest(word, names, cutoff)
    return f"; did you mean {best!r}?" if best is not None else ""


def spec_keys() -> list[str]:
    """Every dotted key ``--set`` takes, the default algorithm's options included (``rounds``,
    ``topology.clients``, ``algorithm.options.lr``, ...); a free-form table (``data.options``) as itself."""
    import typing

    from pydantic import BaseModel

    from fedhop.common import catalog
    from fedhop.common.spec import RunSpec

    def model_of(annotation: object) -> type[BaseModel] | None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation
        return next((m for m in map(model_of, typing.get_args(annotation)) if m is not None), None)

    algorithm = RunSpec.model_fields["algorithm"].get_default(call_default_factory=True).name

    def walk(model: type[BaseModel], prefix: str) -> list[str]:
        keys = []
        for name, info in model.model_fields.items():
            key = prefix + name
            sub = catalog.algorithm(algorithm).options if key == "algorithm.options" else model_of(info.annotation)
            keys += [key] if sub is None else [key, *walk(sub, key + ".")]
        return keys

    return walk(RunSpec, "")


def spec_key_for(name: str, keys: Sequence[str], exact: bool = False) -> str | None:
    """The spec key an option-like ``name`` (``rounds``, ``clients``, ``topology.clients``, ``lr``) stands for:
    a key that is the name or ends with ``.name``, else (unless ``exact``) the closest key or last part of a
    key; a table's ``name`` for the table (``algorithm``: ``algorithm.name``); None if none."""
    key = _spec_key_for(name.replace("-", "_"), keys, exact)
    if key is not None and any(k.startswith(key + ".") for k in keys):  # a table: its name, if it has one
        return key + ".name" if key + ".name" in keys else None
    return key


def _spec_key_for(name: str, keys: Sequence[str], exact: bool) -> str | None:
    if name in keys:
        return name
    tails = [k for k in keys if k.rsplit(".", 1)[-1] == name]
    if tails:
        return min(tails, key=lambda k: k.count("."))  # `--lr`: algorithm.options.lr; the shallowest key wins
    if exact:
        return None
    best = closest(name, keys, cutoff=0.8)
    if best is not None:
        return best
    last = {k.rsplit(".", 1)[-1]: k for k in sorted(keys, key=lambda k: -k.count("."))}  # shallowest kept
    best = closest(name, last, cutoff=0.8)
    return last[best] if best is not None else None


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str], argv: Sequence[str] = ()) -> str:
    """The one-line message for arguments ``parser`` did not take, with a hint for the first option among
    them: ``--set KEY=VALUE`` where the option is a spec field and the command takes ``--set``, else the
    closest option of the command. ``argv``: the whole command line, where the option's value is found when
    argparse took it for a positional (``launch --rounds 5``: 5 became the spec file)."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    options = [(i, t) for i, t in enumerate(extras) if t.startswith("--") and len(t) > 2]
    if not options:
        return message
    i, token = options[0]
    name, eq, value = token[2:].partition("=")
    if not eq:
        after = list(argv)[list(argv).index(token) + 1:] if token in argv else list(extras[i + 1:])
        value = after[0] if after and not after[0].startswith("-") else ""
    known = _option_strings(parser)
    keys: list[str] = []
    if "--set" in known:
        try:
            keys = spec_keys()
        except Exception:  # noqa: BLE001 - a hint must never turn a usage error into a traceback
            keys = []
    key = spec_key_for(name, keys, exact=True)  # a spec field by its very name: --rounds, --lr
    if key is None:  # else the closer of a misspelt option (--quite) and a misspelt spec field (--round)
        option = closest(name, [o[2:] for o in known])
        key = spec_key_for(name, keys)
        if option is not None and (key is None or _likeness(name, option) >= _likeness(name, key)):
            return f"{message}; did you mean --{option}?"
    if key is not None:
        return f"{message}; did you mean --set {key}={value or 'VALUE'}?"
    return message


def _likeness(name: str, key: str) -> float:
    """How like ``name`` an option or a dotted key (its whole or its last part) is: difflib's ratio."""
    name = name.replace("-", "_")
    return max(difflib.SequenceMatcher(None, name, k.replace("-", "_")).ratio() for k in (key, key.rsplit(".", 1)[-1]))


def invalid_choice(action: argparse.Action, value: str) -> str:
    """The one-line message for ``value`` that is not among ``action.choices``: a command or a choice."""
    names = [str(c) for c in action.choices or ()]
    hint = did_you_mean(str(value), names)
    if isinstance(action, argparse._SubParsersAction):
        return f"unknown command {value!r} (commands: {', '.join(names)}){hint}"
    return f"invalid choice {value!r} (choose from {', '.join(names)}){hint}"
