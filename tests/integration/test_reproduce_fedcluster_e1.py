"""The FedCluster E1 reproduction at CI size: runs, writes its outputs and its claims hold."""

import json

from fedhop.reproduce import run_experiment


def test_fedcluster_e1_quick(tmp_path):
    outcome = run_experiment("fedcluster-e1", tmp_path, quick=True)
    assert outcome.checks and outcome.ok, outcome.checks
    for name in ("curves.csv", "results.json", "loss_vs_round.png", "table.md", "outcome.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["rounds_to_reach"] is not None and res["rounds_to_reach"] <= 12
    assert "| claim |" in outcome.table_md
