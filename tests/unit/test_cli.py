"""The command line as a new user meets it: --version, --set, spec --explain, defaults in help, --out/--force,
the run folder's columns and round numbering, exit codes of bad input."""

from __future__ import annotations

import csv
import json
from importlib.metadata import version
from pathlib import Path

import pytest

from fedhop.cli import build_parser, main
from fedhop.cli.console import DEFAULT_SPEC, load_spec
from fedhop.common.algorithms.fedchs import FedCHSOptions
from fedhop.common.exit_codes import DESCRIPTIONS, ExitCode
from fedhop.common.spec import RunSpec, SpecError, TopologySpec, TransportSpec

SMALL = ["--set", "rounds=3", "--set", "topology.clients=3", "--set", "topology.edges=0",
         "--set", 'device="cpu"', "--set", "model.hidden=[8]", "--quiet"]


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedhop {version('fedhop')}"


def test_set_overrides_are_typed_by_the_model():
    spec = load_spec(None, ["rounds=5", "algorithm.options.lr=0.1", "topology.edge_graph=ring",
                            "model.hidden=[32, 16]", "data.standardize=true"])
    assert spec.rounds == 5 and isinstance(spec.rounds, int)
    assert spec.options().lr == 0.1
    assert spec.topology.edge_graph == "ring"
    assert spec.model.hidden == [32, 16]
    assert spec.data.standardize is True
    assert spec.topology.clients == RunSpec.load(DEFAULT_SPEC).topology.clients  # the rest is the file's


@pytest.mark.parametrize(("item", "needle"), [
    ("roundz=5", "unknown key 'roundz' in the spec"),
    ("topology.clientz=3", "unknown key 'clientz' in topology; known: clients, edges"),
    ("algorithm.options.lrr=0.1", "unknown key 'lrr' in algorithm.options; known: lr"),
    ("rounds", "expected KEY=VALUE"),
    ("rounds=zero", "rounds"),
    ("rounds.x=1", "rounds is a value, not a table"),
])
def test_bad_set_is_named(item, needle):
    with pytest.raises(SpecError) as e:
        load_spec(None, [item])
    assert needle in str(e.value)


def test_set_on_the_command_line_exits_2_with_the_key_named(tmp_path, capsys):
    rc = main(["simulate", "--out", str(tmp_path / "run"), "--set", "algorithm.options.nope=1", "--quiet"])
    assert rc == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "nope" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_set_applies_to_the_options_of_the_algorithm_set_beside_it():
    spec = load_spec(None, ["algorithm.name=fedchs", "algorithm.options={}", "algorithm.options.K=7"])
    assert spec.algorithm.name == "fedchs" and spec.options().K == 7


def test_explain_lists_every_field_with_its_default_and_description(capsys):
    assert main(["spec", "--explain", "fedchs"]) == 0
    text = capsys.readouterr().out
    lines = {line.split()[0]: line for line in text.splitlines() if line and not line.startswith(("RunSpec", "Set"))}
    for name in TopologySpec.model_fields:
        assert f"topology.{name}" in lines
    for name, info in TransportSpec.model_fields.items():
        line = lines[f"transport.{name}"]
        assert json.dumps(info.default) in line
        if info.description:
            assert info.description in line
    for name, info in FedCHSOptions.model_fields.items():
        line = lines[f"algorithm.options.{name}"]
        assert json.dumps(info.default) in line, line
        assert (info.description or "") in line
    assert lines["algorithm.name"].split()[2] == '"fedchs"'


def test_explain_of_an_unknown_algorithm_is_a_usage_error(capsys):
    assert main(["spec", "--explain", "nope"]) == ExitCode.USAGE
    assert "unknown algorithm 'nope'" in capsys.readouterr().err


def test_help_shows_defaults():
    text = build_parser()._subparsers._group_actions[0].choices["server"].format_help()
    assert "(default: 127.0.0.1:50051)" in text
    text = build_parser()._subparsers._group_actions[0].choices["client"].format_help()
    assert "(default: 60.0)" in text


def test_out_is_never_overwritten_without_force(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["simulate", "--out", str(out), *SMALL]) == ExitCode.USAGE
    assert "already exists and is not empty" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert main(["simulate", "--out", str(out), "--force", *SMALL]) == 0
    assert (out / "results.json").is_file() and (out / "notes.txt").read_text() == "mine"


def test_run_folder_columns_and_one_round_numbering(tmp_path):
    out = tmp_path / "run"
    assert main(["simulate", "--out", str(out), *SMALL]) == 0
    with (out / "rounds.csv").open() as f:
        rounds = list(csv.DictReader(f))
    jsonl = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    with (out / "links.csv").open() as f:
        links = list(csv.DictReader(f))
    assert [int(r["round"]) for r in rounds] == [1, 2, 3] == [r["round"] for r in jsonl]
    assert {"elapsed_s", "round_s", "cum_payload_bytes", "cum_message_bytes"} <= set(rounds[0])
    assert "payload_bytes" not in rounds[0]
    elapsed = [float(r["elapsed_s"]) for r in rounds]
    durations = [float(r["round_s"]) for r in rounds]
    assert elapsed == sorted(elapsed) and all(d > 0 for d in durations)
    assert sum(durations) == pytest.approx(elapsed[-1], abs=1e-5)
    # FedAvg trains every client in every round: links.csv uses the same rounds 1..3 as rounds.csv
    assert {int(r["round"]) for r in links} == {1, 2, 3}
    for r in rounds:
        upto = sum(int(x["payload_bytes"]) for x in links if int(x["round"]) <= int(r["round"]))
        assert int(r["cum_payload_bytes"]) == upto
    res = json.loads((out / "results.json").read_text())
    assert {r["round"] for r in res["links"]} == {1, 2, 3}


def test_missing_csv_uses_the_same_numbering(tmp_path):
    """missing.csv's rounds are rounds.csv's: a client that fails in (1-based) round 2 is logged in round 2."""
    from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
    from fedhop.common.engine.results import write_run_folder

    spec = load_spec(None, [s for s in SMALL if s != "--quiet" and s != "--set"])
    res = InProcessEngine(spec, faults=FaultPlan(lambda node, task, rnd: node == "client-1" and rnd == 1)).run()
    write_run_folder(res, tmp_path)
    with (tmp_path / "missing.csv").open() as f:
        missing = list(csv.DictReader(f))
    with (tmp_path / "links.csv").open() as f:
        replies = {(r["src"], int(r["round"])) for r in csv.DictReader(f) if r["phase"] == "reply"}
    assert [(m["node"], int(m["round"])) for m in missing] == [("client-1", 2)]
    assert ("client-1", 2) not in replies and ("client-1", 1) in replies and ("client-1", 3) in replies


def test_missing_cuda_device_is_one_line_and_its_exit_code(tmp_path, capsys):
    rc = main(["simulate", "--out", str(tmp_path / "run"), "--device", "cuda:99", *SMALL])
    assert rc == ExitCode.NO_DEVICE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cuda:99" in err
    assert not (tmp_path / "run").exists()


def test_readme_lists_every_exit_code():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for code in ExitCode:
        assert f"| {int(code)} | `{code.name}` | {DESCRIPTIONS[code]} |" in readme


def test_end_of_run_prints_links_largest_first_and_the_route(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--out", str(out), "--set", "algorithm.name=fedchs", "--set", "algorithm.options={K = 2}",
                 "--set", "topology.clients=4", "--set", "topology.edge_graph=ring", "--set", "rounds=3",
                 *SMALL[6:]]) == 0
    text = capsys.readouterr().out
    table = text.split("bytes per link")[1].split("\n\n")[0].splitlines()[3:]
    shown = [(line.split()[0], line.split()[2], int(line.split()[4].replace(",", ""))) for line in table]
    with (out / "links.csv").open() as f:
        links = list(csv.DictReader(f))
    per_link: dict[tuple[str, str], int] = {}
    for r in links:
        per_link[(r["src"], r["dst"])] = per_link.get((r["src"], r["dst"]), 0) + int(r["payload_bytes"])
    assert {(s, d): b for s, d, b in shown} == per_link
    assert [b for _, _, b in shown] == sorted(per_link.values(), reverse=True)
    with (out / "rounds.csv").open() as f:
        edges = [r["edge"] for r in csv.DictReader(f)]
    route = text.split("route: ")[1].splitlines()[1].strip()
    assert route == " -> ".join(f"{e} (r{t})" for t, e in enumerate(edges, 1))


def test_progress_counts_clients_joining_then_rounds():
    from fedhop.cli.console import Progress

    bar = Progress(rounds=5, label="launch fedavg", quiet=True, clients=6)
    assert bar.bar.total == 6 and bar.bar.n == 0
    bar.on_join("edge-0", {"client-0": 10, "client-1": 12, "client-2": 9})
    assert bar.bar.n == 3
    bar.on_join("edge-1", {"client-3": 10, "client-4": 12, "client-5": 9})
    assert bar.bar.total == 5 and bar.bar.n == 0  # everyone is in: the bar counts rounds from now on
    bar.on_round({"round": 1, "accuracy": 0.5})
    assert bar.bar.total == 5 and bar.bar.n == 1
    bar.close()
    partial = Progress(rounds=5, label="launch fedavg", quiet=True, clients=6)
    partial.on_join("edge-0", {"client-0": 10, "client-1": 12, "client-2": 9})
    partial.on_round({"round": 1})  # edge-1 never joined; the run started without it
    assert partial.bar.total == 5 and partial.bar.n == 1
    partial.close()


def test_reproduce_progress_follows_every_run_and_round(tmp_path):
    """`fedhop reproduce` draws its bar from the events of every run made under its RunOptions."""
    from fedhop.cli.console import ReproduceProgress
    from fedhop.common.engine.events import RunEvents
    from fedhop.reproduce.runner import RunOptions, run_spec, using

    events = RunEvents()
    bar = ReproduceProgress("exp", quiet=True)
    events.subscribe(bar)
    seen: list[tuple[str, object]] = []
    events.subscribe(lambda kind, data: seen.append((kind, data.get("round"))) if kind.startswith("round") or
                     kind == "run_started" else None)
    spec = load_spec(None, ["rounds=3", "topology.clients=3", "topology.edges=0", "model.hidden=[8]"])
    with using(RunOptions(events=events)):
        for i in range(2):
            run_spec(spec, tmp_path / f"run-{i}")
    assert bar.runs == 2 and bar.bar.total == 3 and bar.bar.n == 3 and bar.training
    assert seen == 2 * [("run_started", None), ("round_started", 0), ("round_ended", 0), ("round_timeline", 0),
                        ("round_started", 1), ("round_ended", 1), ("round_timeline", 1),
                        ("round_started", 2), ("round_ended", 2), ("round_timeline", 2)]
    bar.close()
