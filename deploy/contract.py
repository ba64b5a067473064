"""The testbed contract: what every way of running a federation as separate processes shares.

Four testbeds run the same roles (``fedhop server|edge|client|clients``) and differ only in where the processes
live and how their bytes are counted: ``fedhop launch`` (loopback, this machine), ``fedhop testbed up``
(network namespaces, deploy/testbed.py), ``fedhop compose-run`` (Docker Compose, deploy/compose_run.py) and
``fedhop stack-run`` (Docker Swarm, deploy/swarm_run.py). They share:

- a :class:`Plan`: node -> address (host and, for a listening node, port), made from the topology;
- one role command line, :class:`RoleCommand` (``args()`` after ``fedhop``; ``argv()`` as a Python command);
- one process supervisor, :class:`fedhop.deploy.processes.Processes`;
- one kernel-counter abstraction, :class:`fedhop.deploy.wire.KernelCounters`, and one per-link table,
  deploy/link_table.py, both written into the run folder by :func:`collect`;
- the :class:`Testbed` protocol: ``start`` / ``wait`` / ``wire`` / ``stop``, which :func:`run` drives.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fedhop.common.topology import Topology
from fedhop.deploy import link_table, wire
from fedhop.deploy.link_table import LinkBytes
from fedhop.deploy.wire import WireReading

ROLES = ("server", "edge", "client")
PS_PORT = 50051  # where the PS listens on a testbed host of its own (namespace, container)
EDGE_PORT = 50061  # where an edge listens on its own host


# -- the plan -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedNode:
    """One node's place: its role, its parent (None for the PS), its host and, if it listens, its port."""

    node: str
    role: str  # server | edge | client
    host: str
    port: int | None = None
    parent: str | None = None


@dataclass(frozen=True)
class Plan:
    """Where every node of a run lives, in the topology's canonical order (the PS first)."""

    nodes: tuple[PlannedNode, ...]

    def __post_init__(self) -> None:
        names = [n.node for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"a plan names each node once (got {names})")
        servers = [n.node for n in self.nodes if n.role == "server"]
        if len(servers) != 1:
            raise ValueError(f"a plan has exactly one server (got {servers})")
        for n in self.nodes:
            if n.role not in ROLES:
                raise ValueError(f"{n.node}: unknown role {n.role!r} (one of {ROLES})")
            if n.role != "client" and n.port is None:
                raise ValueError(f"{n.node}: a {n.role} listens, so its plan needs a port")
            if n.parent is not None and n.parent not in names:
                raise ValueError(f"{n.node}: parent {n.parent!r} is not in the plan")

    @property
    def server(self) -> str:
        return next(n.node for n in self.nodes if n.role == "server")

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(n.node for n in self.nodes)

    def node(self, name: str) -> PlannedNode:
        for n in self.nodes:
            if n.node == name:
                return n
        raise KeyError(f"{name!r} is not a node of this plan")

    def of_role(self, role: str) -> list[str]:
        return [n.node for n in self.nodes if n.role == role]

    def address(self, name: str) -> str:
        """``host:port`` where ``name`` listens (the PS, an edge)."""
        n = self.node(name)
        if n.port is None:
            raise ValueError(f"{name} does not listen: it has no address")
        return f"{n.host}:{n.port}"

    def connect(self, name: str) -> str:
        """The address ``name`` dials: its parent's."""
        parent = self.node(name).parent
        if parent is None:
            raise ValueError(f"{name} is the PS: it dials nobody")
        return self.address(parent)

    def hosts(self) -> dict[str, str]:
        return {n.node: n.host for n in self.nodes}


def plan(topo: Topology, hosts: Mapping[str, str], ports: Mapping[str, int]) -> Plan:
    """The plan of ``topo``: ``hosts`` node -> host (an address, a service name), ``ports`` listening node ->
    port (every listening node: the PS, each edge, and each client of the peer graph, :func:`peer_clients`)."""
    nodes = []
    peers = frozenset(peer_clients(topo))  # once: a pass over every client per node was quadratic (2.6 s at 10,000)
    for n in topo.all_nodes():
        role = topo.role(n)
        listens = role != "client" or n in peers
        if listens and n not in ports:
            raise ValueError(f"{n}: a {role} that listens needs a port in the plan")
        nodes.append(PlannedNode(n, role, hosts[n], ports[n] if listens else None, topo.parent.get(n)))
    return Plan(tuple(nodes))


def peer_clients(topo: Topology) -> tuple[str, ...]:
    """The clients that listen for their peers: every client of a run with client peer links
    (``topology.peer_graph``); none otherwise (clients dial out only)."""
    return tuple(c for c in topo.clients if topo.neighbours.get(c))


def fixed_ports(topo: Topology, server_port: int, edge_port: int) -> dict[str, int]:
    """The PS on ``server_port``, every edge and every client of the peer graph on ``edge_port`` (each on its
    own host)."""
    return {topo.server: server_port, **{n: edge_port for n in (*topo.edges, *peer_clients(topo))}}


# -- the role command line ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoleCommand:
    """The command line of one role process. ``role``: server | edge | client | clients (a client host);
    ``node``: the node id, the id list of a client host, or the PS's spec file."""

    role: str
    node: str
    connect: str | None = None
    listen: str | None = None
    advertise: str | None = None
    security: tuple[str, ...] = ()  # --tls DIR | --insecure | nothing (loopback plaintext)
    device: str | None = None
    data_path: str | None = None
    state_dir: str | None = None
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ("server", "edge", "client", "clients"):
            raise ValueError(f"unknown role {self.role!r}")
        if self.role != "server" and not self.connect:
            raise ValueError(f"a {self.role} needs an address to connect to")

    def args(self) -> list[str]:
        """The arguments after ``fedhop`` (a container's entry point)."""
        if self.role == "server":
            out = ["server", self.node]
        else:
            out = [self.role, "--ids" if self.role == "clients" else "--id", self.node, "--connect", str(self.connect)]
        if self.listen:
            out += ["--listen", self.listen]
        out += self.security
        for flag, value in (("--advertise", self.advertise), ("--state-dir", self.state_dir),
                            ("--device", self.device), ("--data-path", self.data_path)):
            if value:
                out += [flag, value]
        return [*out, *self.extra]

    def argv(self) -> list[str]:
        """``python -m fedhop ...`` with this interpreter."""
        return [sys.executable, "-m", "fedhop", *self.args()]


def link_security(tls_dir: str | None) -> tuple[str, ...]:
    """A role's link options on a testbed: mutual TLS with the certificates in ``tls_dir``, else plaintext, which
    roles must be told (``--insecure``) because a testbed's addresses are not loopback."""
    return ("--tls", tls_dir) if tls_dir else ("--insecure",)


# -- the protocol -------------------------------------------------------------------------------------------------
class Testbed(Protocol):
    """One run of a federation on a testbed. ``start`` creates what the run needs (networks, counters) and starts
    the roles; ``wait`` returns the PS's exit code (124 when ``timeout_s`` passed first); ``wire`` reads the
    kernel's counters (after ``wait``); ``stop`` stops every process and removes what ``start`` created (also
    after a failed ``start``; it never raises for what is already gone)."""

    out: Path  # the run folder

    def start(self) -> None: ...

    def wait(self, timeout_s: float | None = None) -> int: ...

    def wire(self) -> WireReading: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Outcome:
    """What :func:`run` gives: the PS's exit code, the run folder, the per-link table (None when the PS wrote no
    ``links.csv``) and the counters' notes."""

    rc: int
    out: Path
    links: list[LinkBytes] | None
    notes: tuple[str, ...] = ()


def run(bed: Testbed, timeout_s: float | None = None, order: Sequence[str] | None = None) -> Outcome:
    """start, wait, read the counters, stop (always), then :func:`collect` the per-link files into ``bed.out``."""
    try:
        bed.start()
        rc = bed.wait(timeout_s)
        reading = bed.wire()
    finally:
        bed.stop()
    return Outcome(rc, bed.out, collect(bed.out, reading, order), reading.notes)


def collect(out: Path, reading: WireReading, order: Sequence[str] | None = None) -> list[LinkBytes] | None:
    """Write the counters as ``wire.csv`` and, beside the run's meters (``links.csv``), the per-link table
    ``link_bytes.csv`` into the run folder ``out``; returns the table's rows. Nothing is written where there is
    no run folder; None: no ``links.csv`` (the PS did not finish), so no table."""
    if not out.is_dir():
        return None
    wire.write_wire_csv(reading.rows, out / wire.FILE)
    meters_file = out / link_table.METERS_FILE
    if not meters_file.is_file():
        return None
    rows = link_table.reconcile(link_table.read_meters(meters_file), reading.by_link(), order=order,
                                complete=reading.complete)
    link_table.write_link_table(rows, out / link_table.FILE)
    return rows
