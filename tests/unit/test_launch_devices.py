"""`fedhop launch --device auto` spreads processes over the visible GPUs round-robin, CPU when there are none."""

import torch

from fedhop.launch import pick_devices, role_cmd


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
