"""A run folder describes its run completely: spec.toml is the resolved spec (what ``fedhop spec`` prints),
results.json has the run's provenance, ``fedhop rerun`` / ``--spec-from`` run it again bit for bit, and the
built-in default run's name follows what ``--set`` changed."""

from __future__ import annotations

import csv
import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
import torch

from fedhop.cli import main
from fedhop.cli.console import load_spec
from fedhop.common import catalog
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.exit_codes import ExitCode
from fedhop.common.provenance import git_commit, resolved_spec, source_digest
from fedhop.common.spec import RunSpec, SpecError

SMALL = {"name": "write-json", "rounds": 2, "seed": 1, "algorithm": {"name": "fedavg", "options": {"local_steps": 1}},
         "topology": {"clients": 3, "edges": 0}, "model": {"name": "mlp", "hidden": [4]}}
TINY = ["--set", "rounds=2", "--set", "topology.clients=3", "--set", "topology.edges=0", "--set", 'device="cpu"',
        "--set", "model.hidden=[8]", "--set", "algorithm.options.local_steps=2", "--quiet"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("records") / "first"
    assert main(["simulate", "--out", str(out), *TINY]) == 0
    return out


def test_spec_toml_is_what_fedhop_spec_prints(first_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["spec", *(a for a in TINY if a != "--quiet")]) == 0
    printed = capsys.readouterr().out
    written = (first_run / "spec.toml").read_text()
    assert tomllib.loads(written) == tomllib.loads(printed)  # (comments aside)
    options = RunSpec.from_toml(written).algorithm.options
    assert options["lr"] == 0.1 and options["local_steps"] == 2 and "participation" in options  # defaults in


def test_results_json_has_the_provenance(first_run: Path) -> None:
    results = json.loads((first_run / "results.json").read_text())
    prov = results["provenance"]
    for key in ("fedhop", "git_commit", "source_digest", "user_code_digest", "python", "packages", "cuda_devices",
                "host", "command", "cwd", "started", "ended"):
        assert key in prov, key
    assert set(prov["packages"]) >= {"torch", "grpc", "protobuf"} and prov["packages"]["torch"] == torch.__version__
    assert prov["source_digest"] == source_digest() and len(prov["source_digest"]) == 64
    assert prov["started"] <= prov["ended"] and prov["started"].endswith("Z")
    assert prov["resumed_at_round"] is None and prov["user_code_digest"] == ""
    assert results["spec"]["name"] == "default-digits-fedavg-flat-3clients"  # --set renamed the default run


def test_results_json_is_the_results_and_links_csv_its_rows(first_run: Path) -> None:
    """results.json is written as it goes (its link rows one per line, no copy of them in memory) and reads back
    as the result's own JSON; links.csv has the same rows, rounds numbered from 1 in both."""
    results = json.loads((first_run / "results.json").read_text())
    assert list(results) == ["spec", "engine", "wall_s", "interrupted", "rounds", "links", "missing", "totals",
                             "provenance"]
    assert RunSpec.model_validate(results["spec"]).name == results["spec"]["name"]
    with (first_run / "links.csv").open() as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(results["links"]) > 0
    for r, c in zip(results["links"], csv_rows, strict=True):
        assert (r["src"], r["dst"], r["kind"], r["phase"], str(r["round"]), str(r["payload_bytes"])) == (
            c["src"], c["dst"], c["kind"], c["phase"], c["round"], c["payload_bytes"])
    assert {r["round"] for r in results["links"]} == {1, 2}  # numbered from 1 (in memory: 0 and 1)
    assert results["totals"]["payload_bytes"] == sum(r["payload_bytes"] for r in results["links"])
    assert len(results["rounds"]) == 2
    text = (first_run / "results.json").read_text()
    assert text.count("\n  {\"src\"") == len(results["links"])  # a row per line


def test_a_result_writes_the_json_of_to_json(tmp_path: Path) -> None:
    result = InProcessEngine(RunSpec.model_validate(json.loads(json.dumps(SMALL)))).run()
    for r in (result, dataclasses.replace(result, links=[])):
        r.write_json(tmp_path / "r.json", provenance={"host": "x", "list": [1, 2]})
        got = json.loads((tmp_path / "r.json").read_text())
        assert got == {**json.loads(json.dumps(r.to_json())), "provenance": {"host": "x", "list": [1, 2]}}


def test_rerun_is_bit_identical(first_run: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    assert main(["rerun", str(first_run), "--out", str(again), "--quiet"]) == 0
    a, b = torch.load(first_run / "model.pt"), torch.load(again / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (again / "spec.toml").read_text() == (first_run / "spec.toml").read_text()
    rows = [json.loads(line) for line in (first_run / "rounds.jsonl").read_text().splitlines()]
    rows2 = [json.loads(line) for line in (again / "rounds.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == [r["loss"] for r in rows2]


def test_spec_from_takes_set_and_refuses_a_second_spec(first_run: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "x.toml", "--spec-from", str(first_run), "--out", str(tmp_path / "a")]) == ExitCode.USAGE
    assert "not both" in capsys.readouterr().err
    assert main(["rerun", str(tmp_path / "nowhere")]) == ExitCode.USAGE
    assert "not a run folder" in capsys.readouterr().err
    spec = load_spec(str(first_run / "spec.toml"), ["rounds=1"])
    assert spec.rounds == 1 and spec.name == "default-digits-fedavg-flat-3clients"  # a named spec keeps its name


@pytest.mark.parametrize(("sets", "name"), [
    ([], "default-digits-fedavg"),
    (["rounds=3", "algorithm.options.lr=0.2"], "default-digits-fedavg"),
    (["algorithm.name=fedchs"], "default-digits-fedchs"),
    (["algorithm.name=fedadam", "topology.edges=0"], "default-digits-fedadam-flat"),
    (["topology.edges=3", "topology.clients=9", "topology.edge_graph=ring"],
     "default-digits-fedavg-3edges-9clients-ring"),
    (["name=mine", "algorithm.name=fedchs"], "mine"),
])
def test_the_default_runs_name_follows_set(sets: list[str], name: str) -> None:
    assert load_spec(None, sets).name == name


def test_a_users_spec_keeps_its_name(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('name = "exp1"\n[topology]\nclients = 4\n')
    assert load_spec(str(f), ["algorithm.name=fedadam"]).name == "exp1"


def _valid(name: str) -> RunSpec | None:
    for clients, edges in ((6, 2), (6, 0), (1, 0)):
        try:
            return RunSpec.parse({"algorithm": {"name": name}, "topology": {"clients": clients, "edges": edges}})
        except SpecError:
            continue
    return None


@pytest.mark.parametrize("name", sorted(catalog.ALGORITHMS))
def test_the_resolved_spec_reads_back_as_the_same_run(name: str) -> None:
    spec = _valid(name)
    if spec is None:
        pytest.skip(f"{name} needs a special topology")
    full = resolved_spec(spec)
    assert set(full.algorithm.options) == set(type(spec.options()).model_fields) - {
        k for k, v in spec.options() if v is None}
    back = RunSpec.from_toml(full.to_toml())
    assert back == full and back.options() == spec.options()


def test_git_commit_is_read_from_a_worktree_and_packed_refs(tmp_path: Path) -> None:
    repo = tmp_path / "repo" / ".git"
    (repo / "worktrees" / "wt").mkdir(parents=True)
    (repo / "packed-refs").write_text("# pack-refs\n" + "a" * 40 + " refs/heads/main\n")
    (repo / "HEAD").write_text("ref: refs/heads/main\n")
    assert git_commit(repo.parent) == "a" * 40
    wt = tmp_path / "wt"
    wt.mkdir()
    (wt / ".git").write_text(f"gitdir: {repo / 'worktrees' / 'wt'}\n")
    (repo / "worktrees" / "wt" / "HEAD").write_text("ref: refs/heads/topic\n")
    (repo / "worktrees" / "wt" / "commondir").write_text("../..\n")
    (repo / "refs" / "heads").mkdir(parents=True)
    (repo / "refs" / "heads" / "topic").write_text("b" * 40 + "\n")
    assert git_commit(wt) == "b" * 40
    assert git_commit(tmp_path) is None


def test_resume_of_a_finished_run_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedhop.common.engine.inprocess import InProcessEngine
    from fedhop.common.engine.results import write_run_folder
    from fedhop.server.main import RunFinished, load_resume

    spec = load_spec(None, [a for a in TINY if a.startswith(("rounds", "topology", "device", "model", "algo"))])
    run = tmp_path / "run"
    result = InProcessEngine(spec, device="cpu").run(checkpoints=run / "checkpoints" / "ps")
    write_run_folder(result, run)
    with pytest.raises(RunFinished) as e:
        load_resume(run)
    assert e.value.code == ExitCode.ALREADY_FINISHED == 16
    assert main(["launch", "--resume", str(run), "--quiet", "--http", "off"]) == ExitCode.ALREADY_FINISHED
    err = capsys.readouterr().err
    assert f"is finished: all {spec.rounds} rounds are done" in err and "round 3" not in err
    (run / "results.json").unlink()  # the PS died after its last checkpoint: resuming writes the results
    assert load_resume(run).finished
