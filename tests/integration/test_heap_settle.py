"""Issue 19: the processes fedhop owns settle their heap once their federation joined (``common/heap.py``: what
survived a full collection is frozen, so the collector stops walking thousands of sessions every round): the PS,
an edge and each client host; a process that only calls fedhop (a test calling ``launch``) keeps its collector;
``FEDHOP_GC_FREEZE=0`` turns it off; a bad value stops the command, naming the variable."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.netutil import launch_cli_here, launch_run, small_spec

SETTLED = "heap settled ("


def settled_lines(out: Path) -> dict[str, list[str]]:
    """Each process's log (``logs/<name>.log``) -> its 'heap settled' lines."""
    return {p.stem: [ln for ln in p.read_text().splitlines() if SETTLED in ln]
            for p in sorted((out / "logs").glob("*.log"))}


def test_the_ps_an_edge_and_each_client_host_settle_once_joined(tmp_path: Path) -> None:
    spec = small_spec("hierfavg", clients=4, edges=1, rounds=2)
    out = launch_run(spec, tmp_path, extra=["--clients-per-process", "2"])
    lines = settled_lines(out)
    assert any("ps: 1 children joined" in ln for ln in lines["ps"]), lines
    assert any("edge-0: 4 children joined" in ln for ln in lines["edge-0"]), lines
    hosts = {name: got for name, got in lines.items() if ".." in name}  # a host's log is named by its id range
    assert len(hosts) == 2 and all(any("all 2 ids of this host joined" in ln for ln in got)
                                   for got in hosts.values()), lines


def test_a_library_caller_keeps_its_collector_while_the_forked_hosts_settle(tmp_path: Path) -> None:
    before = gc.get_freeze_count()
    spec = small_spec("fedavg", clients=4, rounds=1)
    out = launch_cli_here(spec, tmp_path, extra=["--clients-per-process", "2"])
    assert gc.get_freeze_count() == before == 0  # the PS ran in this process: nothing of it was frozen
    lines = settled_lines(out)
    assert lines["ps"] == []
    hosts = [got for name, got in lines.items() if ".." in name]
    assert len(hosts) == 2 and all(got for got in hosts), lines


def test_turned_off_by_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDHOP_GC_FREEZE", "0")
    out = launch_run(small_spec("fedavg", clients=2, rounds=1), tmp_path, extra=["--clients-per-process", "2"])
    lines = settled_lines(out)
    assert len(lines) >= 2 and all(got == [] for got in lines.values()), lines


def test_a_bad_value_stops_the_command_naming_the_variable() -> None:
    proc = subprocess.run([sys.executable, "-m", "fedhop", "algorithms"], capture_output=True, text=True,
                          env={**os.environ, "FEDHOP_GC_FREEZE": "sometimes"}, timeout=120)
    assert proc.returncode == 2, proc
    assert "FEDHOP_GC_FREEZE='sometimes'" in proc.stderr and "expected 1" in proc.stderr, proc.stderr
