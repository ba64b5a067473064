"""A run folder is held by one process (common/run_lock.py): another holder is refused at once, naming its pid;
a dead holder's record is taken over with a log line; --force never removes the files of a held folder.

"Another process" is played here by a second open file description of the lock file with its own flock (flock
locks belong to open file descriptions, so this process's own acquire conflicts with it as another process's
would); tests/integration/test_resume_network.py holds a folder with a real second process."""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fedhop.cli import main
from fedhop.common import run_lock
from fedhop.common.engine.results import prepare_run_folder
from fedhop.common.exit_codes import ExitCode, Fatal


@contextmanager
def held_elsewhere(folder: Path, pid: int = 4242, command: str = "fedhop server --resume run") -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / run_lock.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": pid, "host": os.uname().nodename, "command": command,
                                  "since": "2026-01-01T00:00:00Z"}).encode(), 0)
        yield
    finally:
        os.close(fd)


def test_a_held_folder_is_refused_naming_the_holder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with held_elsewhere(run):
        with pytest.raises(run_lock.RunFolderLocked) as e:
            run_lock.acquire(run)
        assert e.value.code == ExitCode.USAGE
        assert "in use by process 4242 (fedhop server --resume run)" in e.value.message
        with pytest.raises(run_lock.RunFolderLocked):
            run_lock.check_free(run)
    with run_lock.hold(run) as lock:  # released by its holder: free, and no take-over
        assert lock is not None
        assert json.loads((run / run_lock.LOCK_FILE).read_text())["pid"] == os.getpid()
        run_lock.check_free(run)  # our own
    assert (run / run_lock.LOCK_FILE).read_text() == ""  # released: no record left


def test_a_dead_holders_lock_is_taken_over_with_a_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / run_lock.LOCK_FILE).write_text(json.dumps({"pid": 999999, "command": "fedhop launch", "since": "x"}))
    with caplog.at_level(logging.WARNING, logger="fedhop.run_lock"):
        lock = run_lock.acquire(run)
    try:
        assert "taking over the lock of process 999999 (fedhop launch" in caplog.text
    finally:
        lock.release()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedhop.run_lock"), run_lock.hold(run):
        pass
    assert "taking over" not in caplog.text


def test_this_process_may_hold_a_folder_twice(tmp_path: Path) -> None:
    outer = run_lock.acquire(tmp_path)
    inner = run_lock.acquire(tmp_path)
    assert inner is outer
    inner.release()  # still held by us after one release
    fd = os.open(tmp_path / run_lock.LOCK_FILE, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        outer.release()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free now
    finally:
        os.close(fd)


def test_a_second_run_into_a_held_folder_is_refused_and_removes_nothing(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "rounds.jsonl").write_text('{"round": 1}\n')
    with held_elsewhere(run, pid=777):
        with pytest.raises(run_lock.RunFolderLocked):
            prepare_run_folder(run, force=True)
        for force in (["--force"], []):  # with or without --force: the holder is named
            rc = main(["simulate", "--out", str(run), *force, "--quiet", "--set", "rounds=1"])
            assert rc == ExitCode.USAGE
            err = capsys.readouterr().err
            assert "in use by process 777" in err and len(err.strip().splitlines()) == 1
    assert (run / "rounds.jsonl").read_text() == '{"round": 1}\n'


def test_an_unwritable_folder_is_a_run_folder_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        blocked = tmp_path / "file"
        blocked.write_text("")  # root writes anywhere: a file where the folder should be
        folder = blocked / "run"
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
    with pytest.raises(Fatal) as e:
        run_lock.acquire(folder)
    assert e.value.code == ExitCode.RUN_FOLDER and "cannot be written" in e.value.message
