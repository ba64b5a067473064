"""Many clients on one machine over real gRPC: ``fedhop launch`` with 10 / 100 / 1,000 clients (FedAvg, a small
MLP; no edges, or ``--edges 2``), clients served by client hosts (``fedhop clients``; launch's
``--clients-per-process``, default auto), or (``--by-hand``) a ``fedhop server`` and ``fedhop clients`` processes
started by this script, as a user would by hand. Prints a table:

* join: from starting ``fedhop launch`` to the start of round 1 (every process started, every client joined);
* per client: join / clients;
* mean round: the mean of ``round_s`` over the rounds (``rounds.jsonl``);
* PS peak RSS, PS threads (peak) and CPU seconds (of the PS and of the client processes, whole run): the
  launcher process (which is the PS) or ``fedhop server``, sampled with psutil every 50 ms;
* per client above in-process: (mean round - in-process round) / clients, in ms (issue 19's target: <= 1 ms);
* hosts: the client hosts, the sum of their RSS and the sum of their threads at their sampled peaks; the edges
  (``--edges``) the same in columns of their own;
* in-process round: the in-process engine's mean round on the same spec in this process (the compute floor:
  the same local training and aggregation with no transport).

The baseline, in the same run: 10 clients with ``--clients-per-process 1`` (one ``fedhop client`` process per
client, as before client hosts).

    .venv/bin/python tests/bench/bench_many_clients.py                  # 10, 100, 1000 clients + baseline
    .venv/bin/python tests/bench/bench_many_clients.py --clients 10 100 --baseline 10 30 --per-process auto 64
    .venv/bin/python tests/bench/bench_many_clients.py --clients 100 1000 3000 --baseline --edges 0 2 --repeat 3
    .venv/bin/python tests/bench/bench_many_clients.py --clients 1000 --baseline --by-hand
    .venv/bin/python tests/bench/bench_many_clients.py --clients 1000 --baseline --by-hand --edges 2  # + 2 edges

``--fleet`` measures the PS alone at 1,000 - 10,000 clients: ``fedhop server`` and, in this process, one
asyncio gRPC client per id that says Hello and Ready and answers every Task at once with the model it received
(no training, no client hosts). Its round is the PS's own cost of a round: per client, the PS's overhead.

    .venv/bin/python tests/bench/bench_many_clients.py --fleet --clients 1000 3000 10000

10,000 real clients (two client hosts of 5,000 ids, each on one asyncio loop; ~2 GB, 4-6 minutes on 2 cores;
a host needs ``ulimit -n`` above its ids: a socket each); ``--keepalive-s`` sets the parent's keep-alive interval:

    .venv/bin/python tests/bench/bench_many_clients.py --clients 10000 --baseline --rounds 2 --by-hand

``--profile DIR`` (with ``--by-hand``) runs the PS and the hosts under cProfile in every thread, counting CPU
time (``tests/bench/profile_process.py``; ``DIR/ps-N.prof``, ``DIR/host-N-LO.prof``, read with ``pstats``):

    .venv/bin/python tests/bench/bench_many_clients.py --clients 1000 --baseline --by-hand --profile /tmp/prof

With ``--fleet``, ``--profile DIR`` profiles the PS alone (``DIR/ps-fleet-N.prof``); with ``fedhop launch``
the launcher, which is the PS (``DIR/launch-N.prof``, ``DIR/launch-N-http-off.prof``; its client hosts, forked
from launch's fork server, are not profiled).

``--http default off`` runs each launch case with the live page (launch's default: a child process fed every
run event, server/web/proc.py) and without it, interleaved run by run (with ``--repeat``), a row each:

    .venv/bin/python tests/bench/bench_many_clients.py --clients 10000 --baseline --rounds 2 --http default off

``--host-state-dir`` (with ``--by-hand``) starts the hosts with ``--state-dir RUN/state`` as ``launch`` always does
(each client saves its state to a file after each task; without it, a copy in memory): by hand and launch then
compare like for like. Each run's ``round_s`` and each process's CPU seconds when round 1 ended and at the end go
to stderr (the live page's child apart from the hosts).

``--repeat k`` runs each case k times and reports the median of each column. The load average (1 minute) is
printed before and after every run: the numbers mean little on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from fedhop.common.spec import RunSpec

ALGORITHM: list[str] = []  # --algorithm: the runs' algorithm (default fedavg)
KEEPALIVE_S: list[float] = []  # --keepalive-s: the runs' transport.keepalive_s (default: the spec's)
HOST_STATE: list[bool] = []  # --host-state-dir: by hand, the hosts save each client's state to disk, as launch's do
PROFILE: list[Path] = []  # --profile DIR: the PS (and by hand the hosts) run under tests/bench/profile_process.py


def _fedhop(role: str, name: str) -> list[str]:
    """The command line that starts ``python -m fedhop ROLE`` (under cProfile, into --profile's folder)."""
    if not PROFILE:
        return [sys.executable, "-m", "fedhop", role]
    wrapper = Path(__file__).with_name("profile_process.py")
    return [sys.executable, str(wrapper), str(PROFILE[0] / f"{name}.prof"), role]


def spec_for(clients: int, rounds: int, edges: int = 0) -> RunSpec:
    keepalive = ({"keepalive_s": KEEPALIVE_S[0], "keepalive_timeout_s": max(30.0, 6 * KEEPALIVE_S[0])}
                 if KEEPALIVE_S else {})
    return RunSpec.parse({
        "name": f"many-{clients}",
        "rounds": rounds,
        "seed": 0,
        "device": "cpu",
        "algorithm": {"name": ALGORITHM[0] if ALGORITHM else "fedavg",
                      "options": {"lr": 0.05, "local_steps": 2, "batch_size": 16}},
        "topology": {"clients": clients, "edges": edges},
        "data": {"dataset": "synthetic", "partition": "iid",
                 "options": {"samples": max(4000, 60 * clients), "dim": 20}},
        "model": {"name": "mlp", "hidden": [16]},
        "transport": {"join_timeout_s": 900.0, "round_deadline_s": 600.0, **keepalive},
    })


def _rss(p: psutil.Process) -> int:
    try:
        return int(p.memory_info().rss)
    except psutil.Error:
        return 0


def inprocess_round_s(clients: int, rounds: int, edges: int = 0) -> float:
    from fedhop.common.engine.inprocess import InProcessEngine

    res = InProcessEngine(spec_for(clients, rounds, edges), device="cpu").run()
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
    edges: int = 0
    how: str = "launch"
    ps_threads: int = 0
    load: tuple[float, float] = (float("nan"), float("nan"))  # the 1-minute load average before and after
    hosts_threads: int = 0  # the client processes' threads (the peak of their sum)
    ps_cpu_s: float = float("nan")  # CPU seconds (user + system) of the PS / of the client processes, whole run
    hosts_cpu_s: float = float("nan")
    edges_peak_mb: float = 0.0  # the edges' RSS and threads (the peak of their sums), counted apart from the hosts
    edges_threads: int = 0
    edges_cpu_s: float = 0.0  # CPU seconds of the edges (included in hosts_cpu_s)


def _is_edge(p: psutil.Process) -> bool:
    """Whether a child process is an edge (``fedhop edge``), not a client host."""
    try:
        return " edge " in f" {' '.join(p.cmdline())} "
    except psutil.Error:
        return False


def _cpu(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
        return float(t.user + t.system)
    except psutil.Error:
        return 0.0


def _threads(p: psutil.Process) -> int:
    try:
        return int(p.num_threads())
    except psutil.Error:
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(clients: int, per_process: int, rounds: int, work: Path, edges: int = 0, by_hand: bool = False,
        http: str | None = None) -> Row:
    """One run: ``fedhop launch`` (the launcher is the PS), or (``by_hand``) ``fedhop server``, a ``fedhop edge``
    per edge and one ``fedhop clients`` process per ``per_process`` ids of an edge (of the PS without edges),
    started here. ``http``: launch's ``--http`` (None: its default, the live page on a free port; ``off``: none)."""
    folder = Path(tempfile.mkdtemp(prefix=f"c{clients}-k{per_process}-e{edges}-", dir=work))
    spec_file = folder / "spec.toml"
    spec = spec_for(clients, rounds, edges)
    spec_file.write_text(spec.to_toml())
    out = folder / "run"
    load0 = psutil.getloadavg()[0]
    t0 = time.monotonic()
    err = (folder / "launch.err").open("wb")
    hosts: list[subprocess.Popen] = []
    if by_hand:
        from fedhop.common.topology import build_topology

        addr = f"127.0.0.1:{_free_port()}"
        proc = subprocess.Popen([*_fedhop("server", f"ps-{clients}"), str(spec_file), "--out", str(out),
                                 "--listen", addr, "--device", "cpu", "--log-level", "warning"],
                                stdout=subprocess.DEVNULL, stderr=err)
        topo = build_topology(spec.topology, spec.seed)
        groups: list[tuple[tuple[str, ...], str]] = [(topo.clients, addr)]  # (ids, their parent's address)
        if edges:
            groups = []
            for edge in topo.edges:  # each edge's clients are a contiguous range of ids (common/topology.py)
                edge_addr = f"127.0.0.1:{_free_port()}"
                hosts.append(subprocess.Popen([*_fedhop("edge", f"{edge}-{clients}"), "--id", edge, "--connect", addr,
                                               "--listen", edge_addr, "--device", "cpu", "--log-level", "warning"],
                                              stdout=subprocess.DEVNULL, stderr=err))
                groups.append((topo.cluster(edge), edge_addr))
        for ids, parent in groups:
            for lo in range(0, len(ids), per_process):
                some = f"{ids[lo]}..{ids[min(len(ids), lo + per_process) - 1]}"
                hosts.append(subprocess.Popen([*_fedhop("clients", f"host-{clients}-{ids[lo]}"), "--ids", some,
                                               "--connect", parent, "--device", "cpu", "--log-level", "warning",
                                               *(["--state-dir", str(out / "state")] if HOST_STATE else [])],
                                              stdout=subprocess.DEVNULL, stderr=err))
    else:
        label = f"launch-{clients}" + ("" if http is None else f"-http-{http.replace(':', '_')}")
        proc = subprocess.Popen([*_fedhop("launch", label), str(spec_file), "--out", str(out),
                                 "--device", "cpu", "--quiet", "--clients-per-process", str(per_process),
                                 *(["--http", http] if http is not None else [])],
                                stdout=subprocess.DEVNULL, stderr=err)
    ps = psutil.Process(proc.pid)
    journal = out / "rounds.jsonl"
    ps_peak = hosts_peak = edges_peak = 0.0
    ps_threads = hosts_threads = edges_threads = 0
    edge_pids: dict[int, bool] = {}  # pid -> whether it is an edge
    first_end: float | None = None
    at_first: dict[int, float] = {}
    names: dict[int, str] = {}  # pid -> what it is (for the CPU by process, on stderr)
    children: set[int] = set()
    cpu: dict[int, float] = {}  # pid -> its last sampled CPU seconds
    while proc.poll() is None:
        ps_peak = max(ps_peak, _rss(ps))
        cpu[proc.pid] = _cpu(ps) or cpu.get(proc.pid, 0.0)
        ps_threads = max(ps_threads, _threads(ps))
        try:
            kids = [psutil.Process(h.pid) for h in hosts] if by_hand else [
                k for k in ps.children(recursive=True)  # forked hosts are the fork server's children
                if "multiprocessing.forkserver" not in " ".join(k.cmdline())]
        except psutil.Error:
            kids = []
        children.update(k.pid for k in kids)
        for k in kids:
            if k.pid not in names:
                try:
                    names[k.pid] = " ".join(k.cmdline()[2:5]).strip()[:60] or f"forked {k.pid}"
                except psutil.Error:
                    names[k.pid] = "?"
        for k in kids:
            if k.pid not in edge_pids:
                edge_pids[k.pid] = _is_edge(k)
        edge_kids = [k for k in kids if edge_pids[k.pid]]
        host_kids = [k for k in kids if not edge_pids[k.pid]]
        hosts_peak = max(hosts_peak, sum(_rss(k) for k in host_kids))
        hosts_threads = max(hosts_threads, sum(_threads(k) for k in host_kids))
        edges_peak = max(edges_peak, sum(_rss(k) for k in edge_kids))
        edges_threads = max(edges_threads, sum(_threads(k) for k in edge_kids))
        for k in kids:
            cpu[k.pid] = _cpu(k) or cpu.get(k.pid, 0.0)
        if first_end is None and journal.is_file() and journal.read_text().strip():
            first_end = time.monotonic()
            at_first = dict(cpu)  # each process's CPU seconds when round 1 ended (printed at the end)
        time.sleep(0.05)
    hosts_ok = all(h.wait(60) == 0 for h in hosts)
    rows = [json.loads(line) for line in journal.read_text().splitlines()] if journal.is_file() else []
    join = (first_end - t0 - rows[0]["round_s"]) if first_end is not None and rows else float("nan")
    mean_round = sum(r["round_s"] for r in rows) / len(rows) if rows else float("nan")
    print(f"  round_s: {[r['round_s'] for r in rows]}", file=sys.stderr)
    for pid, v in cpu.items():  # the live page's child shows here apart from the hosts
        print(f"  CPU s {names.get(pid, 'PS')}: {at_first.get(pid, float('nan')):.1f} when round 1 ended, {v:.1f} "
              f"at the end", file=sys.stderr)
    return Row(clients, per_process, len(children), join, mean_round, ps_peak / 2**20, hosts_peak / 2**20,
               proc.returncode == 0 and hosts_ok and len(rows) == rounds, edges,
               "by hand" if by_hand else "launch" if http is None else f"launch, --http {http}",
               ps_threads, (load0, psutil.getloadavg()[0]), hosts_threads, cpu.get(proc.pid, float("nan")),
               sum(v for pid, v in cpu.items() if pid != proc.pid), edges_peak / 2**20, edges_threads,
               sum(v for pid, v in cpu.items() if edge_pids.get(pid)))


def median_row(rows: list[Row]) -> Row:
    """The median of each measured column over repeated runs of one case (ok: every run was)."""
    def med(values: list[float]) -> float:
        return float(statistics.median(values))

    first = rows[0]
    return Row(first.clients, first.per_process, first.processes, med([r.join_s for r in rows]),
               med([r.mean_round_s for r in rows]), med([r.ps_peak_mb for r in rows]),
               med([r.hosts_peak_mb for r in rows]), all(r.ok for r in rows), first.edges, first.how,
               int(med([r.ps_threads for r in rows])), (min(r.load[0] for r in rows), max(r.load[1] for r in rows)),
               int(med([r.hosts_threads for r in rows])), med([r.ps_cpu_s for r in rows]),
               med([r.hosts_cpu_s for r in rows]), med([r.edges_peak_mb for r in rows]),
               int(med([r.edges_threads for r in rows])), med([r.edges_cpu_s for r in rows]))


# -- the PS alone, with a fleet of instant clients --------------------------------------------------------------

async def _fleet_client(node: str, addr: str, size: int, channel: Any, joined: Any, errors: list[str],
                        slots: Any) -> None:
    """One client: Hello (``slots`` joining at once, as a client host's JOIN_SLOTS; dialing again when the PS
    closed the session before its Welcome, as a real client does), Ready with ``size`` samples, each Task
    answered with the model it carried, Bye."""
    async with slots:
        while not await _fleet_session(node, size, channel, joined, errors, slots):
            pass


async def _fleet_session(node: str, size: int, channel: Any, joined: Any, errors: list[str], slots: Any) -> bool:
    """One session of a fleet client; False: refused before its Welcome (dial again)."""
    import asyncio

    from fedhop.common.spec import TransportSpec
    from fedhop.common.wire.control import bye_frame
    from fedhop.common.wire.framing import parse_frame_lenient, serialize_frame, unbatched
    from fedhop.common.wire.messages import message_frames, result_frame
    from fedhop.transport.session import child_assembler, hello_frame
    from fedhop.v1 import fedhop_pb2 as pb

    out: asyncio.Queue = asyncio.Queue()

    async def requests() -> Any:
        while (f := await out.get()) is not None:
            yield f

    call = channel.stream_stream("/fedhop.v1.Parent/Session", request_serializer=serialize_frame,
                                 response_deserializer=parse_frame_lenient)(requests())
    await out.put(hello_frame(node, "client", "", {}, ""))
    asm = child_assembler(TransportSpec())
    welcomed = False
    try:
        async for message in call:
            for frame in unbatched(message):  # a Batch's frames (a small Task's), one by one
                if isinstance(frame, pb.Frame):
                    body = frame.WhichOneof("body")
                    if body == "welcome":
                        ready = pb.Frame()
                        ready.ready.data_sizes[node] = size
                        await out.put(ready)
                        welcomed = True
                        joined()
                        slots.release()  # the next one may join (the caller's ``async with`` takes it back)
                        continue
                    if body == "error" and not welcomed:
                        await out.put(None)
                        return False
                    if body == "bye":
                        await out.put(bye_frame("bye", finished=True))
                        await out.put(None)
                        continue
                    if body == "error":
                        errors.append(f"{node}: {frame.error.message}")
                        continue
                    if body is None or body == "ready":
                        continue
                msg = asm.feed(frame)
                if msg is not None:
                    # as a client sends its Result: a small one as one Batch frame (transport.chunk_bytes)
                    head = result_frame(msg.call_id, {"n": size, "loss": 0.0}, has_bundle=True)
                    for f in message_frames(head, msg.bundle, TransportSpec().chunk_bytes):
                        await out.put(f)
    except Exception as e:  # noqa: BLE001  (a benchmark: count it, go on)
        errors.append(f"{node}: {type(e).__name__}: {e}")
    if welcomed:
        await slots.acquire()  # given back at the Welcome; released again by the caller's ``async with``
    return True


def run_fleet(clients: int, rounds: int, work: Path) -> Row:
    """``fedhop server`` with ``clients`` instant clients of this process (see the module docstring)."""
    import asyncio

    import grpc

    folder = Path(tempfile.mkdtemp(prefix=f"fleet-{clients}-", dir=work))
    spec_file = folder / "spec.toml"
    spec = spec_for(clients, rounds)
    spec_file.write_text(spec.to_toml())
    size = spec.data.options["samples"] // clients
    out = folder / "run"
    addr = f"127.0.0.1:{_free_port()}"
    load0 = psutil.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.Popen([*_fedhop("server", f"ps-fleet-{clients}"), str(spec_file), "--out", str(out),
                             "--listen", addr, "--device", "cpu", "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=(folder / "server.err").open("wb"))
    ps = psutil.Process(proc.pid)
    peaks = {"rss": 0.0, "threads": 0, "cpu": 0.0}
    errors: list[str] = []
    n_joined = [0]
    journal = out / "rounds.jsonl"
    first_end: list[float] = []

    async def fleet() -> None:
        # ids share a few connections (HTTP/2 streams), as client hosts' ids could; 250 streams per connection
        channels = [grpc.aio.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(max(1, clients // 250))]
        for ch in channels:
            while True:
                try:
                    await asyncio.wait_for(ch.channel_ready(), 5)
                    break
                except TimeoutError:
                    continue

        def joined() -> None:
            n_joined[0] += 1

        async def watch() -> None:
            while proc.poll() is None:
                peaks["rss"] = max(peaks["rss"], _rss(ps))
                peaks["threads"] = max(peaks["threads"], _threads(ps))
                peaks["cpu"] = max(peaks["cpu"], _cpu(ps))  # the PS's CPU seconds (the last reading before it exits)
                if not first_end and journal.is_file() and journal.read_text().strip():
                    first_end.append(time.monotonic())
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        slots = asyncio.Semaphore(16)
        await asyncio.gather(*(_fleet_client(f"client-{i}", addr, size, channels[i % len(channels)], joined, errors,
                                             slots) for i in range(clients)))
        await watcher
        for ch in channels:
            await ch.close()

    asyncio.run(fleet())
    proc.wait()
    rows = [json.loads(line) for line in journal.read_text().splitlines()] if journal.is_file() else []
    join = first_end[0] - t0 - rows[0]["round_s"] if first_end and rows else float("nan")
    mean_round = sum(r["round_s"] for r in rows) / len(rows) if rows else float("nan")
    if errors:
        print(f"  {len(errors)} client errors, e.g. {errors[:3]}", file=sys.stderr)
    return Row(clients, clients, 0, join, mean_round, peaks["rss"] / 2**20, 0.0,
               proc.returncode == 0 and not errors and len(rows) == rounds, 0, "fleet (no training)",
               int(peaks["threads"]), (load0, psutil.getloadavg()[0]), ps_cpu_s=peaks["cpu"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--baseline", type=int, nargs="*", default=[10],
                    help="client counts also run with one process per client")
    ap.add_argument("--per-process", nargs="+", default=["auto"],
                    help="--clients-per-process values for the host runs (each a number or auto; default: auto)")
    ap.add_argument("--edges", type=int, nargs="+", default=[0], help="edge counts (default: 0, a flat run)")
    ap.add_argument("--by-hand", action="store_true",
                    help="start fedhop server, fedhop edge (with --edges) and fedhop clients here instead of "
                         "fedhop launch")
    ap.add_argument("--fleet", action="store_true",
                    help="the PS alone with instant clients of this process (no training, no client hosts)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; the table gives the medians")
    ap.add_argument("--keepalive-s", type=float, default=None,
                    help="transport.keepalive_s of the runs (a parent's keep-alive on each quiet session; default 5)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="run the PS under cProfile (every thread; by hand the hosts too), the profiles into this "
                         "folder (ps-N.prof, host-N-LO.prof; launch-N.prof, launch-N-http-off.prof: the launcher, "
                         "which is the PS; tests/bench/profile_process.py)")
    ap.add_argument("--http", nargs="+", default=[None], metavar="ADDRESS",
                    help="launch's --http for the launch runs, each case run with each value in turn (interleaved "
                         "with --repeat): 'default' (launch's own: the live page on a free port), 'off' (no page), "
                         "HOST:PORT; e.g. --http default off")
    ap.add_argument("--algorithm", choices=["fedavg", "scaffold"], default="fedavg",
                    help="the runs' algorithm: fedavg (its clients keep no state: nothing saved under --state-dir) "
                         "or scaffold (each client keeps its control variate c_i: a state saved after every task)")
    ap.add_argument("--host-state-dir", action="store_true",
                    help="with --by-hand: give the client hosts --state-dir RUN/state, as launch does (each client "
                         "saves its state to a file after each task; without it, a copy in memory)")
    a = ap.parse_args()
    if a.host_state_dir:
        if not a.by_hand:
            raise SystemExit("--host-state-dir is for --by-hand: launch's hosts always have a state folder")
        HOST_STATE.append(True)
    https: list[str | None] = [None if h in (None, "default") else h for h in a.http]
    if a.by_hand and https != [None]:
        raise SystemExit("--http is launch's option; by hand, fedhop server serves no page unless asked")
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
        PROFILE.append(a.profile.resolve())
    if a.keepalive_s is not None:
        KEEPALIVE_S.append(a.keepalive_s)
    ALGORITHM.append(a.algorithm)
    from fedhop.client_ids import resolve_per_process

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-many-") as tmp:
        cases = [(n, 1, e) for n in a.baseline for e in a.edges]
        cases += [(n, k, e) for n in a.clients for e in a.edges
                  for k in dict.fromkeys(resolve_per_process(c, n) for c in a.per_process)]
        if a.fleet:
            cases = [(n, n, 0) for n in a.clients]
        for n, k, e in cases:
            if a.fleet:
                runs = [run_fleet(n, a.rounds, Path(tmp)) for _ in range(a.repeat)]
                rows.append(median_row(runs))
                print(f"  done: {rows[-1]}", file=sys.stderr)
                continue
            by_http: dict[str | None, list[Row]] = {h: [] for h in https}
            for _ in range(a.repeat):  # the --http values interleaved: one of each, then again
                for h in https:
                    by_http[h].append(run(n, k, a.rounds, Path(tmp), e, a.by_hand, h))
                    print(f"  run: {by_http[h][-1]}", file=sys.stderr)
            for h in https:
                rows.append(median_row(by_http[h]))
                print(f"  done: {rows[-1]}", file=sys.stderr)
    # the fleet trains nothing: its floor is 0 and its "per client" the PS's own cost of a client per round
    floors = {(n, e): 0.0 if a.fleet else inprocess_round_s(n, a.rounds, e)
              for n, e in sorted({(r.clients, r.edges) for r in rows})}
    print(f"{a.algorithm}, MLP 20-16-10, synthetic iid, {a.rounds} rounds, real gRPC on loopback, {psutil.cpu_count()} "
          f"cores; {'median of ' + str(a.repeat) + ' runs' if a.repeat > 1 else 'one run'} per row; load average "
          f"at the end {psutil.getloadavg()[0]:.1f}")
    print("| clients | edges | started by | clients per process | client processes | join (start -> round 1) "
          "| mean round | in-process round | per client above in-process | PS peak RSS | PS threads (peak) "
          "| hosts' RSS (sum, peak) | hosts' threads (sum, peak) | edges' RSS (sum, peak) | edges' threads (sum, peak) "
          "| CPU s: PS / hosts / edges | load (1 min) before / after | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        floor = floors[(r.clients, r.edges)]
        print(f"| {r.clients:,} | {r.edges} | {r.how} | {r.per_process} | {r.processes} | {r.join_s:.1f} s | "
              f"{r.mean_round_s:.2f} s | {floor:.2f} s | {1000 * (r.mean_round_s - floor) / r.clients:.1f} ms | "
              f"{r.ps_peak_mb:.0f} MB | {r.ps_threads} | {r.hosts_peak_mb:.0f} MB | {r.hosts_threads} | "
              f"{r.edges_peak_mb:.0f} MB | {r.edges_threads} | "
              f"{r.ps_cpu_s:.1f} / {r.hosts_cpu_s - r.edges_cpu_s:.1f} / {r.edges_cpu_s:.1f} | "
              f"{r.load[0]:.1f} / {r.load[1]:.1f} | {'yes' if r.ok else 'NO'} |")


if __name__ == "__main__":
    main()
