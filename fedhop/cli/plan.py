"""``fedhop plan SPEC [--host NODE=ADDR ...] [--tls DIR]``: a run on separate machines, written out.

For every machine, the exact command line of each node on it (``fedhop server|edge|client|clients``: address,
``--listen``, ``--advertise``, parent, credentials, data path), which client belongs under which edge, the order
to start them in and, with ``--tls``, the ``fedhop certs init`` that gives the listening nodes certificates for
the addresses their peers dial. The placement is a :class:`fedhop.deploy.contract.Plan` and every command a
:class:`~fedhop.deploy.contract.RoleCommand`, the testbeds' own, so the plan runs what they run.

Placement: ``--host NODE=ADDR`` puts a node (or an id list of clients, ``client-0..client-9``) on a machine;
ADDR is a host name or address, with ``:PORT`` for the PS or an edge. A node without one gets a placeholder
host: its own id for the PS and the edges, and one machine per parent (``clients-of-<parent>``) for clients,
served by one ``fedhop clients`` host process. Clients of one parent on one machine share one process.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedhop.cli.console import HelpFormatter, load_spec
from fedhop.common.exit_codes import ExitCode, Fatal

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec
    from fedhop.common.topology import Topology
    from fedhop.deploy.contract import Plan, RoleCommand


@dataclass(frozen=True)
class Machine:
    """One machine of the plan: its host and the role processes to start on it (each: the nodes it runs and
    its command)."""

    host: str
    processes: tuple[tuple[tuple[str, ...], RoleCommand], ...]


@dataclass(frozen=True)
class Deployment:
    """A run's plan for separate machines."""

    spec: RunSpec
    plan: Plan
    machines: tuple[Machine, ...]
    security: tuple[str, ...]
    tls: str | None

    def children(self) -> dict[str, list[str]]:
        """Each parent (the PS, every edge) -> its clients, in id order."""
        out: dict[str, list[str]] = {}
        for n in self.plan.nodes:
            if n.role == "client" and n.parent is not None:
                out.setdefault(n.parent, []).append(n.node)
        return out

    def certs_command(self, spec_path: str | None) -> list[str]:
        """``fedhop certs init`` for this plan: every listening node's certificate names the host peers dial."""
        hosts = [x for n in self.plan.nodes if n.role != "client" for x in ("--host", f"{n.node}={n.host}")]
        return ["fedhop", "certs", "init", *([spec_path] if spec_path else []), "--out", self.tls or "certs", *hosts]


def parse_hosts(values: Sequence[str], topo: Topology) -> tuple[dict[str, str], dict[str, int]]:
    """``--host NODE=ADDR`` options: node -> host and listening node -> port (when ADDR gives one)."""
    from fedhop.client_ids import IdListError, parse_ids

    nodes = set(topo.all_nodes())
    hosts: dict[str, str] = {}
    ports: dict[str, int] = {}
    for v in values:
        who, sep, addr = v.partition("=")
        who, addr = who.strip(), addr.strip()
        if not sep or not who or not addr:
            raise Fatal(ExitCode.USAGE, f"--host {v!r}: expected NODE=ADDR, e.g. --host edge-0=10.0.0.5 or "
                                        "--host client-0..client-9=10.0.1.7")
        try:
            ids = parse_ids(who) if (".." in who or "," in who) else [who]
        except IdListError as e:
            raise Fatal(ExitCode.USAGE, f"--host {v!r}: {e}") from None
        host, port = _split(addr, v)
        for node in ids:
            if node not in nodes:
                raise Fatal(ExitCode.USAGE, f"--host {v!r}: {node} is not a node of this run (its nodes: ps, "
                                            f"edge-0..edge-{len(topo.edges) - 1}, client-0..client-"
                                            f"{len(topo.clients) - 1})" if topo.edges else
                            f"--host {v!r}: {node} is not a node of this run (its nodes: ps, client-0..client-"
                            f"{len(topo.clients) - 1})")
            if node in hosts:
                raise Fatal(ExitCode.USAGE, f"--host {v!r}: {node} is placed twice")
            hosts[node] = host
            if port is not None:
                if topo.role(node) == "client":
                    raise Fatal(ExitCode.USAGE, f"--host {v!r}: a client listens on no port (give its host only)")
                ports[node] = port
    return hosts, ports


def _split(addr: str, option: str) -> tuple[str, int | None]:
    """``host``, ``host:port`` or ``[v6]:port``."""
    if addr.startswith("["):
        host, _, rest = addr[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        host = f"[{host}]"
    elif addr.count(":") == 1:
        host, _, port_text = addr.partition(":")
    else:
        host, port_text = addr, ""
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Fatal(ExitCode.USAGE, f"--host {option!r}: {port_text!r} is not a port (1-65535)")
    return host, int(port_text)


def make_plan(spec: RunSpec, spec_path: str | None, sets: Sequence[str], host_options: Sequence[str], *,
              tls: str | None = None, data_path: str | None = None, state_dir: str | None = None) -> Deployment:
    """The deployment of ``spec`` (read from ``spec_path`` with ``sets``) on the machines ``host_options`` name."""
    from fedhop.client_ids import format_ids
    from fedhop.common.topology import build_topology
    from fedhop.deploy.contract import EDGE_PORT, PS_PORT, RoleCommand, link_security, plan

    topo = build_topology(spec.topology, spec.seed)
    hosts, ports = parse_hosts(host_options, topo)
    for n in (topo.server, *topo.edges):
        hosts.setdefault(n, n)
    for c in topo.clients:
        hosts.setdefault(c, f"clients-of-{topo.parent[c]}")
    taken: dict[tuple[str, int], str] = {}
    for n, p in ports.items():
        if (hosts[n], p) in taken:
            raise Fatal(ExitCode.USAGE, f"--host: {taken[hosts[n], p]} and {n} both listen on {hosts[n]}:{p}")
        taken[hosts[n], p] = n
    for n in (topo.server, *topo.edges):  # the default ports, the next free one where a machine holds several
        if n not in ports:
            p = PS_PORT if n == topo.server else EDGE_PORT
            while (hosts[n], p) in taken:
                p += 1
            ports[n] = p
            taken[hosts[n], p] = n
    where = plan(topo, hosts, ports)
    security = link_security(tls)
    procs: dict[str, list[tuple[tuple[str, ...], RoleCommand]]] = {}
    server_args = tuple(x for s in sets for x in ("--set", s))
    procs.setdefault(hosts[topo.server], []).append(((topo.server,), RoleCommand(
        "server", spec_path or "", listen=f"0.0.0.0:{ports[topo.server]}", security=security, extra=server_args)))
    for e in topo.edges:
        procs.setdefault(hosts[e], []).append(((e,), RoleCommand(
            "edge", e, connect=where.connect(e), listen=f"0.0.0.0:{ports[e]}", advertise=where.address(e),
            security=security, state_dir=state_dir)))
    groups: dict[tuple[str, str], list[str]] = {}
    for c in topo.clients:
        groups.setdefault((hosts[c], topo.parent[c]), []).append(c)
    for (host, parent), ids in groups.items():
        role, name = ("client", ids[0]) if len(ids) == 1 else ("clients", format_ids(ids))
        procs.setdefault(host, []).append((tuple(ids), RoleCommand(
            role, name, connect=where.address(parent), security=security, data_path=data_path,
            state_dir=state_dir)))
    machines = tuple(Machine(h, tuple(p)) for h, p in procs.items())
    return Deployment(spec, where, machines, security, tls)


def command_line(cmd: RoleCommand) -> str:
    """The shell command of one role (``fedhop server`` of the built-in spec names no spec file)."""
    return shlex.join(["fedhop", *(a for a in cmd.args() if a != "")])


def render(dep: Deployment, spec_path: str | None) -> str:
    """The plan as text: the client -> parent mapping, each machine's commands, the start order."""
    topo = dep.spec.topology
    lines = [f"plan of {dep.spec.name} ({dep.spec.algorithm.name}): 1 PS, {topo.edges} edges, {topo.clients} "
             f"clients on {len(dep.machines)} machines; "
             + ("mutual TLS with the certificates in " + dep.tls if dep.tls else
                "plaintext (--insecure: a network you trust; --tls DIR for mutual TLS)"), "", "clients -> parent:"]
    from fedhop.client_ids import format_ids

    for parent, clients in dep.children().items():
        lines.append(f"  {parent}: {format_ids(clients)} ({len(clients)})")
    if dep.tls:
        lines += ["", "certificates (on one machine; copy ca.crt and each node's <id>.crt/.key to its machine):",
                  "  " + shlex.join(dep.certs_command(spec_path))]
    lines += ["", "start the PS first, then the edges, then the clients (each retries its parent for "
              "--connect-timeout):"]
    order = {"server": 0, "edge": 1, "client": 2, "clients": 2}
    for m in sorted(dep.machines, key=lambda m: min(order[c.role] for _, c in m.processes)):
        kinds = sorted({c.role for _, c in m.processes}, key=order.__getitem__)
        lines.append(f"\nmachine {m.host} ({', '.join(kinds)}):")
        for _, cmd in sorted(m.processes, key=lambda p: order[p[1].role]):
            lines.append("  " + command_line(cmd))
    if dep.spec.data.path is not None or dep.spec.data.source is not None:
        lines.append("\nevery client machine needs the data the spec names (data.path / data.source; "
                     "--data-path PATH sets the clients' path)")
    return "\n".join(lines)


def to_json(dep: Deployment) -> dict[str, Any]:
    return {
        "run": dep.spec.name,
        "children": dep.children(),
        "machines": [{"host": m.host, "processes": [{"nodes": list(nodes), "role": cmd.role,
                                                    "argv": ["fedhop", *(a for a in cmd.args() if a != "")]}
                                                   for nodes, cmd in m.processes]} for m in dep.machines],
        "addresses": {n.node: f"{n.host}:{n.port}" for n in dep.plan.nodes if n.port is not None},
    }


def cmd_plan(a: argparse.Namespace) -> int:
    spec = load_spec(a.spec, a.set)
    dep = make_plan(spec, a.spec, a.set, a.host, tls=a.tls, data_path=a.data_path, state_dir=a.state_dir)
    print(json.dumps(to_json(dep), indent=1) if a.json else render(dep, a.spec))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("plan", help="the command line of every node of a run on separate machines, per machine",
                       formatter_class=HelpFormatter)
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one spec field "
                   "(the PS's command gets it too)")
    s.add_argument("--host", action="append", default=[], metavar="NODE=ADDR",
                   help="put NODE (or a client id list, client-0..client-9) on the machine ADDR (a host name or "
                        "address; HOST:PORT for the PS or an edge); repeatable. Default: the PS and each edge "
                        "on a machine named after it, each parent's clients on one machine")
    s.add_argument("--tls", metavar="DIR", help="mutual TLS with the certificates in DIR on every machine (and "
                   "the `fedhop certs init` that makes them); default: plaintext with --insecure")
    s.add_argument("--data-path", metavar="PATH", help="the data path every client uses on its machine")
    s.add_argument("--state-dir", metavar="DIR", help="where every edge and client saves its state (resume)")
    s.add_argument("--json", action="store_true", help="the plan as JSON (machines, argv per process)")
    s.set_defaults(fn=cmd_plan)
