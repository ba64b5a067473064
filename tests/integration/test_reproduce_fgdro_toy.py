"""``fedhop reproduce fgdro-toy --quick``: the FGDRO toy and imbalanced-digits checks hold (about a minute)."""

import json

from fedhop.reproduce import run_experiment


def test_fgdro_toy_quick(tmp_path):
    outcome = run_experiment("fgdro-toy", tmp_path, quick=True)
    assert outcome.ok, {k: v for k, v in outcome.checks.items() if not v}
    assert len(outcome.checks) >= 6
    for f in ("toy.csv", "digits.csv", "results.json", "toy_objectives.png", "digits_worst_client.png", "table.md"):
        assert (tmp_path / f).stat().st_size > 0, f
    res = json.loads((tmp_path / "results.json").read_text())
    rows = {r["method"]: r for r in res["toy"]["rows"]}
    # payload per round per client and direction: d+1 (CVaR), 2d+1 (KL), 3d+1 (KL-Adam) floats, d = 10
    rounds = rows["FedAvg"]["rounds"]
    for name, floats in (("FedAvg", 10), ("FGDRO-CVaR eta=0.02", 11), ("FGDRO-KL b2=0.01", 21),
                         ("FGDRO-KL-Adam b2=0.01", 31)):
        init = 8 * 4 if name.startswith("FGDRO-KL") else 0      # KL warm init: one float up per client, once
        assert round(rows[name]["payload_MB"] * 1e6) == rounds * 8 * 2 * 4 * floats + init, name
    # DRFA-Prox (KL) on the same toy: the model down and up for the distinct clients drawn, the model down and one
    # float up for the N loss evaluations (unit-tested per round in tests/unit/test_baselines_drfa_prox.py)
    drfa = rows["DRFA-Prox (KL)"]
    assert drfa["missing"] == 0
    assert rounds * 8 * (4 * 10 + 4) < drfa["payload_MB"] * 1e6 <= rounds * 8 * (4 * 10 + 4 + 2 * 4 * 10)
