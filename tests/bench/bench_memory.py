"""Peak RSS of the PS and of a client against the model size, on a real ``fedhop launch`` FedAvg job.

    .venv/bin/python tests/bench/bench_memory.py                       # 25M-parameter MLP (100 MB), 4 clients
    .venv/bin/python tests/bench/bench_memory.py --hidden 15800 --clients 2 --rounds 2   # a ~1 GB model
    .venv/bin/python tests/bench/bench_memory.py --clients-per-process 4   # the 4 clients in one client host
    .venv/bin/python tests/bench/bench_memory.py --compare --repeat 3    # issue 19: streamed fold vs decoded replies
    .venv/bin/python tests/bench/bench_memory.py --compare-spill --repeat 3   # issue 19: M0 spilled or kept
    .venv/bin/python tests/bench/bench_memory.py --rounds 2 --edges 2 --maps --maps-role edge   # an edge's smaps

The job is the one of ``bench_vs_flower.py`` (FedAvg, digits IID, MLP 64-h-h-10, 12 local steps of batch 32)
with ``rounds`` rounds, one ``fedhop client`` process per client unless ``--clients-per-process`` says
otherwise (launch's own default puts up to 16 clients in one client host). psutil polls every process of
the run (the launcher, which is the PS, and its children) every 20 ms and keeps each one's RSS over time. Per process:

* **idle**: its RSS just before round 1 starts (the PS log's last "is ready" line): the process with its data
  loaded and its model built, before the first bundle travels (the issue's "idle process");
* **peak**: its largest RSS during the run;
* **(peak - idle) / model**: how many models' worth of memory the run adds on top of the idle process. The
  target (issue 11) was peak <= 3 x model + idle, i.e. this ratio <= 3; issue 19's is <= 2 for the PS;
* **... in rounds**: the same with the peak taken from round 1's start to the last round's end only (the PS
  then writes the run folder: model.pt is serialized in memory first).

Also printed: the RSS of a process that only imports fedhop and torch (the floor under every idle figure) and
(idle - import) / model, the copies a process holds before the run starts. Other processes on the machine do
not change RSS figures (unlike timings), but the 20 ms polling can miss a short spike: figures are lower bounds.

``--compare`` runs the job with the PS folding replies chunk by chunk as they arrive (issue 19, the default) and
with the PS decoding each reply whole before folding it (``--no-stream``: ``FEDHOP_FOLD_STREAM=0``, as before
issue 19), alternating, ``--repeat`` times each, and prints every run (with the load average at its end) and
the median of each figure per mode. ``--compare-spill`` runs the streamed fold with the round's starting model
spilled into a file mapping whose pages the PS drops once its requests are out (``transport.spill_model_bytes``,
``common/engine/spill.py``; the default from 64 MiB of state) and with it kept in memory
(``spill_model_bytes = 0``), alternating; ``--spill-bytes N`` sets the option (of every run, or of the spilled
runs of ``--compare-spill``: 1 spills a model of any size).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from launch_job import fedavg_job, log_time, mlp_params

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
    maps: bool = False  # also keep one process's mappings at its peak and about every second (``Maps``)
    maps_role: str = "ps"  # whose: the PS (the root), or the first process of this role (e.g. "edge")
    series: dict[int, tuple[str, list[tuple[float, int]]]] = field(default_factory=dict)
    peak_maps: list[Mapping] = field(default_factory=list)
    timed_maps: list[tuple[float, list[Mapping]]] = field(default_factory=list)
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
                    rss = p.memory_info().rss
                    if self.maps and p.pid == self._mapped():
                        self._snap(p.pid, now, rss)
                    self.series[p.pid][1].append((now, rss))
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue

    def _mapped(self) -> int | None:
        """The pid whose mappings are kept: the root for "ps", else the first process of ``maps_role`` seen."""
        if self.maps_role == "ps":
            return self.root.pid
        return next((pid for pid, (role, _) in self.series.items() if role == self.maps_role), None)

    def _snap(self, pid: int, now: float, rss: int) -> None:
        series = self.series[pid][1]
        peak = max((r for _, r in series), default=0)
        if rss > peak + (1 << 20):
            self.peak_maps = read_maps(pid)
        if not self.timed_maps or now - self.timed_maps[-1][0] >= 1.0:
            self.timed_maps.append((now, read_maps(pid)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Mapping:
    """One line of /proc/PID/smaps with its resident and anonymous bytes."""

    name: str  # the mapped file, [heap], [stack], or "" (anonymous)
    start: int
    perms: str
    size: int
    rss: int
    anon: int


def read_maps(pid: int) -> list[Mapping]:
    out: list[Mapping] = []
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            parts = rest.split(None, 4)
            out.append(Mapping(parts[4].strip() if len(parts) > 4 else "", lo, parts[0], hi - lo, 0, 0))
        elif head == "Rss:":
            out[-1].rss = int(rest.split()[0]) * 1024
        elif head == "Anonymous:":
            out[-1].anon = int(rest.split()[0]) * 1024
    return out


def classify(maps: list[Mapping]) -> dict[str, int]:
    """Resident bytes by kind of mapping. Anonymous ones: glibc's per-thread malloc arenas (64 MiB-aligned
    heaps; blocks below glibc's mmap threshold, 256 KiB in role processes: gRPC's buffers, Python objects of the
    threads), 8 MiB thread stacks, single allocations of >= 256 KiB (each its own mapping, though the kernel
    merges neighbours: tensors, decode buffers, chunk frames, Python's 1 MiB object arenas) and the rest; then
    the heap (glibc's main arena), the round's starting model spilled into a file mapping (issue 19) and the other
    file-backed mappings (libraries)."""
    out: dict[str, int] = {}
    for m in maps:
        if "fedhop-m0-" in m.name:
            kind = "file-backed: the spilled model (engine/spill.py)"
        elif m.name.startswith("/"):
            kind = "file-backed (libraries and their data)"
        elif m.name:
            kind = m.name  # [heap] (glibc's main arena), [stack], ...
        elif m.start % (64 << 20) == 0 and m.perms.startswith("rw"):
            kind = "anon: malloc arenas of threads (blocks < 256 KiB)"
        elif m.size == 8 << 20:
            kind = "anon: thread stacks (8 MiB)"
        elif m.size >= 256 << 10:
            kind = "anon: single blocks >= 256 KiB (tensors, decode buffers, chunk frames)"
        else:
            kind = "anon: other (< 256 KiB)"
        out[kind] = out.get(kind, 0) + m.rss
    return out


@dataclass
class Row:
    role: str
    idle: int
    peak: int
    in_rounds: int  # the largest RSS from round 1's start to the last round's end (the run folder's writing aside)


@dataclass
class Job:
    rows: list[Row]
    mean_round_s: float
    results: dict
    ready: float  # when round 1 started (time.time())
    poller: Poller


# ``--auto-window``: the PS (the launcher process) with gRPC's auto-tuned receive windows, as before
# ``channels.RECEIVE_WINDOW_BYTES``; its children are started as usual
AUTO_WINDOW_LAUNCH = ("import sys; from fedhop.transport import channels; channels.SERVER_OPTIONS[:] = [o for o in "
                      "channels.SERVER_OPTIONS if o[0] not in ('grpc.http2.bdp_probe', 'grpc.http2.lookahead_bytes')]; "
                      "from fedhop.cli import main; sys.exit(main(sys.argv[1:]))")




def run_job(hidden: int, clients: int, rounds: int, steps: int, work: Path, timeout: float,
            trace: Path | None = None, per_process: str = "1", maps: bool = False, auto_window: bool = False,
            stream: bool = True, edges: int = 0, spill: int | None = None, maps_role: str = "ps") -> Job:
    spec = work / "spec.toml"
    text = fedavg_job(hidden, clients, rounds, steps, name="bench-memory")
    if spill is not None:  # the job's spec ends with its [transport] table
        text += f"spill_model_bytes = {spill}\n"
    if edges:  # FedAvg through an edge tier: each edge folds its clients' replies (issue 19: "edges the same")
        text = text.replace(f"[topology]\nclients = {clients}\n", f"[topology]\nclients = {clients}\nedges = {edges}\n")
    spec.write_text(text)
    out = work / "run"
    if auto_window and not stream:
        raise ValueError("--auto-window and --no-stream are separate ablations")
    fedhop = ["-c", AUTO_WINDOW_LAUNCH] if auto_window else ["-m", "fedhop"]
    # --no-stream: the PS and the edges decode every reply whole before folding it, as before issue 19
    env = {**os.environ, "FEDHOP_FOLD_STREAM": "1" if stream else "0"}
    p = subprocess.Popen([sys.executable, *fedhop, "launch", str(spec), "--out", str(out), "--device", "cpu",
                          "--quiet", "--http", "off", "--clients-per-process", per_process],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    poller = Poller(psutil.Process(p.pid), maps=maps, maps_role=maps_role).start()
    try:
        output, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
        poller.stop()
    if p.returncode != 0:
        raise RuntimeError(f"fedhop launch exited with {p.returncode}:\n{output[-3000:]}")
    log = (out / "logs" / "ps.log").read_text().splitlines()
    ready = max(log_time(x) for x in log if " is ready" in x)
    ended = max((log_time(x) for x in log if f" round {rounds}/{rounds} " in x), default=float("inf"))
    rows = []
    for role, series in poller.series.values():
        before = [rss for t, rss in series if t <= ready]
        if not before:
            continue
        during = [rss for t, rss in series if ready < t <= ended] or before
        rows.append(Row(role, before[-1], max(rss for _, rss in series), max(during)))
    res = json.loads((out / "results.json").read_text())
    if trace is not None:  # RSS over time per process, with the PS log's round marks
        marks = [(log_time(x), x[24:].strip()) for x in log if " round " in x or " is ready" in x]
        series = {f"{role}-{pid}": s for pid, (role, s) in poller.series.items()}
        maps = {"peak_maps": [vars(m) for m in poller.peak_maps],
                "timed_maps": [(t, [vars(m) for m in ms]) for t, ms in poller.timed_maps]} if maps else {}
        trace.write_text(json.dumps({"marks": marks, "series": series, **maps}))
    return Job(rows, res["wall_s"] / rounds, res, ready, poller)


def print_maps(job: Job, model: int) -> None:
    """One process's resident memory (the PS's, or ``--maps-role``'s) by kind of mapping at idle (the last
    snapshot before round 1) and at its peak."""
    who = "PS" if job.poller.maps_role == "ps" else f"First {job.poller.maps_role}"
    idle = [m for t, m in job.poller.timed_maps if t <= job.ready]
    if not idle or not job.poller.peak_maps:
        print("no mappings captured")
        return
    a, b = classify(idle[-1]), classify(job.poller.peak_maps)
    mb = 1 << 20
    print(f"\n{who}'s resident memory by mapping kind (/proc/PID/smaps), MiB")
    print("| kind | idle | peak | peak - idle | / model |")
    print("|---|---:|---:|---:|---:|")
    for k in sorted(set(a) | set(b), key=lambda k: -(b.get(k, 0) - a.get(k, 0))):
        d = b.get(k, 0) - a.get(k, 0)
        if max(a.get(k, 0), b.get(k, 0)) < 1 << 20 and abs(d) < 1 << 20:
            continue  # [vdso], [vvar], ...: nothing
        print(f"| {k} | {a.get(k, 0) / mb:.1f} | {b.get(k, 0) / mb:.1f} | {d / mb:+.1f} | {d / model:+.3f} |")
    ta, tb = sum(a.values()), sum(b.values())
    print(f"| total | {ta / mb:.1f} | {tb / mb:.1f} | {(tb - ta) / mb:+.1f} | {(tb - ta) / model:+.3f} |")
    # the single blocks by size (the kernel merges neighbouring mappings, so a tensor may share one with others)
    buckets = [(model * 0.9, "~ a model or more"), (4 * mb, "4 MiB .. a model"), (1 * mb, "1-4 MiB"), (0, "< 1 MiB")]

    def by_size(maps: list[Mapping]) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for m in maps:
            if m.name or m.start % (64 << 20) == 0 or m.size == 8 << 20 or m.size < 256 << 10:
                continue
            label = next(name for lo, name in buckets if m.size >= lo)
            n, r = out.get(label, (0, 0))
            out[label] = (n + 1, r + m.rss)
        return out

    sa, sb = by_size(idle[-1]), by_size(job.poller.peak_maps)
    print(f"\n{who}'s single blocks >= 256 KiB by mapping size: count and resident MiB, idle -> peak")
    print("| mapping size | idle | peak | peak - idle (MiB) |")
    print("|---|---:|---:|---:|")
    for _, name in buckets:
        (na, ra), (nb, rb) = sa.get(name, (0, 0)), sb.get(name, (0, 0))
        print(f"| {name} | {na}: {ra / mb:.1f} | {nb}: {rb / mb:.1f} | {(rb - ra) / mb:+.1f} |")


def fold_cost(hidden: int, replies: int, repeat: int) -> None:
    """``--fold-only``: the fold of ``replies`` replies of the MLP's size in this process, no network: each reply
    decoded whole then folded (as before issue 19) against streamed into the aggregate chunk by chunk (with the
    undo log), 1 MiB chunks; seconds per reply (median of ``repeat``) and the most decode-buffer bytes alive at
    once (``codec.BUFFERS``, in models)."""
    import gc

    import torch

    from fedhop.common.algorithms.aggregate import WeightedMean
    from fedhop.common.engine.api import Reply
    from fedhop.common.wire.codec import BUFFERS, BundleDecoder, encode_views

    torch.set_num_threads(1)
    n = mlp_params(hidden)
    g = torch.Generator().manual_seed(0)
    bundle = {"w": torch.randn(n, generator=g)}
    header, chunks = encode_views(bundle)
    frames = [c for c in chunks]  # views of the one bundle: every reply sends the same bytes
    times: dict[str, list[float]] = {"decoded": [], "streamed": []}
    peaks: dict[str, int] = {}
    for _ in range(repeat):
        for mode in times:
            mean = WeightedMean(lambda node, r: 1.0, replies)
            gc.collect()
            BUFFERS.reset()
            live = BUFFERS.live
            began = time.perf_counter()
            for i in range(replies):
                sink = mean.sink(f"c{i}", {}, header) if mode == "streamed" else None
                dec = BundleDecoder(header, sink=sink)
                for c in frames:
                    dec.feed(c)
                mean(f"c{i}", Reply(dec.finish(), {}))
                del dec, sink
            mean.result()
            times[mode].append((time.perf_counter() - began) / replies)
            peaks[mode] = BUFFERS.peak - live
            del mean
    print(f"fold of {replies} replies of {n * 4 / (1 << 20):.1f} MiB in one process (1 MiB chunks, median of {repeat}, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    print("| path | s per reply | decode buffers alive at most (models) |")
    print("|---|---:|---:|")
    for mode, ts in times.items():
        print(f"| {mode} | {statistics.median(ts):.3f} | {peaks[mode] / (n * 4):.2f} |")


Figures = tuple[str, float, float, float, float]  # role, idle MiB, peak MiB, (peak - idle) / model, ... in rounds


def report(job: Job, a: argparse.Namespace, model: int, floor: int, label: str) -> list[Figures]:
    """Print one run; its rows as (role, idle MiB, peak MiB, (peak - idle) / model)."""
    mb = 1 << 20
    res = job.results
    last = res["rounds"][-1] if res["rounds"] else {}
    print(f"\n[{label}] mean round {job.mean_round_s:.2f} s; results.json: {len(res['rounds'])} of {a.rounds} rounds, "
          f"interrupted {res['interrupted']}, final accuracy {last.get('accuracy', float('nan')):.4f}, "
          f"{len(res['missing'])} missing entries, payload {res['totals']['payload_bytes']:,} B, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| process | idle MiB | peak MiB | (idle - import) / model | (peak - idle) / model | ... in rounds |")
    print("|---|---:|---:|---:|---:|---:|")
    out = []
    for r in sorted(job.rows, key=lambda r: (r.role != "ps", r.role)):
        extra, during = (r.peak - r.idle) / model, (r.in_rounds - r.idle) / model
        print(f"| {r.role} | {r.idle / mb:.0f} | {r.peak / mb:.0f} | {(r.idle - floor) / model:.2f} | {extra:.2f} | "
              f"{during:.2f} |")
        out.append((r.role, r.idle / mb, r.peak / mb, extra, during))
    if a.maps:
        print_maps(job, model)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=4960, help="MLP width h (4960: 24,978,570 parameters)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--edges", type=int, default=0, help="edges between the PS and the clients (default none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12, help="local steps per round")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--clients-per-process", default="1", metavar="K",
                    help="clients per client process, passed to launch (a number or auto; default 1)")
    ap.add_argument("--trace", type=Path, help="write every process's RSS over time (JSON) to this file")
    ap.add_argument("--auto-window", action="store_true",
                    help="ablation: the PS with gRPC's auto-tuned HTTP/2 receive windows (before issue 11's fixed one)")
    ap.add_argument("--no-stream", action="store_true",
                    help="ablation: the PS decodes each reply whole before folding it (before issue 19)")
    ap.add_argument("--compare", action="store_true",
                    help="run streamed and --no-stream alternately (--repeat times each) and print the medians")
    ap.add_argument("--compare-spill", action="store_true",
                    help="run with the starting model spilled (the default) and kept (spill_model_bytes = 0) "
                         "alternately, streamed fold (--repeat times each) and print the medians")
    ap.add_argument("--spill-bytes", type=int, metavar="N",
                    help="transport.spill_model_bytes of every run (default: the spec's default)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode (the median is printed; default 1)")
    ap.add_argument("--fold-only", action="store_true",
                    help="only time the fold of --clients replies in this process: decoded whole vs streamed")
    ap.add_argument("--maps", action="store_true",
                    help="also print the PS's resident memory by kind of mapping (smaps) at idle and at its peak")
    ap.add_argument("--maps-role", default="ps", choices=("ps", "edge", "client"),
                    help="with --maps: whose mappings, the PS's (default) or the first edge's / client's")
    a = ap.parse_args()
    if min(a.hidden, a.clients, a.rounds, a.steps, a.repeat) < 1:
        ap.error("--hidden, --clients, --rounds, --steps and --repeat must be at least 1")
    if a.clients_per_process != "auto" and not (a.clients_per_process.isdigit() and int(a.clients_per_process) >= 1):
        ap.error(f"--clients-per-process must be a positive number or auto, got {a.clients_per_process!r}")
    if a.compare and (a.no_stream or a.auto_window):
        ap.error("--compare runs both modes itself; leave out --no-stream and --auto-window")
    if a.compare_spill and a.compare:
        ap.error("--compare-spill and --compare are two comparisons; run one at a time")
    if a.spill_bytes is not None and a.spill_bytes < 0:
        ap.error("--spill-bytes must be at least 0")
    if a.fold_only:
        fold_cost(a.hidden, a.clients, max(a.repeat, 3))
        return
    model = mlp_params(a.hidden) * 4
    floor = int(subprocess.run([sys.executable, "-c", IMPORT_ONLY], capture_output=True, text=True,
                               check=True).stdout.strip().splitlines()[-1])
    mb = 1 << 20
    print(f"FedAvg, MLP h={a.hidden}: {mlp_params(a.hidden):,} parameters, model {model / mb:.1f} MiB; "
          f"{a.clients} clients ({a.clients_per_process} per process), {a.rounds} rounds, PS receive window "
          f"{'auto-tuned' if a.auto_window else 'fixed'}; import-only process {floor / mb:.0f} MiB; "
          f"load average at start {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    # each mode: (its name, streamed fold, transport.spill_model_bytes or None for the spec's default)
    if a.compare_spill:
        modes = [("M0 spilled", True, a.spill_bytes), ("M0 kept (spill_model_bytes = 0)", True, 0)]
    elif a.compare:
        modes = [("streamed fold", True, a.spill_bytes), ("decoded replies", False, a.spill_bytes)]
    else:
        modes = [("streamed fold" if not a.no_stream else "decoded replies (--no-stream)", not a.no_stream,
                  a.spill_bytes)]
    runs: dict[str, list[tuple[list[Figures], float]]] = {m[0]: [] for m in modes}
    for i in range(a.repeat):
        for name, stream, spill in modes:
            label = f"{name}, run {i + 1}"
            with tempfile.TemporaryDirectory(prefix="fedhop-bench-memory-") as tmp:
                job = run_job(a.hidden, a.clients, a.rounds, a.steps, Path(tmp), a.timeout, a.trace,
                              a.clients_per_process, a.maps, a.auto_window, stream, a.edges, spill, a.maps_role)
            runs[name].append((report(job, a, model, floor, label), job.mean_round_s))
    print(f"\nMedians over {a.repeat} run(s) per mode; load average at the end "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| mode | process | idle MiB | peak MiB | (peak - idle) / model | ... in rounds | mean round s "
          "| target <= 2 |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for mode, rs in runs.items():
        roles = sorted({row[0] for rows, _ in rs for row in rows}, key=lambda r: (r != "ps", r))
        for role in roles:
            rows = [row for rows, _ in rs for row in rows if row[0] == role]
            idle = statistics.median(r[1] for r in rows)
            peak = statistics.median(r[2] for r in rows)
            extra = statistics.median(r[3] for r in rows)
            during = statistics.median(r[4] for r in rows)
            rnd = statistics.median(t for _, t in rs)
            print(f"| {mode} | {role} | {idle:.0f} | {peak:.0f} | {extra:.2f} | {during:.2f} | {rnd:.2f} | "
                  f"{'met' if extra <= 2 else 'not met'} |")


if __name__ == "__main__":
    main()
