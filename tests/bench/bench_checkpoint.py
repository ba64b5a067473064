"""What a checkpoint costs per round, beside the round itself.

    python tests/bench/bench_checkpoint.py [--sizes 1 100] [--rounds 3]

For a ~1 MB and a ~100 MB model (MLP on digits, FedAvg, 4 clients, 12 local steps of batch 32, the Flower
baseline job), the in-process engine runs the same rounds twice in this process: without checkpoints and with
``checkpoint_every = 1`` (the PS's state plus every node's snapshot, written atomically through the codec with
fsync). Printed per model: mean round time without / with, the difference (the checkpoint's cost), bytes
written per checkpoint, and write and read times of one checkpoint on its own.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedhop.common.engine.checkpoint import read_checkpoint, write_checkpoint
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.spec import RunSpec

HIDDEN = {1: [512, 448], 100: [5000, 4900]}  # 266,698 and 24,874,910 parameters (float32)


def spec(mb: int, rounds: int, every: int) -> RunSpec:
    return RunSpec.parse({
        "name": f"ckpt-{mb}", "rounds": rounds, "seed": 0, "device": "cpu", "checkpoint_every": every,
        "algorithm": {"name": "fedavg", "options": {"lr": 0.05, "local_steps": 12, "batch_size": 32}},
        "topology": {"clients": 4}, "data": {"dataset": "digits", "partition": "iid"},
        "model": {"name": "mlp", "hidden": HIDDEN[mb]}})


def round_times(s: RunSpec, folder: Path | None) -> list[float]:
    marks: list[float] = []
    eng = InProcessEngine(s)
    t0 = time.perf_counter()

    def mark(t: int) -> None:
        marks.append(time.perf_counter())

    eng.run(checkpoints=folder, after_commit=mark)
    starts = [t0, *marks[:-1]]
    return [b - a for a, b in zip(starts, marks, strict=True)][1:]  # round 1 includes start-up


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 100], choices=sorted(HIDDEN))
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':>8} {'params':>11} {'round (no ckpt)':>16} {'round (ckpt)':>13} {'cost':>8} "
          f"{'bytes/ckpt':>12} {'write':>8} {'read':>8}")
    for mb in a.sizes:
        base = round_times(spec(mb, a.rounds, 0), None)
        with tempfile.TemporaryDirectory() as d:
            with_ck = round_times(spec(mb, a.rounds, 1), Path(d))
            files = sorted(Path(d).glob("ckpt_*.fhck"))
            size = files[-1].stat().st_size
            eng = InProcessEngine(spec(mb, 1, 0))
            state = {"model": eng.ws.initial_params()}
            t = time.perf_counter()
            write_checkpoint(Path(d) / "one.fhck", {}, state)
            w = time.perf_counter() - t
            t = time.perf_counter()
            read_checkpoint(Path(d) / "one.fhck")
            r = time.perf_counter() - t
        params = sum(v.numel() for v in state["model"].values())
        mb_, mc = statistics.mean(base), statistics.mean(with_ck)
        print(f"{mb:>6}MB {params:>11,} {mb_:>15.3f}s {mc:>12.3f}s {mc - mb_:>7.3f}s {size:>12,} "
              f"{w:>7.3f}s {r:>7.3f}s")


if __name__ == "__main__":
    main()
