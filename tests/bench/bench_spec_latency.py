"""How long a bad spec takes to report, in a fresh interpreter (issue 15: under 1 s), beside ``import torch``.

    python tests/bench/bench_spec_latency.py [--repeat 3]

Each command runs ``--repeat`` times in a new ``python`` process (the one running this script, with this
checkout first on ``PYTHONPATH``); the table gives the median and the spread of the wall-clock times, and the
load average before and after (the machine is shared: a busy one makes every row slower alike). Rows:

- ``import torch``: the baseline a spec check used to pay;
- ``fedhop spec BAD.toml``: the CLI on a spec with a typo in ``[algorithm.options]`` (exit code 2);
- ``fedhop spec``: the CLI printing the default spec, every option filled in;
- ``fedhop spec --set``: the default spec with a ``--set`` key that does not exist (exit code 2);
- ``RunSpec.load(BAD.toml)``: the library path alone (import the RunSpec, validate, report);
- ``import fedhop.common.spec``: the import alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BAD = '[algorithm]\nname = "fedavg"\n\n[algorithm.options]\nlrr = 0.1\n'


def commands(bad: Path) -> list[tuple[str, list[str], int]]:
    py = sys.executable
    load = (f"from fedhop.common.spec import RunSpec, SpecError\ntry:\n    RunSpec.load({str(bad)!r})\n"
            "except SpecError as e:\n    print(e)\n")
    return [
        ("import torch", [py, "-c", "import torch"], 0),
        ("fedhop spec BAD.toml", [py, "-m", "fedhop", "spec", str(bad)], 2),
        ("fedhop spec", [py, "-m", "fedhop", "spec"], 0),
        ("fedhop spec --set", [py, "-m", "fedhop", "spec", "--set", "algorithm.options.lrr=0.1"], 2),
        ("RunSpec.load(BAD.toml)", [py, "-c", load], 0),
        ("import fedhop.common.spec", [py, "-c", "import fedhop.common.spec"], 0),
    ]


def time_once(cmd: list[str], want_rc: int, env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    dt = time.perf_counter() - t0
    if proc.returncode != want_rc:
        raise SystemExit(f"{' '.join(cmd)}: exit code {proc.returncode}, expected {want_rc}\n{proc.stderr[-2000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "BAD.toml"
        bad.write_text(BAD)
        load_before = os.getloadavg()
        rows = []
        for name, cmd, rc in commands(bad):
            times = [time_once(cmd, rc, env, Path(tmp)) for _ in range(args.repeat)]
            rows.append((name, statistics.median(times), min(times), max(times)))
        load_after = os.getloadavg()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; load average (1, 5, 15 min) before "
          f"{' '.join(f'{x:.2f}' for x in load_before)}, after {' '.join(f'{x:.2f}' for x in load_after)}")
    print(f"{'command (fresh interpreter)':<28} {'median s':>9} {'min s':>7} {'max s':>7}  (n = {args.repeat})")
    for name, med, lo, hi in rows:
        print(f"{name:<28} {med:>9.3f} {lo:>7.3f} {hi:>7.3f}")


if __name__ == "__main__":
    main()
