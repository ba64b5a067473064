"""How a reproduction runs its specs: with the in-process engine (the default) or over real processes
(``fedhop reproduce NAME --network``: the PS in this process, every edge and client a local OS process on
loopback, started by :func:`fedhop.launch.launch`, the code ``fedhop launch`` runs), and which of its runs
(``--only``).

Every run writes a run folder (``results.json``, ``rounds.csv``, ``links.csv``, ``model.pt``, ...) under the
experiment's ``runs/`` folder, named by the run's key, whichever engine made it; ``fedhop compare`` draws the
reproductions' figures from those folders, and the networked test compares the two engines' folders.

Experiments read the options of the current ``fedhop reproduce`` call through :func:`current`; they are set
for the duration of one experiment by :func:`using`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from fedhop.common.engine import results
from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.results import RunResult
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec

Customize = Callable[[Workspace], None]  # applied to the evaluating workspace (the PS's) before round 1


@dataclass(frozen=True)
class RunOptions:
    """``network``: every run over real processes. ``only``: run only the runs whose key contains one of
    these substrings (the claims that need a run left out are not checked, and the outcome says so).
    ``events``: the lifecycle events of every run made in this process (not those of a worker pool)."""

    network: bool = False
    only: tuple[str, ...] = ()
    events: RunEvents | None = None  # every run made in this process emits its lifecycle events here (a bar)

    @property
    def engine(self) -> str:
        return "network" if self.network else "inprocess"

    def selected(self, key: str) -> bool:
        return not self.only or any(s in key for s in self.only)


_CURRENT: ContextVar[RunOptions | None] = ContextVar("fedhop_reproduce_options", default=None)


def current() -> RunOptions:
    return _CURRENT.get() or RunOptions()


@contextlib.contextmanager
def using(options: RunOptions) -> Iterator[RunOptions]:
    token = _CURRENT.set(options)
    try:
        yield options
    finally:
        _CURRENT.reset(token)


def folder_name(key: str) -> str:
    """A run key as a folder name: letters, digits, '.', '_', '-' (runs of anything else become one '_')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_")


def run_spec(spec: RunSpec, folder: Path, customize: Customize | None = None) -> RunResult:
    """Run ``spec`` with the current engine and write its run folder to ``folder`` (replacing an older run's
    files there). ``customize(ws)``: e.g. the figure's metric in place of the test loss, applied to the
    workspace that evaluates the model (in-process: the engine's only one; networked: the PS's)."""
    results.prepare_run_folder(folder, force=True)
    if current().network:
        return _launch(spec, folder, customize)
    from fedhop.common.engine.inprocess import InProcessEngine

    eng = InProcessEngine(spec)
    if customize is not None:
        customize(eng.ws)
    res = eng.run(journal=folder / "rounds.jsonl", events=current().events)
    results.write_run_folder(res, folder)
    return res


JOIN_S_PER_PROCESS = 5.0


def startup_allowance(spec: RunSpec) -> RunSpec:
    """``spec`` with ``transport.join_timeout_s`` at least 5 s per edge and client process: a reproduction's
    federation (up to 41 processes at --quick size, each importing torch) can take longer than the default
    60 s to start on a small, busy machine. Only the PS's wait for the joins changes, never the math; a child
    that dies while starting still stops the run at once (the launcher's startup check)."""
    nodes = spec.topology.clients + spec.topology.edges
    wait = max(spec.transport.join_timeout_s, JOIN_S_PER_PROCESS * nodes)
    return spec.model_copy(update={"transport": spec.transport.model_copy(update={"join_timeout_s": wait})})


def _launch(spec: RunSpec, folder: Path, customize: Customize | None) -> RunResult:
    from fedhop.launch import launch

    return launch(startup_allowance(spec), folder, device=spec.device, events=current().events,
                  ps_workspace=customize)
