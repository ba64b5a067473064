"""Benchmark of the web face's read side (server/web): what one event and one page update cost as a run grows.

    .venv/bin/python tests/bench/bench_web_status.py                # 100 clients / 10 edges, up to 1000 rounds

A synthetic FedAvg-over-edges run: every round, each client exchanges a request and a reply with its edge and
each edge with the PS, so the meter holds 4 x (clients + edges) rows per round, and the PS emits all rows
so far after every round (as the ``links`` event does). For growing round counts it prints the time of:
  links event   RunStatus handling one ``links`` event (copying the rows)
  tables        building the per-link summary and per-round byte prefix (once per links event, cached)
  /api/rounds   every round record with its cumulative bytes
  SSE update    one feed message to a connected page after a round (new round, links table, status)
  /metrics      one Prometheus scrape
beside ``attach_cumulative_bytes`` (results.py: the end-of-run computation of the same cumulative column) as
the baseline, in the same run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import generate_latest

from fedhop.common.engine.results import attach_cumulative_bytes
from fedhop.common.spec import RunSpec
from fedhop.server.web.feed import Cursor, next_message
from fedhop.server.web.metrics import make_registry
from fedhop.server.web.status import RunStatus


def rows_for(round_idx: int, clients: int, edges: int) -> list[dict[str, Any]]:
    out = []
    for c in range(clients):
        e = f"edge-{c % edges}"
        for src, dst, phase in ((e, f"client-{c}", "request"), (f"client-{c}", e, "reply")):
            out.append({"src": src, "dst": dst, "kind": "fedavg.train", "phase": phase, "round": round_idx,
                        "messages": 1, "payload_bytes": 40_000, "message_bytes": 40_210})
    for m in range(edges):
        for src, dst, phase in (("ps", f"edge-{m}", "request"), (f"edge-{m}", "ps", "reply")):
            out.append({"src": src, "dst": dst, "kind": "edge.round", "phase": phase, "round": round_idx,
                        "messages": 1, "payload_bytes": 40_000, "message_bytes": 40_190})
    return out


def best(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def measure(n: int, spec: RunSpec, clients: int, edges: int, reps: int) -> None:
    st = RunStatus()
    st("run_started", {"run_id": "b", "spec": spec, "nodes": None, "resumed_at": 0})
    rows: list[dict[str, Any]] = []
    for t in range(n):
        st("round_ended", {"round": t, "record": {"round": t + 1, "accuracy": 0.5, "loss": 1.0}, "duration_s": 1.0})
        rows += rows_for(t, clients, edges)
    st("links", {"rows": rows})
    cur = Cursor()
    next_message(st, cur)
    registry = make_registry(st)

    def event() -> None:
        st("links", {"rows": rows})

    def tables() -> None:
        st("links", {"rows": rows})
        st.links()

    def sse() -> None:  # a page that has seen everything but the last round, after a links event
        st("links", {"rows": rows})
        c = Cursor(**{**cur.__dict__, "rounds": n - 1, "route": 0, "cumulative": list(cur.cumulative[:-1])})
        next_message(st, c)

    records = [{"round": t + 1} for t in range(n)]
    t_event = best(event, reps)
    t_tables = best(tables, reps) - t_event
    t_rounds = best(st.rounds, reps)
    t_sse = best(sse, reps)
    t_metrics = best(lambda: generate_latest(registry), reps)
    t_base = best(lambda: attach_cumulative_bytes(records, rows), 1 if n >= 1000 else reps)
    print(f"{n:7d} {len(rows):8d} {t_event:12.2f} {t_tables:8.2f} {t_rounds:12.2f} {t_sse:11.2f} "
          f"{t_metrics:9.2f} {t_base:18.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--edges", type=int, default=10)
    ap.add_argument("--rounds", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    spec = RunSpec.model_validate({"algorithm": {"name": "fedavg"}, "rounds": max(a.rounds),
                                   "topology": {"clients": a.clients, "edges": a.edges}})
    print(f"{a.clients} clients, {a.edges} edges; times in ms (best of {a.reps})")
    print(f"{'rounds':>7s} {'rows':>8s} {'links event':>12s} {'tables':>8s} {'/api/rounds':>12s} "
          f"{'SSE update':>11s} {'/metrics':>9s} {'attach_cum (base)':>18s}")
    for n in a.rounds:
        measure(n, spec, a.clients, a.edges, a.reps)


if __name__ == "__main__":
    main()
