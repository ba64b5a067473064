"""Users' own protocols (issue 16): the three example protocols, each a module of the user's (``algorithm.name =
"module:NAME"``), pass ``fedhop check`` (in-process vs real processes, payload per link, PS crash, client fault),
and one runs in the network-namespace testbed with the model the in-process engine computes, bit for bit.

Each command runs in a copy of the example's folder, as the examples' READMEs say (fedhop imports the module a
spec names from the working directory; the testbed's roles start there too). ``fedhop check`` needs no root; the
namespace run does (``make test-testbed``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REPO = Path(__file__).resolve().parents[2]
SMALLER = {  # what each example's spec.toml holds -> the size these tests run it at
    "server_momentum": (("rounds = 10", "rounds = 3"),),
    "gossip": (("rounds = 10", "rounds = 3"), ("clients = 6", "clients = 4")),
    "fedbuff": (("rounds = 10", "rounds = 3"), ("clients = 6", "clients = 4"), ("concurrency = 4", "concurrency = 3"),
                ("buffer = 3", "buffer = 2"), ("local_steps = 5", "local_steps = 2"), ("client-5", "client-3")),
}


def example(name: str, tmp: Path) -> Path:
    folder = tmp / name
    shutil.copytree(EXAMPLES / name, folder, ignore=shutil.ignore_patterns("__pycache__", "data"))
    text = (folder / "spec.toml").read_text()
    for old, new in SMALLER[name]:
        assert old in text, f"examples/{name}/spec.toml no longer holds {old!r}"
        text = text.replace(old, new)
    (folder / "spec.toml").write_text(text)
    return folder


def fedhop(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "fedhop", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("name", sorted(SMALLER))
def test_the_example_protocols_pass_fedhop_check(name: str, tmp_path: Path) -> None:
    folder = example(name, tmp_path)
    p = fedhop(folder, "check", "spec.toml", "--out", str(tmp_path / "check"))
    print(p.stdout)
    assert p.returncode == 0, f"fedhop check on examples/{name}: exit {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    assert "model" in p.stdout and "payload" in p.stdout  # the verdict table was printed


def test_a_user_module_protocol_runs_in_the_namespace_testbed(root: None, tmp_path: Path) -> None:
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.fail("the namespace testbed needs ip and tc (iproute2)")
    folder = example("server_momentum", tmp_path)
    sim = fedhop(folder, "simulate", "spec.toml", "--out", str(tmp_path / "sim"), "--quiet")
    assert sim.returncode == 0, sim.stderr[-3000:]
    net = fedhop(folder, "testbed", "up", "spec.toml", "--out", str(tmp_path / "net"), "--timeout", "300")
    assert net.returncode == 0, f"{net.stdout}\n{net.stderr[-3000:]}"
    a, b = (torch.load(tmp_path / d / "model.pt") for d in ("sim", "net"))
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), "testbed model differs from simulate"
    assert (tmp_path / "net" / "wire.csv").is_file()  # the namespaces' kernel counters were read
