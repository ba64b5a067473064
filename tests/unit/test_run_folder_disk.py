"""Issue 20, "a full disk still loses the trained model and leaves spec.toml at 0 bytes": every file of a run
folder is written whole or not at all, and what the run folder cannot take (the model first) goes to a folder
under $TMPDIR that the error names (exit code RUN_FOLDER).

The disk is faked here by a file system error on the run folder's files only (``fsync`` answering ENOSPC, where
a file system with delayed allocation reports a full disk); tests/testbed/test_disk.py fills a real tmpfs under
a running PS."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from fedhop.cli.errors import as_fatal
from fedhop.common import atomic_files
from fedhop.common.engine.results import RunFolderNotWritten, RunResult, write_run_folder
from fedhop.common.exit_codes import ExitCode
from tests.specs import run_spec


def _result() -> RunResult:
    spec = run_spec("fedavg", {}, clients=2, edges=0, rounds=1, name="disk")
    links = [{"src": "client-0", "dst": "server", "kind": "train", "phase": "reply", "round": 0, "messages": 1,
              "payload_bytes": 40, "message_bytes": 60}]
    return RunResult(spec, "inprocess", [{"round": 1, "accuracy": 0.5, "loss": 1.0}], links, [],
                     {"w": torch.arange(6.0).reshape(2, 3)}, wall_s=0.1)


@pytest.fixture
def full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path/run``'s files cannot be synced (ENOSPC); $TMPDIR (``tmp_path/spill``) has room."""
    run = tmp_path / "run"
    spill = tmp_path / "spill"
    run.mkdir()
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads $TMPDIR again
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(run) + "/"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return run


def test_a_full_run_folder_keeps_its_files_whole_and_the_model_goes_to_tmpdir(full_disk: Path) -> None:
    run = full_disk
    (run / "spec.toml").write_text("name = 'the previous write'\n")  # e.g. a resumed run's folder
    result = _result()
    with pytest.raises(RunFolderNotWritten) as e:
        write_run_folder(result, run)
    assert (run / "spec.toml").read_text() == "name = 'the previous write'\n"  # not truncated
    assert sorted(p.name for p in run.iterdir()) == ["spec.toml"]  # no temporary file left, no results.json
    spill = e.value.spilled
    assert spill is not None and spill.parent == run.parent / "spill" and spill.name.startswith("fedhop-run-")
    model = torch.load(spill / "model.pt", weights_only=True)
    assert torch.equal(model["w"], result.final["w"])
    assert "payload_bytes" in (spill / "links.csv").read_text() and (spill / "results.json").is_file()
    assert e.value.lost == ()
    fatal = as_fatal(e.value)
    assert fatal is not None and fatal.code == ExitCode.RUN_FOLDER
    assert f"could not be written to {run} (No space left on device)" in fatal.message
    assert f"model.pt, spec.toml, rounds.csv, links.csv, missing.csv, timeline.csv, results.json, plots.png in " \
           f"{spill}" in fatal.message


def test_a_file_that_cannot_be_written_leaves_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text("old\n")
    with pytest.raises(OSError, match="No space"), atomic_files.replacing(path) as tmp:
        tmp.write_bytes(b"half")  # the disk fills up half way through
        raise OSError(errno.ENOSPC, "No space left on device")
    assert path.read_text() == "old\n" and list(tmp_path.iterdir()) == [path]
    atomic_files.write_text(path, "new\n")
    assert path.read_text() == "new\n" and list(tmp_path.iterdir()) == [path]


def test_a_run_folder_with_room_is_written_whole(tmp_path: Path) -> None:
    write_run_folder(_result(), tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"model.pt", "spec.toml", "rounds.csv", "links.csv", "missing.csv", "timeline.csv",
                     "results.json", "plots.png"}
