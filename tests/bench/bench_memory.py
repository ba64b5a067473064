"""Peak RSS of the PS and of a client against the model size, on a real ``fedhop launch`` FedAvg job.

    .venv/bin/python tests/bench/bench_memory.py                       # 25M-parameter MLP (100 MB), 4 clients
    .venv/bin/python tests/bench/bench_memory.py --hidden 16000 --clients 2 --rounds 2   # a ~1 GB model

The job is the one of ``bench_vs_flower.py`` (FedAvg, digits IID, MLP 64-h-h-10, 12 local steps of batch 32)
with ``rounds`` rounds. psutil polls every process of the run (the launcher, which is the PS, and its
children) every 20 ms and keeps each one's RSS over time. Per process:

* **idle**: its RSS just before round 1 starts (the PS log's last "is ready" line): the process with its data
  loaded and its model built, before the first bundle travels (the issue's "idle process");
* **peak**: its largest RSS during the run;
* **(peak - idle) / model**: how many models' worth of memory the run adds on top of the idle process. The
  target (issue 11) is peak <= 3 x model + idle, i.e. this ratio <= 3.

Also printed: the RSS of a process that only imports fedhop and torch (the floor under every idle figure) and
(idle - import) / model, the copies a process holds before the run starts. Other processes on the machine do
not change RSS figures (unlike timings), but the 20 ms polling can miss a short spike: figures are lower bounds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from launch_job import fedavg_job, launch, log_time, mlp_params

IMPORT_ONLY = ("import fedhop.transport.child, fedhop.server.main, torch, gc; gc.collect(); "
               "print([int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmRSS:')][0] * 1024)")


def role_of(cmd: list[str]) -> str:
    cmd = " ".join(cmd).split()  # a forked child's title (fedhop/forkstart.py) is one string
    if cmd[1:3] == ["-m", "fedhop"] and len(cmd) > 3:
        return {"launch": "ps", "client": "client", "edge": "edge", "clients": "clients"}.get(cmd[3], "")
    return ""


@dataclass
class Poller:
    """RSS over time of a root process and its descendants: pid -> (role, [(time, rss)])."""

    root: psutil.Process
    every_s: float = 0.02
    series: dict[int, tuple[str, list[tuple[float, int]]]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Poller:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                procs = [self.root, *self.root.children(recursive=True)]  # the PS (launcher), its nodes
            except psutil.NoSuchProcess:
                continue
            now = time.time()
            for p in procs:
                try:
                    if p.pid not in self.series:
                        # a child forked by the launcher shows the launcher's command line until it execs
                        role = "ps" if p.pid == self.root.pid else role_of(p.cmdline())
                        if not role or role == "ps" and p.pid != self.root.pid:
                            continue
                        self.series[p.pid] = (role, [])
                    self.series[p.pid][1].append((now, p.memory_info().rss))
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Row:
    role: str
    idle: int
    peak: int


def run_job(hidden: int, clients: int, rounds: int, steps: int, work: Path, timeout: float,
            trace: Path | None = None) -> tuple[list[Row], float]:
    spec = work / "spec.toml"
    spec.write_text(fedavg_job(hidden, clients, rounds, steps, name="bench-memory"))
    pollers: list[Poller] = []
    try:
        run = launch(spec, work / "run", args=("--http", "off"), timeout=timeout,
                     on_start=lambda p: pollers.append(Poller(psutil.Process(p.pid)).start()))
    finally:
        for poller in pollers:
            poller.stop()
    log = run.ps_log().splitlines()
    ready = max(log_time(x) for x in log if " is ready" in x)
    rows = []
    for role, series in pollers[0].series.values():
        before = [rss for t, rss in series if t <= ready]
        if not before:
            continue
        rows.append(Row(role, before[-1], max(rss for _, rss in series)))
    if trace is not None:  # RSS over time per process, with the PS log's round marks
        marks = [(log_time(x), x[24:].strip()) for x in log if " round " in x or " is ready" in x]
        trace.write_text(json.dumps({"marks": marks, "series": {f"{role}-{pid}": s for pid, (role, s)
                                                                 in pollers[0].series.items()}}))
    return rows, run.results["wall_s"] / rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=4960, help="MLP width h (4960: 24,978,570 parameters)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12, help="local steps per round")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--trace", type=Path, help="write every process's RSS over time (JSON) to this file")
    a = ap.parse_args()
    if min(a.hidden, a.clients, a.rounds, a.steps) < 1:
        ap.error("--hidden, --clients, --rounds and --steps must be at least 1")
    model = mlp_params(a.hidden) * 4
    floor = int(subprocess.run([sys.executable, "-c", IMPORT_ONLY], capture_output=True, text=True,
                               check=True).stdout.strip().splitlines()[-1])
    with tempfile.TemporaryDirectory(prefix="fedhop-bench-memory-") as tmp:
        rows, mean_round = run_job(a.hidden, a.clients, a.rounds, a.steps, Path(tmp), a.timeout, a.trace)
    mb = 1 << 20
    print(f"FedAvg, MLP h={a.hidden}: {mlp_params(a.hidden):,} parameters, model {model / mb:.1f} MiB; "
          f"{a.clients} clients, {a.rounds} rounds, mean round {mean_round:.2f} s; import-only process "
          f"{floor / mb:.0f} MiB")
    print("| process | idle MiB | peak MiB | (idle - import) / model | (peak - idle) / model | target <= 3 |")
    print("|---|---:|---:|---:|---:|---|")
    for r in sorted(rows, key=lambda r: (r.role != "ps", r.role)):
        extra = (r.peak - r.idle) / model
        print(f"| {r.role} | {r.idle / mb:.0f} | {r.peak / mb:.0f} | {(r.idle - floor) / model:.2f} | {extra:.2f} | "
              f"{'met' if extra <= 3 else 'not met'} |")


if __name__ == "__main__":
    main()
