"""Where a command's results go when no ``--out`` is given: ``runs/<time>-<name>-<engine>`` for a run (simulate,
launch, server, testbed up), ``runs/<time>-compare`` for ``fedhop compare``.

Shared by the command line and the testbeds (``deploy/testbed.py``), so it imports nothing of either.
"""

from __future__ import annotations

import time
from pathlib import Path

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
