"""What the ``links`` event costs the PS with the live page on, per commit, at 10,000 clients.

    python tests/bench/bench_links_event.py [--clients 10000] [--rounds 3] [--rows-per-client 5] [--repeat 3]
    python tests/bench/bench_links_event.py --memory --rounds 5     # the PS's memory per meter key
    python tests/bench/bench_links_event.py --write --rounds 8      # the run folder's links.csv and results.json
    python tests/bench/bench_links_event.py --feed                  # the per-link table in a live page's message

After each round's commit the Run emits ``links`` with every meter row so far and the rounds whose rows changed
(common/engine/run.py); with the live page on, the web process's listener (server/web/proc.py) pickles the
event in the emitting thread and its sender thread writes the frame to the page's child, which unpickles it and
feeds its RunStatus. The frame carried every row until the eleventh session of issue 19; now it carries the
changed rounds and the child rebuilds every row from them (RoundRows). Both are timed in the same run. This fills a
:class:`~fedhop.common.wire.meter.ByteMeter` as a networked PS does (per client and round ``--rows-per-client``
rows: the task's request and reply, then a keep-alive each way and the client's Report; bench_commit.py's
shapes) and, after each round, times (median of ``--repeat``):

* rows: ``ByteMeter.rows()``, which the commit reads with or without a page;
* pickle: the listener's ``_encode`` of the event (the PS's emitting thread, holding the GIL), and the frame's
  bytes: every row / the rounds changed;
* child: unpickling the frame (and, now, rebuilding every row from the changed rounds) and the child's RunStatus
  taking the event and rebuilding its link tables (what a page request then reads; apart: without them), in the
  child's process (niced), here in this one.

The load average before and after is printed.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import time

from fedhop.common.wire.meter import ByteMeter, RoundRows
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


def memory(clients: int, rounds: int, per_client: int) -> None:
    """RSS per meter key: a meter filled as the PS's, its row cache built (what the PS holds per row)."""
    import gc

    import psutil

    gc.collect()
    before = psutil.Process().memory_info().rss
    meter = ByteMeter()
    ids = [f"client-{i}" for i in range(clients)]
    for t in range(rounds):
        fill_round(meter, ids, t, per_client)
        meter.rows()
    gc.collect()
    grown = psutil.Process().memory_info().rss - before
    print(f"{len(meter.counts):,} meter keys ({clients:,} clients x {per_client} rows x {rounds} rounds): "
          f"{grown / 2**20:.0f} MiB, {grown / len(meter.counts):.0f} B per key")


def write(clients: int, rounds: int, per_client: int, repeat: int) -> None:
    """The end of a run: links.csv and results.json of a result with the filled meter's rows, the way before
    (every row copied with its file round, results.json's whole text built by ``json.dumps(indent=1)``) and now
    (``RunResult.write_json``, rows converted as written): time (median of ``repeat``) and the peak of memory
    allocated above the start (tracemalloc, one more run each)."""
    import dataclasses
    import json
    import tempfile
    import tracemalloc
    from pathlib import Path

    from fedhop.common.engine.inprocess import InProcessEngine
    from fedhop.common.engine.results import LINKS_HEADER, _csv, file_links
    from fedhop.common.spec import RunSpec

    small = RunSpec.model_validate({"name": "write", "rounds": 1, "algorithm": {"name": "fedavg"},
                                    "topology": {"clients": 2, "edges": 0}, "model": {"name": "mlp", "hidden": [4]}})
    meter = ByteMeter()
    ids = [f"client-{i}" for i in range(clients)]
    for t in range(rounds):
        fill_round(meter, ids, t, per_client)
    result = dataclasses.replace(InProcessEngine(small).run(), links=meter.rows())
    folder = Path(tempfile.mkdtemp())

    def before() -> None:
        _csv(folder / "links.csv", file_links(result.links), LINKS_HEADER)
        (folder / "results.json").write_text(json.dumps({**result.to_json(), "provenance": {}}, indent=1))

    def now() -> None:
        _csv(folder / "links.csv", ({**r, "round": r["round"] + 1} for r in result.links), LINKS_HEADER)
        result.write_json(folder / "results.json", provenance={})

    load0 = os.getloadavg()[0]
    print(f"{len(result.links):,} rows ({clients:,} clients x {per_client} x {rounds} rounds); median of {repeat}")
    print("| way | links.csv + results.json | peak allocated above the start |")
    print("|---|---|---|")
    for name, fn in (("before: whole text in memory", before), ("now: written as it goes", now)):
        seconds = timed(fn, repeat)
        tracemalloc.start()
        fn()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"| {name} | {seconds:.2f} s | {peak / 2**20:.0f} MiB |")
    print(f"load average (1 min) before / after: {load0:.1f} / {os.getloadavg()[0]:.1f}")


def feed(clients: int, rounds: int, per_client: int, repeat: int) -> None:
    import json

    from fedhop.server.web.feed import page_links

    load0 = os.getloadavg()[0]
    meter = ByteMeter()
    names = [f"client-{i}" for i in range(clients)]
    for t in range(rounds):
        fill_round(meter, names, t, per_client)
    status = RunStatus()
    status("links", {"rows": meter.rows()})
    summary = status.links()
    print(f"{clients:,} clients, {rounds} rounds: {len(summary['links']):,} links, {len(summary['by_kind']):,} "
          f"(link, kind, phase) entries; median of {repeat}")
    print("| feed message's links | JSON | json.dumps |")
    print("|---|---|---|")
    for name, part in (("whole summary (before)", summary), ("the page's part (now)", page_links(summary))):
        print(f"| {name} | {len(json.dumps(part)) / 2**10:,.0f} KiB | "
              f"{timed(lambda p=part: json.dumps(p), repeat) * 1e3:.1f} ms |")
    print(f"load average (1 min) before / after: {load0:.1f} / {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows-per-client", type=int, choices=(2, 5), default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory", action="store_true",
                    help="only fill the meter (and build its rows) and print the PS's memory per meter key")
    ap.add_argument("--write", action="store_true",
                    help="only time the run folder's links.csv and results.json for the filled meter's rows: "
                         "the whole text built in memory (before) against written as it goes (now)")
    ap.add_argument("--feed", action="store_true",
                    help="only the per-link table a live page's feed message carries after a round: the whole "
                         "summary (before) against the page's part (feed.page_links), JSON size and encoding time")
    a = ap.parse_args()
    if a.feed:
        feed(a.clients, a.rounds, a.rows_per_client, a.repeat)
        return
    if a.memory:
        memory(a.clients, a.rounds, a.rows_per_client)
        return
    if a.write:
        write(a.clients, a.rounds, a.rows_per_client, a.repeat)
        return
    load0 = os.getloadavg()[0]
    meter = ByteMeter()
    clients = [f"client-{i}" for i in range(a.clients)]
    status_all, status_new, status_now = RunStatus(), RunStatus(), RunStatus()
    copy, copy_now = RoundRows(), RoundRows()
    seen: dict[int, int] = {}
    print(f"{a.clients:,} clients, {a.rows_per_client} rows per client and round; median of {a.repeat}; "
          "every row (the event's old frame) / the rounds changed (its frame now, ByteMeter.view)")
    print("child: every row, tables from every row (before the eleventh session) / the rounds changed, tables "
          "from every row (eleventh) / the rounds changed, tables kept from them (twelfth: status.py's _LinkSums)")
    print("| after round | rows | ByteMeter.rows() | pickle (PS): every row / rounds changed | frame | "
          "child: unpickle + status + tables (a page request) | child, without the tables (no page request) |")
    print("|---|---|---|---|---|---|---|")
    for t in range(a.rounds):
        fill_round(meter, clients, t, a.rows_per_client)
        rows_s = timed(meter.rows, a.repeat)
        rows = meter.rows()
        view = meter.view(seen)
        seen.update((r, v) for r, (v, _) in view.changed.items())
        old = ("links", {"rows": rows}, time.monotonic())
        new = ("links", {"rounds": {r: rr for r, (_, rr) in view.changed.items()}, "totals": {}}, time.monotonic())
        frames = {name: _encode(event) for name, event in (("old", old), ("new", new))}
        pickle_s = {name: timed(lambda e=event: _encode(e), a.repeat) for name, event in (("old", old), ("new", new))}

        def child_old(tables: bool = True, frame: bytes = frames["old"]) -> None:
            kind, data, _ = pickle.loads(frame[4:])
            status_all(kind, data)
            if tables:
                status_all.links()

        def child_new(tables: bool = True, frame: bytes = frames["new"]) -> None:
            kind, data, _ = pickle.loads(frame[4:])
            status_new(kind, {"rows": copy.apply(data["rounds"])})
            if tables:
                status_new.links()

        def child_now(tables: bool = True, frame: bytes = frames["new"]) -> None:
            kind, data, _ = pickle.loads(frame[4:])
            status_now(kind, {"rows": copy_now.apply(data["rounds"]), "rounds": data["rounds"]})  # as proc.py
            if tables:
                status_now.links()
        modes = {"old": child_old, "new": child_new, "now": child_now}
        child = {m: timed(fn, a.repeat) for m, fn in modes.items()}
        bare = {m: timed(lambda fn=fn: fn(False), a.repeat) for m, fn in modes.items()}
        assert status_new.links() == status_all.links() == status_now.links()  # the page shows the same each way
        print(f"| {t + 1} | {len(rows):,} | {rows_s * 1e3:.0f} ms | {pickle_s['old'] * 1e3:.0f} / "
              f"{pickle_s['new'] * 1e3:.0f} ms | {len(frames['old']) / 2**20:.1f} / "
              f"{len(frames['new']) / 2**20:.1f} MiB | "
              f"{' / '.join(f'{child[m] * 1e3:.0f}' for m in modes)} ms | "
              f"{' / '.join(f'{bare[m] * 1e3:.0f}' for m in modes)} ms |")
    print(f"load average (1 min) before / after: {load0:.1f} / {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
