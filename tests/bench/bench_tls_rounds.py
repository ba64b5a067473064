"""What the credentials cost a whole job: the issue's jobs launched with plaintext links, mutual TLS and tokens
over TLS (``fedhop launch``: PS, edges and clients as separate processes on loopback), all in one run.

    python tests/bench/bench_tls_rounds.py [--jobs fedavg-25m fedchs] [--rounds 3] [--reps 1]

Jobs:

* ``fedavg-25m``: the 25M-parameter FedAvg job of bench_vs_flower.py / bench_memory.py (4 clients, digits IID,
  MLP 64-4960-4960-10 = 24,978,570 parameters, 12 local steps of batch 32; ``--hidden`` changes the width);
* ``fedchs``: Fed-CHS over 4 edge servers on a ring, 8 clients (2 per edge), digits IID, MLP 64-200-200-10
  (55,210 parameters), K = 20 interactions per round: per round 20 x 2 x 2 model-sized messages between the
  active edge and its clients, and one edge -> edge hand-off.

Prints per job and mode: the median round time (the PS log's, rounds 2.. so that the first round's warm-up is
left out), the run's payload and message bytes (the byte meter: equal in every mode, since TLS sits below the
messages) and the ratios to plaintext. The modes take turns within each repetition; with ``--reps`` > 1 the
best median per mode counts. Wire bytes with TLS (record headers) are the testbed's to measure
(``fedhop compose-run``, ``deploy/netns.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launch_job import fedavg_job, launch, mlp_params

MODES = ("plaintext", "mutual TLS", "tokens")

FEDCHS_JOB = """name = "bench-tls-fedchs"
rounds = {rounds}
seed = 0
device = "cpu"

[algorithm]
name = "fedchs"

[algorithm.options]
K = 20
batch_size = 32

[topology]
clients = 8
edges = 4
edge_graph = "ring"

[data]
dataset = "digits"
partition = "iid"

[model]
name = "mlp"
hidden = [200, 200]

[transport]
round_deadline_s = 1200.0
join_timeout_s = 600.0
"""


@dataclass
class Job:
    name: str
    describe: str
    spec: str


@dataclass
class Measured:
    round_s: float
    payload: int
    message: int


def fedhop(*args: str) -> None:
    p = subprocess.run([sys.executable, "-m", "fedhop", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"fedhop {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")


def jobs(rounds: int, hidden: int) -> dict[str, Job]:
    return {
        "fedavg-25m": Job("fedavg-25m", f"FedAvg, 4 clients, MLP 64-{hidden}-{hidden}-10 ({mlp_params(hidden):,} "
                                        "parameters), 12 local steps",
                          fedavg_job(hidden, 4, rounds, name="bench-tls-fedavg")),
        "fedchs": Job("fedchs", f"Fed-CHS, 4 edges (ring) x 2 clients, MLP 64-200-200-10 ({mlp_params(200):,} "
                                "parameters), K = 20", FEDCHS_JOB.format(rounds=rounds)),
    }


def measure(job: Job, mode: str, work: Path, tag: str) -> Measured:
    sec = {"plaintext": [], "mutual TLS": ["--tls", str(work / "certs")],
           "tokens": ["--tls", str(work / "certs"), "--token", str(work / "tokens.toml")]}[mode]
    run = launch(work / "spec.toml", work / f"run-{tag}", args=("--http", "off", *sec))
    times = run.round_s[1:] or run.round_s
    return Measured(statistics.median(times), run.payload_bytes(), run.message_bytes())


def load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", nargs="+", choices=["fedavg-25m", "fedchs"], default=["fedavg-25m", "fedchs"])
    ap.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3; round 1 is left out)")
    ap.add_argument("--hidden", type=int, default=4960, help="width of fedavg-25m's two hidden layers")
    ap.add_argument("--reps", type=int, default=1, help="runs per mode, taking turns; the best median counts")
    a = ap.parse_args()
    if a.rounds < 2 or a.reps < 1 or a.hidden < 1:
        ap.error("--rounds must be at least 2 (round 1 is left out), --reps and --hidden at least 1")
    print(f"load average at the start: {load()} ({os.cpu_count()} CPUs)", file=sys.stderr, flush=True)
    table: dict[str, dict[str, Measured]] = {}
    all_jobs = jobs(a.rounds, a.hidden)
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as d:
        for name in a.jobs:
            job, work = all_jobs[name], Path(d) / name
            work.mkdir()
            (work / "spec.toml").write_text(job.spec)
            fedhop("certs", "init", str(work / "spec.toml"), "--out", str(work / "certs"))
            fedhop("tokens", "init", str(work / "spec.toml"), "--out", str(work / "tokens.toml"))
            best: dict[str, Measured] = {}
            for rep in range(a.reps):
                for mode in MODES:
                    print(f"{name}: {mode} (rep {rep + 1}/{a.reps}); load average {load()}", file=sys.stderr,
                          flush=True)
                    got = measure(job, mode, work, f"{mode.replace(' ', '-')}-{rep}")
                    if mode not in best or got.round_s < best[mode].round_s:
                        best[mode] = got
            table[name] = best
    print(f"{a.rounds} rounds per run (median of rounds 2-{a.rounds}), loopback, {a.reps} run(s) per mode; "
          f"load average at the end {load()} ({os.cpu_count()} CPUs)")
    print("| job | mode | round s (median) | ratio | payload B | message B | message ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, best in table.items():
        base = best["plaintext"]
        for mode in MODES:
            r = best[mode]
            print(f"| {all_jobs[name].describe if mode == 'plaintext' else ''} | {mode} | {r.round_s:.3f} | "
                  f"{r.round_s / base.round_s:.2f} | {r.payload:,} | {r.message:,} | {r.message / base.message:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
