"""Does the web face get in training's way? A small FedAvg run with its live page served (the in-process engine,
``fedhop simulate --http``), quiet and under a flood from another process: ``--requests`` (2,000) JSON/metrics
requests in ``--flood-s`` (10) s from a thread pool, new connection each, while ``--streams`` (100) clients hold
/api/events open (a refused stream retries after its Retry-After).

    python tests/bench/bench_web_flood.py [--rounds 60] [--reps 3] [--hidden 200] [--in-thread]

By default the page is served as a run's ``--http`` serves it: from its own process (server/web/proc.py), fed
with the run's events over a pipe. ``--in-thread``: from a server thread of the run's process (the harshest
case: it shares the training's GIL; what ``--http`` did before).

Prints per repetition the median round time of the rounds that ended while the flood ran (the same round indices
quiet), the ratio flood / quiet, what the flood got back (status codes), the CPU time the run's process spent on
the web face during the flooded run (a measure of its cost that the machine's load does not blur: the process
mode's pickling of events and its sender / watcher threads, or the in-thread server's thread; with one training
thread, the GIL makes it an upper bound of the time taken from training), the web face process's own CPU time
(process mode: taken from the machine, not from the run's process), and the load average; then the median over
repetitions. Quiet and flood take turns within each repetition. Also: ``fedhop launch`` wall time with
plaintext and with ``--tls auto`` (``--launch-reps``; 0 = skip). ``--control``: the same flood against a web face
in another process, while the run serves nothing to anyone: on a small machine the flood's own client and server
take CPU from training too, and this measures that share apart from the run's process. ``--server-only``: no
run, the flood against a served status: the server thread's CPU seconds per flood (the web face's own cost).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROUTES = ("api/status", "api/rounds", "api/links", "api/topology", "api/missing", "api/timeline", "metrics")

JOB = """name = "bench-web-flood"
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
edges = 2

[data]
dataset = "digits"
partition = "iid"

[model]
name = "mlp"
hidden = [{hidden}, {hidden}]
"""


def load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


# -- the flood (its own process: its threads must not share the run's GIL) ----------------------------------


def flood(url: str, requests: int, seconds: float, streams: int, threads: int) -> dict[str, Any]:
    stop = threading.Event()
    codes: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def count(key: str) -> None:
        with lock:
            codes[key] += 1

    def one(i: int) -> None:
        try:
            with urllib.request.urlopen(url + ROUTES[i % len(ROUTES)], timeout=10) as r:
                r.read()
                count(str(r.status))
        except urllib.error.HTTPError as e:
            count(str(e.code))
        except OSError as e:
            count(type(e).__name__)

    def stream() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(url + "api/events", timeout=5) as r:
                    count("stream 200")
                    while not stop.is_set() and r.readline():
                        pass
            except urllib.error.HTTPError as e:
                count(f"stream {e.code}")
                stop.wait(float(e.headers.get("Retry-After", "1")))
            except OSError:
                stop.wait(0.5)

    holders = [threading.Thread(target=stream, daemon=True) for _ in range(streams)]
    for t in holders:
        t.start()
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for i in range(requests):
            delay = t0 + i * seconds / requests - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, i)
    sent_s = time.monotonic() - t0
    stop.set()
    return {"codes": dict(codes), "sent_s": sent_s}


# -- the run --------------------------------------------------------------------------------------------------


def thread_cpu_s(tid: int, which: str = "all") -> float:
    """CPU seconds a thread of this process has used (Linux: /proc/self/task/TID/stat): user + system (``all``),
    or only ``user`` (the Python code, which holds the GIL) or ``system`` (the kernel's: on loopback a send
    also does the receiving end's TCP work; the GIL is released meanwhile)."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rpartition(")")[2].split()
    user, system = int(fields[11]), int(fields[12])
    ticks = {"all": user + system, "user": user, "system": system}[which]
    return ticks / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (Linux: /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(spec_text: str, with_flood: bool, a: argparse.Namespace) -> tuple[list[tuple[float, float]], dict]:
    """(end time, duration) of every round, and what the flood got back (empty when quiet) with the CPU seconds
    the run's process spent on the web face during the run (``server_cpu_s``), the web face process's CPU
    seconds (``child_cpu_s``; process mode) and the run's wall time."""
    from fedhop.common.spec import RunSpec
    from fedhop.server.web.live import live_page, simulate
    from fedhop.server.web.proc import WebProcess

    spec = RunSpec.parse(tomllib.loads(spec_text))
    rounds: list[tuple[float, float]] = []
    got: dict[str, Any] = {}
    with live_page("127.0.0.1:0", in_thread=a.in_thread) as page:
        page.events.subscribe(lambda kind, d: rounds.append((time.monotonic(), float(d["duration_s"])))
                              if kind == "round_ended" else None)
        proc = elsewhere = None
        url = page.url or ""
        if with_flood and a.control:  # the same flood against a web face in another process: the machine's share
            elsewhere = subprocess.Popen([sys.executable, __file__, "--serve-elsewhere"], stdout=subprocess.PIPE,
                                         text=True)
            url = (elsewhere.stdout.readline() if elsewhere.stdout else "").strip()
        if with_flood:
            proc = subprocess.Popen([sys.executable, __file__, "--flood-client", url, str(a.requests),
                                     str(a.flood_s), str(a.streams), str(a.threads)], stdout=subprocess.PIPE,
                                    text=True)
        web = page.http if isinstance(page.http, WebProcess) else None

        def spent() -> tuple[float, float]:  # (the run's process on the web face, the web face's process)
            if web is not None:
                return web.parent_cpu_s(), process_cpu_s(web.pid)
            tid = page.http._thread.native_id if page.http is not None else None  # type: ignore[union-attr]
            return (thread_cpu_s(tid) if tid else 0.0), 0.0

        cpu0, child0 = spent()
        t0 = time.monotonic()
        simulate(spec, page.events)
        wall = time.monotonic() - t0
        if proc is not None:
            out, _ = proc.communicate(timeout=120)
            got = json.loads(out)
        if elsewhere is not None:
            elsewhere.terminate()
            elsewhere.wait(10)
        cpu1, child1 = spent()
        got["server_cpu_s"] = cpu1 - cpu0  # the run's process: pickling + sender / watcher, or the server thread
        got["child_cpu_s"] = child1 - child0
        got["wall_s"] = wall
    return [(t - t0, d) for t, d in rounds], got


def server_only(a: argparse.Namespace) -> int:
    """``--server-only``: the flood against a served RunStatus and no run, ``--reps`` times: the CPU seconds the
    server thread used per flood and per answer (what the web face costs the process it runs in, whatever the
    machine's load does to round times)."""
    from fedhop.server.web.serve import start_http
    from fedhop.server.web.status import RunStatus

    print(f"load average at the start: {load()} ({os.cpu_count()} CPUs)", flush=True)
    used = []
    for rep in range(a.reps):
        http = start_http(RunStatus(), "127.0.0.1", 0)
        tid = http._thread.native_id
        cpu0 = thread_cpu_s(tid) if tid else 0.0
        user0 = thread_cpu_s(tid, "user") if tid else 0.0
        out = subprocess.run([sys.executable, __file__, "--flood-client", http.url, str(a.requests), str(a.flood_s),
                              str(a.streams), str(a.threads)], capture_output=True, text=True).stdout
        cpu = (thread_cpu_s(tid) if tid else 0.0) - cpu0
        user = (thread_cpu_s(tid, "user") if tid else 0.0) - user0
        http.stop()
        codes = json.loads(out)["codes"]
        n = sum(codes.values())
        used.append((cpu, user))
        print(f"rep {rep + 1}: the server thread used {cpu:.2f} CPU s ({user:.2f} s user, the GIL's share) for {n} "
              f"answers ({1000 * cpu / n:.2f} ms each): {codes}; load average {load()}", flush=True)
    print(f"\nmedian of {a.reps}: {statistics.median(u[0] for u in used):.2f} CPU s, "
          f"{statistics.median(u[1] for u in used):.2f} s of it user, per flood of {a.requests} requests in "
          f"{a.flood_s:g} s with {a.streams} streams")
    return 0


def window(rounds: list[tuple[float, float]], start: float, end: float) -> list[int]:
    return [i for i, (t, _) in enumerate(rounds) if start <= t <= end]


def measure_launch(reps: int, rounds: int) -> dict[str, float]:
    out: dict[str, list[float]] = {"plaintext": [], "--tls auto": []}
    with tempfile.TemporaryDirectory(prefix="bench-web-launch-") as d:
        for rep in range(reps):
            for mode in out:
                args = [sys.executable, "-m", "fedhop", "launch", "--set", f"rounds={rounds}", "--out",
                        f"{d}/run-{rep}-{len(out[mode])}-{mode.replace(' ', '')}", "--http", "off", "--quiet"]
                if mode != "plaintext":
                    args += ["--tls", "auto"]
                t0 = time.monotonic()
                p = subprocess.run(args, capture_output=True, text=True)
                if p.returncode != 0:
                    raise SystemExit(f"launch ({mode}) failed ({p.returncode}): {p.stderr[-2000:]}")
                out[mode].append(time.monotonic() - t0)
    return {m: statistics.median(v) for m, v in out.items()}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-elsewhere":  # a web face on its own, until terminated
        from fedhop.server.web.serve import start_http
        from fedhop.server.web.status import RunStatus

        print(start_http(RunStatus(), "127.0.0.1", 0).url, flush=True)
        threading.Event().wait()
    if len(sys.argv) > 1 and sys.argv[1] == "--flood-client":
        url, requests, seconds, streams, threads = sys.argv[2:7]
        print(json.dumps(flood(url, int(requests), float(seconds), int(streams), int(threads))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=200)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--flood-s", type=float, default=10.0)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--in-thread", action="store_true",
                    help="serve the page from a thread of the run's process (as --http did before), not from its "
                    "own process")
    ap.add_argument("--control", action="store_true",
                    help="flood a web face in another process instead of the run's (what the flood costs the "
                    "machine, apart from the run's process)")
    ap.add_argument("--server-only", action="store_true",
                    help="no run: the flood against a served status, the server thread's CPU seconds per flood")
    ap.add_argument("--launch-reps", type=int, default=3)
    ap.add_argument("--launch-rounds", type=int, default=2)
    a = ap.parse_args()
    if a.server_only:
        return server_only(a)
    spec_text = JOB.format(rounds=a.rounds, steps=a.steps, clients=a.clients, hidden=a.hidden)
    mode = "in-thread" if a.in_thread else "own process"
    print(f"web face: {mode}{' (--control: the flood goes to another web face)' if a.control else ''}; load "
          f"average at the start: {load()} ({os.cpu_count()} CPUs)", flush=True)
    rows = []
    for rep in range(a.reps):
        flooded, got = run_once(spec_text, True, a)
        quiet, calm = run_once(spec_text, False, a)
        # the rounds that ended while the flood was sent (after its process started: 1 s in), same indices quiet
        idx = window(flooded, 1.0, 1.0 + got["sent_s"]) or list(range(len(flooded)))
        q = statistics.median(quiet[i][1] for i in idx)
        f = statistics.median(flooded[i][1] for i in idx)
        cpu = got["server_cpu_s"] / got["wall_s"]
        rows.append((q, f, f / q, cpu, got["child_cpu_s"]))
        print(f"rep {rep + 1}: {len(idx)} rounds under the flood; median round quiet {q:.4f} s, flood {f:.4f} s, "
              f"ratio {f / q:.3f}; flood got {got['codes']} in {got['sent_s']:.1f} s; the run's process spent "
              f"{got['server_cpu_s']:.3f} CPU s on the web face in the run's {got['wall_s']:.1f} s "
              f"({100 * cpu:.2f}%; quiet: {calm['server_cpu_s']:.3f} s); the web face's process "
              f"{got['child_cpu_s']:.2f} CPU s; load average {load()}",
              flush=True)
    mq, mf, mr, mc, mchild = (statistics.median(r[i] for r in rows) for i in range(5))
    print(f"\nmedian of {a.reps}: quiet {mq:.4f} s, flood {mf:.4f} s, ratio {mr:.3f} (flood/quiet); the run's "
          f"process spent {100 * mc:.2f}% of the flooded run's wall time on the web face, the web face's process "
          f"{mchild:.2f} CPU s; load average at the end {load()}")
    if a.launch_reps:
        got_launch = measure_launch(a.launch_reps, a.launch_rounds)
        p, t = got_launch["plaintext"], got_launch["--tls auto"]
        print(f"fedhop launch (default spec, {a.launch_rounds} rounds), median of {a.launch_reps}: plaintext "
              f"{p:.2f} s, --tls auto {t:.2f} s ({t - p:+.2f} s); load average {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
