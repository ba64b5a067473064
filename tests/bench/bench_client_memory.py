"""Peak RSS of a client process's data and model loading: every partition (what a client did before it could
load its own alone: ``Workspace.fed``) vs its own partition only (``Workspace.client_data``, what
``fedhop client`` does now). Prints a table.

    .venv/bin/python tests/bench/bench_client_memory.py            # digits (20 clients), synthetic 200k x 100
    .venv/bin/python tests/bench/bench_client_memory.py --samples 1000000

Each measurement runs in a fresh process and reports its own peak RSS (``ru_maxrss``) and the RSS it still
holds once loading is done (what it keeps for the whole run); "import" is a process that imports fedhop and
torch and builds nothing: the floor both modes share. The peak is set by the dataset builder, which still
materialises the whole pool (a partitioner's assignment is global); what a client keeps is its own part.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys  # noqa: E401
import torch
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec
spec, mode = RunSpec.model_validate_json(sys.argv[1]), sys.argv[2]
ws = Workspace(spec, "cpu")
n = 0
if mode == "all":
    ws.fed  # what every process built before: every client's partition and the test set
if mode != "import":
    n = len(ws.client_data("client-0"))
    ws.model
import gc; gc.collect()
now = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")][0] / 1024
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "now_mb": now, "samples": n}))
"""


def measure(spec_json: str, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, spec_json, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200_000, help="synthetic dataset size (train + test)")
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--clients", type=int, default=20)
    a = ap.parse_args()
    from fedhop.common.spec import RunSpec

    cases = {
        "digits": {"dataset": "digits", "partition": "dirichlet"},
        f"synthetic {a.samples:,} x {a.dim}": {"dataset": "synthetic", "partition": "dirichlet",
                                             "options": {"samples": a.samples, "dim": a.dim}},
    }
    print(f"client-0 of {a.clients} clients: peak RSS and RSS held after loading (MB) of one process")
    print("| dataset | import only | before: peak | before: held | now: peak | now: held | held above import, "
          "now / before |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, data in cases.items():
        spec = RunSpec.parse({"device": "cpu", "topology": {"clients": a.clients}, "data": data})
        js = spec.model_dump_json()
        base, before, now = (measure(js, m) for m in ("import", "all", "own"))
        ratio = (now["now_mb"] - base["now_mb"]) / max(before["now_mb"] - base["now_mb"], 1e-9)
        print(f"| {name} | {base['rss_mb']:.0f} | {before['rss_mb']:.0f} | {before['now_mb']:.0f} | "
              f"{now['rss_mb']:.0f} | {now['now_mb']:.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
