"""The PS under an orchestrator's SIGTERM: 0 once its run folder is complete, 143 before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys, time
from pathlib import Path
from fedhop.lifecycle import exit_zero_on_sigterm_once_written
out = Path(sys.argv[1])
exit_zero_on_sigterm_once_written(out)
if sys.argv[2] == "write":
    out.mkdir(parents=True, exist_ok=True)
    for f in ("results.json", "plots.png"):
        (out / f).write_text("x")
print("ready", flush=True)
sys.stdin.read()
"""


def run_and_term(tmp: Path, mode: str) -> int:
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp / "run"), mode], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    return p.wait(60)


def test_sigterm_after_results_exits_zero(tmp_path: Path) -> None:
    assert run_and_term(tmp_path, "write") == 0


def test_sigterm_during_the_run_exits_143(tmp_path: Path) -> None:
    assert run_and_term(tmp_path, "none") == 143


def test_stale_results_from_an_earlier_run_do_not_count(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    for f in ("results.json", "plots.png"):
        (out / f).write_text("old")
        os.utime(out / f, (1, 1))
    assert run_and_term(tmp_path, "none") == 143
