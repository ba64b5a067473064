"""Bit-identity between the engines must not depend on the machine's core count, thread settings or CPU
capability (issue 19). Each variant runs the same small CNN job (convolutions go through oneDNN, the dense
layer through BLAS) with ``fedhop simulate`` and with ``fedhop launch`` (real role processes) in one fresh
interpreter started under that variant's settings, and the two final models must be equal bit for bit.

What this machine can emulate: the ATen kernel set (``ATEN_CPU_CAPABILITY=default`` turns the vectorised
kernels off, ``avx2`` caps them below AVX-512), the OpenMP / MKL thread counts a user's environment sets, and
the number of cores the processes may use (``taskset``: one core, so role processes are time-sliced). The
variants are not compared with each other: a different kernel set may round differently, and fedhop promises
equal engines on one machine, not equal machines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.specs import DIGITS, run_spec

DRIVER = """
import os, sys
import torch
from fedhop.cli import main
out = sys.argv[1]
print(torch.backends.cpu.get_cpu_capability(), len(os.sched_getaffinity(0)))
for engine in ("simulate", "launch"):
    code = main([engine, out + "/spec.toml", "--out", out + "/" + engine, "--quiet"])
    if code != 0:
        sys.exit(f"{engine} failed with exit code {code}")
"""

VARIANTS = {
    "no-vector-kernels-two-threads": ({"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2",
                                       "MKL_NUM_THREADS": "2"}, None),
    "avx2-one-core": ({"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "4"}, "0"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_launch_equals_simulate_under_cpu_variant(variant: str, tmp_path: Path) -> None:
    env_extra, cores = VARIANTS[variant]
    if cores is not None and shutil.which("taskset") is None:
        pytest.fail("taskset (util-linux) is needed to run role processes on one core")
    spec = run_spec("fedavg", {"local_steps": 2, "lr": 0.05, "batch_size": 16}, clients=2, rounds=2, seed=3,
                     data={**DIGITS, "dataset": "digits-img"}, model={"name": "cnn2"})
    (tmp_path / "spec.toml").write_text(spec.to_toml())
    path = [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, **env_extra, "PYTHONPATH": os.pathsep.join(path)}  # keep the caller's path (carried deps)
    cmd = [sys.executable, "-c", DRIVER, str(tmp_path)]
    if cores is not None:
        cmd = ["taskset", "-c", cores, *cmd]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    capability, n_cores = done.stdout.split()[:2]  # the settings took effect in the driver (and so in its children)
    assert capability == env_extra["ATEN_CPU_CAPABILITY"].upper()
    assert cores is None or int(n_cores) == 1
    sim, net = (torch.load(tmp_path / engine / "model.pt") for engine in ("simulate", "launch"))
    assert list(sim) == list(net)
    differ = [k for k in sim if not torch.equal(sim[k], net[k])]
    assert not differ, f"{variant}: launch differs from simulate in {differ}"
