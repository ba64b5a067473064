"""``fedhop compare`` on two small real runs: the table agrees with the runs' own files, read independently here,
and the figure is a PNG."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fedhop.cli import main

SPECS = {
    # server + clients only: every byte is client<->PS
    "flat": ["--set", "algorithm.name=fedavg", "--set", "topology.edges=0", "--set", "topology.clients=3"],
    # Fed-CHS: client<->edge training, edge<->edge hand-offs and describes, edge<->PS control and collection
    "walk": ["--set", "algorithm.name=fedchs", "--set", "topology.edges=2", "--set", "topology.clients=4",
             "--set", "topology.edge_graph=ring", "--set", "algorithm.options={K = 4}"],
}
COMMON = ["--set", "rounds=4", "--set", "device=\"cpu\"", "--set", "model.hidden=[16]", "--quiet"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    spec = root / "base.toml"
    spec.write_text('name = "cmp"\n[algorithm]\nname = "fedavg"\n[algorithm.options]\nlr = 0.2\n')
    out = {}
    for name, sets in SPECS.items():
        out[name] = root / name
        assert main(["simulate", str(spec), "--out", str(out[name]), *sets, *COMMON]) == 0
    return out


def _class(src: str, dst: str) -> str:
    kinds = {n.split("-")[0] for n in (src, dst)}
    return {frozenset({"client", "edge"}): "client_edge", frozenset({"edge"}): "edge_edge",
            frozenset({"edge", "ps"}): "edge_ps", frozenset({"client", "ps"}): "client_ps"}[frozenset(kinds)]


def _expected(run: Path, target: float) -> dict[str, object]:
    """What the table must say, from the run's links.csv and rounds.csv (not through fedhop.compare)."""
    with (run / "links.csv").open() as f:
        links = list(csv.DictReader(f))
    with (run / "rounds.csv").open() as f:
        rounds = list(csv.DictReader(f))
    by_class = {"client_edge": 0, "edge_edge": 0, "edge_ps": 0, "client_ps": 0}
    for r in links:
        by_class[_class(r["src"], r["dst"])] += int(r["payload_bytes"])
    accs = [r for r in rounds if r["accuracy"] != ""]
    hit = next((r for r in accs if float(r["accuracy"]) >= target), None)
    return {"final_accuracy": float(accs[-1]["accuracy"]), "by_class": by_class,
            "total": sum(int(r["payload_bytes"]) for r in links),
            "round": int(hit["round"]) if hit else None,
            "bytes": int(hit["cum_payload_bytes"]) if hit else None,
            "wall": float(hit["elapsed_s"]) if hit else None}


def _table(out: Path) -> dict[str, dict[str, str]]:
    with (out / "table.csv").open() as f:
        return {r["run"]: r for r in csv.DictReader(f)}


def test_table_matches_the_runs_files_and_the_figure_is_a_png(runs, tmp_path):
    res = {k: json.loads((v / "results.json").read_text()) for k, v in runs.items()}
    target = min(res[k]["rounds"][-1]["accuracy"] for k in runs) * 0.95
    out = tmp_path / "cmp"
    assert main(["compare", str(runs["flat"]), str(runs["walk"]), "--out", str(out),
                 "--target-accuracy", str(target)]) == 0
    table = _table(out)
    assert set(table) == {"flat", "walk"}
    for name, run in runs.items():
        want, got = _expected(run, target), table[name]
        assert float(got["final_accuracy"]) == pytest.approx(want["final_accuracy"], abs=1e-12)
        assert int(got["round_to_target"]) == want["round"]
        assert int(got["payload_bytes_to_target"]) == want["bytes"]
        assert float(got["wall_s_to_target"]) == pytest.approx(want["wall"], abs=1e-9)
        assert int(got["payload_bytes_total"]) == want["total"]
        for cls, b in want["by_class"].items():
            assert int(got[f"payload_bytes_{cls}"]) == b, (name, cls)
    # the classes the two topologies must (not) use
    assert int(table["flat"]["payload_bytes_client_ps"]) > 0
    assert int(table["flat"]["payload_bytes_client_edge"]) == int(table["flat"]["payload_bytes_edge_edge"]) == 0
    assert int(table["walk"]["payload_bytes_client_ps"]) == 0
    assert int(table["walk"]["payload_bytes_edge_edge"]) > 0 and int(table["walk"]["payload_bytes_client_edge"]) > 0
    md = (out / "table.md").read_text()
    assert sum(line.startswith("| ") for line in md.splitlines()) == 3
    assert "| flat | fedavg |" in md and "| walk | fedchs |" in md
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_unreached_target_and_default_target(runs, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", str(runs["flat"]), str(runs["walk"]), "--out", str(out),
                 "--target-accuracy", "1.0"]) == 0
    table = _table(out)
    assert all(r["round_to_target"] == "" and r["payload_bytes_to_target"] == "" for r in table.values())
    assert "not reached" in (out / "table.md").read_text()
    # default target: the lowest final accuracy, which every run reaches
    assert main(["compare", str(runs["flat"]), str(runs["walk"]), "--out", str(out)]) == 0
    assert all(r["round_to_target"] != "" for r in _table(out).values())


def test_not_a_run_folder_is_a_usage_error(tmp_path, capsys):
    assert main(["compare", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "no results.json" in capsys.readouterr().err


def test_another_metric_is_reached_at_or_below_its_target(runs, tmp_path):
    """``--metric loss``: the first evaluated round whose loss is <= the target, read here from rounds.csv."""
    with (runs["flat"] / "rounds.csv").open() as f:
        losses = [(int(r["round"]), float(r["loss"])) for r in csv.DictReader(f) if r["loss"] != ""]
    target = losses[1][1] * 1.0000001  # reached at round 2 at the latest (round 1 too, if its loss is as low)
    want = next(t for t, loss in losses if loss <= target)
    out = tmp_path / "loss"
    assert main(["compare", str(runs["flat"]), str(runs["walk"]), "--out", str(out), "--metric", "loss",
                 "--target", str(target), "--log-y"]) == 0
    row = _table(out)["flat"]
    assert int(row["round_to_target"]) == want
    assert float(row["final_loss"]) == pytest.approx(losses[-1][1], abs=1e-12)
    assert "Target loss" in (out / "table.md").read_text() and "at or below" in (out / "table.md").read_text()
    # --goal max turns it around: round 1's loss is already >= a target below every loss
    assert main(["compare", str(runs["flat"]), "--out", str(tmp_path / "max"), "--metric", "loss", "--goal", "max",
                 "--target", str(min(v for _, v in losses) / 2)]) == 0
    assert int(_table(tmp_path / "max")["flat"]["round_to_target"]) == losses[0][0]
    # a metric no run reports: a usage error naming it
    assert main(["compare", str(runs["flat"]), "--out", str(tmp_path / "none"), "--metric", "f1"]) == 2


def test_timeline_option_draws_time_per_round_by_phase(runs, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", str(runs["flat"]), str(runs["walk"]), "--out", str(out), "--timeline"]) == 0
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", str(runs["flat"]), "--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "timeline.png").exists()
    # the phases summed per round, as drawn, from each run's own timeline.csv
    from fedhop.common.timeline import PHASES, per_round, read_csv

    walk = per_round(read_csv(runs["walk"] / "timeline.csv"), first=1)
    assert sorted(walk) == [1, 2, 3, 4] and all(set(v) == set(PHASES) for v in walk.values())
    assert all(v["compute"] > 0 and v["transfer"] > 0 for v in walk.values())


def test_timeline_of_a_run_without_timeline_csv_says_so(runs, tmp_path):
    from fedhop.compare import plot_timeline

    old = tmp_path / "old"
    old.mkdir()
    lacking = plot_timeline([runs["flat"], old], ["flat", "old"], tmp_path / "t.png")
    assert lacking == ["old"] and (tmp_path / "t.png").is_file()
