"""The quick Fed-CHS reproduction runs end to end and the paper's claims hold in direction."""

from __future__ import annotations

import json
from pathlib import Path

from fedhop.reproduce import run_experiment


def test_fedchs_digits_quick(tmp_path: Path) -> None:
    outcome = run_experiment("fedchs-digits", tmp_path, quick=True)
    for f in ("results.json", "results.csv", "compare-lam0.3/compare.png", "compare-lam0.6/compare.png", "table.md",
              "outcome.json"):
        assert (tmp_path / f).is_file(), f
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert {r["method"] for r in runs} >= {"Fed-CHS", "FedAvg-A", "Hier-Local-QSGD", "WRWGD"}
    assert {r["lam"] for r in runs} == {0.3, 0.6}
    assert outcome.checks, "the experiment must check at least one claim"
    assert outcome.ok, outcome.table_md
    # FedAvg + QSGD (Fig. 2): reading A, 20 communications a round to all 30 clients; per communication the model
    # down (4d bytes) and Q_127(w_k - w) up (d int8 levels + a float32 norm for each of the mlp's 4 tensors)
    d = 64 * 64 + 64 + 64 * 10 + 10
    qsgd = [r for r in runs if r["method"] == "FedAvg-A+QSGD"]
    assert qsgd and all(r["bytes_per_round"] == 20 * 30 * (4 * d + d + 4 * 4) for r in qsgd)
