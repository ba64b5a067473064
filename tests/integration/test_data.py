"""The federated data is the same in another OS process (the in-process checks of the data are in
tests/unit/test_data.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from fedhop.common.data import DataSpec, build_federated_data
from tests.unit.test_data import digest


def test_identical_in_another_process() -> None:
    """Every OS process builds its own copy: string hashing salt must not leak into the partition."""
    spec = DataSpec(dataset="synthetic", partition="dirichlet", options={"samples": 600})
    here = digest(build_federated_data(spec, 7, 5))
    code = ("from fedhop.common.data import DataSpec, build_federated_data\n"
            "import hashlib\n"
            f"fd = build_federated_data(DataSpec.model_validate_json({spec.model_dump_json()!r}), 7, 5)\n"
            "h = hashlib.sha256()\n"
            "for d in [*fd.clients, fd.test]:\n"
            "    h.update(d.x.numpy().tobytes()); h.update(d.y.numpy().tobytes())\n"
            "print(h.hexdigest())\n")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == here
