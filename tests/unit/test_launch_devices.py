"""`fedhop launch --device auto` spreads processes over the visible GPUs round-robin, CPU when there are none."""

import torch

from fedhop.cli.app import build_parser
from fedhop.cli.spec import load_run_spec
from fedhop.launch import node_devices, pick_devices, role_cmd


def test_auto_spreads_round_robin_over_visible_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert pick_devices("auto", 7) == ["cuda:0", "cuda:1", "cuda:2", "cuda:0", "cuda:1", "cuda:2", "cuda:0"]


def test_auto_without_gpu_is_cpu_and_explicit_choice_is_kept(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_devices("auto", 3) == ["cpu"] * 3
    assert pick_devices("cuda:1", 2) == ["cuda:1", "cuda:1"]


def test_role_command_carries_device_and_data_path():
    cmd = role_cmd("client", "client-3", "127.0.0.1:5", device="cuda:1", data_path="/data")
    assert cmd[cmd.index("-m") + 1:cmd.index("-m") + 3] == ["fedhop", "client"]
    assert cmd[cmd.index("--device") + 1] == "cuda:1" and cmd[cmd.index("--data-path") + 1] == "/data"
    assert cmd[cmd.index("--connect") + 1] == "127.0.0.1:5" and cmd[cmd.index("--id") + 1] == "client-3"


def test_launch_takes_the_specs_device_unless_the_command_line_names_one(monkeypatch):
    """Where a GPU is visible, a spec saying ``cpu`` runs its every process on the CPU, as `fedhop simulate` runs
    it (issue 19: launch's old default ``auto`` put the clients of examples/npy_cnn on the lent H200's GPU, and
    the engines differed); ``auto`` in the spec spreads over the GPUs; ``--device`` overrides the spec."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    nodes = ["ps", "client-0", "client-1"]
    cpu = load_run_spec(None, ["device=cpu"])
    auto = load_run_spec(None, ["device=auto"])
    assert node_devices(cpu, None, nodes) == {n: "cpu" for n in nodes}
    assert node_devices(auto, None, nodes) == {"ps": "cuda:0", "client-0": "cuda:1", "client-1": "cuda:0"}
    assert node_devices(cpu, "cuda:1", nodes) == {n: "cuda:1" for n in nodes}
    assert node_devices(auto, "cpu", nodes) == {n: "cpu" for n in nodes}
    assert build_parser().parse_args(["launch"]).device is None  # no default of its own: the spec's
