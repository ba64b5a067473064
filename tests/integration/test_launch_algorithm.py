"""``fedhop launch --algorithm NAME`` runs that algorithm's template over real processes, and ``--log-level``
reaches the children's logs."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from fedhop.cli import main


def test_launch_runs_a_template_and_passes_its_log_level_to_the_children(tmp_path: Path) -> None:
    out = tmp_path / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(["launch", "--algorithm", "wrwgd", "--set", "rounds=2", "--set", "topology.clients=3",
                     "--set", "algorithm.options.K=2", "--set", 'device="cpu"', "--out", str(out), "--quiet",
                     "--log-level", "warning"])
    assert code == 0, printed.getvalue()
    res = json.loads((out / "results.json").read_text())
    assert res["spec"]["algorithm"]["name"] == "wrwgd" and len(res["rounds"]) == 2
    assert {r["kind"] for r in res["links"] if r["payload_bytes"]} >= {"handoff"}  # the template's peer graph
    child = (out / "logs" / "client-0.log").read_text()
    assert "joined run" not in child  # an info line: the child logs at warning, as the launch was told
