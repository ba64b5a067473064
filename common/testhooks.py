"""Test hooks that let a test choose the moment of a fault without sleeping.

``FEDHOP_TEST_GATE=DIR``: at a named point (``gate("3")`` on the PS before round 3, ``gate("edge-1-3")`` on a
child before running a task of round 3), if the test made ``DIR/stop-<name>``, the process writes
``DIR/at-<name>`` and waits until the test makes ``DIR/go-<name>``. Without the variable, or without the
stop file, a gate returns at once. ``released("join-ps")``: whether the test made ``DIR/go-join-ps``, which
ends a parent's wait for its children to join at once (a test that holds a node back to join late need not
wait out the join timeout). ``mark("ready-ps-client-1")``: a state the process reached (a child said Ready, a
late one was admitted, a child re-joins), one line appended to ``DIR/seen-<name>`` each time, so that a test
awaits the state (and counts it) instead of a log line. Nothing else in fedhop reads the variable.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def gate(name: str) -> None:
    folder = os.environ.get("FEDHOP_TEST_GATE")
    if not folder or not (Path(folder) / f"stop-{name}").exists():
        return
    (Path(folder) / f"at-{name}").touch()
    while not (Path(folder) / f"go-{name}").exists():
        time.sleep(0.05)


def released(name: str) -> bool:
    folder = os.environ.get("FEDHOP_TEST_GATE")
    return bool(folder) and (Path(folder) / f"go-{name}").exists()


def mark(name: str) -> None:
    """Record that this process reached the state ``name`` (one line more in ``DIR/seen-<name>``); nothing
    without the variable."""
    folder = os.environ.get("FEDHOP_TEST_GATE")
    if folder:
        with open(Path(folder) / f"seen-{name}", "a") as f:
            f.write(f"{os.getpid()}\n")
