"""What the ``links`` event costs the PS with the live page on, per commit, at 10,000 clients.

    python tests/bench/bench_links_event.py [--clients 10000] [--rounds 3] [--rows-per-client 5] [--repeat 3]

After each round's commit the Run emits ``links`` with every meter row so far (common/engine/run.py); with the
live page on, the web process's listener (server/web/proc.py) pickles the event in the emitting thread and its
sender thread writes the frame to the page's child, which unpickles it and feeds its RunStatus. This fills a
:class:`~fedhop.common.wire.meter.ByteMeter` as a networked PS does (per client and round ``--rows-per-client``
rows: the task's request and reply, then a keep-alive each way and the client's Report; bench_commit.py's
shapes) and, after each round, times (median of ``--repeat``):

* rows: ``ByteMeter.rows()``, which the commit reads with or without a page;
* pickle: the listener's ``_encode`` of the event (the PS's emitting thread, holding the GIL), and the frame's
  bytes;
* child: unpickling the frame and the child's RunStatus taking the event and rebuilding its link tables (what a
  page request then reads), in the child's process (niced), here in this one.

The load average before and after is printed.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import time

from fedhop.common.wire.meter import ByteMeter
from fedhop.server.web.proc import _encode
from fedhop.server.web.status import RunStatus

KIND = "fedavg.train"


def fill_round(meter: ByteMeter, clients: list[str], t: int, per_client: int) -> None:
    for c in clients:
        meter.record("ps", c, KIND, "request", 1_066_792, 1_067_020, t)
        meter.record(c, "ps", KIND, "reply", 1_066_792, 1_067_031, t)
        if per_client >= 5:
            meter.record("ps", c, "keepalive", "request", 0, 2, t)
            meter.record(c, "ps", "keepalive", "request", 0, 2, t)
            meter.record(c, "ps", "report", "request", 0, 211, t)


def timed(fn: object, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows-per-client", type=int, choices=(2, 5), default=5)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    meter = ByteMeter()
    clients = [f"client-{i}" for i in range(a.clients)]
    status = RunStatus()
    print(f"{a.clients:,} clients, {a.rows_per_client} rows per client and round; median of {a.repeat}")
    print("| after round | rows | ByteMeter.rows() | pickle (PS) | frame | unpickle + status + tables (child) |")
    print("|---|---|---|---|---|---|")
    for t in range(a.rounds):
        fill_round(meter, clients, t, a.rows_per_client)
        rows_s = timed(meter.rows, a.repeat)
        rows = meter.rows()
        event = ("links", {"rows": rows}, time.monotonic())
        pickle_s = timed(lambda: _encode(event), a.repeat)  # noqa: B023 (used at once)
        frame = _encode(event)

        def child() -> None:
            kind, data, _ = pickle.loads(frame[4:])  # noqa: B023
            status(kind, data)
            status.links()
        child_s = timed(child, a.repeat)
        print(f"| {t + 1} | {len(rows):,} | {rows_s * 1e3:.0f} ms | {pickle_s * 1e3:.0f} ms | "
              f"{len(frame) / 2**20:.1f} MiB | {child_s * 1e3:.0f} ms |")
    print(f"load average (1 min) before / after: {load0:.1f} / {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
