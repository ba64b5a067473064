"""The bring-your-own examples (examples/), each run from its own folder as the README says, at a small size:
least squares with FOCUS vs FedAvg, a CNN on .npy files (also over real processes with ``fedhop launch``, equal
to the in-process run bit for bit), and a participation trace."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhop.cli import main
from fedhop.forkstart import warm

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def fedhop(args: list[str], cwd: Path) -> None:
    """``fedhop ARGS --quiet`` run from the example's folder as the README says, through the command line's
    ``main`` in this process (no new interpreter: a torch import saved per call): ``cwd`` is the working
    directory and first on sys.path, as ``python -m fedhop`` run there has it (the example's own module
    imports from it; a launch's children, forked, start there too). Afterwards the folder's modules are
    forgotten, the directory and sys.path restored."""
    warm()  # the fork server starts (if not yet) with this process's own sys.path, not the example's
    before = set(sys.modules)
    here = os.getcwd()
    sys.path.insert(0, str(cwd))
    os.chdir(cwd)
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main([*args, "--quiet"])
    finally:
        os.chdir(here)
        sys.path.remove(str(cwd))
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(cwd)):
                del sys.modules[name]
    assert code == 0, f"fedhop {' '.join(args)} failed ({code}):\n{err.getvalue()[-3000:]}"


def rounds(out: Path) -> list[dict[str, str]]:
    with (out / "rounds.csv").open() as f:
        return list(csv.DictReader(f))


def copy_example(name: str, tmp_path: Path, edit: dict[str, str] | None = None) -> Path:
    folder = tmp_path / name
    shutil.copytree(EXAMPLES / name, folder, ignore=shutil.ignore_patterns("data", "__pycache__"))
    for file, (old, new) in (edit or {}).items():
        text = (folder / file).read_text()
        assert old in text
        (folder / file).write_text(text.replace(old, new))
    return folder


def test_least_squares_focus_reaches_the_optimum_fedavg_does_not(tmp_path: Path) -> None:
    folder = copy_example("least_squares", tmp_path, {"focus.toml": ("rounds = 300", "rounds = 120"),
                                                      "fedavg.toml": ("rounds = 300", "rounds = 120")})
    for alg in ("focus", "fedavg"):
        fedhop(["simulate", f"{alg}.toml", "--out", str(tmp_path / alg)], folder)
    # the global optimum, computed here from the same arrays with numpy (the test set is every client's rows)
    sys.path.insert(0, str(folder))
    try:
        import lsq

        from fedhop.common.data.source import DataRequest

        a, b = lsq.source(DataRequest("test", None, 8, 0, None, {"dim": 10, "rows": 20, "spread": 1.0}))
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("lsq", None)
    x = np.linalg.lstsq(a, b, rcond=None)[0]
    f_star = 0.5 * float(np.mean((a @ x - b) ** 2))
    focus, fedavg = rounds(tmp_path / "focus")[-1], rounds(tmp_path / "fedavg")[-1]
    assert float(focus["loss"]) == pytest.approx(f_star, rel=1e-9)
    assert float(fedavg["loss"]) > f_star * 1.01  # client drift under heterogeneity and partial participation
    assert float(focus["max_residual"]) == pytest.approx(float(np.abs(a @ x - b).max()), rel=1e-6)
    assert json.loads((tmp_path / "focus" / "results.json").read_text())["spec"]["model"]["dtype"] == "float64"


def test_npy_cnn_launch_equals_simulate(tmp_path: Path) -> None:
    folder = copy_example("npy_cnn", tmp_path)
    subprocess.run([sys.executable, "images.py", "prepare", "data"], cwd=folder, check=True, timeout=120)
    assert sorted(p.name for p in (folder / "data").iterdir())[:2] == ["client_0_x.npy", "client_0_y.npy"]
    fedhop(["simulate", "spec.toml", "--out", str(tmp_path / "sim")], folder)
    fedhop(["launch", "spec.toml", "--out", str(tmp_path / "net")], folder)
    sim, net = (torch.load(tmp_path / d / "model.pt") for d in ("sim", "net"))
    assert list(sim) == list(net) and all(torch.equal(sim[k], net[k]) for k in sim)
    last = rounds(tmp_path / "net")[-1]
    assert float(last["accuracy"]) > 0.8 and float(last["macro_f1"]) > 0.8  # 4 balanced classes: chance is 0.25
    assert rounds(tmp_path / "sim")[-1]["macro_f1"] == last["macro_f1"]


def test_trace_is_replayed(tmp_path: Path) -> None:
    folder = copy_example("trace", tmp_path)
    fedhop(["simulate", "spec.toml", "--out", str(tmp_path / "run")], folder)
    table = np.loadtxt(folder / "availability.csv", delimiter=",", comments="#", dtype=int)
    got = [int(r["participants"]) for r in rounds(tmp_path / "run")]
    assert got == table.sum(axis=1).tolist()[:len(got)] and len(got) == 24
