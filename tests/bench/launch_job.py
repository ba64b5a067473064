"""The fedhop side of the launch benchmarks, shared by bench_vs_flower.py, bench_memory.py and
bench_tls_rounds.py: the FedAvg job they measure (as a spec), ``fedhop launch`` of a spec in a subprocess,
and the round times read back from the PS log.

The job: FedAvg over ``clients`` clients, scikit-learn digits split IID, MLP 64-h-h-10 (h = 4960: 24,978,570
parameters, the 25M-parameter job), ``steps`` local steps of mini-batch SGD with batch 32 and lr 0.05.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

FEDAVG_JOB = """name = "{name}"
rounds = {rounds}
seed = 0
device = "cpu"

[algorithm]
name = "fedavg"

[algorithm.options]
lr = 0.05
local_steps = {steps}
batch_size = 32

[topology]
clients = {clients}

[data]
dataset = "digits"
partition = "iid"

[model]
name = "mlp"
hidden = [{hidden}, {hidden}]

[transport]
round_deadline_s = 1200.0
join_timeout_s = 600.0
"""


def mlp_params(hidden: int) -> int:
    """Parameters of the MLP 64-h-h-10."""
    return 64 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10


def fedavg_job(hidden: int, clients: int, rounds: int, steps: int = 12, name: str = "bench") -> str:
    """The FedAvg job's spec (TOML)."""
    return FEDAVG_JOB.format(name=name, rounds=rounds, clients=clients, hidden=hidden, steps=steps)


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def log_time(line: str) -> float:
    """The time stamp at the start of a fedhop log line (seconds since the epoch)."""
    m = _LOG_TIME.match(line)
    if not m:
        raise ValueError(f"no timestamp at the start of PS log line {line!r}")
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def round_times(ps_log: str, rounds: int) -> list[float]:
    """Each round's duration from the PS log: between successive "round k/N" lines, round 1 from the last
    child's "is ready"."""
    lines = ps_log.splitlines()
    ready = [log_time(x) for x in lines if " is ready" in x]
    done = [log_time(x) for x in lines if re.search(rf" round \d+/{rounds} ", x)]
    if not ready or len(done) != rounds:
        raise ValueError(f"PS log: expected 'is ready' lines and {rounds} 'round k/{rounds}' lines, found "
                         f"{len(ready)} and {len(done)}")
    marks = [max(ready), *done]
    return [b - a for a, b in zip(marks, marks[1:], strict=False)]


@dataclass
class Launched:
    """One finished ``fedhop launch``: its run folder, results.json, the PS log's round times and the wall-clock
    from starting the launcher to its exit."""

    out: Path
    results: dict[str, Any]
    round_s: list[float]
    wall_s: float

    def payload_bytes(self) -> int:
        return sum(r["payload_bytes"] for r in self.results["links"])

    def message_bytes(self) -> int:
        return sum(r["message_bytes"] for r in self.results["links"])

    def ps_log(self) -> str:
        return (self.out / "logs" / "ps.log").read_text()


def launch(spec: Path, out: Path, *, args: Sequence[str] = (), timeout: float = 7200,
           wrap: Callable[[list[str]], list[str]] | None = None,
           on_start: Callable[[subprocess.Popen], None] | None = None) -> Launched:
    """``fedhop launch SPEC --out OUT --device cpu --quiet ARGS`` (``wrap``: prefixes the command, e.g. to run
    it in a network namespace; ``on_start``: called with the process once started, e.g. to poll its RSS)."""
    cmd = [sys.executable, "-m", "fedhop", "launch", str(spec), "--out", str(out), "--device", "cpu", "--quiet",
           *args]
    t0 = time.perf_counter()
    p = subprocess.Popen(wrap(cmd) if wrap else cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if on_start is not None:
            on_start(p)
        output, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"fedhop launch exited with {p.returncode}:\n{output[-3000:]}")
    results = json.loads((out / "results.json").read_text())
    rounds = len(results["rounds"])
    return Launched(out, results, round_times((out / "logs" / "ps.log").read_text(), rounds), wall)
