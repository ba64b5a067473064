"""Helpers of the GPU tests (tests/gpu): the skip marker, determinism in every process, small CUDA specs.

What the tests set for bit-identity (also in docs/benchmarks.md, section "GPU (H100/H200)"):

- ``CUBLAS_WORKSPACE_CONFIG=:4096:8``: cuBLAS uses fixed workspaces, so its kernels reduce in one fixed order
  (PyTorch's "Reproducibility" notes; without it, deterministic algorithms refuse cuBLAS calls);
- ``torch.use_deterministic_algorithms(True)`` in the test process and, through ``site/sitecustomize.py`` on
  PYTHONPATH with ``FEDHOP_TEST_DETERMINISTIC=1``, in every fedhop process the tests start (an op without a
  deterministic CUDA kernel then raises instead of giving different bits).

fedhop itself already pins what it can on every device: one intra-op thread in clients, parameters built on the CPU
from the seed and moved, random numbers drawn from CPU generators.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhop.common.spec import RunSpec

CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(
    not CUDA, reason=f"needs a CUDA device (torch {torch.__version__} sees none, CUDA build: {torch.version.cuda}); "
                     "run `make test-gpu` on a GPU machine")

SITE = Path(__file__).with_name("site")
DETERMINISM_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "FEDHOP_TEST_DETERMINISTIC": "1"}


@contextmanager
def deterministic() -> Iterator[None]:
    """Deterministic algorithms here and in every Python process started inside the block (see the module
    docstring); the environment and the flag are restored afterwards."""
    keys = [*DETERMINISM_ENV, "PYTHONPATH"]
    saved = {k: os.environ.get(k) for k in keys}
    was = torch.are_deterministic_algorithms_enabled()
    os.environ.update(DETERMINISM_ENV)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), *filter(None, [saved["PYTHONPATH"]])])
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def gpu_spec(algorithm: str = "fedavg", *, clients: int = 3, edges: int = 0, rounds: int = 3,
             options: dict[str, Any] | None = None, edge_graph: str = "random", hidden: list[int] | None = None,
             device: str = "auto") -> RunSpec:
    """A small digits run (like tests/integration/netutil.small_spec) whose device is ``device``."""
    base = {"lr": 0.1, "local_steps": 3, "batch_size": 16} if algorithm in ("fedavg", "hierfavg") else {}
    return RunSpec.parse({
        "name": f"gpu-{algorithm}-{edges}e",
        "rounds": rounds,
        "seed": 7,
        "device": device,
        "algorithm": {"name": algorithm, "options": {**base, **(options or {})}},
        "topology": {"clients": clients, "edges": edges, "edge_graph": edge_graph},
        "data": {"dataset": "digits", "partition": "dirichlet", "dirichlet_lambda": 0.5},
        "model": {"name": "mlp", "hidden": hidden or [64]},
        "transport": {"round_deadline_s": 120.0, "join_timeout_s": 120.0},
    })


CLIENT_JOINED = r"{node}: joined run \S+ under \S+ with \d+ samples on (\S+)"
EDGE_JOINED = r"{node}: joined run \S+ on (\S+), serving on"


def logged_device(log: str, node: str, edge: bool) -> str:
    """The device ``node`` said it runs on when it joined (client/main.py, edge/node.py)."""
    m = re.search((EDGE_JOINED if edge else CLIENT_JOINED).format(node=re.escape(node)), log)
    assert m, f"{node} logged no join line with its device:\n{log[-2000:]}"
    return m.group(1)


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double().cpu() - b[k].double().cpu()).abs().max()) for k in a)
