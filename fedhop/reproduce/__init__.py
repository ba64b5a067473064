"""Paper reproductions: ``fedhop reproduce NAME [--quick]``.

Each experiment module registers one function with :func:`experiment`. It runs its specs through
:func:`fedhop.reproduce.runner.run_spec` (the in-process engine, or real processes with ``--network``), each
into a run folder under ``runs/``, writes results (JSON/CSV), figures (PNG, most of them by ``fedhop compare``
from those run folders) and a markdown table into its output folder,
and returns an :class:`Outcome` whose ``checks`` state the direction of the paper's claim, as measured.
``--quick`` is the reduced size CI runs: smaller and shorter, but still checking each claim's direction.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fedhop.reproduce.runner import RunOptions, current, using

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


class ExperimentError(ValueError):
    """An experiment that cannot run as asked (an unknown name, options it does not take); ``fedhop reproduce``
    ends with exit code 2 (USAGE) and this message."""


Experiment = Callable[..., Outcome]  # (out, quick) or, with takes_data, (out, quick, dataset=, path=)
EXPERIMENTS: dict[str, Experiment] = {}
TAKES_DATA: set[str] = set()


def experiment(name: str, takes_data: bool = False) -> Callable[[Experiment], Experiment]:
    """Register an experiment; ``takes_data``: it can run on a user's dataset files (``--dataset/--data-path``)."""
    def deco(fn: Experiment) -> Experiment:
        EXPERIMENTS[name] = fn
        if takes_data:
            TAKES_DATA.add(name)
        return fn

    return deco


def load_all() -> dict[str, Experiment]:
    for m in MODULES:
        importlib.import_module(f"fedhop.reproduce.{m}")
    return EXPERIMENTS


def run_experiment(name: str, out: Path, quick: bool, dataset: str | None = None,
                   path: str | None = None, options: RunOptions | None = None) -> Outcome:
    """Run one experiment into ``out``; ``options``: the engine (``--network``) and ``--only``."""
    with using(options or RunOptions()):
        return _run_experiment(name, out, quick, dataset, path)


def _run_experiment(name: str, out: Path, quick: bool, dataset: str | None, path: str | None) -> Outcome:
    opts = current()
    exps = load_all()
    if name not in exps:
        raise ExperimentError(f"unknown experiment {name!r}; known: {', '.join(sorted(exps))}")
    out.mkdir(parents=True, exist_ok=True)
    if dataset or path:
        if name not in TAKES_DATA:
            raise ExperimentError(f"experiment {name!r} runs on its own data; --dataset/--data-path apply to: "
                             f"{', '.join(sorted(TAKES_DATA))}")
        outcome = exps[name](out, quick, dataset=dataset, path=path)
    else:
        outcome = exps[name](out, quick)
    (out / "table.md").write_text(f"# {name}{' (quick)' if quick else ''}\n\n{outcome.table_md}\n")
    (out / "outcome.json").write_text(json.dumps(
        {"name": name, "quick": quick, "engine": opts.engine, "only": list(opts.only), "checks": outcome.checks,
         "notes": outcome.notes}, indent=1))
    return outcome
