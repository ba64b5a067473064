"""``fedhop check`` and :mod:`fedhop.testing` (issue 16, section 4): a small FedAvg spec passes every check over
real processes (the engines agree bit for bit, the bytes match the declared formula, a PS crash resumes to the
same model, a killed client is named missing while the run finishes); a planted divergence and a wrong declared
formula fail with a row that says so; a bad spec ends with the usage code."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fedhop.check import formula_verdict, run_oracle
from fedhop.cli import main
from fedhop.common.engine.api import ALGORITHMS, get_algorithm
from fedhop.common.exit_codes import ExitCode
from fedhop.common.spec import RunSpec
from fedhop.testing import ProtocolCheckFailed, assert_holds, check_engines
from tests.integration.netutil import small_spec


def fedavg_spec(rounds: int = 3, **kw: Any) -> RunSpec:
    """The check's small run: FedAvg, 2 clients, an MLP with 16 hidden units, digits."""
    return small_spec("fedavg", clients=2, rounds=rounds, **kw)


def fedhop(*args: str) -> subprocess.CompletedProcess[str]:
    """``fedhop ARGS`` through the command line's ``main`` in this process: its exit code (a usage error's
    SystemExit too) and what it printed. The check starts the processes it needs itself (the networked run's
    children, the crash and fault launches); run here, it saves a new interpreter and fork server (two torch
    imports). An exception out of ``main`` fails the test, as a traceback of the command would.

    What the command puts on this process's ``PYTHONPATH`` and ``sys.path`` (the spec's folder, for user code:
    ``cli/spec_fields._importable``) is taken back afterwards: left there, it made the session's fork server
    (started before it) differ from this process's environment, and every later test of the worker that asserts a
    forked child got a new interpreter instead (tests/integration/test_forkstart.py, seen on 2026-11-26)."""
    out, err = io.StringIO(), io.StringIO()
    path, pythonpath = list(sys.path), os.environ.get("PYTHONPATH")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            sys.path[:] = path
            if pythonpath is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = pythonpath
    return subprocess.CompletedProcess(["fedhop", *args], code, out.getvalue(), err.getvalue())


def fedhop_check(spec_file: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = fedhop("check", str(spec_file), "--out", str(out), "--quiet", *args)
    report = json.loads((out / "check.json").read_text()) if (out / "check.json").is_file() else {}
    return proc, report


def test_fedhop_check_passes_every_check_on_fedavg(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(fedavg_spec().to_toml())
    proc, report = fedhop_check(spec_file, tmp_path / "out", "--crash-round", "2", "--kill-client", "client-1@1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {v["check"]: v for v in report["verdicts"]}
    assert list(rows) == ["model", "payload", "formula", "crash", "fault"]
    assert all(v["verdict"] == "ok" for v in rows.values()), proc.stdout
    assert "as declared" in rows["formula"]["detail"]
    assert "killed after round 2" in rows["crash"]["detail"]
    assert "client-1 killed after round 1" in rows["fault"]["detail"]
    for row in ("model", "payload", "formula", "crash", "fault"):  # the table printed on stdout
        assert any(line.split()[:2] == [row, "ok"] for line in proc.stdout.splitlines()), proc.stdout


def test_a_planted_divergence_fails_the_model_row(tmp_path: Path) -> None:
    """A loss that reads the process id trains differently in the checker's process than in a client's."""
    raw = fedavg_spec(rounds=2).model_dump(mode="json")
    raw["model"]["loss"] = "tests.integration.planted:pid_loss"
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(RunSpec.parse(raw).to_toml())
    proc, report = fedhop_check(spec_file, tmp_path / "out", "--skip", "crash,fault")
    assert proc.returncode == int(ExitCode.FAILED), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    rows = {v["check"]: v for v in report["verdicts"]}
    assert rows["model"]["verdict"] == "FAIL" and "tensors differ" in rows["model"]["detail"], rows
    assert rows["crash"]["verdict"] == rows["fault"]["verdict"] == "skipped"
    assert "FAILED" in proc.stdout


def test_a_wrong_declared_formula_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = fedavg_spec(rounds=2)
    oracle = run_oracle(spec)
    assert formula_verdict(spec, oracle).ok is True
    right = get_algorithm("fedavg").payload_per_round
    assert right is not None

    def doubled(spec, topo, model_bytes):  # the model counted twice on the way up
        return {(s, d, k): n * (2 if d == "ps" else 1) for (s, d, k), n in right(spec, topo, model_bytes).items()}

    monkeypatch.setitem(ALGORITHMS, "fedavg", dataclasses.replace(ALGORITHMS["fedavg"], payload_per_round=doubled))
    v = formula_verdict(spec, oracle)
    assert v.ok is False
    assert "round 1" in v.detail and "client-0->ps local.train" in v.detail and "vs declared" in v.detail
    # outside what the formula covers (drawn participation): skipped, saying why, not failed
    monkeypatch.setitem(ALGORITHMS, "fedavg", dataclasses.replace(ALGORITHMS["fedavg"], payload_per_round=right))
    sampled = small_spec("fedavg", clients=3, rounds=1, options={"participation": 0.5})
    assert formula_verdict(sampled, run_oracle(sampled)).ok is None


def test_a_bad_spec_is_a_usage_error(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(fedavg_spec().to_toml().replace('name = "fedavg"', 'name = "fedavgg"'))
    proc = fedhop("check", str(spec_file), "--out", str(tmp_path / "o"))
    assert proc.returncode == int(ExitCode.USAGE), proc.stderr
    assert "fedavgg" in proc.stderr and "Traceback" not in proc.stderr
    good = tmp_path / "good.toml"
    good.write_text(fedavg_spec().to_toml())
    bad_kill = fedhop("check", str(good), "--out", str(tmp_path / "o2"), "--kill-client", "client-1")
    assert bad_kill.returncode == int(ExitCode.USAGE) and "ID@ROUND" in bad_kill.stderr, bad_kill.stderr
    bad_skip = fedhop("check", str(good), "--out", str(tmp_path / "o3"), "--skip", "crash,model")
    assert bad_skip.returncode == int(ExitCode.USAGE) and "cannot skip ['model']" in bad_skip.stderr, bad_skip.stderr


# a few representative built-ins, equivalence part only (test_network_equivalence.py covers every algorithm)
BUILTINS = {
    "hierfavg": dict(algorithm="hierfavg", clients=4, edges=2, rounds=2, options={"edge_rounds": 2}),
    "fedchs": dict(algorithm="fedchs", clients=3, edges=3, edge_graph="ring", rounds=2, options={"K": 2}),
    "fgdro-kl-adam": dict(algorithm="fgdro-kl-adam", clients=2, rounds=2, options={"local_steps": 2}),
    "focus": dict(algorithm="focus", clients=3, rounds=2, options={"participation": {"kind": "bernoulli",
                                                                                      "p": [0.9, 0.5, 0.5]}}),
}


@pytest.mark.parametrize("case", list(BUILTINS))
def test_builtins_pass_the_equivalence_checks(case: str, tmp_path: Path) -> None:
    report = check_engines(small_spec(**BUILTINS[case]), tmp_path)
    assert_holds(report)
    assert report.verdict("model").ok and report.verdict("payload").ok
    if case in ("hierfavg", "fgdro-kl-adam"):  # they declare their formulas (2d per average; 3d + 1)
        assert report.verdict("formula").ok is True, report.table()


def test_assert_holds_fails_with_the_table() -> None:
    from fedhop.check import CheckReport, Verdict

    bad = CheckReport("s", "fedavg", (Verdict("model", True, "bit-identical"), Verdict("payload", False, "x differ")))
    with pytest.raises(ProtocolCheckFailed, match=r"payload\s+FAIL\s+x differ"):
        assert_holds(bad)
    assert_holds(CheckReport("s", "fedavg", (Verdict("crash", None, "skipped"),)))


def test_the_fault_check_kills_a_client_the_protocol_still_needs(tmp_path: Path) -> None:
    """A client the protocol never asks again after the kill (here: a replayed trace leaves client-1 out of
    round 2) cannot be missed: the row is skipped, saying so, and the default victim is one still asked."""
    import numpy as np

    from fedhop.check import KillClient, default_victim, fault_verdict

    table = tmp_path / "trace.npy"
    np.save(table, np.array([[1, 1], [1, 0]], dtype=np.int8))
    spec = fedavg_spec(rounds=2, options={"participation": {"kind": "trace", "path": str(table)}})
    oracle = run_oracle(spec)
    v = fault_verdict(spec, tmp_path / "fault", KillClient("client-1", 1), oracle=oracle)
    assert v.ok is None and "never asks client-1" in v.detail, v
    assert default_victim(spec, oracle) == KillClient("client-0", 1)
    assert default_victim(fedavg_spec(), run_oracle(fedavg_spec(rounds=2))) == KillClient("client-1", 1)
