"""Runnable templates (``fedhop spec --template``, ``simulate/launch --algorithm``), ``fedhop spec --explain``'s
values, participation models and exit codes, the one-line participation and topology errors, relative paths in a
spec file, and ``--data-path`` (issue 18, "Switching algorithm is trial and error")."""

from __future__ import annotations

import json
import os
import re
import sys
import typing
from pathlib import Path

import pytest

from fedhop.cli import build_parser, main
from fedhop.cli.console import load_spec
from fedhop.cli.spec import load_run_spec
from fedhop.common import catalog
from fedhop.common.exit_codes import ExitCode, Fatal
from fedhop.common.options.participation import ParticipationModel
from fedhop.common.spec import RunSpec, SpecError
from fedhop.common.templates import CLIENTS, EDGES, TEMPLATES, template_raw, template_spec, template_toml

REPO = Path(__file__).resolve().parents[2]
BUILT_IN = sorted(n for n, a in catalog.ALGORITHMS.items() if a.module.startswith("fedhop.common.algorithms."))

# a tiny size for each template's run: 1 round, and the options that count steps cut down where the template has them
TINY_OPTIONS = {"local_steps": 2, "K": 2, "iters_per_round": 5, "edge_rounds": 1}


def test_every_built_in_algorithm_has_a_template():
    assert sorted(TEMPLATES) == BUILT_IN


def test_templates_have_the_default_runs_size():
    run = load_spec(None)
    assert (run.topology.clients, run.topology.edges) == (CLIENTS, EDGES)
    assert template_spec("fedchs").topology.edges == EDGES and template_spec("scaffold").topology.clients == CLIENTS


@pytest.mark.parametrize("algorithm", sorted(TEMPLATES))
def test_template_is_valid_and_has_a_topology_its_algorithm_accepts(algorithm, capsys):
    spec = template_spec(algorithm)
    needs = catalog.algorithm(algorithm).needs_edges
    assert (spec.topology.edges > 0) if needs else (spec.topology.edges == 0)
    assert main(["spec", "--template", algorithm]) == 0
    printed = capsys.readouterr().out
    assert printed == template_toml(algorithm)
    assert RunSpec.from_toml(printed) == spec  # the printed text is the spec (the header is TOML comments)
    # every option is written out, so the paper's settings are visible in the file
    assert set(template_raw(algorithm)["algorithm"]["options"]) >= {
        k for k, v in spec.options().model_dump().items() if v is not None}


@pytest.mark.parametrize("algorithm", sorted(TEMPLATES))
def test_template_runs_to_completion(algorithm, tmp_path, monkeypatch):
    import fedhop.common.engine.results as results_module

    # plots.png costs 10x a tiny run; the run and every other file of its folder are what this test checks
    # (the stand-in still writes a file: the run folder's writer renames what each writer wrote into place)
    monkeypatch.setattr(results_module, "plot_rounds", lambda rounds, path, **k: Path(path).write_bytes(b""))
    options = template_raw(algorithm)["algorithm"]["options"]
    tiny = [f"algorithm.options.{k}={v}" for k, v in TINY_OPTIONS.items() if k in options]
    sets = [x for s in ["rounds=1", 'device="cpu"', "eval_every=1", *tiny] for x in ("--set", s)]
    out = tmp_path / "run"
    assert main(["simulate", "--algorithm", algorithm, "--out", str(out), "--quiet", *sets]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1]
    assert results["spec"]["algorithm"]["name"] == algorithm


def test_algorithm_flag_and_a_spec_file_are_one_or_the_other(tmp_path):
    for command in ("simulate", "launch"):
        assert build_parser().parse_args([command, "--algorithm", "fedchs"]).algorithm == "fedchs"
    spec = load_run_spec(None, ["rounds=3"], "scaffold")
    assert spec.algorithm.name == "scaffold" and spec.rounds == 3 and spec.topology.edges == 0
    with pytest.raises(Fatal) as e:
        load_run_spec(str(tmp_path / "x.toml"), [], "fedavg")
    assert e.value.code == ExitCode.USAGE


def test_unknown_template_names_the_algorithms(capsys):
    assert main(["spec", "--template", "fedavgg"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "unknown algorithm 'fedavgg'" in err and "fedchs" in err and len(err.strip().splitlines()) == 1


def _explain(args: list[str], capsys) -> dict[str, str]:
    """``fedhop spec --explain ARGS``: each key's line, and ``"KEY="``: the value column of that line."""
    assert main(["spec", "--explain", *args]) == 0
    text = capsys.readouterr().out
    col = next(line for line in text.splitlines() if line.startswith("key ")).index("value")
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    values = {f"{k}=": line[col:].split("  —  ")[0] for k, line in lines.items() if len(line) > col}
    return lines | values | {"": text}


def test_explain_shows_the_default_runs_values(capsys):
    lines = _explain([], capsys)
    run = load_spec(None)
    for key in ("clients", "edges"):
        value = getattr(run.topology, key)
        assert lines[f"topology.{key}="].split()[0] == str(value), lines[f"topology.{key}"]
    assert "(if omitted: 10)" in lines["topology.clients"] and "(if omitted: 0)" in lines["topology.edges"]
    # --explain ALGORITHM explains what `--algorithm ALGORITHM` runs
    lines = _explain(["scaffold"], capsys)
    assert lines["topology.edges="] == "0"
    assert lines["algorithm.options.lr="].split()[0] == str(template_spec("scaffold").options().lr)


def test_explain_lists_every_participation_model_and_field(capsys):
    text = _explain(["focus"], capsys)[""]
    section = text[text.index("algorithm.options.participation: one of these models"):]
    members = typing.get_args(typing.get_args(ParticipationModel)[0])
    assert len(members) == 7
    for model in members:
        kind = model.model_fields["kind"].default
        assert f'kind = "{kind}"' in section
        for field in model.model_fields:
            if field != "kind":
                assert re.search(rf"^\s+participation\.{field}\s", section[section.index(f'kind = "{kind}"'):],
                                 re.M), (kind, field)
    assert "a fraction f in (0, 1]" in section


def test_explain_quotes_the_exit_codes_of_exit_codes_py(capsys):
    lines = _explain([], capsys)
    assert f"code {ExitCode.LATE_JOIN_REFUSED:d})" in lines["transport.late_join"]
    assert f"exit code {ExitCode.PARENT_LOST:d})" in lines["transport.reconnect_s"]
    quoted = {int(n) for n in re.findall(r"code (\d+)", lines[""])}
    assert quoted == {ExitCode.LATE_JOIN_REFUSED, ExitCode.PARENT_LOST}


@pytest.mark.parametrize(("value", "needles"), [
    ('{kind="bernouli", p=0.5}', ["participation.kind: 'bernouli'", "'bernoulli'", "'markov'", "'trace'"]),
    ('{kind="bernoulli", pp=0.5}', ["participation.pp: kind 'bernoulli' has no field 'pp'", "p, groups"]),
    ("{p=0.5}", ["participation: a table needs kind = one of", "'uniform'"]),
    ('{kind="uniform", m=0}', ["participation.m (kind 'uniform')", "greater than or equal to 1"]),
])
def test_a_participation_mistake_is_one_line_naming_the_field_and_the_allowed_values(value, needles, capsys):
    assert main(["spec", "--set", f"algorithm.options.participation={value}"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    for internal in ("tagged-union", "constrained-float", "function-after", "Input tag"):
        assert internal not in err


def test_switching_to_a_flat_algorithm_says_what_to_set(capsys):
    assert main(["spec", "--set", "algorithm.name=fedavg"]) == 0  # fedavg runs flat or through edges
    capsys.readouterr()
    assert main(["spec", "--set", "algorithm.name=scaffold"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--set topology.edges=0" in err and "--algorithm scaffold" in err
    assert main(["spec", "--set", "algorithm.name=scaffold", "--set", "topology.edges=0"]) == 0
    with pytest.raises(SpecError, match=r"needs edge servers.*--set topology.edges=2.*--algorithm fedchs"):
        load_spec(None, ["algorithm.name=fedchs", "topology.edges=0"])


def test_relative_paths_are_the_spec_files_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # restored afterwards
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "avail.csv").write_text("1,0,1\n0,1,1\n")
    module = "tpl_relative_metric_mod"
    (folder / f"{module}.py").write_text("def hits(outputs, y):\n    return 1.0\n")
    (folder / "spec.toml").write_text(
        f'metrics = ["{module}:hits"]\nrounds = 2\n[algorithm]\nname = "focus"\n'
        '[algorithm.options]\nparticipation = {kind = "trace", path = "avail.csv"}\n'
        '[topology]\nclients = 3\n[data]\ndataset = "mnist"\npath = "../mnist"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for spec in (load_spec("../specs/spec.toml"), RunSpec.load("../specs/spec.toml")):
        assert spec.options().participation.path == folder / "avail.csv"
        assert spec.data.path == tmp_path / "mnist"
    assert str(folder) in sys.path and str(folder) in os.environ["PYTHONPATH"].split(os.pathsep)  # its module
    # a path on the command line is the working directory's
    assert load_spec("../specs/spec.toml", ['data.path="here"']).data.path == elsewhere / "here"
    # the shipped example runs from anywhere, not only from its folder
    assert load_spec(str(REPO / "examples/trace/spec.toml")).options().participation.path.is_file()


def test_data_path_satisfies_a_file_backed_datasets_path(tmp_path, monkeypatch):
    spec_file = tmp_path / "mnist.toml"
    spec_file.write_text('[data]\ndataset = "mnist"\n')
    with pytest.raises(SpecError, match="data.path"):
        load_run_spec(str(spec_file), [])
    monkeypatch.chdir(tmp_path)
    spec = load_run_spec(str(spec_file), [], data_path="data")
    assert spec.data.path == tmp_path / "data"
    assert build_parser().parse_args(["launch", "--data-path", "d"]).data_path == "d"
