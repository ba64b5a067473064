"""``fedhop new protocol NAME``: the skeleton it writes (a protocol module, a spec, a test) runs as written."""

from __future__ import annotations

import ast
import csv
from pathlib import Path

import pytest

from fedhop.cli import main
from fedhop.cli.new import skeleton

NAME = "fh_skeleton_proto"  # a module name no other test imports


def test_the_skeleton_runs_with_simulate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "proto"
    assert main(["new", "protocol", NAME, "--out", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{NAME}.py", "spec.toml", f"test_{NAME}.py"])
    assert f'name = "{NAME}:ALGORITHM"' in (folder / "spec.toml").read_text()
    for f in (f"{NAME}.py", f"test_{NAME}.py"):
        ast.parse((folder / f).read_text())  # valid Python
    assert "fedhop.api import" in (folder / f"{NAME}.py").read_text()  # the public API only
    assert "fedhop.common" not in (folder / f"{NAME}.py").read_text()
    capsys.readouterr()
    monkeypatch.chdir(folder)  # as the user runs it: the module is imported from the working directory
    monkeypatch.delitem(__import__("sys").modules, NAME, raising=False)
    out = tmp_path / "run"
    assert main(["simulate", "spec.toml", "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    with (out / "rounds.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and 0.0 <= float(rows[-1]["accuracy"]) <= 1.0
    with (out / "links.csv").open() as f:
        assert {r["kind"] for r in csv.DictReader(f)} == {f"{NAME}.train"}


def test_existing_files_are_kept_without_force(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "p"
    assert main(["new", "protocol", "abc", "--out", str(folder)]) == 0
    (folder / "abc.py").write_text("# mine\n")
    assert main(["new", "protocol", "abc", "--out", str(folder)]) == 2
    assert "already exist" in capsys.readouterr().err and (folder / "abc.py").read_text() == "# mine\n"
    assert main(["new", "protocol", "abc", "--out", str(folder), "--force"]) == 0
    assert (folder / "abc.py").read_text() == skeleton("abc")["abc.py"]


@pytest.mark.parametrize("bad", ["My-Proto", "1abc", "a.b", "has space"])
def test_a_name_that_is_no_module_name_is_refused(bad: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["new", "protocol", bad, "--out", str(tmp_path / "x")]) == 2
    assert "must be a Python module name" in capsys.readouterr().err and not (tmp_path / "x").exists()
