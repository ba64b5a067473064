"""What the PS's commit after a round costs at 10,000 clients, as the rounds go by.

    python tests/bench/bench_commit.py [--clients 10000] [--at 1 5 20] [--repeat 3] [--late 0.01]

A :class:`~fedhop.common.engine.run.Run` with a byte meter filled like a networked run's (per client and round:
the task's request and reply, a keep-alive each way and the client's Report, so 5 rows; ``--late``: that share
of the clients also has a late reply counted in the round before, which changes an older round's rows) commits
every round, as the round loop does, each with a checkpoint (``checkpoint_every = 1``, the default) of a small
model state, written through the codec with fsync into a temporary folder, and a subscriber to the ``links``
event that keeps the rows as the live page's status does (``list(rows)``); the commits after rounds ``--at``
are timed.

The script uses only what every version of fedhop has (``Run``, ``ByteMeter.record``), so the same command run
with another tree first on ``PYTHONPATH`` times that tree's commit (the script's own folder comes first on
``sys.path``, so without ``PYTHONPATH`` it times the installed tree; it prints which):
``PYTHONPATH=/work/main python tests/bench/bench_commit.py`` is the baseline. Printed: the cost of one
``ByteMeter.record`` (the hot path, once per message); per ``--at``, the rows so far and the medians of
``--repeat`` runs of the commit, of its checkpoint and of the checkpoint folder's bytes (checkpoints and meter
files); the end's cumulative bytes per round record after the last (``attach_cumulative_bytes``, in
``Run.finish``); the load average before and after, and the process's peak RSS (the rows a meter keeps between
commits show there).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

import fedhop
from fedhop.common.engine import run as run_module
from fedhop.common.engine.base import MissingLog
from fedhop.common.engine.checkpoint import CheckpointStore
from fedhop.common.engine.results import RoundRecorder, attach_cumulative_bytes
from fedhop.common.engine.run import Run
from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.common.wire.meter import ByteMeter

KIND = "fedavg.train"


def spec(clients: int, rounds: int) -> RunSpec:
    return RunSpec.parse({
        "name": "commit-bench", "rounds": rounds, "seed": 0, "device": "cpu", "checkpoint_every": 1,
        "algorithm": {"name": "fedavg", "options": {"lr": 0.05, "local_steps": 1}},
        "topology": {"clients": clients}, "data": {"dataset": "digits", "partition": "iid"},
        "model": {"name": "mlp", "hidden": [8]}})


def fill_round(meter: ByteMeter, clients: tuple[str, ...], t: int, late: int) -> None:
    """Round ``t``'s rows, as a networked PS counts them; the first ``late`` clients' replies of round t - 1
    arrive now (a late reply: an older round's rows change)."""
    for c in clients:
        meter.record("ps", c, KIND, "request", 1_066_792, 1_067_020, t)
        meter.record(c, "ps", KIND, "reply", 1_066_792, 1_067_031, t)
        meter.record("ps", c, "keepalive", "request", 0, 2, t)
        meter.record(c, "ps", "keepalive", "request", 0, 2, t)
        meter.record(c, "ps", "report", "request", 0, 211, t)
    if t > 0:
        for c in clients[:late]:
            meter.record(c, "ps", KIND, "reply", 1_066_792, 1_067_031, t - 1)


def one_run(clients: int, at: list[int], late_share: float) -> tuple[dict[int, tuple[int, float, float, int]], float]:
    """Rounds 0 .. max(at) - 1, a commit after each; per R in ``at``: (rows, commit s, checkpoint s, bytes); and
    the seconds of the end's cumulative bytes per round record (``attach_cumulative_bytes``) after them."""
    s = spec(clients, max(at))
    topo = build_topology(s.topology, 0)
    meter = ByteMeter()
    kept: list[list[dict[str, Any]]] = []

    def status(kind: str, data: dict[str, Any]) -> None:  # the live page's RunStatus keeps the rows so
        if kind == "links":
            kept[:] = [list(data["rows"])]

    state = {"model": {"w": torch.zeros(1000, 100), "b": torch.zeros(100)}, "round": 0}
    out: dict[int, tuple[int, float, float, int]] = {}
    with tempfile.TemporaryDirectory() as d:
        store = CheckpointStore(Path(d) / "ps")
        run = Run(s, topo, engine="network", meter=meter, missing=MissingLog(), run_id="bench", store=store)
        run.events.subscribe(status)
        run._ctx = SimpleNamespace(comm=SimpleNamespace(last_ok={}))  # type: ignore[assignment]
        run.recorder = RoundRecorder(records=[], journal=None)
        saved: list[float] = []
        real_save = run_module.save

        def timed_save(*a: Any, **k: Any) -> int:
            t0 = time.perf_counter()
            n = real_save(*a, **k)
            saved.append(time.perf_counter() - t0)
            return n

        run_module.save = timed_save  # type: ignore[assignment]
        try:
            late = int(clients * late_share)
            for t in range(max(at)):
                fill_round(meter, topo.clients, t, late)
                run.recorder.records.append({"round": t + 1})
                timed = t + 1 in at
                saved.clear()
                t0 = time.perf_counter()
                run.commit(t, state)
                took = time.perf_counter() - t0
                if timed:
                    files = sorted(store.folder.rglob("*"))
                    size = sum(f.stat().st_size for f in files if f.is_file())
                    out[t + 1] = (len(kept[0]), took, saved[0] if saved else 0.0, size)
        finally:
            run_module.save = real_save  # type: ignore[assignment]
    rows = meter.rows()
    t0 = time.perf_counter()
    attach_cumulative_bytes(run.recorder.records, rows)
    return out, time.perf_counter() - t0


def record_us(clients: int, repeat: int) -> float:
    """Microseconds per ``ByteMeter.record`` (the hot path a meter that keeps its rows adds to): a round's rows
    recorded twice into a fresh meter (new keys, then the same keys again), median of ``repeat``."""
    names = tuple(f"client-{i}" for i in range(clients))
    times = []
    for _ in range(repeat):
        meter = ByteMeter()
        t0 = time.perf_counter()
        fill_round(meter, names, 0, 0)
        fill_round(meter, names, 0, 0)
        times.append((time.perf_counter() - t0) / (10 * clients) * 1e6)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10_000)
    p.add_argument("--at", type=int, nargs="+", default=[1, 5, 20])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--late", type=float, default=0.01, help="share of clients with a late reply each round")
    a = p.parse_args()
    print(f"tree: {Path(fedhop.__file__).resolve().parent}   load average before: {os.getloadavg()}")
    print(f"ByteMeter.record: {record_us(a.clients, a.repeat):.2f} us a call (median of {a.repeat})")
    got = [one_run(a.clients, sorted(a.at), a.late) for _ in range(a.repeat)]
    runs = [r for r, _ in got]
    print(f"{'clients':>8} {'R':>4} {'rows':>10} {'commit s':>9} {'ckpt s':>8} {'ckpt folder bytes':>18}   "
          f"(median of {a.repeat}; commits: {', '.join(f'{r[k][1]:.3f}' for r in runs for k in sorted(r)[-1:])})")
    for r in sorted(a.at):
        rows = runs[0][r][0]
        commit = statistics.median(x[r][1] for x in runs)
        ckpt = statistics.median(x[r][2] for x in runs)
        size = int(statistics.median(x[r][3] for x in runs))
        print(f"{a.clients:>8} {r:>4} {rows:>10,} {commit:>9.3f} {ckpt:>8.3f} {size:>18,}")
    print(f"the end's cumulative bytes per round (attach_cumulative_bytes) after R = {max(a.at)}: "
          f"{statistics.median(f for _, f in got):.3f} s (median of {a.repeat})")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"load average after: {os.getloadavg()}   peak RSS of this process: {rss:,.0f} MiB")


if __name__ == "__main__":
    main()
