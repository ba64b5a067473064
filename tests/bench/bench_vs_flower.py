"""fedhop beside Flower: the same FedAvg job on Flower's deployment engine and on ``fedhop launch``, one after
the other on this machine. Prints a table (and writes it as JSON with --json).

    sudo .venv/bin/python tests/bench/bench_vs_flower.py            # both model sizes (long: Flower is slow)
    sudo .venv/bin/python tests/bench/bench_vs_flower.py --quick    # only the 55,210-parameter model

The job (tests/bench/flower_app/ is the Flower side, written for this benchmark): FedAvg over 4 clients,
scikit-learn digits split 80/20 and the training part IID over the clients, 10 rounds, MLP 64-h-h-10 with
h = 200 (55,210 parameters) and h = 4,960 (24,978,570 parameters), one local epoch of mini-batch SGD with
batch 32 (12 steps: 359-360 samples per client) and lr 0.05, the global model evaluated centrally on the test
split after every round, no federated evaluation. fedhop runs it as ``local_steps = 12``.

Flower: installed from the package index into its own virtual environment (``--flower-venv``, default
``~/.cache/fedhop/flwr-VERSION``; created with --system-site-packages so the system torch is reused, and never
another torch). One SuperLink and 4 SuperNodes as separate processes (insecure, 127.0.0.1), the app run with
``flwr run``; runtime dependency installation disabled.

Measured, per framework and model:
* median round: Flower: time between successive central evaluations (its ServerApp appends their times to a
  file); fedhop: time between successive "round k/N" lines of the PS log (round 1 from the last client's
  "is ready"). Mean round: fedhop's training wall-clock / rounds; Flower: first to last evaluation / rounds.
* total wall: from starting the first process to the end of the run (start-up, joining, all rounds).
* loopback bytes / raw parameter bytes: each framework runs in a fresh network namespace; the ``lo``
  interface's tx byte counter at the end (TCP/IP headers included; every byte sent between its processes),
  over 2 x rounds x clients x parameters x 4 bytes (one model down and one up per client and round).
* peak RSS per process: psutil polls every process of the run (the launcher and all its descendants) every
  0.1 s; per role, the largest peak of a process in that role.

Needs root (``ip netns``) and the package index (first run only).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from launch_job import fedavg_job, launch, mlp_params

HERE = Path(__file__).resolve().parent
APP = HERE / "flower_app"
FLWR_VERSION = "1.42.0"
MODELS = {"55,210 params": 200, "24,978,570 params": 4960}
SUPERLINK_PORT = 8000


# -- Flower's virtual environment -------------------------------------------------------------------------


def _venv_ok(python: Path, version: str) -> bool:
    probe = ("import flwr, sklearn, torch, psutil, sys; "
             f"sys.exit(0 if flwr.__version__ == {version!r} and not torch.__file__.startswith(sys.prefix) else 1)")
    return python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def ensure_flower(venv: Path, version: str) -> Path:
    """The venv's bin folder with flwr ``version``, scikit-learn and psutil installed; torch from the system."""
    python = venv / "bin" / "python"
    if _venv_ok(python, version):
        return venv / "bin"
    print(f"installing Flower {version} into {venv} (once) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--clear", str(venv)], check=True)
    # torch as this interpreter has it (also when that is a virtual environment's, which --system-site-packages
    # does not reach): its folder goes last on the Flower venv's path, after Flower's own packages
    import torch

    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "_fedhop_torch.pth").write_text(str(Path(torch.__file__).resolve().parents[1]) + "\n")
    pip = [str(python), "-m", "pip", "install", "-q"]
    done = subprocess.run([*pip, f"flwr=={version}", "scikit-learn", "psutil"], capture_output=True, text=True)
    if done.returncode != 0:
        # flwr pins its dependencies' floors to the release day; an index a little older than the release
        # lacks some (e.g. certifi). Install flwr itself, then its requirements with the floors the index
        # cannot meet dropped, and say so.
        print(f"pip could not resolve flwr=={version}'s pins:\n{done.stderr.strip()[-600:]}\n"
              "installing flwr without dependencies, then its requirements one by one (unmet floors dropped)",
              file=sys.stderr, flush=True)
        subprocess.run([*pip, "--no-deps", f"flwr=={version}"], check=True)
        reqs = subprocess.run([str(python), "-c", "from importlib.metadata import requires; "
                               "print('\\n'.join(r for r in requires('flwr') if 'extra ==' not in r))"],
                              check=True, capture_output=True, text=True).stdout.split("\n")
        for req in [r.strip() for r in reqs if r.strip()] + ["scikit-learn", "psutil"]:
            if subprocess.run([*pip, req], capture_output=True).returncode != 0:
                name = re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0]
                print(f"  {req!r} is not on the index; installing {name} without the version floor",
                      file=sys.stderr, flush=True)
                subprocess.run([*pip, name], check=True)
    if not _venv_ok(python, version):
        raise SystemExit(f"{venv}: Flower {version} with scikit-learn, psutil and the system torch is not "
                         "importable after the install; remove the folder and try again")
    return venv / "bin"


# -- measurement helpers ----------------------------------------------------------------------------------


class Netns:
    """A fresh network namespace with ``lo`` up; ``wrap`` prefixes a command to run inside it."""

    def __init__(self, tag: str) -> None:
        self.name = f"fhb-{os.getpid()}-{tag}"

    def __enter__(self) -> Netns:
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        subprocess.run(["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"], check=True)
        return self

    def wrap(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def lo_tx_bytes(self) -> int:
        out = subprocess.run(self.wrap(["cat", "/sys/class/net/lo/statistics/tx_bytes"]), check=True,
                             capture_output=True, text=True).stdout
        return int(out)

    def __exit__(self, *exc: object) -> None:
        pids = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout.split()
        procs = []
        for pid in pids:
            try:
                procs.append(psutil.Process(int(pid)))
                procs[-1].terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=10)
        for p in alive:
            p.kill()
        psutil.wait_procs(alive, timeout=10)
        subprocess.run(["ip", "netns", "del", self.name], check=True)


@dataclass
class RssPoller:
    """Polls the RSS of the given root processes and all their descendants; keeps each pid's peak and role."""

    role_of: Callable[[list[str]], str]
    roots: list[psutil.Process] = field(default_factory=list)
    peaks: dict[int, tuple[str, int]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> RssPoller:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for root in list(self.roots):
                try:
                    procs = [root, *root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
                for p in procs:
                    try:
                        rss = p.memory_info().rss
                        role = self.peaks[p.pid][0] if p.pid in self.peaks else self.role_of(p.cmdline())
                    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        continue
                    if role and rss > self.peaks.get(p.pid, ("", 0))[1]:
                        self.peaks[p.pid] = (role, rss)

    def stop(self) -> dict[str, tuple[int, int]]:
        """Per role: (number of processes, largest peak RSS in bytes)."""
        self._stop.set()
        self._thread.join()
        out: dict[str, tuple[int, int]] = {}
        for role, rss in self.peaks.values():
            n, peak = out.get(role, (0, 0))
            out[role] = (n + 1, max(peak, rss))
        return out


def wait_for(what: str, cond: Callable[[], bool], timeout: float, procs: list[subprocess.Popen]) -> None:
    end = time.monotonic() + timeout
    while not cond():
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"waiting for {what}: {dead[0].args[-1] if dead[0].args else '?'} exited "
                               f"with {dead[0].returncode}")
        if time.monotonic() > end:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.05)


@dataclass
class Result:
    framework: str
    model: str
    params: int
    rounds: list[float]
    mean_round: float
    wall: float
    lo_bytes: int
    raw_bytes: int
    rss: dict[str, tuple[int, int]]
    accuracy: float

    def row(self) -> dict:
        return {"framework": self.framework, "model": self.model, "median round s": statistics.median(self.rounds),
                "mean round s": self.mean_round, "total wall s": self.wall, "loopback B": self.lo_bytes,
                "loopback / raw": self.lo_bytes / self.raw_bytes, "final accuracy": self.accuracy,
                "peak RSS MB (role: n x max)": ", ".join(f"{r}: {n}x{rss / 1e6:.0f}"
                                                         for r, (n, rss) in sorted(self.rss.items()))}


# -- Flower -----------------------------------------------------------------------------------------------


def flower_role(cmd: list[str]) -> str:
    text = " ".join(cmd[:3])
    for role in ("flower-superlink", "flower-supernode", "flwr-serverapp", "flwr-clientapp", "flower-superexec"):
        if role in text:
            return role.split("-", 1)[1]
    return ""


def run_flower(bin_dir: Path, version: str, hidden: int, rounds: int, clients: int, work: Path, timeout: float
               ) -> Result:
    home, app, timing = work / "flwr-home", work / "app", work / "timing.jsonl"
    home.mkdir(parents=True)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\n'
                                      f'address = "127.0.0.1:{SUPERLINK_PORT}"\ninsecure = true\n')
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    logs = work / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []
    poller = RssPoller(flower_role).start()

    def start(name: str, cmd: list[str]) -> subprocess.Popen:
        with (logs / f"{name}.log").open("w") as log:
            p = subprocess.Popen(ns.wrap(cmd), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        procs.append(p)
        poller.roots.append(psutil.Process(p.pid))
        return p

    with Netns("flwr") as ns:
        t0 = time.perf_counter()
        start("superlink", [str(bin_dir / "flower-superlink"), "--insecure", "--port", str(SUPERLINK_PORT),
                            "--disable-runtime-dependency-installation"])
        wait_for("the SuperLink to listen", lambda: "Uvicorn running" in (logs / "superlink.log").read_text(),
                 120, procs)
        for i in range(clients):
            start(f"supernode-{i}", [str(bin_dir / "flower-supernode"), "--insecure", "--superlink",
                                     f"127.0.0.1:{SUPERLINK_PORT}", "--port", str(9094 + i), "--node-config",
                                     f"partition-id={i} num-partitions={clients}"])
        config = (f'num-server-rounds={rounds} num-partitions={clients} hidden={hidden} '
                  f'timing-file="{timing}"')
        start("flwr-run", [str(bin_dir / "flwr"), "run", str(app), "bench", "--run-config", config, "--stream"])

        def stamps() -> list[dict]:
            return [json.loads(x) for x in timing.read_text().splitlines()] if timing.exists() else []

        wait_for(f"{rounds} Flower rounds", lambda: len(stamps()) > rounds, timeout, procs[:1])
        wall = time.perf_counter() - t0
        lo = ns.lo_tx_bytes()
        rss = poller.stop()
    s = stamps()
    times = [b["t"] - a["t"] for a, b in zip(s, s[1:], strict=False)]
    return Result(f"Flower {version}", "", mlp_params(hidden), times, (s[-1]["t"] - s[0]["t"]) / rounds,
                  wall, lo, 2 * rounds * clients * mlp_params(hidden) * 4, rss, s[-1]["accuracy"])


# -- fedhop -----------------------------------------------------------------------------------------------


def fedhop_role(cmd: list[str]) -> str:
    """``python -m fedhop launch ...`` is the PS (it runs in the launcher); ``python -m fedhop client ...``."""
    cmd = " ".join(cmd).split()  # a forked child's title (fedhop/forkstart.py) is one string
    if cmd[1:3] == ["-m", "fedhop"] and len(cmd) > 3:
        return {"launch": "ps (launch)", "client": "client", "clients": "client host",
                "edge": "edge"}.get(cmd[3], "")
    return ""


def run_fedhop(hidden: int, rounds: int, clients: int, work: Path, timeout: float,
               per_process: str = "1") -> Result:
    spec = work / "spec.toml"
    spec.write_text(fedavg_job(hidden, clients, rounds, name="vs-flower"))
    poller = RssPoller(fedhop_role).start()
    with Netns("fedhop") as ns:
        run = launch(spec, work / "run", args=("--clients-per-process", per_process), timeout=timeout, wrap=ns.wrap,
                     on_start=lambda p: poller.roots.append(psutil.Process(p.pid)))
        lo = ns.lo_tx_bytes()
        rss = poller.stop()
    res = run.results
    return Result("fedhop", "", mlp_params(hidden), run.round_s, res["wall_s"] / rounds, run.wall_s, lo,
                  2 * rounds * clients * mlp_params(hidden) * 4, rss, res["rounds"][-1]["accuracy"])


# -- output -----------------------------------------------------------------------------------------------


def print_table(rows: list[dict]) -> None:
    fmt = {"median round s": ".3f", "mean round s": ".3f", "total wall s": ".1f", "loopback B": ",",
           "loopback / raw": ".3f", "final accuracy": ".3f"}
    cols = list(rows[0])
    cells = [[format(r[c], fmt.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="only the 55,210-parameter model")
    p.add_argument("--hidden", type=int, action="append", help="run these hidden widths h instead (repeatable), "
                   "e.g. --hidden 4960 for the 25M-parameter model alone")
    p.add_argument("--rounds", type=int, default=10, help="FedAvg rounds (default 10)")
    p.add_argument("--clients", type=int, default=4, help="clients / SuperNodes (default 4)")
    p.add_argument("--flwr-version", default=FLWR_VERSION, help=f"Flower release to install (default {FLWR_VERSION})")
    p.add_argument("--flower-venv", type=Path, help="Flower's virtual environment (default "
                   "~/.cache/fedhop/flwr-VERSION; created on first use)")
    p.add_argument("--only", choices=["flower", "fedhop"], help="run one framework only")
    p.add_argument("--timeout", type=float, default=7200, help="seconds one framework's run may take")
    p.add_argument("--clients-per-process", default="1", metavar="K",
                   help="fedhop's `launch --clients-per-process` (default 1: a process per client, as Flower's "
                        "SuperNodes; `auto` puts 4 clients in one host that trains them one at a time)")
    p.add_argument("--keep", type=Path, help="keep the work folders (logs, run results) here")
    p.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    a = p.parse_args()
    if a.rounds < 1 or a.clients < 1:
        p.error("--rounds and --clients must be at least 1")
    if os.geteuid() != 0:
        p.error("needs root: each framework runs in its own network namespace (ip netns)")
    if shutil.which("ip") is None:
        p.error("needs the 'ip' command (iproute2)")
    venv = a.flower_venv or Path.home() / ".cache" / "fedhop" / f"flwr-{a.flwr_version}"
    bin_dir = ensure_flower(venv, a.flwr_version) if a.only != "fedhop" else Path()
    models = dict(list(MODELS.items())[:1]) if a.quick else MODELS
    if a.hidden:
        if any(h < 1 for h in a.hidden):
            p.error("--hidden must be at least 1")
        models = {f"{mlp_params(h):,} params": h for h in a.hidden}
    work_root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench-vs-flower-"))
    work_root.mkdir(parents=True, exist_ok=True)
    print(f"work folders under {work_root}; load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}, "
          f"{os.cpu_count()} CPUs", file=sys.stderr, flush=True)
    rows = []
    try:
        for label, hidden in models.items():
            for fw in ("flower", "fedhop"):
                if a.only and fw != a.only:
                    continue
                work = work_root / f"{fw}-h{hidden}"
                work.mkdir()
                print(f"{fw}: {label} (h = {hidden}), {a.rounds} rounds, {a.clients} clients ...", file=sys.stderr,
                      flush=True)
                r = (run_flower(bin_dir, a.flwr_version, hidden, a.rounds, a.clients, work, a.timeout) if fw == "flower"
                     else run_fedhop(hidden, a.rounds, a.clients, work, a.timeout,
                                     a.clients_per_process))
                r.model = label
                rows.append(r.row())
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(work_root, ignore_errors=True)
    print(f"\nFedAvg, digits IID over {a.clients} clients, {a.rounds} rounds, MLP 64-h-h-10, one local epoch "
          f"(batch 32, lr 0.05); load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}, "
          f"{os.cpu_count()} CPUs")
    print_table(rows)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
