"""A run folder that fills up or turns read-only mid-run (root: a tmpfs of the test's own, remounted
read-only between two rounds with the PS's gate). Training goes on; the checkpoints written before are the
model; the PS ends with the run-folder exit code and one message saying what was saved and where."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

from fedhop.common.engine.checkpoint import CheckpointStore, read_checkpoint
from fedhop.common.exit_codes import ExitCode
from tests.integration.netutil import Federation, small_spec
from tests.integration.test_resume_network import wait_file


def test_read_only_run_folder_mid_run(root, tmp_path: Path, monkeypatch) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "stop-2").touch()
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(gate))
    try:
        spec = small_spec("fedavg", clients=2, rounds=4)
        fed = Federation(spec, tmp_path, out=mnt / "run")  # only the run folder is on the tmpfs
        try:
            wait_file(gate / "at-2", fed)
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
            (gate / "go-2").touch()
            rc = fed.wait(240)
        finally:
            fed.close()
        log = fed.ps_log()
        assert rc == ExitCode.RUN_FOLDER, log
        assert "the checkpoint of round 3 could not be written" in log and "the run goes on" in log
        assert "could not be written to" in log and "the trained state (the model)" in log and "(round 2)" in log
        store = CheckpointStore(fed.out / "checkpoints" / "ps")
        meta, ck = read_checkpoint(store.folder / store._name(store.tags()[-1]))
        assert meta["next_round"] == 2 and len(ck.records) == 2  # the model of round 2 is safe
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_run_folder_mid_run_keeps_the_model_in_tmpdir(root, tmp_path: Path, monkeypatch) -> None:
    """Issue 20: the tmpfs fills up between two rounds (a file takes every block left). The checkpoints after it
    fail, training goes on, and at the end the files the run folder cannot take, the model first, are written
    whole to a folder under $TMPDIR that the exit message names; no file of the run folder is left truncated."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    spill = tmp_path / "spill"
    spill.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
    monkeypatch.setenv("TMPDIR", str(spill))  # the PS's $TMPDIR: room there
    try:
        spec = small_spec("fedavg", clients=2, rounds=4)
        fed = Federation(spec, tmp_path, out=mnt / "run", holds=(2,))
        try:
            fed.wait_round(2, 240)
            filled = subprocess.run(["dd", "if=/dev/zero", f"of={mnt / 'filler'}", "bs=64k"], capture_output=True)
            assert b"No space left on device" in filled.stderr, filled.stderr
            fed.go(2)
            rc = fed.wait(240)
        finally:
            fed.close()
        log = fed.ps_log()
        assert rc == ExitCode.RUN_FOLDER, log
        assert "the checkpoint of round 3 could not be written" in log
        saved = [p for p in spill.iterdir() if p.name.startswith("fedhop-run-")]
        assert len(saved) == 1, (list(spill.iterdir()), log)
        assert f"model.pt, spec.toml, rounds.csv, links.csv, missing.csv, timeline.csv, results.json, plots.png " \
               f"in {saved[0]}" in log, log
        model = torch.load(saved[0] / "model.pt", weights_only=True)
        assert model and all(torch.isfinite(t).all() for t in model.values())
        res = json.loads((saved[0] / "results.json").read_text())
        assert [r["round"] for r in res["rounds"]] == [1, 2, 3, 4] and res["totals"]["payload_bytes"] > 0
        for f in (fed.out / "spec.toml", fed.out / "results.json", fed.out / "model.pt"):
            assert not f.exists() or f.stat().st_size > 0, f  # whole or absent, never truncated
        assert not (fed.out / "results.json").exists()  # the run folder is not taken for a finished run
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
