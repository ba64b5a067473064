"""A protocol from the user's own module (examples/server_momentum: FedAvg with server momentum, written against
``fedhop.api`` only) over real processes: ``fedhop launch`` ends with the model ``fedhop simulate`` ends with,
bit for bit, and the same payload bytes on every link; killed between rounds and resumed with ``launch
--resume``, it restores the user's state (its momentum) from the checkpoints and ends with the same model. A node
without the module, or with another version of it, leaves with USER_CODE; a user protocol through edges (an edge
handler that scatters to its clients) is as bit-identical across engines as a flat one."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedhop.common.wire.control import CONTROL_KINDS
from tests.integration.netutil import launch_killed_and_resumed

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "server_momentum"
SMALL = ("rounds = 10", "rounds = 4")


def copy_example(tmp_path: Path) -> Path:
    folder = tmp_path / "server_momentum"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    text = (folder / "spec.toml").read_text()
    assert SMALL[0] in text
    (folder / "spec.toml").write_text(text.replace(*SMALL))
    return folder


def fedhop(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "fedhop", *args, "--quiet"], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"fedhop {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def payload_per_link(run: Path, *, control: bool = False) -> dict[tuple[str, ...], tuple[int, int]]:
    """Messages and payload per (src, dst, kind, phase, round): the protocol's own traffic, or with ``control``
    only the network-only kinds (reports, session frames, the wire level: CONTROL_KINDS)."""
    with (run / "links.csv").open() as f:
        return {(r["src"], r["dst"], r["kind"], r["phase"], r["round"]): (int(r["messages"]), int(r["payload_bytes"]))
                for r in csv.DictReader(f) if (r["kind"] in CONTROL_KINDS) == control}


def assert_same_model(a: Path, b: Path) -> None:
    ma, mb = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    assert list(ma) == list(mb) and all(torch.equal(ma[k], mb[k]) for k in ma)


def test_server_momentum_launch_equals_simulate(tmp_path: Path) -> None:
    folder = copy_example(tmp_path)
    fedhop(["simulate", "spec.toml", "--out", str(tmp_path / "sim")], folder)
    fedhop(["launch", "spec.toml", "--out", str(tmp_path / "net"), "--http", "off"], folder)
    assert_same_model(tmp_path / "sim", tmp_path / "net")
    sim, net = payload_per_link(tmp_path / "sim"), payload_per_link(tmp_path / "net")
    assert sim == net
    assert {k[2] for k in net} == {"server_momentum.train"} and len({k[:2] for k in net}) == 2 * 4  # 4 clients
    d_bytes = sum(v.numel() * v.element_size() for v in torch.load(tmp_path / "net" / "model.pt").values())
    assert set(net.values()) == {(1, d_bytes)}  # one model down and one up per client and round


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "gate"
    folder.mkdir()
    (folder / "stop-2").touch()  # the PS stops before round 3 (index 2) until the test removes this
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(folder))
    return folder


def test_server_momentum_launch_killed_and_resumed_restores_the_user_state(tmp_path: Path, gate: Path) -> None:
    folder = copy_example(tmp_path)
    fedhop(["simulate", "spec.toml", "--out", str(tmp_path / "sim")], folder)
    run = tmp_path / "run"
    again = launch_killed_and_resumed(["spec.toml"], run, gate, cwd=folder)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "at round 3 of 4" in again.stderr
    assert_same_model(tmp_path / "sim", run)


def test_a_node_without_the_protocol_module_or_with_another_version_leaves_with_user_code(tmp_path: Path) -> None:
    """The PS runs the example's module; a client whose copy differs, and one that has none, each leave at the
    Welcome with exit code USER_CODE and one line (no traceback), as for any other user reference."""
    from fedhop.common.exit_codes import ExitCode
    from fedhop.launch import free_port, role_cmd

    folder = copy_example(tmp_path)
    edited = tmp_path / "edited"
    shutil.copytree(folder, edited)
    (edited / "momentum.py").write_text((folder / "momentum.py").read_text() + "\n# edited on this machine only\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    addr = f"127.0.0.1:{free_port()}"
    with (tmp_path / "ps.log").open("w") as log:
        ps = subprocess.Popen([sys.executable, "-m", "fedhop", "server", "spec.toml", "--listen", addr, "--out",
                               str(tmp_path / "run"), "--device", "cpu", "--http", "off"], cwd=folder,
                              stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        for cwd, client, says in ((edited, "client-0", "client-0 runs different user code than the parameter server"),
                                  (empty, "client-1", "cannot import module 'momentum'")):
            proc = subprocess.run(role_cmd("client", client, addr, device="cpu"), cwd=cwd, capture_output=True,
                                  text=True, timeout=120)
            out = proc.stdout + proc.stderr
            assert proc.returncode == ExitCode.USER_CODE, out
            assert says in out and "Traceback" not in out, out
        assert ps.poll() is None, "the PS keeps waiting for nodes with its code"
    finally:
        ps.kill()
        ps.wait(10)


HIERARCHICAL = '''
"""A two-level user protocol: each edge averages its clients' local models, the PS averages the edges'."""
from dataclasses import dataclass

from fedhop.api import Algorithm, Bundle, NodeContext, NoOptions, Reply, Scalar, local_sgd, task, weighted_mean


@dataclass
class State:
    model: Bundle


@task("fh_hier.client")
def client(ctx: NodeContext, params: Bundle, args: dict[str, Scalar]) -> Reply:
    w, loss = local_sgd(ctx, params, steps=3, lr=0.05, batch_size=16)
    return Reply(w, {"n": len(ctx.data)})


@task("fh_hier.edge")
def edge(ctx: NodeContext, params: Bundle, args: dict[str, Scalar]) -> Reply:
    replies = ctx.comm.scatter(ctx.children, "fh_hier.client", params, expect=params)
    n = sum(int(r.scalars["n"]) for r in replies.values())
    return Reply(weighted_mean((float(r.scalars["n"]), r.bundle) for r in replies.values()), {"n": n})


def init(ctx: NodeContext) -> State:
    return State(ctx.initial_params())


def round_(ctx: NodeContext, s: State) -> State:
    replies = ctx.comm.scatter(ctx.children, "fh_hier.edge", s.model, expect=s.model)
    model = weighted_mean((float(r.scalars["n"]), r.bundle) for r in replies.values())
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(model))
    return State(model)


ALGORITHM = Algorithm(name="hier", options=NoOptions, init=init, round=round_, needs_edges=True)
'''

HIER_SPEC = '''name = "fh-hier"
rounds = 2
seed = 5
device = "cpu"
[algorithm]
name = "fh_hier:ALGORITHM"
[topology]
clients = 4
edges = 2
[data]
dataset = "digits"
[model]
name = "mlp"
hidden = [8]
'''


def test_a_hierarchical_user_protocol_through_edges_launch_equals_simulate(tmp_path: Path) -> None:
    folder = tmp_path / "hier"
    folder.mkdir()
    (folder / "fh_hier.py").write_text(HIERARCHICAL)
    (folder / "spec.toml").write_text(HIER_SPEC)
    fedhop(["simulate", "spec.toml", "--out", str(tmp_path / "sim")], folder)
    fedhop(["launch", "spec.toml", "--out", str(tmp_path / "net"), "--http", "off"], folder)
    assert_same_model(tmp_path / "sim", tmp_path / "net")
    sim, net = payload_per_link(tmp_path / "sim"), payload_per_link(tmp_path / "net")
    control = payload_per_link(tmp_path / "net", control=True)
    reports = {k[:2] for k in control if k[2] == "report"}  # edges report their meters to the PS
    assert reports == {("edge-0", "ps"), ("edge-1", "ps")}
    assert all(payload == 0 for _, payload in control.values())
    assert not payload_per_link(tmp_path / "sim", control=True)  # the in-process engine has no network-only kinds
    assert sim == net
    assert {k[2] for k in net} == {"fh_hier.client", "fh_hier.edge"}
    assert {k[:2] for k in net if k[2] == "fh_hier.edge"} == {("ps", "edge-0"), ("ps", "edge-1"), ("edge-0", "ps"),
                                                             ("edge-1", "ps")}
