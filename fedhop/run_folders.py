"""Where a command's results go when no ``--out`` is given: ``runs/<time>-<name>-<engine>`` for a run (simulate,
launch, server, testbed up), ``runs/<time>-compare`` for ``fedhop compare``; and the name of the built-in default
run once ``--set`` changed what it runs (:func:`derived_name`).

Shared by the command line and the testbeds (``deploy/testbed.py``), so it imports nothing of either.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec

RUNS = Path("runs")


def stamp() -> str:
    """The local time, as the folder names start with it (sorting by name sorts by time)."""
    return time.strftime("%Y%m%d-%H%M%S")


def default_out(spec_name: str, engine: str) -> Path:
    """The run folder of ``spec_name`` run by ``engine`` (simulate, launch, server, testbed) without ``--out``."""
    return RUNS / f"{stamp()}-{spec_name}-{engine}"


def default_compare_out() -> Path:
    """``fedhop compare``'s output folder without ``--out``."""
    return RUNS / f"{stamp()}-compare"


def _token(text: str) -> str:
    """``text`` as a piece of a folder name (a user algorithm ``pkg.mod:NAME`` becomes ``pkg.mod-NAME``)."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text).strip("-") or "x"


def derived_name(spec: RunSpec, default: RunSpec) -> str:
    """The name of the built-in default run ``default`` (``default-digits-fedavg``) after ``--set`` made it
    ``spec``: ``default-<dataset>-<algorithm>`` with the topology's differences appended (``-flat`` for no
    edges, ``-<n>edges``, ``-<n>clients``, the edge graph, the cluster sizes), so that the folder, the run id,
    the live page and the compare legend say what ran. ``default.name`` when none of these changed."""
    t, d = spec.topology, default.topology
    parts = [f"default-{_token(spec.data.source or spec.data.dataset)}-{_token(spec.algorithm.name)}"]
    if t.edges != d.edges:
        parts.append("flat" if t.edges == 0 else f"{t.edges}edges")
    if t.clients != d.clients:
        parts.append(f"{t.clients}clients")
    if t.edge_graph != d.edge_graph:
        parts.append(t.edge_graph)
    if t.clients_per_edge is not None and t.clients_per_edge != d.clients_per_edge:
        parts.append("x".join(str(n) for n in t.clients_per_edge))
    name = "-".join(parts)
    base = f"default-{_token(default.data.source or default.data.dataset)}-{_token(default.algorithm.name)}"
    return default.name if name == base else name


def run_spec_file(run_dir: str | Path) -> Path:
    """The spec a run folder ran (its ``spec.toml``: the resolved spec, every default filled in); a Fatal
    (USAGE) when ``run_dir`` is not a run folder."""
    from fedhop.common.exit_codes import ExitCode, Fatal

    folder = Path(run_dir)
    spec = folder / "spec.toml"
    if not folder.is_dir():
        raise Fatal(ExitCode.USAGE, f"{folder} is not a run folder (no such folder)")
    if not spec.is_file():
        raise Fatal(ExitCode.USAGE, f"{folder} is not a run folder: it has no spec.toml")
    return spec


RERUN_COMMAND = {"inprocess": "simulate", "network": "launch"}  # results.json's engine -> the command to rerun it


def run_engine(run_dir: str | Path) -> str:
    """The command that reruns a run folder's run with its own engine: ``simulate`` for the in-process engine,
    ``launch`` for the networked one (``server`` runs, too: on this machine); ``simulate`` when its
    ``results.json`` is missing or unreadable (a run that did not finish)."""
    import json

    try:
        engine = json.loads((Path(run_dir) / "results.json").read_text()).get("engine")
    except (OSError, ValueError, AttributeError):
        return "simulate"
    return RERUN_COMMAND.get(engine, "simulate")
