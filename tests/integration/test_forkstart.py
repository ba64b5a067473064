"""Role processes forked from a preloaded server (fedhop/forkstart.py) behave like the command line: the
caller's working directory, ``sys.path[0]``, environment at the time of the start (not the server's), their
own session, their log, their exit code and signals."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedhop import forkstart
from fedhop.forkstart import ForkedChild, fedhop_argv, import_time_differences, server_defaults
from fedhop.launch import Processes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "least_squares"


def fedhop(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedhop", *args]


def _not_forked_because() -> str:
    """What made :class:`Processes` start a new interpreter (the variables on which this process's environment and
    the fork server's differ), for an assertion's message."""
    differ = import_time_differences(dict(os.environ))
    return ", ".join(f"{k}: {os.environ.get(k)!r} here, {forkstart._server_env.get(k)!r} at the server's start"
                     for k in differ) or "no environment difference"


def test_only_fedhop_commands_are_forked() -> None:
    assert fedhop_argv(fedhop("spec", "x.toml")) == ["spec", "x.toml"]
    assert fedhop_argv(["/another/python", "-m", "fedhop", "spec"]) is None
    assert fedhop_argv([sys.executable, "-c", "pass"]) is None
    assert fedhop_argv([sys.executable, "-m", "other"]) is None


def test_forked_child_runs_in_the_callers_folder_with_its_environment(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(EXAMPLE / "fedavg.toml", work)
    shutil.copy(EXAMPLE / "lsq.py", work)  # user code: importable only through sys.path[0] = the working directory
    timers = tmp_path / "timers"
    monkeypatch.chdir(work)
    monkeypatch.setenv("FEDHOP_TIMERS", str(timers))  # read at import by common/timing.py: must be re-read
    procs = Processes(tmp_path / "logs")
    try:
        p = procs.start("probe", fedhop("spec", "fedavg.toml"))
        assert isinstance(p, ForkedChild), f"started as a new interpreter: {_not_forked_because()}"
        assert p.wait(120) == 0, (tmp_path / "logs" / "probe.log").read_text()
    finally:
        procs.kill_all()
    log = (tmp_path / "logs" / "probe.log").read_text()
    assert 'source = "lsq:source"' in log and 'name = "lsq:build"' in log
    assert timers.is_dir()


def test_forked_child_fails_like_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    procs = Processes(tmp_path / "logs")
    try:
        forked = procs.start("forked", fedhop("spec", "missing.toml"))
        code = forked.wait(120)
    finally:
        procs.kill_all()
    spawned = subprocess.run(fedhop("spec", "missing.toml"), capture_output=True, text=True, timeout=120)
    assert code == spawned.returncode != 0
    assert spawned.stderr.strip() in (tmp_path / "logs" / "forked.log").read_text()


def test_forked_child_has_its_own_session_and_dies_by_signal(tmp_path: Path) -> None:
    procs = Processes(tmp_path / "logs")
    try:
        # a client that keeps dialling a port nobody listens on
        p = procs.start("client-0", fedhop("client", "--id", "client-0", "--connect", "127.0.0.1:9",
                                           "--connect-timeout", "600"))
        assert isinstance(p, ForkedChild), f"started as a new interpreter: {_not_forked_because()}"
        deadline = time.monotonic() + 60  # the child calls setsid() right after the fork
        while os.getsid(p.pid) != p.pid and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.getsid(p.pid) == p.pid != os.getsid(0)
        title = Path(f"/proc/{p.pid}/cmdline").read_bytes().rstrip(b"\0").decode()
        assert title == f"{sys.executable} -m fedhop client --id client-0 --connect 127.0.0.1:9 --connect-timeout 600"
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(0.5)
        procs.kill("client-0")
        assert p.wait(60) == -signal.SIGKILL
    finally:
        procs.kill_all()


def test_what_the_servers_imports_set_by_default_is_no_difference() -> None:
    """scikit-learn (preloaded by the server) sets KMP_INIT_AT_FORK and KMP_DUPLICATE_LIB_OK with setdefault: a
    caller that lacked them when the server started and has them now (it imported scikit-learn later, e.g. the PS
    of a first launch) still forks its children; another value than the default is a difference."""
    import sklearn  # noqa: F401  (sets the defaults in this process too)

    now = dict(os.environ)
    assert now["KMP_INIT_AT_FORK"] == "FALSE"
    assert "KMP_INIT_AT_FORK" not in import_time_differences(now)
    assert "KMP_INIT_AT_FORK" in import_time_differences({**now, "KMP_INIT_AT_FORK": "TRUE"})
    if "KMP_INIT_AT_FORK" in server_defaults():  # this process imported scikit-learn after the server started
        assert server_defaults()["KMP_INIT_AT_FORK"] == "FALSE"
        without = {k: v for k, v in now.items() if not k.startswith("KMP_")}
        assert import_time_differences(without) == import_time_differences(now)


def test_exec_children_start_new_interpreters(tmp_path: Path) -> None:
    procs = Processes(tmp_path / "logs", fork=False)
    try:
        p = procs.start("probe", fedhop("algorithms"))
        assert isinstance(p, subprocess.Popen)
        assert p.wait(120) == 0
    finally:
        procs.kill_all()
    assert "fedchs" in (tmp_path / "logs" / "probe.log").read_text()


def test_a_child_needing_other_import_time_settings_is_a_new_interpreter(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC reads GRPC_TRACE when it is imported: the fork server imported it already, so a child that asks for
    another value (here: the handshake trace that names the peer of a failed TLS handshake) is exec'd."""
    Processes(tmp_path / "warm").start("warm", fedhop("algorithms")).wait(120)  # the server runs, without it
    monkeypatch.setenv("GRPC_TRACE", "handshaker")
    procs = Processes(tmp_path / "logs")
    try:
        p = procs.start("probe", fedhop("health", "127.0.0.1:9", "--timeout", "2"))
        assert isinstance(p, subprocess.Popen)
        p.wait(120)
    finally:
        procs.kill_all()
    assert "gRPC Tracers: handshaker" in (tmp_path / "logs" / "probe.log").read_text()
