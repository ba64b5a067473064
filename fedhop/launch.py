"""``fedhop launch``: a whole federation on this machine, one OS process per edge and one per group of clients.

The launcher process is the PS itself (it runs :func:`fedhop.server.main.run_server`); every edge is a child
process (``python -m fedhop edge ...``) on a free loopback port, and the clients of each parent are served by
client hosts (``python -m fedhop clients --ids ...``) of at most ``clients_per_process`` ids each (1: one
``fedhop client`` process per client), with each process's stderr in ``<run folder>/logs/<name>.log`` (a host's
name is its id list, e.g. ``client-0..client-63``). Ctrl-C or any error kills every child.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedhop.client_ids import AUTO, format_ids, resolve_per_process
from fedhop.common.engine.results import RunResult
from fedhop.common.engine.topology import Topology, build_topology
from fedhop.common.spec import RunSpec
from fedhop.forkstart import ForkedChild, fedhop_argv, import_time_differences, warm

log = logging.getLogger("fedhop.launch")


def client_groups(topo: Topology, per_process: int) -> list[tuple[str, list[str]]]:
    """(parent, ids) of every client process: each parent's clients in canonical order, split into
    ``ceil(n / per_process)`` contiguous groups of nearly equal size."""
    if per_process < 1:
        raise ValueError(f"clients per process must be >= 1, got {per_process}")
    out: list[tuple[str, list[str]]] = []
    for p in (topo.server, *topo.edges):
        mine = [c for c in topo.clients if topo.parent[c] == p]
        n_groups = -(-len(mine) // per_process)
        for g in range(n_groups):
            out.append((p, mine[g * len(mine) // n_groups:(g + 1) * len(mine) // n_groups]))
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def pick_devices(choice: str, n: int) -> list[str]:
    """One device per process: ``auto`` spreads over the visible GPUs round-robin (CPU when none)."""
    if choice == "auto":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [f"cuda:{i % count}" for i in range(n)] if count else ["cpu"] * n
    return [choice] * n


def role_cmd(role: str, node: str, connect: str, *, listen: str | None = None, device: str | None = None,
             data_path: str | None = None, state_dir: Path | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The command line of one child process; ``role`` "clients" (a client host) takes an id list as ``node``."""
    cmd = [sys.executable, "-m", "fedhop", role, "--ids" if role == "clients" else "--id", node, "--connect", connect,
           *extra]
    if state_dir is not None:
        cmd += ["--state-dir", str(state_dir)]
    if listen:
        cmd += ["--listen", listen]
    if device:
        cmd += ["--device", device]
    if data_path:
        cmd += ["--data-path", data_path]
    return cmd


class Processes:
    """The child processes of a federation, by node id. ``fork``: start ``python -m fedhop ...`` commands by
    forking a server that has imported torch once (fedhop/forkstart.py) instead of a new interpreter each."""

    def __init__(self, logs: Path, fork: bool = True) -> None:
        self.logs = logs
        self.fork = fork
        self.procs: dict[str, subprocess.Popen | ForkedChild] = {}
        self._files: list[Any] = []

    def start(self, node: str, cmd: list[str]) -> subprocess.Popen | ForkedChild:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_file = self.logs / f"{node}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        argv = fedhop_argv(cmd) if self.fork else None
        if argv is not None and (differ := import_time_differences(env)):
            log.info("%s: started as a new interpreter: %s differ from the fork server's environment", node,
                     ", ".join(differ))
            argv = None
        if argv is not None:
            log_file.write_bytes(b"")
            p: subprocess.Popen | ForkedChild = ForkedChild(argv, log_file, env)
        else:
            f = log_file.open("wb")
            self._files.append(f)
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)  # Ctrl-C reaches the launcher, which then kills us
        self.procs[node] = p
        return p

    def start_nodes(self, topo: Topology, ps_addr: str, devices: dict[str, str] | None = None,
                    data_path: str | None = None, state_dir: Path | None = None,
                    extra: Sequence[str] = (), clients_per_process: int = 1) -> dict[str, str]:
        """Every edge and client of ``topo`` (each saving its state under ``state_dir``, if given; ``extra``:
        options for every child, e.g. ``--tls DIR``), clients in hosts of up to ``clients_per_process`` ids
        (:func:`client_groups`); returns the edges' addresses."""
        devices = devices or {}
        addr = {topo.server: ps_addr}
        for e in topo.edges:
            addr[e] = f"127.0.0.1:{free_port()}"
            self.start(e, role_cmd("edge", e, ps_addr, listen=addr[e], device=devices.get(e), state_dir=state_dir,
                                   extra=extra))
        for parent, ids in client_groups(topo, clients_per_process):
            if len(ids) == 1:
                self.start(ids[0], role_cmd("client", ids[0], addr[parent], device=devices.get(ids[0]),
                                            data_path=data_path, state_dir=state_dir, extra=extra))
                continue
            name = format_ids(ids)
            self.start(name, role_cmd("clients", name, addr[parent], device=devices.get(ids[0]),
                                      data_path=data_path, state_dir=state_dir, extra=extra))
        return {e: addr[e] for e in topo.edges}

    def wait(self, timeout_s: float) -> dict[str, int | None]:
        """Exit codes after waiting up to ``timeout_s`` in all (None: still running)."""
        import time

        end = time.monotonic() + timeout_s
        out: dict[str, int | None] = {}
        for n, p in self.procs.items():
            try:
                out[n] = p.wait(max(0.01, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                out[n] = None
        return out

    def startup_failure(self) -> str | None:
        """Why the federation cannot start: the first child that has already exited, with its log's tail."""
        for n, p in self.procs.items():
            code = p.poll()
            if code is not None:
                tail = (self.logs / f"{n}.log").read_text(errors="replace").strip().splitlines()[-8:]
                return f"{n} exited with code {code} before the run started; its log ends:\n  " + "\n  ".join(tail)
        return None

    def kill(self, node: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[node]
        if p.poll() is None:
            p.send_signal(sig)

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(3)
        for f in self._files:
            f.close()
        self._files.clear()


def launch(spec: RunSpec, out: Path, *, device: str = "auto", data_path: str | None = None,
           resume: Any = None,
           events: Any = None, security: Any = None, child_args: Sequence[str] = (),
           ps_workspace: Callable[[Any], None] | None = None,
           clients_per_process: int | str = AUTO, fork_children: bool = True) -> RunResult:
    """Run ``spec`` with the PS in this process, every edge in its own process and the clients in client hosts
    of up to ``clients_per_process`` ids (1: a ``fedhop client`` process per client; ``auto``: see
    :func:`~fedhop.client_ids.resolve_per_process`).

    Every child saves its state after each task under ``out/state/<node>`` (the PS checkpoints into
    ``out/checkpoints``), so that ``resume`` (a :class:`~fedhop.server.main.Resume` of ``out``) continues the
    run with every node restored. ``events``: the run's lifecycle events (progress; see run_server). ``security``:
    the PS's links (transport.credentials.Security); ``child_args``: the same for every child (``--tls DIR``).
    ``ps_workspace(ws)``: applied to the PS's Workspace before round 1 (see run_server). ``fork_children``:
    children are forked from a process that imported torch once (:class:`Processes`), else each is a new
    interpreter."""
    from fedhop.server.main import run_server

    topo = build_topology(spec.topology, spec.seed)
    nodes = topo.all_nodes()
    devices = dict(zip(nodes, pick_devices(device, len(nodes)), strict=True))
    out.mkdir(parents=True, exist_ok=True)
    procs = Processes(out / "logs", fork=fork_children)
    if fork_children:
        warm()
    (out / "logs").mkdir(exist_ok=True)
    handler = logging.FileHandler(out / "logs" / "ps.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("fedhop")
    saved = root.level, root.propagate
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False  # the PS's log goes to logs/ps.log; the terminal shows the progress bar

    def spawn(port: int) -> None:
        procs.start_nodes(topo, f"127.0.0.1:{port}", devices, data_path, out / "state", child_args,
                          resolve_per_process(clients_per_process, len(topo.clients)))

    try:
        result = run_server(spec, "127.0.0.1:0", out=out, device=devices[topo.server], on_listening=spawn,
                            startup_failure=procs.startup_failure, resume=resume, events=events,
                            security=security, ps_workspace=ps_workspace)
        codes = procs.wait(30)
        bad = {n: c for n, c in codes.items() if c != 0}
        if bad:
            log.warning("processes that did not exit cleanly: %s (logs in %s)", bad, out / "logs")
        return result
    finally:
        procs.kill_all()
        root.removeHandler(handler)
        root.setLevel(saved[0])
        root.propagate = saved[1]
        handler.close()
