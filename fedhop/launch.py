"""``fedhop launch``: a whole federation on this machine, one OS process per edge and one per group of clients.

The launcher process is the PS itself (it runs :func:`fedhop.server.main.run_server`); every edge is a child
process (``python -m fedhop edge ...``) on a free loopback port, and the clients of each parent are served by
client hosts (``python -m fedhop clients --ids ...``) of at most ``clients_per_process`` ids each (1: one
``fedhop client`` process per client), with each process's stderr in ``<run folder>/logs/<name>.log`` (a host's
name is its id list, e.g. ``client-0..client-63``). Ctrl-C or any error kills every child.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedhop.client_ids import AUTO, format_ids, resolve_per_process
from fedhop.common.engine.results import RunResult
from fedhop.common.spec import RunSpec
from fedhop.common.topology import Topology, build_topology
from fedhop.deploy import processes as deploy_processes
from fedhop.deploy.contract import RoleCommand, peer_clients, plan
from fedhop.deploy.wire import WireReading
from fedhop.forkstart import ForkedChild, fedhop_argv, import_time_differences, warm
from fedhop.transport.credentials import PLAINTEXT, Security

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


def node_devices(spec: RunSpec, device: str | None, nodes: Sequence[str]) -> dict[str, str]:
    """Each node's device: ``device`` (the command line's ``--device``) when given, else the spec's ``device``, as
    the in-process engine reads it, so that a spec saying ``cpu`` runs on the CPU in both engines even where a GPU
    is visible (before, launch's default ``auto`` put the clients of such a spec on the GPU: issue 19's
    "bit-identity on a 16-core Intel host" was that)."""
    return dict(zip(nodes, pick_devices(device or spec.device, len(nodes)), strict=True))


def role_cmd(role: str, node: str, connect: str, *, listen: str | None = None, device: str | None = None,
             data_path: str | None = None, state_dir: Path | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The command line of one child process; ``role`` "clients" (a client host) takes an id list as ``node``
    (:class:`fedhop.deploy.contract.RoleCommand`, the one builder of every testbed)."""
    return RoleCommand(role, node, connect=connect, listen=listen, device=device, data_path=data_path,
                       state_dir=None if state_dir is None else str(state_dir), extra=tuple(extra)).argv()


def _forked(name: str, cmd: list[str], log_file: Path, env: dict[str, str]) -> ForkedChild | None:
    """Start ``python -m fedhop ...`` by forking the fork server (None: start a new interpreter instead)."""
    argv = fedhop_argv(cmd)
    if argv is not None and (differ := import_time_differences(env)):
        log.info("%s: started as a new interpreter: %s differ from the fork server's environment", name,
                 ", ".join(differ))
        argv = None
    if argv is None:
        return None
    log_file.write_bytes(b"")
    return ForkedChild(argv, log_file, env)


class Processes(deploy_processes.Processes):
    """The child processes of a federation, by node id (:class:`fedhop.deploy.processes.Processes`). ``fork``:
    start ``python -m fedhop ...`` commands by forking a server that has imported torch once
    (fedhop/forkstart.py) instead of a new interpreter each."""

    def __init__(self, logs: Path, fork: bool = True) -> None:
        super().__init__(logs, forker=_forked if fork else None)
        self.fork = fork

    def start_nodes(self, topo: Topology, ps_addr: str, devices: dict[str, str] | None = None,
                    data_path: str | None = None, state_dir: Path | None = None,
                    extra: Sequence[str] = (), clients_per_process: int = 1) -> dict[str, str]:
        """Every edge and client of ``topo`` (each saving its state under ``state_dir``, if given; ``extra``:
        options for every child, e.g. ``--tls DIR``), clients in hosts of up to ``clients_per_process`` ids
        (:func:`client_groups`); returns the edges' addresses."""
        devices = devices or {}
        ps_host, _, ps_port = ps_addr.rpartition(":")
        hosts = {n: "127.0.0.1" for n in topo.all_nodes()}
        hosts[topo.server] = ps_host
        ports = {topo.server: int(ps_port), **{e: free_port() for e in topo.edges},
                 **{c: free_port() for c in peer_clients(topo)}}
        where = plan(topo, hosts, ports)
        state = None if state_dir is None else str(state_dir)
        for e in topo.edges:
            self.start(e, RoleCommand("edge", e, connect=where.connect(e), listen=where.address(e),
                                      device=devices.get(e), state_dir=state, extra=tuple(extra)).argv())
        if peer_clients(topo):
            clients_per_process = 1  # a client of the peer graph listens for its peers: a process of its own
        for parent, ids in client_groups(topo, clients_per_process):
            role, name = ("client", ids[0]) if len(ids) == 1 else ("clients", format_ids(ids))
            listen = where.address(name) if where.node(ids[0]).port is not None else None
            self.start(name, RoleCommand(role, name, connect=where.address(parent), listen=listen,
                                         device=devices.get(ids[0]), data_path=data_path, state_dir=state,
                                         extra=tuple(extra)).argv())
        return {e: where.address(e) for e in topo.edges}


def launch(spec: RunSpec, out: Path, *, device: str | None = None, data_path: str | None = None,
           resume: Any = None,
           events: Any = None, security: Security = PLAINTEXT, child_args: Sequence[str] = (),
           ps_workspace: Callable[[Any], None] | None = None,
           clients_per_process: int | str = AUTO, fork_children: bool = True) -> RunResult:
    """Run ``spec`` with the PS in this process, every edge in its own process and the clients in client hosts
    of up to ``clients_per_process`` ids (1: a ``fedhop client`` process per client; ``auto``: see
    :func:`~fedhop.client_ids.resolve_per_process`).

    Every child saves its state after each task under ``out/state/<node>`` (the PS checkpoints into
    ``out/checkpoints``), so that ``resume`` (a :class:`~fedhop.server.main.Resume` of ``out``) continues the
    run with every node restored. ``events``: the run's lifecycle events (progress; see run_server). ``security``:
    the PS's links (transport.credentials.Security); ``child_args``: the same for every child (``--tls DIR``).
    ``device``: every process's device (:func:`node_devices`; None: the spec's ``device``).
    ``ps_workspace(ws)``: applied to the PS's Workspace before round 1 (see run_server). ``fork_children``:
    children are forked from a process that imported torch once (:class:`Processes`), else each is a new
    interpreter."""
    from fedhop.server.main import run_server

    topo = build_topology(spec.topology, spec.seed)
    nodes = topo.all_nodes()
    devices = node_devices(spec, device, nodes)
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


class LaunchTestbed:
    """``fedhop launch`` as a :class:`fedhop.deploy.contract.Testbed`. The PS is this process, so the federation
    starts and runs inside :meth:`wait` (``launch(spec, out, **options)``; its exceptions propagate as launch's
    do) and has stopped every child when :meth:`wait` returns. Loopback links have no kernel counter of their
    own: :meth:`wire` is an empty, incomplete reading (the per-link table then shows no wire bytes)."""

    def __init__(self, spec: RunSpec, out: Path, **options: Any) -> None:
        self.spec = spec
        self.out = out
        self.options = options
        self.result: RunResult | None = None

    def start(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)

    def wait(self, timeout_s: float | None = None) -> int:
        """Run the federation to its end (``timeout_s`` does not apply: the spec's own deadlines do); 0."""
        self.result = launch(self.spec, self.out, **self.options)
        return 0

    def wire(self) -> WireReading:
        return WireReading((), "none", complete=False,
                           notes=("fedhop launch runs on loopback: no wire bytes per link",))

    def stop(self) -> None:
        """Nothing left to stop: launch stops its children before it returns or raises."""
