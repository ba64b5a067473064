"""Paper reproductions: ``fedhop reproduce NAME [--quick]``.

Each experiment module registers one function with :func:`experiment`. It runs its specs with the
in-process engine, writes results (JSON/CSV), plots (PNG) and a markdown table into its output folder,
and returns an :class:`Outcome` whose ``checks`` state the direction of the paper's claim, as measured.
``--quick`` is the reduced size CI runs: smaller and shorter, but still checking each claim's direction.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MODULES = ("focus_fig4", "fedcluster_e1", "fedchs_digits", "fgdro_toy")


@dataclass
class Outcome:
    name: str
    table_md: str  # the markdown table: paper's claim vs our number
    checks: dict[str, bool] = field(default_factory=dict)  # claim direction -> held?
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


Experiment = Callable[[Path, bool], Outcome]
EXPERIMENTS: dict[str, Experiment] = {}


def experiment(name: str) -> Callable[[Experiment], Experiment]:
    def deco(fn: Experiment) -> Experiment:
        EXPERIMENTS[name] = fn
        return fn

    return deco


def load_all() -> dict[str, Experiment]:
    for m in MODULES:
        try:
            importlib.import_module(f"fedhop.reproduce.{m}")
        except ModuleNotFoundError as e:
            if e.name != f"fedhop.reproduce.{m}":
                raise
    return EXPERIMENTS


def run_experiment(name: str, out: Path, quick: bool) -> Outcome:
    exps = load_all()
    if name not in exps:
        raise SystemExit(f"unknown experiment {name!r}; known: {', '.join(sorted(exps))}")
    out.mkdir(parents=True, exist_ok=True)
    outcome = exps[name](out, quick)
    (out / "table.md").write_text(f"# {name}{' (quick)' if quick else ''}\n\n{outcome.table_md}\n")
    (out / "outcome.json").write_text(json.dumps(
        {"name": name, "quick": quick, "checks": outcome.checks, "notes": outcome.notes}, indent=1))
    return outcome
