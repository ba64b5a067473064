"""``fedhop reproduce focus-fig4 --quick``: FOCUS exact under full / uniform / arbitrary participation,
FedAvg and FedAU stall, SCAFFOLD exact but behind at equal communication (about 30 s of CPU)."""

import json

from fedhop.reproduce import run_experiment


def test_focus_fig4_quick(tmp_path):
    outcome = run_experiment("focus-fig4", tmp_path, quick=True)
    assert outcome.ok, {k: v for k, v in outcome.checks.items() if not v}
    assert len(outcome.checks) >= 14
    for f in ("results.json", "rel_err.csv", "table.md", *(f"compare-{p}/{x}" for p in ("full", "uniform", "arbitrary")
                                                          for x in ("compare.png", "table.md"))):
        assert (tmp_path / f).stat().st_size > 0, f
    # the figure's table (fedhop compare over the runs' folders): FOCUS reaches 1e-12 in the full panel, FedAvg never
    table = (tmp_path / "compare-full" / "table.md").read_text()
    assert "| FOCUS | focus |" in table and "| FedAvg | fedavg |" in table and "not reached" in table
    res = json.loads((tmp_path / "results.json").read_text())
    runs = {(r["panel"], r["alg"]): r for r in res["runs"]}
    # full participation: FOCUS hits 1e-12 at round ~53 (spec 7.2: 53), as the notebook
    first = next(i + 1 for i, e in enumerate(runs[("full", "focus")]["rel_err"]) if e < 1e-12)
    assert 50 <= first <= 56
    # payload: every participant pulls d and pushes d float64 (d = 50); SCAFFOLD twice that
    for (panel, alg), r in runs.items():
        per = 2 * 50 * 8 * (2 if alg == "scaffold" else 1)
        assert all(b == per * k for b, k in zip(r["payload_bytes"], r["participants"], strict=True)), (panel, alg)
        if panel != "full":
            assert set(r["participants"]) == {4}
