"""What the always-on timeline costs (issue 17 section 3: below 1% of a round), beside a round it times.

    python tests/bench/bench_timing_cost.py [--repeat 3] [--rounds 5] [--clients 8] [--edges 2]

A round's timing is a fixed number of calls per node and link (two ``time.perf_counter()`` reads and one
:meth:`Timeline.add` per measured phase), plus, over the network, the serialization of the node's new rows into
its Report. The script

1. runs the in-process engine on a small digits job, counting every ``Timeline.add`` and the rows each round
   adds (the networked engine times the same points: tests/integration/test_timeline.py), and takes the
   median round duration from the ``round_ended`` events;
2. times the primitives alone: ``perf_counter`` pair + ``Timeline.add``, and ``Report`` serialization of one
   round's rows (``report_frame`` + ``SerializeToString``) and its parse + merge on the parent;
3. runs the same job with ``fedhop launch`` (unless ``--no-network``) for its median round;
4. prints calls per round x primitive cost as a share of each engine's round (the in-process engine ships no
   Reports), each the median of ``--repeat`` tries, with the load average before and after (the machine is
   shared: a busy one slows every row alike).

The round is the smallest one fedhop runs (a 16-unit MLP on digits, 2 local steps): real jobs have longer
rounds and the same number of timing calls, so the share printed is an upper bound for this topology.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fedhop.common import timeline as timelines
from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.wire.control import report_frame, timeline_from_pb
from fedhop.v1 import fedhop_pb2 as pb
from tests.specs import DIGITS, run_spec


def spec(rounds: int, clients: int, edges: int) -> Any:
    return run_spec("fedavg", {"lr": 0.1, "local_steps": 2, "batch_size": 16}, clients=clients, edges=edges,
                    name="bench-timing", rounds=rounds, seed=3, data=DIGITS, model={"name": "mlp", "hidden": [16]})


def one_run(rounds: int, clients: int, edges: int) -> tuple[float, float, list[dict[str, Any]]]:
    """(median round seconds, Timeline.add calls per round, the rows of the last round)."""
    calls = [0]
    original = timelines.Timeline.add

    def counting(self: timelines.Timeline, *a: Any, **kw: Any) -> None:
        calls[0] += 1
        original(self, *a, **kw)

    durations: list[float] = []
    events = RunEvents()
    events.subscribe(lambda k, d: durations.append(d["duration_s"]) if k == "round_ended" and d["round"] >= 0
                     else None)
    engine = InProcessEngine(spec(rounds, clients, edges))
    timelines.Timeline.add = counting  # type: ignore[method-assign]
    try:
        engine.run(events=events)
    finally:
        timelines.Timeline.add = original  # type: ignore[method-assign]
    rows = engine.timeline.rows()
    last = max(r["round"] for r in rows)
    return statistics.median(durations), calls[0] / (rounds + 1), [r for r in rows if r["round"] == last]


def network_round(rounds: int, clients: int, edges: int) -> float:
    """Median round seconds of ``fedhop launch`` (PS here, edges and client hosts as processes) on the same job,
    read from its timeline.csv (the PS's ``round`` rows)."""
    from fedhop.launch import launch

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        launch(spec(rounds, clients, edges), out, device="cpu")
        rows = timelines.read_csv(out / "timeline.csv")
    return statistics.median(r["seconds"] for r in rows if r["phase"] == "round" and r["round"] >= 1)


def primitive_add(n: int = 100_000) -> float:
    """Seconds of one timed phase: two perf_counter reads and one Timeline.add."""
    t = timelines.Timeline()
    t0 = time.perf_counter()
    for i in range(n):
        began = time.perf_counter()
        t.add(0, "client-0", "busy", time.perf_counter() - began, peer="" if i % 2 else "edge-0")
    return (time.perf_counter() - t0) / n


def primitive_report(rows: list[dict[str, Any]], n: int = 2000) -> float:
    """Seconds to put one round's rows in a Report, serialize it, parse it and merge it on the parent."""
    parent = timelines.Timeline()
    t0 = time.perf_counter()
    for _ in range(n):
        data = report_frame([], [], 0, rows).SerializeToString()
        parent.merge(timeline_from_pb(pb.Frame.FromString(data).report.timeline))
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--edges", type=int, default=2)
    ap.add_argument("--no-network", action="store_true", help="skip the fedhop launch rows")
    args = ap.parse_args()
    load0 = os.getloadavg()
    runs = [one_run(args.rounds, args.clients, args.edges) for _ in range(args.repeat)]
    round_s = statistics.median(r[0] for r in runs)
    per_round = statistics.median(r[1] for r in runs)
    rows = runs[-1][2]
    add_s = statistics.median(primitive_add() for _ in range(args.repeat))
    report_s = statistics.median(primitive_report(rows) for _ in range(args.repeat))
    net_s = None if args.no_network else \
        statistics.median(network_round(args.rounds, args.clients, args.edges) for _ in range(args.repeat))
    load1 = os.getloadavg()
    timed = per_round * add_s
    # over the network each node sends its own rows and its children's once per round, and the PS parses and
    # merges them all: counted here as every row of a round shipped once, in one Report
    shipped = report_s
    print(f"fedavg, digits, MLP[16], {args.clients} clients, {args.edges} edges, {args.rounds} rounds; "
          f"median of {args.repeat}")
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f}\n")
    print(f"{'what':<52} {'seconds':>12} {'share of a round':>17}")
    print(f"{'a round (in-process engine, timing on)':<52} {round_s:>12.6f} {'100%':>17}")
    print(f"{'one timed phase (2 perf_counter + Timeline.add)':<52} {add_s:>12.9f} {'':>17}")
    print(f"{f'timed phases per round: {per_round:.0f}':<52} {timed:>12.9f}")
    print(f"{f'one round of rows ({len(rows)}) in a Report, parsed, merged':<52} {shipped:>12.9f}")
    print(f"{'in-process: timed phases (no Reports there)':<52} {timed:>12.9f} {timed / round_s:>16.3%}")
    if net_s is not None:
        print(f"\n{'a round (fedhop launch, timing on)':<52} {net_s:>12.6f} {'100%':>17}")
        print(f"{'networked: timed phases + one round of rows shipped':<52} {timed + shipped:>12.9f} "
              f"{(timed + shipped) / net_s:>16.3%}")


if __name__ == "__main__":
    main()
