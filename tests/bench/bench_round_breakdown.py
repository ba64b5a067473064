"""Where a round's wall time goes, per role: compute, serialization, transfer, waiting (issues 8 and 11).

    .venv/bin/python tests/bench/bench_round_breakdown.py              # every case below
    .venv/bin/python tests/bench/bench_round_breakdown.py --case fedavg-25M --rounds 3

Each case is one ``fedhop launch`` (digits, MLP 64-h-h-10 on the CPU) with the light timers of
``fedhop/common/timing.py`` switched on (``FEDHOP_TIMERS``): every process logs when a parent sent each Task
(``call``), when the child held all of it (``task_in``), when its handler started and returned (``run`` /
``ran``) and when the parent held the whole Result (``reply``), on the machine's one monotonic clock, plus the
CPU seconds it spent in the codec. Per round and per process of a role (mean over the processes of the role):

* compute: a client's handler time; an edge's handler time outside its own scatters; the PS's round time
  outside its scatters (aggregation that is not folded during the scatter, evaluation, the algorithm);
* down / up: a child's Task from the parent's send to the child holding all of it / its Result from the
  handler's return to the parent holding all of it (serialization, the wire, a reply gate's wait);
* encode / decode: CPU seconds in the codec over the whole run (set-up and the final collection included):
  checksums, chunk frames / copying into the decode buffer, which the chunk pipeline overlaps with the
  transfer: they are part of down / up, not in addition to them;
* waiting: the rest of the round (a child idle while others are served, a parent waiting for its children).

Cases: Fed-CHS (2 edges, 4 clients, K = 4 interactions per round instead of the paper's 20, to keep the
100 MB case short) and FOCUS (4 clients, full participation) with a 1 MB (h = 460) and a 100 MB (h = 4960)
model, and FedAvg on the 25M-parameter job (4 clients, 12 local steps of batch 32), whose mean round is set
beside the compute floor: the same clients' local training with no transport, a process of one thread each
started together in the same run, right before and right after the job (a round can be no faster than its
slowest client), then the PS's evaluation of the round's model on the test set (one thread, as the PS runs it
between two rounds in both engines; the ratio is printed with and without it). The CPU accounting line sums
every process's CPU per round (the events' ``cpu`` stamps): what the transport costs beside the training, which
on a machine whose cores the training fills is taken from the training; it includes the PS's work after its
scatter (FedAvg: the evaluation, which the floor counts too), printed apart. The critical-path line gives the
round's gaps (:data:`LATENCY`): the model's way down to the last client's training, the replies' way up once
every client trained (the fold takes them one at a time, in canonical order), the evaluation, the gap between
rounds. The machine is shared (other work runs
beside): compare figures within one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HIDDEN = {"1MB": 460, "100MB": 4960}

BASE = """name = "breakdown-{name}"
rounds = {rounds}
seed = 0
device = "cpu"
checkpoint_every = 0

[algorithm]
name = "{algorithm}"

[algorithm.options]
{options}

[topology]
clients = {clients}
edges = {edges}

[data]
dataset = "digits"
partition = "iid"

[model]
name = "mlp"
hidden = [{hidden}, {hidden}]

[transport]
round_deadline_s = 1800.0
join_timeout_s = 600.0
rpc_timeout_s = 600.0
"""

CASES = {
    **{f"fedchs-{size}": dict(algorithm="fedchs", edges=2, hidden=h, options="K = 4\nbatch_size = 32")
       for size, h in HIDDEN.items()},
    **{f"focus-{size}": dict(algorithm="focus", edges=0, hidden=h, options="lr = 0.05\nlocal_steps = 3")
       for size, h in HIDDEN.items()},
    "fedavg-25M": dict(algorithm="fedavg", edges=0, hidden=4960,
                       options="lr = 0.05\nlocal_steps = 12\nbatch_size = 32"),
}


def mlp_params(hidden: int) -> int:
    return 64 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10


def write_spec(name: str, rounds: int, work: Path, clients: int = 4) -> Path:
    spec = work / f"{name}.toml"
    spec.write_text(BASE.format(name=name, rounds=rounds, clients=clients, **CASES[name]))
    return spec


def run_case(name: str, rounds: int, work: Path, per_process: str = "1", clients: int = 4) -> Path:
    spec = write_spec(name, rounds, work, clients)
    timers = work / f"{name}-timers"
    env = {**os.environ, "FEDHOP_TIMERS": str(timers)}
    done = subprocess.run([sys.executable, "-m", "fedhop", "launch", str(spec), "--out", str(work / f"{name}-run"),
                           "--device", "cpu", "--quiet", "--http", "off", "--clients-per-process", per_process],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: fedhop launch exited with {done.returncode}:\n{done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    return timers


def role(node: str) -> str:
    return "ps" if node == "ps" else node.split("-")[0]


def cpu_accounting(events: list[dict], windows: list[tuple[float, float]]) -> dict[str, float]:
    """CPU seconds per round, summed over the processes (rounds after the first: a client's round is from its
    previous handler's return to this one's, which covers its receive, its training and its last reply's send):
    ``ps`` (the PS's process over the round window), ``clients`` (every client process), ``training`` (the clients'
    handlers: process CPU between ``run`` and ``ran``), ``other`` = ps + clients - training, the CPU that moving and
    checking the bundles costs beside the training. Empty where the events carry no ``cpu`` stamps. Meaningful with
    one client per process (the default ``--clients-per-process 1``): a host's ids share one process's CPU."""
    if len(windows) < 2 or any("cpu" not in e for e in events):
        return {}
    marks = sorted((e for e in events if e.get("at", e["node"]) == "ps" and e["kind"] in ("round", "round_end")
                    and e.get("round", 0) >= 0), key=lambda e: e["t"])
    starts = [e for e in marks if e["kind"] == "round"]
    ends = [e for e in marks if e["kind"] == "round_end"]
    ps_cpu = [b["cpu"] - a["cpu"] for a, b in zip(starts, ends, strict=True)][1:]
    # the PS's work after its round's last scatter (FedAvg: the evaluation of the new model, which the floor also
    # counts), the CPU of the PS from the scatter's end to the round's end
    scatter_ends = sorted((e for e in events if e.get("at", e["node"]) == "ps" and e["kind"] == "scatter_end"),
                          key=lambda e: e["t"])
    after = []
    for a, b in list(zip(starts, ends, strict=True))[1:]:
        last = [e for e in scatter_ends if a["t"] <= e["t"] <= b["t"]]
        after.append(b["cpu"] - last[-1]["cpu"] if last else 0.0)

    def window(t: float) -> int | None:
        return next((i for i, (a, b) in enumerate(windows) if a <= t <= b), None)

    per_client: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    for e in events:
        if e["kind"] in ("run", "ran") and role(e["at"]) == "client" and (i := window(e["t"])) is not None:
            per_client[e["at"]].setdefault(i, {})[e["kind"]] = e["cpu"]
    clients, training = [0.0] * len(windows), [0.0] * len(windows)
    for rounds in per_client.values():
        for i in range(1, len(windows)):
            now, last = rounds.get(i, {}), rounds.get(i - 1, {})
            if {"run", "ran"} <= now.keys() and "ran" in last:
                clients[i] += now["ran"] - last["ran"]
                training[i] += now["ran"] - now["run"]
    n = len(ps_cpu)
    out = {"ps": sum(ps_cpu) / n, "clients": sum(clients[1:]) / n, "training": sum(training[1:]) / n,
           "ps_after": sum(after) / n}
    out["other"] = out["ps"] + out["clients"] - out["training"]
    out.update({f"other_{i + 1}": ps_cpu[i - 1] + clients[i] - training[i] for i in range(1, len(windows))})
    return out


LATENCY = (("lead", "round start -> first request sent (the starting model spilled, the scatter set up)"),
           ("down", "first request sent -> the last client starts training (model down, hand-off to training)"),
           ("handoff", "a client holds its request -> its training starts (mean over the clients)"),
           ("skew", "the first client's training ends -> the last one's"),
           ("tail", "the last client's training ends -> the PS holds the last reply (encode, gate, uploads)"),
           ("settle", "the last reply held -> the scatter ends (its fold committed)"),
           ("after", "the scatter ends -> the round ends (the evaluation; its CPU as after_cpu)"),
           ("between", "the round ends -> the next one starts"))


def latency(events: list[dict]) -> dict[str, float]:
    """The critical path's gaps of a one-scatter round (FedAvg), mean seconds over the rounds after the first
    (:data:`LATENCY`); empty where a round's events are incomplete (e.g. several scatters a round)."""
    ps = sorted((e for e in events if e.get("at", e["node"]) == "ps"
                 and e["kind"] in ("round", "round_end", "scatter_end", "call", "reply")), key=lambda e: e["t"])
    starts = [e for e in ps if e["kind"] == "round" and e["round"] >= 0]
    ends = [e for e in ps if e["kind"] == "round_end" and e["round"] >= 0]
    child: dict[int, dict[str, float]] = defaultdict(dict)
    for e in events:
        if e["kind"] in ("task_in", "run", "ran"):
            child[e["call"]][e["kind"]] = e["t"]
    rows = []
    for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
        inside = [e for e in ps if a["t"] <= e["t"] <= b["t"]]
        calls = [e for e in inside if e["kind"] == "call"]
        replies = [e for e in inside if e["kind"] == "reply"]
        scatter_ends = [e for e in inside if e["kind"] == "scatter_end"]
        if i == 0 or len(scatter_ends) != 1 or not calls or not all(
                {"task_in", "run", "ran"} <= child[c["call"]].keys() for c in calls):
            continue
        c = [child[x["call"]] for x in calls]
        last_reply, end = max(r["t"] for r in replies), scatter_ends[0]
        row = {"lead": calls[0]["t"] - a["t"], "down": max(x["run"] for x in c) - calls[0]["t"],
               "handoff": statistics.mean(x["run"] - x["task_in"] for x in c),
               "skew": max(x["ran"] for x in c) - min(x["ran"] for x in c),
               "tail": last_reply - max(x["ran"] for x in c), "settle": end["t"] - last_reply,
               "after": b["t"] - end["t"], "after_cpu": b["cpu"] - end["cpu"]}
        if i + 1 < len(starts):
            row["between"] = starts[i + 1]["t"] - b["t"]
        rows.append(row)
    if not rows:
        return {}
    return {k: statistics.mean(r[k] for r in rows if k in r) for k in rows[0]}


def breakdown(timers: Path) -> tuple[list[float], dict[str, dict[str, float]]]:
    """(round wall times, per role: mean seconds per round and process of each part; under "cpu", the CPU
    accounting of :func:`cpu_accounting`)."""
    events, sums = [], defaultdict(lambda: defaultdict(float))
    for f in timers.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e["kind"] == "sums":
                for k, v in e.items():
                    if k.endswith("_s"):
                        sums[e["node"]][k] += v
            else:
                events.append(e)
    ps = sorted((e for e in events if e.get("at", e["node"]) == "ps" and e["kind"] in ("round", "round_end")),
                key=lambda e: e["t"])
    starts = [e["t"] for e in ps if e["kind"] == "round" and e["round"] >= 0]  # not an algorithm's set-up step
    ends = [e["t"] for e in ps if e["kind"] == "round_end" and e["round"] >= 0]
    windows = list(zip(starts, ends, strict=True))
    walls = [b - a for a, b in windows]
    rounds = len(walls)

    def in_rounds(t: float) -> bool:
        return any(a <= t <= b for a, b in windows)

    by_call: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for e in events:
        if e["kind"] in ("call", "reply"):
            by_call[(e["child"], e["call"])][e["kind"]] = e["t"]
        elif e["kind"] in ("task_in", "run", "ran"):
            by_call[(e["at"], e["call"])][e["kind"]] = e["t"]
    parts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (node, _), t in by_call.items():
        if {"call", "task_in", "run", "ran", "reply"} <= t.keys() and in_rounds(t["call"]):
            p = parts[node]
            p["down"] += t["task_in"] - t["call"]
            p["handler"] += t["ran"] - t["run"]
            p["up"] += t["reply"] - t["ran"]
    scatter_open: dict[str, float] = {}
    for e in sorted((e for e in events if e["kind"] in ("scatter", "scatter_end")), key=lambda e: e["t"]):
        if e["kind"] == "scatter":
            scatter_open[e["at"]] = e["t"]
        elif e["at"] in scatter_open:
            began = scatter_open.pop(e["at"])
            if in_rounds(began):
                parts[e["at"]]["in_scatter"] += e["t"] - began
    total = sum(walls)
    out: dict[str, dict[str, float]] = {}
    nodes_by_role: dict[str, list[str]] = defaultdict(list)
    for node in set(parts) | set(sums):
        nodes_by_role[role(node)].append(node)
    for r, nodes in nodes_by_role.items():
        rows = []
        for n in nodes:
            p, s = parts.get(n, {}), sums.get(n, {})
            inside = p.get("in_scatter", 0.0)
            compute = (total if r == "ps" else p.get("handler", 0.0)) - inside
            busy = compute + p.get("down", 0.0) + p.get("up", 0.0) + inside
            rows.append({"compute": compute, "down": p.get("down", 0.0), "up": p.get("up", 0.0),
                         "in_scatter": p.get("in_scatter", 0.0), "encode": s.get("encode_s", 0.0),
                         "decode": s.get("decode_s", 0.0), "waiting": max(0.0, total - busy)})
        out[r] = {k: statistics.mean(row[k] for row in rows) / max(rounds, 1) for k in rows[0]}
        out[r]["n"] = len(nodes)
    cpu = cpu_accounting(events, windows)
    if cpu:
        out["cpu"] = cpu
    gaps = latency(events)
    if gaps:
        out["latency"] = gaps
    return walls, out


# -- the compute floor -------------------------------------------------------------------------------------


def _floor_worker(spec_json: str, client: str, rounds: int, barrier: mp.Barrier, q: mp.Queue) -> None:
    import torch

    from fedhop.common.algorithms.local import local_train, solver_for
    from fedhop.common.engine.api import NodeContext
    from fedhop.common.engine.base import MissingLog
    from fedhop.common.engine.workspace import Workspace
    from fedhop.common.spec import RunSpec
    from fedhop.transport.child import LeafComm

    torch.set_num_threads(1)
    ws = Workspace(RunSpec.model_validate_json(spec_json), "cpu")
    data = ws.client_data(client)
    ctx = NodeContext(node_id=client, role="client", ws=ws, comm=LeafComm(client, ws.topology, MissingLog()),
                      sizes={client: len(data)})
    params = ws.initial_params()
    ws.model  # noqa: B018
    times, cpus, evals = [], [], []
    barrier.wait()
    for r in range(rounds):
        barrier.wait()
        t0, c0 = time.perf_counter(), time.process_time()
        w, _ = local_train(ws, params, data, solver_for(ctx, {}), ctx.rng("local.train", r, 0))
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        barrier.wait()  # every client trained: the PS's evaluation of the round's model, alone (one thread, as the PS)
        if client == "client-0":
            t0 = time.perf_counter()
            ws.evaluate(w)
            evals.append(time.perf_counter() - t0)
        # nobody leaves while it evaluates: the last round's evaluation ran beside the other workers' exit and took
        # 0.40-0.85 s instead of 0.20 (a floor too high by 0.07-0.2 s, the ratio too low by 0.02-0.05)
        barrier.wait()
    q.put((client, times, cpus, evals))


def compute_floor(spec_path: Path, rounds: int) -> tuple[list[float], float, list[float]]:
    """Per round: the slowest of the clients' local training, run as one one-thread process each, together; the
    mean CPU seconds of a round's training, summed over the 4; and per round the PS's evaluation of the trained
    model on the test set (one thread, once every client trained: what the PS does between two rounds, in both
    engines, while no client computes)."""
    import tomllib

    from fedhop.common.spec import RunSpec

    spec = RunSpec.parse(tomllib.loads(spec_path.read_text()))
    ctx = mp.get_context("spawn")
    clients = [f"client-{i}" for i in range(spec.topology.clients)]
    barrier, q = ctx.Barrier(len(clients)), ctx.Queue()
    procs = [ctx.Process(target=_floor_worker, args=(spec.model_dump_json(), c, rounds, barrier, q)) for c in clients]
    for p in procs:
        p.start()
    got = {c: (t, cpu, ev) for c, t, cpu, ev in (q.get() for _ in procs)}
    for p in procs:
        p.join()
    return ([max(got[c][0][r] for c in clients) for r in range(rounds)],
            statistics.mean(sum(got[c][1][r] for c in clients) for r in range(rounds)), got["client-0"][2])


# -- output -------------------------------------------------------------------------------------------------


def table(name: str, walls: list[float], parts: dict[str, dict[str, float]]) -> str:
    c = CASES[name]
    mb = mlp_params(c["hidden"]) * 4 / 1e6
    lines = [f"**{name}** ({mlp_params(c['hidden']):,} parameters, {mb:.1f} MB): {len(walls)} rounds, mean round "
             f"{statistics.mean(walls):.2f} s (rounds: {', '.join(f'{w:.2f}' for w in walls)})", "",
             "| role (processes) | compute | down | up | encode (CPU) | decode (CPU) | in own scatters | waiting |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ("ps", "edge", "client"):
        if r in parts:
            p = parts[r]
            lines.append(f"| {r} ({p['n']:.0f}) | {p['compute']:.2f} | {p['down']:.2f} | {p['up']:.2f} | "
                         f"{p['encode']:.2f} | {p['decode']:.2f} | {p['in_scatter']:.2f} | {p['waiting']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="run only these cases (repeatable)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per case (fedavg-25M: at least 3)")
    ap.add_argument("--keep", type=Path, help="keep the run folders and timer logs here")
    ap.add_argument("--clients", type=int, default=4,
                    help="clients of every case (default 4; for fedavg-25M: with fewer clients than cores the training "
                    "leaves a core to the transport)")
    ap.add_argument("--clients-per-process", default="1", metavar="K",
                    help="clients per client process (launch --clients-per-process); default 1, as the compute floor "
                    "runs them (a client host runs its clients' tasks one at a time)")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if a.clients < 1:
        ap.error("--clients must be at least 1")
    if a.clients_per_process != "auto" and not (a.clients_per_process.isdigit() and int(a.clients_per_process) >= 1):
        ap.error(f"--clients-per-process must be a positive number or auto, got {a.clients_per_process!r}")
    cases = a.case or list(CASES)
    with tempfile.TemporaryDirectory(prefix="fedhop-breakdown-") as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print("Seconds per round, mean over the processes of a role (see the module docstring for the parts)\n")
        for name in cases:
            rounds = max(a.rounds, 3) if name == "fedavg-25M" else a.rounds
            # the floor is measured right before and right after the job: on a shared machine the load moves
            floor_before, cpu_before, eval_before = (compute_floor(write_spec(name, rounds, work, a.clients), rounds)
                                                     if name == "fedavg-25M" else ([], 0.0, []))
            walls, parts = breakdown(run_case(name, rounds, work, a.clients_per_process, a.clients))
            print(table(name, walls, parts))
            if "cpu" in parts:
                c = parts["cpu"]
                cores = os.cpu_count() or 1
                print(f"\nCPU seconds per round (rounds after the first, all processes): PS {c['ps']:.2f}, clients "
                      f"{c['clients']:.2f}, of which training {c['training']:.2f}; beside the training "
                      f"{c['other']:.2f} s = {c['other'] / cores:.2f} s of wall on {cores} cores if nothing overlaps "
                      f"(by round: {', '.join(f'{k[6:]}: {v:.2f}' for k, v in c.items() if k.startswith('other_'))}); "
                      f"of it the PS after its scatter (the evaluation) {c['ps_after']:.2f}, the rest "
                      f"{c['other'] - c['ps_after']:.2f}")
            if "latency" in parts:
                g = parts["latency"]
                print("\ncritical path, seconds per round (rounds after the first): " + ", ".join(
                    f"{k} {g[k]:.3f}" for k, _ in LATENCY if k in g) + f" (CPU {g['after_cpu']:.3f})")
            if name == "fedavg-25M":
                floor_after, cpu_after, eval_after = compute_floor(work / f"{name}.toml", rounds)
                mean_round = statistics.mean(walls)
                before, after = statistics.mean(floor_before), statistics.mean(floor_after)
                mean_floor = (before + after) / 2
                evaluation = (statistics.mean(eval_before) + statistics.mean(eval_after)) / 2
                print(f"\ncompute floor ({a.clients} clients' local training together, no transport): "
                      f"{before:.2f} s per round "
                      f"before the job, {after:.2f} s after; mean round / mean floor = {mean_round / mean_floor:.2f} "
                      f"(against each: {mean_round / before:.2f}, {mean_round / after:.2f}); "
                      f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
                print(f"with the PS's evaluation of each round's model ({evaluation:.2f} s, one thread, measured with "
                      f"the floor): floor {mean_floor + evaluation:.2f} s, mean round / floor = "
                      f"{mean_round / (mean_floor + evaluation):.2f} (target <= 1.15); "
                      f"round - floor = {mean_round - mean_floor - evaluation:.2f} s; the floor's training CPU "
                      f"{(cpu_before + cpu_after) / 2:.2f} s per round ({a.clients} clients)")
                in_run = parts.get("latency", {}).get("after")
                floor_evals = ", ".join(f"{x:.2f}" for x in eval_before + eval_after)
                run_eval = (f"; in the run (the PS's scatter end -> round end, rounds after the first): {in_run:.2f} s"
                            if in_run is not None else "")
                print(f"the evaluation per round in the floor: {floor_evals} s{run_eval}")
            print(flush=True)


if __name__ == "__main__":
    main()
