"""`simulate` and `launch` on CUDA give bit-identical final models and byte counts (deterministic algorithms on:
tests/gpu/gpuutil.py), and `launch --device auto` spreads its processes over the visible GPUs round-robin, each
node on the device it was given (read from the nodes' own join lines and the PS's Workspace).

Run by `make test-gpu`; skipped where torch sees no CUDA device."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.launch import launch, pick_devices
from tests.gpu.gpuutil import cuda_only, deterministic, gpu_spec, logged_device, max_abs_diff
from tests.integration.netutil import load_result, logs, node_log, rows_by_key

pytestmark = cuda_only

CASES: dict[str, dict[str, Any]] = {
    "fedavg-flat": dict(algorithm="fedavg", clients=3, edges=0),
    "fedavg-edges": dict(algorithm="fedavg", clients=4, edges=2),
    "fedchs-handoff": dict(algorithm="fedchs", clients=3, edges=3, edge_graph="ring", options={"K": 2}),
    # 17M parameters: matrix products big enough for cuBLAS to pick other kernels than for the small MLP
    "fedavg-mlp-17M": dict(algorithm="fedavg", clients=3, edges=0, rounds=2, hidden=[4096, 4096]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_launch_matches_simulate_on_cuda(case: str, tmp_path: Path) -> None:
    spec = gpu_spec(**CASES[case])
    topo = build_topology(spec.topology, spec.seed)
    nodes = topo.all_nodes()
    expected = dict(zip(nodes, pick_devices("auto", len(nodes)), strict=True))
    ps_device: list[torch.device] = []
    with deterministic():
        t0 = time.perf_counter()
        engine = InProcessEngine(spec, device="auto")
        oracle = engine.run()
        t_sim = time.perf_counter() - t0
        assert engine.ws.device.type == "cuda"
        t0 = time.perf_counter()
        out = tmp_path / "run"
        launch(spec, out, device="auto", clients_per_process=1, ps_workspace=lambda ws: ps_device.append(ws.device))
        t_launch = time.perf_counter() - t0
    assert "did not exit cleanly" not in (out / "logs" / "ps.log").read_text(), logs(out)
    res, final = load_result(out)

    # bit-identity: the final model, the accuracy of every round, the bytes of every link
    assert list(final) == list(oracle.final)
    for k, v in oracle.final.items():
        assert torch.equal(final[k], v.cpu()), f"{case}: tensor {k} differs between simulate and launch on CUDA " \
                                               f"(max |diff| {float((final[k] - v.cpu()).abs().max()):.3g})"
    assert [r.get("accuracy") for r in res["rounds"]] == [r.get("accuracy") for r in oracle.rounds]
    work = [r for r in res["links"] if r["payload_bytes"]]
    assert rows_by_key(work, "payload_bytes") == rows_by_key(
        [r for r in oracle.links if r["payload_bytes"]], "payload_bytes")

    # the spread: every node on the device launch gave it (one GPU: all on cuda:0)
    used = {topo.server: str(ps_device[0])}
    for e in topo.edges:
        used[e] = logged_device(node_log(out, e), e, edge=True)
    for c in topo.clients:
        used[c] = logged_device(node_log(out, c), c, edge=False)
    assert used == expected, logs(out)
    n_gpus = torch.cuda.device_count()
    assert len(set(used.values())) == min(n_gpus, len(nodes))

    # the same run on the CPU, for the record (not asserted: CUDA kernels round differently)
    cpu = InProcessEngine(spec, device="cpu").run()
    print(f"\n[gpu] {case}: {torch.cuda.get_device_name(0)} x{n_gpus}; simulate {t_sim:.2f} s, launch {t_launch:.2f} s "
          f"({len(nodes)} processes); devices {sorted(set(used.values()))}; final accuracy "
          f"{oracle.rounds[-1].get('accuracy')}; bit-identical simulate == launch on CUDA; CUDA vs CPU final model: "
          f"max |diff| {max_abs_diff(oracle.final, cpu.final):.3g}")


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "fedhop", *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"fedhop {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_default_digits_run_from_the_command_line(tmp_path: Path) -> None:
    """The README's default run (FedAvg, 2 edges, 6 clients) as `fedhop simulate --device cuda` and
    `fedhop launch --device auto` commands, 3 rounds: the same model.pt bits and accuracies."""
    sim, net = tmp_path / "sim", tmp_path / "launch"
    with deterministic():
        t0 = time.perf_counter()
        _run("simulate", "--device", "cuda", "--set", "rounds=3", "--out", str(sim), "--quiet")
        t_sim = time.perf_counter() - t0
        t0 = time.perf_counter()
        _run("launch", "--device", "auto", "--set", "rounds=3", "--out", str(net), "--quiet")
        t_launch = time.perf_counter() - t0
    a, b = torch.load(sim / "model.pt"), torch.load(net / "model.pt")
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), f"tensor {k}: max |diff| {float((a[k] - b[k]).abs().max()):.3g}"
    ra, rb = (json.loads((p / "results.json").read_text())["rounds"] for p in (sim, net))
    assert [r.get("accuracy") for r in ra] == [r.get("accuracy") for r in rb] and len(ra) == 3
    spec = RunSpec.model_validate(json.loads((net / "results.json").read_text())["spec"])
    topo = build_topology(spec.topology, spec.seed)
    devices = {c: logged_device(node_log(net, c), c, edge=False) for c in topo.clients}
    devices |= {e: logged_device(node_log(net, e), e, edge=True) for e in topo.edges}
    assert all(d.startswith("cuda:") and int(d[5:]) < torch.cuda.device_count() for d in devices.values()), devices
    print(f"\n[gpu] default digits run, 3 rounds: `fedhop simulate --device cuda` {t_sim:.1f} s, `fedhop launch "
          f"--device auto` {t_launch:.1f} s (commands, start-up included); final accuracy {ra[-1].get('accuracy')}; "
          f"model.pt bit-identical; node devices {sorted(set(devices.values()))}")
