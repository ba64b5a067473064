"""Runtime failures of real ``fedhop`` processes end in one clear line and the documented exit code
(common/exit_codes.py), never a traceback: a port in use, the PS's join timeout, an unreachable parent (one
that is not a fedhop node: test_network_faults_startup.py), Ctrl-C on a client, and Ctrl-C on launch, which
writes the rounds done."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fedhop.common.exit_codes import ExitCode
from fedhop.launch import free_port
from tests.integration.netutil import small_spec
from tests.waiting import exited, wait_until

FEDHOP = [sys.executable, "-m", "fedhop"]


def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*FEDHOP, *args], capture_output=True, text=True, timeout=timeout)


def last_line(proc: subprocess.CompletedProcess | tuple[int, str]) -> str:
    err = proc.stderr if isinstance(proc, subprocess.CompletedProcess) else proc[1]
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.fixture
def busy_port():
    """A port some other process-like listener holds (a plain socket, not SO_REUSEPORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_server_on_a_port_in_use(tmp_path, busy_port):
    p = run(["server", "--listen", f"127.0.0.1:{busy_port}", "--out", str(tmp_path / "run")])
    assert p.returncode == ExitCode.ADDRESS_IN_USE, p.stderr
    assert last_line(p) == (f"fedhop server: cannot listen on 127.0.0.1:{busy_port}: port {busy_port} is already "
                            "in use by another process")
    assert not (tmp_path / "run").exists()


def test_edge_on_a_port_in_use(busy_port):
    p = run(["edge", "--id", "edge-0", "--connect", f"127.0.0.1:{free_port()}", "--listen",
             f"127.0.0.1:{busy_port}"])
    assert p.returncode == ExitCode.ADDRESS_IN_USE, p.stderr
    assert "already in use" in last_line(p)


def test_join_timeout(tmp_path):
    p = run(["server", "--listen", f"127.0.0.1:{free_port()}", "--out", str(tmp_path / "run"),
             "--set", "transport.join_timeout_s=1.5", "--set", 'device="cpu"'])
    assert p.returncode == ExitCode.JOIN_TIMEOUT, p.stderr
    assert last_line(p).startswith("fedhop server: no node joined within 1.5s (expected ['edge-0', 'edge-1'])")


def test_unreachable_parent_is_retried_visibly_then_given_up():
    p = run(["client", "--id", "client-0", "--connect", f"127.0.0.1:{free_port()}", "--connect-timeout", "3"])
    assert p.returncode == ExitCode.UNREACHABLE, p.stderr
    retries = [line for line in p.stderr.splitlines() if "connection refused" in line and "retry" in line]
    assert len(retries) >= 2, p.stderr
    assert "unreachable after" in last_line(p) and "connection refused" in last_line(p)


def _ctrl_c_reaches_it() -> None:
    """In the child before exec: SIGINT back to its default, which Python turns into KeyboardInterrupt (a shell
    that runs a job in the background without job control starts it with SIGINT ignored, and Python keeps that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(cond, timeout: float, what: str, proc: subprocess.Popen) -> None:
    # its stderr is read only once it has exited (a read before would wait for the end)
    wait_until(cond, what, timeout=timeout, stop_if=exited(proc),
               details=lambda: proc.stderr.read() if proc.poll() is not None else "")


def test_ctrl_c_on_a_waiting_client(tmp_path):
    gates = tmp_path / "gate"  # the client marks its wait for the parent there (common/testhooks.py)
    gates.mkdir()
    proc = subprocess.Popen([*FEDHOP, "client", "--id", "client-0", "--connect", f"127.0.0.1:{free_port()}",
                             "--connect-timeout", "600"], stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_reaches_it, env={**os.environ, "FEDHOP_TEST_GATE": str(gates)})
    _wait_for((gates / "seen-waiting-for-parent").is_file, 60, "the client to wait for its parent", proc)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(30)
    err = proc.stderr.read()
    assert rc == ExitCode.INTERRUPTED, err
    assert last_line((rc, err)) == "fedhop client: interrupted"


def test_ctrl_c_on_launch_writes_the_rounds_done(tmp_path):
    spec = small_spec("fedavg", clients=4, edges=2, rounds=400, options={"local_steps": 20})
    (tmp_path / "spec.toml").write_text(spec.to_toml())
    out = tmp_path / "run"
    proc = subprocess.Popen([*FEDHOP, "launch", str(tmp_path / "spec.toml"), "--out", str(out), "--device", "cpu",
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_reaches_it)
    journal = out / "rounds.jsonl"
    _wait_for(lambda: journal.is_file() and len(journal.read_text().splitlines()) >= 2, 180, "round 2", proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    line = last_line((proc.returncode, err))
    assert line.startswith("fedhop launch: interrupted after ") and "of 400 rounds" in line and str(out) in line
    res = json.loads((out / "results.json").read_text())
    done = len(res["rounds"])
    assert res["interrupted"] is True and 2 <= done < 400
    assert f"interrupted after {done} of 400 rounds" in line
    assert [r["round"] for r in res["rounds"]] == list(range(1, done + 1))
    with (out / "rounds.csv").open() as f:
        assert len(list(csv.DictReader(f))) == done
    with (out / "links.csv").open() as f:
        links = list(csv.DictReader(f))
    # the edges reported their clients' links on the way out: every client trained in the rounds done
    for c in ("client-0", "client-1", "client-2", "client-3"):
        assert {int(r["round"]) for r in links if r["src"] == c and r["phase"] == "reply"} >= set(range(1, done + 1))
    assert (out / "plots.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "model.pt").exists()
    assert sorted(p.name for p in Path(out / "logs").glob("*.log")) == sorted(
        ["ps.log", "edge-0.log", "edge-1.log", "client-0..client-1.log", "client-2..client-3.log"])  # a host per edge
