"""What the message layer (issue 16: ``submit`` / ``collect``, peer links, arrival order) costs on the existing
paths: the 25M-parameter FedAvg round and the 256 MB transfer, before and after, in the same run.

    python tests/bench/bench_message_layer.py --before /work/wt/before [--after .] [--reps 3]

``--before`` is a checkout of the tree without the message layer (e.g. ``git worktree add /work/wt/before
2d108c1``), ``--after`` the tree under test (default: this one). Both trees run the same benchmarks, each as its
own subprocess with ``PYTHONPATH`` and the working directory set to the tree (two trees cannot share a process:
both are the package ``fedhop``), alternately (before, after, after, before, before, after, ...) so that a change
of the machine's load hits both alike:

* ``round``: ``tests/bench/bench_round_breakdown.py``'s ``fedavg-25M`` case (``fedhop launch``, 4 clients, an MLP
  of 25M parameters, 12 local steps of batch 32), its mean round wall time over ``--rounds`` rounds (the
  benchmark's compute floor is not run: it measures no transport), and two of its parts, per client and round
  (mean over the clients): ``compute`` (the local training: no message code, so a yardstick of the load) and
  ``moving`` (down + up: the model from the PS's send to the client holding all of it, and the update from the
  handler's return to the PS holding all of it: what the message layer could slow);
* ``down`` / ``up``: ``tests/bench/bench_transfer.py --mb 256``: one scatter pushing a 256 MiB bundle PS ->
  client, and one reply bringing it back, over gRPC on the loopback (best of ``--transfer-reps`` within a run),
  beside the raw TCP socket of the same run (the load's yardstick).

Prints every run and then, per measure and tree, the median over ``--reps`` runs and the after / before ratio,
with the load average before and after. ``--round-case`` picks a smaller case of bench_round_breakdown.py
(``focus-1MB``, ...) where the machine is too loaded for the 25M one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROUND_SNIPPET = """
import json, sys, statistics
from pathlib import Path
sys.path.insert(0, "tests/bench")
import bench_round_breakdown as b
walls, parts = b.breakdown(b.run_case(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
c = parts["client"]
print(json.dumps({"round": statistics.mean(walls), "compute": c["compute"], "moving": c["down"] + c["up"]}))
"""


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def run_round(tree: Path, case: str, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fedhop-msglayer-") as work:
        done = subprocess.run([sys.executable, "-c", ROUND_SNIPPET, case, str(rounds), work], cwd=tree,
                              env=_env(tree), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: the round benchmark exited with {done.returncode}:\n{done.stderr[-3000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    out = {k: float(got[k]) for k in ("round", "compute", "moving")}
    # the load moves the whole round; measured against the same run's local training it mostly cancels
    return {**out, "round/compute": out["round"] / out["compute"], "moving/compute": out["moving"] / out["compute"]}


def run_transfer(tree: Path, mb: int, reps: int) -> dict[str, float]:
    script = tree / "tests/bench/bench_transfer.py"
    # older trees took --no-ablation; since issue 19 the ablation rows are opt-in (--ablation) and it is gone
    extra = ["--no-ablation"] if "--no-ablation" in script.read_text() else []
    done = subprocess.run([sys.executable, "tests/bench/bench_transfer.py", "--mb", str(mb), "--reps", str(reps),
                           "--chunk-mib", "1", "--no-lane", *extra], cwd=tree, env=_env(tree),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: the transfer benchmark exited with {done.returncode}:\n{done.stderr[-3000:]}")
    out: dict[str, float] = {}
    for line in done.stdout.splitlines():
        row = _transfer_row(line)
        if row is None:
            continue
        name, seconds = row
        key = ("tcp" if name.startswith("raw TCP socket") or name == "raw TCP (sendall / recv_into)"
               else "down" if "scatter PS -> client" in name else "up" if "reply client -> PS" in name else None)
        if key:
            out[key] = seconds
    if set(out) != {"tcp", "down", "up"}:
        raise RuntimeError(f"{tree}: could not read the transfer table:\n{done.stdout}")
    return out


def _transfer_row(line: str) -> tuple[str, float] | None:
    """(path, seconds) of a plaintext row of bench_transfer.py's table, in either of its layouts: the markdown one
    (| path | security | seconds | MB/s | ...; issue 19 on) or the older fixed columns (path in 40 characters, then
    chunk, seconds, MB/s, vs TCP)."""
    if line.startswith("|"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or cells[1] != "plain":
            return None
        try:
            return cells[0], float(cells[2])
        except ValueError:
            return None
    name, cols = line[:40].strip(), line[40:].split()
    if len(cols) < 3:
        return None
    try:
        return name, float(cols[-3])
    except ValueError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="the tree without the message layer")
    ap.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[2], help="the tree under test")
    ap.add_argument("--reps", type=int, default=3, help="runs per tree (the table shows their median)")
    ap.add_argument("--round-case", default="fedavg-25M", help="bench_round_breakdown.py case")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per round-benchmark run")
    ap.add_argument("--mb", type=int, default=256, help="transfer size in MiB")
    ap.add_argument("--transfer-reps", type=int, default=3, help="transfers per transfer-benchmark run (best of)")
    ap.add_argument("--skip", choices=["round", "transfer"], action="append", default=[])
    a = ap.parse_args()
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    for name, tree in trees.items():
        if not (tree / "tests/bench/bench_round_breakdown.py").is_file():
            ap.error(f"--{name} {tree} is not a fedhop checkout")
    print(f"before = {trees['before']}\nafter  = {trees['after']}\nload average at start {load()}, "
          f"{os.cpu_count()} CPUs", flush=True)
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for rep in range(a.reps):
        order = ("before", "after") if rep % 2 == 0 else ("after", "before")
        for which in order:
            got: dict[str, float] = {}
            if "round" not in a.skip:
                got.update(run_round(trees[which], a.round_case, a.rounds))
            if "transfer" not in a.skip:
                got.update(run_transfer(trees[which], a.mb, a.transfer_reps))
            results[which].append(got)
            print(f"run {rep + 1} {which:6s} " + "  ".join(f"{k} {v:.3f}" for k, v in got.items())
                  + f"  (load {load()})", flush=True)
    keys = list(results["after"][0])
    label = {"round": f"{a.round_case} mean round ({a.rounds} rounds)",
             "compute": f"{a.round_case}: a client's local training per round (load yardstick)",
             "moving": f"{a.round_case}: a client's model down + update up per round (the message path)",
             "round/compute": f"{a.round_case}: round / compute (ratio, load-normalized)",
             "moving/compute": f"{a.round_case}: moving / compute (ratio, load-normalized)",
             "down": f"{a.mb} MiB scatter PS -> client", "up": f"{a.mb} MiB reply client -> PS",
             "tcp": f"{a.mb} MiB raw TCP (yardstick)"}
    print(f"\nmedian of {a.reps} runs per tree: seconds, or a ratio where the measure says so; load average at "
          f"the end {load()}\n")
    print("| measure | before | after | after / before |\n|---|---:|---:|---:|")
    for k in keys:
        b = statistics.median(r[k] for r in results["before"])
        af = statistics.median(r[k] for r in results["after"])
        print(f"| {label[k]} | {b:.3f} | {af:.3f} | {af / b:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
