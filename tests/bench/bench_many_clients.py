"""Many clients on one machine over real gRPC: ``fedhop launch`` with 10 / 100 / 1,000 clients (FedAvg, a small
MLP, no edges), clients served by client hosts (``fedhop clients``; launch's ``--clients-per-process``, default
auto). Prints a table:

* join: from starting ``fedhop launch`` to the start of round 1 (every process started, every client joined);
* per client: join / clients;
* mean round: the mean of ``round_s`` over the rounds (``rounds.jsonl``);
* PS peak RSS: the launcher process (which is the PS), sampled with psutil every 50 ms;
* hosts: the client processes and the sum of their RSS at its sampled peak;
* in-process round: the in-process engine's mean round on the same spec in this process (the compute floor:
  the same local training and aggregation with no transport).

The baseline, in the same run: 10 clients with ``--clients-per-process 1`` (one ``fedhop client`` process per
client, as before client hosts).

    .venv/bin/python tests/bench/bench_many_clients.py                  # 10, 100, 1000 clients + baseline
    .venv/bin/python tests/bench/bench_many_clients.py --clients 10 100 --baseline 10 30 --per-process auto 64
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from fedhop.common.spec import RunSpec


def spec_for(clients: int, rounds: int) -> RunSpec:
    return RunSpec.parse({
        "name": f"many-{clients}",
        "rounds": rounds,
        "seed": 0,
        "device": "cpu",
        "algorithm": {"name": "fedavg", "options": {"lr": 0.05, "local_steps": 2, "batch_size": 16}},
        "topology": {"clients": clients, "edges": 0},
        "data": {"dataset": "synthetic", "partition": "iid",
                 "options": {"samples": max(4000, 60 * clients), "dim": 20}},
        "model": {"name": "mlp", "hidden": [16]},
        "transport": {"join_timeout_s": 900.0, "round_deadline_s": 600.0},
    })


def _rss(p: psutil.Process) -> int:
    try:
        return int(p.memory_info().rss)
    except psutil.Error:
        return 0


def inprocess_round_s(clients: int, rounds: int) -> float:
    from fedhop.common.engine.inprocess import InProcessEngine

    res = InProcessEngine(spec_for(clients, rounds), device="cpu").run()
    return sum(r["round_s"] for r in res.rounds) / len(res.rounds)


@dataclass
class Row:
    clients: int
    per_process: int
    processes: int
    join_s: float
    mean_round_s: float
    ps_peak_mb: float
    hosts_peak_mb: float
    ok: bool
    inprocess_round_s: float = float("nan")


def run(clients: int, per_process: int, rounds: int, work: Path) -> Row:
    folder = work / f"c{clients}-k{per_process}"
    folder.mkdir()
    spec_file = folder / "spec.toml"
    spec_file.write_text(spec_for(clients, rounds).to_toml())
    out = folder / "run"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "fedhop", "launch", str(spec_file), "--out", str(out),
                             "--device", "cpu", "--quiet", "--clients-per-process", str(per_process)],
                            stdout=subprocess.DEVNULL, stderr=(folder / "launch.err").open("wb"))
    ps = psutil.Process(proc.pid)
    journal = out / "rounds.jsonl"
    ps_peak = hosts_peak = 0.0
    first_end: float | None = None
    children: set[int] = set()
    while proc.poll() is None:
        ps_peak = max(ps_peak, _rss(ps))
        try:
            kids = [k for k in ps.children(recursive=True)  # forked hosts are the fork server's children
                    if "multiprocessing.forkserver" not in " ".join(k.cmdline())]
        except psutil.Error:
            kids = []
        children.update(k.pid for k in kids)
        hosts_peak = max(hosts_peak, sum(_rss(k) for k in kids))
        if first_end is None and journal.is_file() and journal.read_text().strip():
            first_end = time.monotonic()
        time.sleep(0.05)
    rows = [json.loads(line) for line in journal.read_text().splitlines()] if journal.is_file() else []
    join = (first_end - t0 - rows[0]["round_s"]) if first_end is not None and rows else float("nan")
    mean_round = sum(r["round_s"] for r in rows) / len(rows) if rows else float("nan")
    return Row(clients, per_process, len(children), join, mean_round, ps_peak / 2**20, hosts_peak / 2**20,
               proc.returncode == 0 and len(rows) == rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--baseline", type=int, nargs="*", default=[10],
                    help="client counts also run with one process per client")
    ap.add_argument("--per-process", nargs="+", default=["auto"],
                    help="--clients-per-process values for the host runs (each a number or auto; default: auto)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from fedhop.client_ids import resolve_per_process

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-many-") as tmp:
        for n in a.baseline:
            rows.append(run(n, 1, a.rounds, Path(tmp)))
            print(f"  done: {rows[-1]}", file=sys.stderr)
        for n in a.clients:
            for k in dict.fromkeys(resolve_per_process(c, n) for c in a.per_process):
                rows.append(run(n, k, a.rounds, Path(tmp)))
                print(f"  done: {rows[-1]}", file=sys.stderr)
    floors = {n: inprocess_round_s(n, a.rounds) for n in sorted({r.clients for r in rows})}
    print(f"FedAvg, MLP 20-16-10, synthetic iid, {a.rounds} rounds, no edges, real gRPC on loopback; "
          f"load average at the end {psutil.getloadavg()[0]:.1f}")
    print("| clients | clients per process | client processes | join (launch -> round 1) | join per client "
          "| mean round | in-process round | PS peak RSS | client processes' RSS (sum, peak) | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.clients:,} | {r.per_process} | {r.processes} | {r.join_s:.1f} s | "
              f"{1000 * r.join_s / r.clients:.0f} ms | {r.mean_round_s:.2f} s | {floors[r.clients]:.2f} s | "
              f"{r.ps_peak_mb:.0f} MB | {r.hosts_peak_mb:.0f} MB | {'yes' if r.ok else 'NO'} |")


if __name__ == "__main__":
    main()
