"""A run folder that fills up or turns read-only mid-run (root: a tmpfs of the test's own, remounted
read-only between two rounds with the PS's gate). Training goes on; the checkpoints written before are the
model; the PS ends with the run-folder exit code and one message saying what was saved and where."""

from __future__ import annotations

import subprocess
from pathlib import Path

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
