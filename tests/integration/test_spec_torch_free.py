"""In a fresh interpreter, importing the RunSpec and validating specs (good ones and ones with typos) loads no
torch and no algorithm module, and ``fedhop spec`` on a spec with a typo imports no torch (issue 15).

The static form of the same claim, read from the source, is ``tests/unit/test_spec_torch_free.py``; this one
runs the code (processes: hence integration).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("torch", "fedhop.common.algorithms", "fedhop.common.engine", "fedhop.common.data.",
             "fedhop.common.models.")

SCRIPT = r"""
import json, sys
from fedhop.common import catalog
from fedhop.common.spec import RunSpec, SpecError

RunSpec.parse({})
bad = [
    {"algorithm": {"name": "fedavgg"}},
    {"algorithm": {"name": "fedavg", "options": {"lrr": 0.1}}},
    {"roundz": 3},
    {"data": {"dataset": "mnistt"}},
    {"model": {"name": "lenet", "options": {"variantt": "mnist"}}},
    {"algorithm": {"name": "hierfavg"}},
    {"algorithm": {"name": "fedcluster"}, "topology": {"clients": 8, "edges": 4, "edge_graph": "ring"}},
]
errors = []
for raw in bad:
    try:
        RunSpec.parse(raw)
        errors.append(None)
    except SpecError as e:
        errors.append(str(e))
for name in sorted(catalog.ALGORITHMS):
    catalog.algorithm(name).options.model_validate({})
forbidden = FORBIDDEN
print(json.dumps({"errors": errors, "loaded": sorted(m for m in sys.modules
                                                     if any(m == f.rstrip(".") or m.startswith(f.rstrip(".") + ".")
                                                            for f in forbidden))}))
"""


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [e.get("PYTHONPATH")])])
    return e


def test_validating_specs_loads_no_torch_and_no_algorithm() -> None:
    script = SCRIPT.replace("forbidden = FORBIDDEN", f"forbidden = {FORBIDDEN!r}")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env(),
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded"] == []
    errors = out["errors"]
    assert all(errors), errors  # every bad spec was refused
    assert "unknown algorithm 'fedavgg'; known: centralized-sgd," in errors[0]
    assert "algorithm.options for 'fedavg': lrr: Extra inputs are not permitted" in errors[1]
    assert "roundz: Extra inputs are not permitted" in errors[2]
    assert "unknown dataset 'mnistt'; valid names:" in errors[3]
    assert "bad options for model 'lenet': variantt: Extra inputs are not permitted" in errors[4]
    assert "algorithm 'hierfavg' needs edge servers" in errors[5]
    assert "fedcluster with order='reshuffle' hands the model between clusters" in errors[6]


def test_fedhop_spec_on_a_typo_imports_no_torch(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[algorithm]\nname = "fedavg"\n\n[algorithm.options]\nlrr = 0.1\n')
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fedhop", "spec", str(bad)],
                          capture_output=True, text=True, timeout=120, env=env(), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}
    assert "fedhop.common.spec" in imported  # -X importtime did report the imports
    assert sorted(m for m in imported if m == "torch" or m.startswith("fedhop.common.algorithms")) == []
    assert lines[-1].endswith("algorithm.options for 'fedavg': lrr: Extra inputs are not permitted (did you mean "
                              "'lr'?)")
