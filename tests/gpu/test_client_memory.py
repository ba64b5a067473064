"""The GPU memory of a client: a FedAvg client on cuda:0 (here, in the test process, so that PyTorch's own
counters can be read: ``torch.cuda.max_memory_allocated``), its PS a `fedhop server` process, a 17M-parameter
MLP. The peak is reported relative to the model's size and bounded: the client holds the model it received, its
gradient and the stepped parameters, plus cuBLAS's workspaces, and nothing may pile up across rounds.

Run by `make test-gpu`; skipped where torch sees no CUDA device."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fedhop.client.main import run_client
from fedhop.common.engine.workspace import Workspace
from fedhop.launch import Processes, free_port
from fedhop.transport.node_config import NodeConfig
from tests.gpu.gpuutil import cuda_only, deterministic, gpu_spec

pytestmark = cuda_only

MiB = 1 << 20
WORKSPACE_ALLOWANCE = 64 * MiB  # cuBLAS workspaces (CUBLAS_WORKSPACE_CONFIG=:4096:8: 8 x 4 MiB per handle) and such


def test_gpu_client_peak_memory_is_a_few_models(tmp_path: Path) -> None:
    spec = gpu_spec(clients=1, edges=0, rounds=3, hidden=[4096, 4096], options={"local_steps": 5, "batch_size": 32})
    model_bytes = sum(v.numel() * v.element_size() for v in Workspace(spec, "cpu").initial_params().values())
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(spec.to_toml())
    port = free_port()
    procs = Processes(tmp_path / "logs", fork=False)
    threads = torch.get_num_threads()
    with deterministic():
        procs.start("ps", [sys.executable, "-m", "fedhop", "server", str(spec_file), "--listen", f"127.0.0.1:{port}",
                           "--out", str(tmp_path / "run"), "--device", "cuda:0"])
        try:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(0)
            before = torch.cuda.memory_allocated(0)
            code = run_client(NodeConfig("client-0", f"127.0.0.1:{port}", device="cuda:0", connect_timeout_s=120))
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated(0) - before
            after = torch.cuda.memory_allocated(0) - before
            reserved = torch.cuda.max_memory_reserved(0)
            ps_code = procs.wait(60)["ps"]
        finally:
            procs.kill_all()
            torch.set_num_threads(threads)  # run_client pins one thread
    ps_log = (tmp_path / "logs" / "ps.log").read_text(errors="replace")[-3000:]
    assert code == 0 and ps_code == 0, f"client {code}, PS {ps_code}:\n{ps_log}"
    ratio = peak / model_bytes
    print(f"\n[gpu] client on {torch.cuda.get_device_name(0)}: model {model_bytes / MiB:.1f} MiB "
          f"({model_bytes // 4:,} float32 parameters); peak allocated {peak / MiB:.1f} MiB = {ratio:.2f}x the model; "
          f"{after / MiB:.1f} MiB still allocated after the run; peak reserved by the caching allocator "
          f"{reserved / MiB:.1f} MiB")
    assert peak >= 2 * model_bytes, "the client must have held the received model and its gradient on the GPU"
    assert peak <= 6 * model_bytes + WORKSPACE_ALLOWANCE, f"peak {ratio:.2f}x the model"
