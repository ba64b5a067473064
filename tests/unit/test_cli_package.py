"""The CLI package's own contracts (that importing it imports no torch is checked in fresh interpreters in
tests/integration/test_cli_package.py): one table maps every failure to its exit code and line; a run's
failures are worded for launch and for server as before; the fork server finds the command line by name;
``--tls auto`` never needs a namespace mutated."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedhop.cli.errors import EXIT_CODES, RunPlace, as_fatal, run_command, run_failure, run_failures
from fedhop.common.exit_codes import ExitCode, Fatal


@pytest.mark.parametrize(("ref", "code"), EXIT_CODES)
def test_every_exit_code_entry_names_an_exception_class(ref: str, code: ExitCode) -> None:
    module, _, name = ref.partition(":")
    cls = getattr(importlib.import_module(module), name)  # a class moved elsewhere must be followed in the table
    assert isinstance(cls, type) and issubclass(cls, Exception)
    fatal = as_fatal(cls("what went wrong"))
    assert fatal is not None and (fatal.code, fatal.message) == (code, "what went wrong")


def test_as_fatal_passes_fatal_maps_ctrl_c_and_leaves_bugs_alone() -> None:
    f = Fatal(ExitCode.RUN_FOLDER, "no")
    assert as_fatal(f) is f
    ki = as_fatal(KeyboardInterrupt())
    assert ki is not None and (ki.code, ki.message) == (ExitCode.INTERRUPTED, "interrupted")
    assert as_fatal(ValueError("a bug")) is None


def test_run_command_prints_one_line_and_returns_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    def fails() -> int:
        raise Fatal(ExitCode.NO_DEVICE, "cuda:3 is not there")

    assert run_command("fedhop x", fails) == ExitCode.NO_DEVICE
    assert capsys.readouterr().err == "fedhop x: cuda:3 is not there\n"
    assert run_command("fedhop x", lambda: None) == 0
    with pytest.raises(ZeroDivisionError):
        run_command("fedhop x", lambda: 1 // 0)


def _interrupted(done: int, rounds: int) -> BaseException:
    from fedhop.server.main import Interrupted

    return Interrupted(SimpleNamespace(rounds=[{}] * done, spec=SimpleNamespace(rounds=rounds)))  # type: ignore[arg-type]


def test_run_failures_are_worded_for_launch_and_for_server() -> None:
    from fedhop.common.engine.loop import RoundFailed
    from fedhop.server.main import JoinTimeout, ResultsNotWritten, StartupFailed

    out, logs = Path("runs/x"), Path("runs/x/logs")
    launch, server = RunPlace(5, out, logs), RunPlace(5, out)
    expected = [
        (_interrupted(2, 5), ExitCode.INTERRUPTED,
         "interrupted after 2 of 5 rounds; every process was stopped; the rounds done are in runs/x (logs in "
         "runs/x/logs)",
         "interrupted after 2 of 5 rounds; the rounds done are in runs/x"),
        (KeyboardInterrupt(), ExitCode.INTERRUPTED,
         "interrupted before round 1; every process was stopped (logs in runs/x/logs)",
         "interrupted before round 1; nothing written"),
        (StartupFailed("edge-0 exited"), ExitCode.STARTUP,
         "edge-0 exited\n(every process was stopped; logs in runs/x/logs)", "edge-0 exited"),
        (JoinTimeout("no node joined"), ExitCode.JOIN_TIMEOUT,
         "no node joined; every process was stopped (logs in runs/x/logs)", "no node joined"),
        (RoundFailed("too few"), ExitCode.FAILED,
         "too few; the rounds done are in runs/x (logs in runs/x/logs)", "too few; the rounds done are in runs/x"),
        (ResultsNotWritten("disk full"), ExitCode.RUN_FOLDER, "disk full", "disk full"),
    ]
    for e, code, at_launch, at_server in expected:
        for place, text in ((launch, at_launch), (server, at_server)):
            fatal = run_failure(e, place)
            assert fatal is not None and (fatal.code, fatal.message) == (code, text)
    assert run_failure(ValueError("a bug"), launch) is None


def test_run_failures_block_raises_fatal_and_lets_others_through() -> None:
    from fedhop.server.main import JoinTimeout

    with pytest.raises(Fatal) as caught, run_failures(RunPlace(3, Path("o"))):
        raise JoinTimeout("nobody")
    assert (caught.value.code, caught.value.message) == (ExitCode.JOIN_TIMEOUT, "nobody")
    with pytest.raises(LookupError), run_failures(RunPlace(3, Path("o"))):
        raise LookupError("a bug")


def test_fork_server_finds_the_command_line_by_name() -> None:
    import fedhop.cli
    from fedhop.forkstart import ENTRY, resolve_entry

    assert resolve_entry(ENTRY) is fedhop.cli.main
    for bad in ("fedhop.cli", "fedhop.cli:", ":main"):
        with pytest.raises(ValueError, match="is not 'package.module:function'"):
            resolve_entry(bad)
    with pytest.raises(TypeError, match="is not a function"):
        resolve_entry("fedhop.forkstart:ENTRY")


def test_launch_tls_auto_gives_children_the_run_folders_ca(tmp_path: Path) -> None:
    from fedhop.cli.console import load_spec
    from fedhop.cli.run import launch_security
    from fedhop.cli.security import SecurityArgs

    args = SecurityArgs(tls="auto")
    security, children = launch_security(args, load_spec(None), tmp_path)
    assert children == ["--tls", str(tmp_path / "tls")]
    assert (tmp_path / "tls" / "ca.crt").is_file()
    assert args.tls == "auto"  # the command's arguments are read, never rewritten
    assert security.mode == "tls"
