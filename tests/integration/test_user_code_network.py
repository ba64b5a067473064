"""Bring-your-own code over real processes: every node checks that it runs the parameter server's version of
the modules the spec names. The PS puts its code digest in every Welcome, an edge passes the PS's digest on to
its clients, and a node whose own copy differs leaves at once with exit code USER_CODE and a line naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedhop.common.exit_codes import ExitCode
from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.launch import free_port, role_cmd
from tests.integration.netutil import small_spec
from tests.waiting import exited, wait_until

MODULE = "fhdigest_metric"  # a name no other test imports
SOURCE = '''def score(outputs, y):
    """A user metric."""
    return float((outputs.argmax(1) == y).float().mean())
'''


def _folder(root: Path, name: str, source: str) -> Path:
    d = root / name
    d.mkdir()
    (d / f"{MODULE}.py").write_text(source)
    return d


def _start(cmd: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    """A role process whose working directory (on sys.path for user modules) is ``cwd``."""
    with log.open("w") as f:
        return subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)


def _wait_joined(gates: Path, node: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    """Wait until ``node`` accepted its parent's Welcome, every check passed (its test-hook mark ``joined``)."""
    wait_until((gates / f"seen-joined-{node}").is_file, f"{node} to join", timeout=timeout,
               stop_if=exited(proc, log.stem), details=log.read_text)


def test_a_node_with_other_user_code_is_refused_directly_and_through_an_edge(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    same = _folder(tmp_path, "same", SOURCE)
    other = _folder(tmp_path, "other", SOURCE + "# edited on this machine only\n")
    monkeypatch.syspath_prepend(str(same))  # the spec names the module: parsing it imports it
    gates = tmp_path / "gate"
    gates.mkdir()
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(gates))  # the nodes mark what they reached (common/testhooks.py)
    raw = small_spec("fedavg", clients=4, edges=2, rounds=1, edge_graph="complete").model_dump(mode="json")
    spec = RunSpec.parse({**raw, "metrics": [f"{MODULE}:score"]})
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(spec.to_toml())
    topo = build_topology(spec.topology, spec.seed)
    ps_addr = f"127.0.0.1:{free_port()}"
    edge_ok, edge_bad = topo.edges
    client_bad, client_ok = topo.children(edge_ok)[:2]
    edge_addr = f"127.0.0.1:{free_port()}"
    procs: list[subprocess.Popen] = []
    try:
        ps = _start([sys.executable, "-m", "fedhop", "server", str(spec_file), "--listen", ps_addr,
                     "--out", str(tmp_path / "run"), "--device", "cpu"], same, tmp_path / "ps.log")
        procs.append(ps)
        # an edge with the PS's code joins; an edge with other code refuses itself at the Welcome
        ok = _start(role_cmd("edge", edge_ok, ps_addr, listen=edge_addr, device="cpu"), same,
                    tmp_path / "edge-ok.log")
        procs.append(ok)
        bad = subprocess.run(role_cmd("edge", edge_bad, ps_addr, listen=f"127.0.0.1:{free_port()}", device="cpu"),
                             cwd=other, capture_output=True, text=True, timeout=120)
        assert bad.returncode == ExitCode.USER_CODE, bad.stdout + bad.stderr
        assert f"{edge_bad} runs different user code than the parameter server" in bad.stdout + bad.stderr
        # a client under the edge that has the PS's code: the edge passed the PS's digest on
        client = subprocess.run(role_cmd("client", client_bad, edge_addr, device="cpu"), cwd=other,
                                capture_output=True, text=True, timeout=120)
        assert client.returncode == ExitCode.USER_CODE, client.stdout + client.stderr
        assert f"{client_bad} runs different user code than the parameter server" in client.stdout + client.stderr
        # ... and a client with the PS's code under that edge joins (the edge forwarded a digest, not nothing)
        good = _start(role_cmd("client", client_ok, edge_addr, device="cpu"), same, tmp_path / "client-ok.log")
        procs.append(good)
        _wait_joined(gates, client_ok, good, tmp_path / "client-ok.log")  # marked after the check
        _wait_joined(gates, edge_ok, ok, tmp_path / "edge-ok.log")
        assert ok.poll() is None and ps.poll() is None and good.poll() is None, "nodes with the PS's code stay"
        assert not any((gates / f"seen-joined-{n}").exists() for n in (edge_bad, client_bad))
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
