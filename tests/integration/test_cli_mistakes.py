"""A sample of tests/unit/test_cli_mistakes.py's table as real ``fedhop`` processes (the console script's own
path: ``python -m fedhop``), and what only a process shows: a closed standard output (``fedhop algorithms |
head -1``) ends quietly with 141, with no BrokenPipeError traceback and no "Exception ignored" at exit. Each
process must leave nothing running (its session is empty once it exits)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedhop.common.exit_codes import ExitCode

FEDHOP = [sys.executable, "-m", "fedhop"]


def run(args: list[str], stdout: int = subprocess.PIPE) -> tuple[int, str, str]:
    """``fedhop ARGS`` in its own session: its exit code, stdout and stderr, once it and everything it started
    are gone (the session has no process left)."""
    with subprocess.Popen([*FEDHOP, *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        out, err = proc.communicate(timeout=60)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing left running in its session
    return proc.returncode, out or "", err


@pytest.mark.parametrize("args", [["algorithms"], ["spec", "--explain"], ["--help"]])
def test_a_closed_stdout_ends_quietly(args):
    """The reader is gone before the command prints (deterministic: the pipe's read end is closed before the
    process starts), as with `| head -1` once head has its line: 141 (128 + SIGPIPE). `--help` is printed by
    argparse, which ignores a failed write itself: it ends with 0, as quietly."""
    r, w = os.pipe()
    os.close(r)
    try:
        rc, _, err = run(args, stdout=w)
    finally:
        os.close(w)
    assert ExitCode.BROKEN_PIPE == 141
    assert rc == (0 if args == ["--help"] else ExitCode.BROKEN_PIPE), err
    assert err == "", err


@pytest.mark.parametrize(("args", "needle"), [
    (["launch", "--rounds", "5"], "fedhop launch: unrecognized arguments: --rounds; did you mean --set rounds=5?"),
    (["reproduce", "focus-fig"], "fedhop reproduce: argument NAME: unknown reproduction 'focus-fig'"),
    (["lanch"], "did you mean 'launch'?"),
    (["spec", "--set", "algorithm.name=fedvag"], "did you mean 'fedavg'?"),
])
def test_a_mistake_is_one_line_from_a_real_process(args, needle):
    rc, out, err = run(args)
    assert rc == ExitCode.USAGE, err
    assert out == "" and "Traceback" not in err
    assert len(err.splitlines()) == 1 and needle in err, err  # no progress bar either
