"""``fedhop compose SPEC``: a Docker Compose file for any RunSpec, one service per node.

Two documents come out of one spec (:func:`compose_files`):

- the **base** file (``docker-compose.yml``): services, the overlay-ready network, the spec and the run
  folder bind-mounted into the PS (Compose 1.29 ignores ``configs`` outside a swarm), healthchecks, Swarm
  placement and restart policy. It is valid for
  ``docker compose up``, ``docker-compose up`` (1.29) and ``docker stack deploy`` alike, so it keeps to what
  ``docker stack deploy`` accepts: no ``profiles``, ``depends_on`` only in its short form (here: none).
- the **override** file (``docker-compose.override.yml``), which both Compose versions read automatically
  beside the base and ``docker stack deploy`` does not: start order through
  ``depends_on: {condition: service_healthy}`` and the ``gpu`` profile.

Node ids cannot be derived inside a replicated service (Compose gives a replica no index), and a client's
parent edge follows from its id, so every node is its own service; ``--scale`` does not apply.

With a ``[network]`` profile, every service with a shaped link (a rate on what it sends, a loss on what it
receives or sends, a delay into its server, at any time of the profile's traces) shapes its own namespace: its
entrypoint is deploy/container_net.py (which then runs the role), it gets ``cap_add: [NET_ADMIN]``, the spec and
the trace files are mounted into it, and a listening node behind the delay proxy runs its role on 127.0.0.1 (the
proxy takes the service's address and port). Swarm applies ``cap_add`` from Docker 20.10.

Ports inside the network: PS 50051, edges 50061 (the testbed contract's), client health 50070. Every container
reaches the others by service name (the node id), also on a Swarm overlay network; the commands are the contract's
role command lines (deploy/contract.py).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from fedhop.common.network_spec import TraceError, load_traces, trace_files
from fedhop.common.spec import RunSpec, SpecError
from fedhop.common.topology import build_topology
from fedhop.deploy import profile
from fedhop.deploy.contract import (
    EDGE_PORT,
    PS_PORT,
    RoleCommand,
    fixed_ports,
    link_security,
    peer_clients,
    plan,
)

HEALTH_PORT = 50070
SPEC_TARGET = "/etc/fedhop/spec.toml"
TLS_TARGET = "/etc/fedhop/tls"
RUNS_TARGET = "/runs"
COMPOSE_VERSION = "3.8"  # docker stack deploy on Docker < 23 needs a version; Compose v2 only warns about it
CONNECT_S = 600  # a child waits this long for its parent (no start order under Swarm; torch imports are slow)
LINGER_S = 300  # how long a finished edge/client waits for the PS to finish (see ``--linger-until``)


@dataclass(frozen=True)
class ComposeOptions:
    """What the generated files refer to outside the spec itself."""

    spec_path: str  # the spec file as the compose file refers to it (relative to the compose file's folder)
    image: str = "fedhop:latest"
    gpu_image: str = "fedhop:gpu"
    runs: str = "./runs"  # host folder bind-mounted at /runs; FEDHOP_RUNS overrides it at `up` time
    device: str | None = None  # every role's --device; None: the spec's device, as every other engine reads it
    health_interval_s: int = 3
    tls: str | None = None  # a `fedhop certs init` folder (relative to the compose file's folder): mutual TLS
    base_dir: str = "."  # the compose file's folder here, where the spec's trace files are read at generation time


def _tls_mounts(folder: str, node: str) -> list[str]:
    """A node sees the CA certificate and its own certificate and key, nothing else of the folder."""
    return [f"{folder}/{name}:{TLS_TARGET}/{name}:ro" for name in ("ca.crt", f"{node}.crt", f"{node}.key")]


def _healthcheck(port: int, interval_s: int, tls_id: str | None = None) -> dict[str, Any]:
    tls = ["--tls", TLS_TARGET, "--id", tls_id] if tls_id else []  # a TLS server is probed with the node's own cert
    return {
        "test": ["CMD", "fedhop", "health", f"127.0.0.1:{port}", "--timeout", "3", *tls],
        "interval": f"{interval_s}s",
        "timeout": "10s",
        "retries": 40,
        "start_period": "120s",
    }


def _placement(label: str) -> dict[str, Any]:
    """Swarm only: pin a role to the nodes labelled for it (``docker node update --label-add``)."""
    # dnsrr: a service name resolves to its one task's address. No virtual IP, so no IPVS (missing in some
    # kernels) between the long-lived gRPC streams and their peers.
    return {"placement": {"constraints": [f"node.labels.fedhop.{label} == true"]},
            "restart_policy": {"condition": "none"}, "endpoint_mode": "dnsrr"}


def host_path(path: str) -> str:
    """A bind-mount source Compose cannot take for a named volume: ``spec.toml`` becomes ``./spec.toml``."""
    return path if path.startswith(("/", "./", "../", "$", "~")) else f"./{path}"


@dataclass(frozen=True)
class Shaping:
    """What a node's service needs to shape its own links (:func:`shaping_of`)."""

    node: str
    proxy: bool  # a delay proxy in front of its server (where the kernel delay is unavailable): the role listens
    # on 127.0.0.1, and the entrypoint opens it to the network when the kernel holds the delays instead


def shaping_of(spec: RunSpec, spec_dir: Path) -> dict[str, Shaping]:
    """Node -> :class:`Shaping` for every node with a shaped link at some time of the run (the profile and its
    traces, read from ``spec_dir``); raises SpecError naming a trace that cannot be read or replayed."""
    if spec.network is None:
        return {}
    topo = build_topology(spec.topology, spec.seed)
    try:
        steps = profile.timeline(topo, spec.network, load_traces(spec.network, spec_dir))
    except (TraceError, ValueError) as e:
        raise SpecError(f"{spec.name}: invalid run spec: {e}") from None
    # the sender of a lossy direction too: it turns its segmentation offloads off (deploy/container_net.py)
    sends_lossy = {a for _, links in steps for lk in links for a, _, s in lk.directions() if s.loss}
    out = {}
    for n in topo.all_nodes():
        rated, lossy, delayed = profile.ever(n, steps)
        delayed = delayed and topo.role(n) != "client"  # (the proxy fallback: a client's held by its parent's)
        held = profile.ever_held(n, steps)  # the kernel delay holds what a node receives, a client's too
        if rated or lossy or delayed or held or n in sends_lossy:
            out[n] = Shaping(n, delayed)
    return out


def trace_mounts(spec: RunSpec, spec_path: str) -> list[str]:
    """Every trace file, mounted where the spec inside the container (``SPEC_TARGET``) reads it."""
    if spec.network is None:
        return []
    host_dir, spec_dir = posixpath.dirname(spec_path) or ".", posixpath.dirname(SPEC_TARGET)
    out = []
    for t in trace_files(spec.network):
        if posixpath.isabs(t):
            out.append(f"{t}:{t}:ro")
        else:
            out.append(f"{host_path(posixpath.join(host_dir, t))}:{posixpath.normpath(posixpath.join(spec_dir, t))}:ro")
    return out


def _shaped(svc: dict[str, Any], sh: Shaping, spec_mount: str, traces: list[str], port: int | None,
            interval: str | None = None) -> dict[str, Any]:
    """``svc`` run through deploy/container_net.py with NET_ADMIN, the spec and the traces mounted (and its
    healthcheck every ``interval``)."""
    entry = ["python", "-m", "fedhop.deploy.container_net", "--node", sh.node, "--spec", SPEC_TARGET]
    if sh.proxy and port is not None:
        entry += ["--proxy-port", str(port)]
    volumes = list(svc.get("volumes", []))
    volumes = [v for v in [spec_mount, *traces] if v not in volumes] + volumes
    out = {**svc, "entrypoint": [*entry, "--"], "cap_add": ["NET_ADMIN"], "volumes": volumes}
    if interval is not None:  # Swarm's DNS lists a task once healthy: its peers shape its links from then on
        out["healthcheck"] = {**svc["healthcheck"], "interval": interval}
    return out


def compose_files(spec: RunSpec, opts: ComposeOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    """The base and override documents for ``spec`` (see the module docstring)."""
    shaped = shaping_of(spec, Path(opts.base_dir) / posixpath.dirname(opts.spec_path))
    traces = trace_mounts(spec, host_path(opts.spec_path))
    opts = replace(opts, spec_path=host_path(opts.spec_path), runs=host_path(opts.runs),
                   tls=host_path(opts.tls).rstrip("/") if opts.tls else None)
    sec = link_security(TLS_TARGET if opts.tls else None)

    def tls_of(node: str) -> dict[str, Any]:
        return {"volumes": _tls_mounts(opts.tls, node)} if opts.tls else {}

    def hc_id(node: str) -> str | None:
        return node if opts.tls else None

    topo = build_topology(spec.topology, spec.seed)
    where = plan(topo, {n: n for n in topo.all_nodes()}, fixed_ports(topo, PS_PORT, EDGE_PORT))  # service = node
    ps_addr = where.address(topo.server)

    def bind(node: str, port: int) -> str:  # behind the delay proxy the role listens on loopback only
        return f"127.0.0.1:{port}" if node in shaped and shaped[node].proxy else f"0.0.0.0:{port}"
    role: dict[str, Any] = {
        "image": opts.image,
        "build": {"context": ".", "dockerfile": "deploy/Dockerfile"},
        "networks": ["fl"],
        "init": True,
    }
    services: dict[str, Any] = {
        topo.server: {
            **role,
            "command": RoleCommand("server", SPEC_TARGET, listen=bind(topo.server, PS_PORT), security=sec,
                                   device=opts.device,
                                   extra=("--out", f"{RUNS_TARGET}/${{FEDHOP_RUN:-{spec.name}}}")).args(),
            "volumes": [f"{opts.spec_path}:{SPEC_TARGET}:ro", f"${{FEDHOP_RUNS:-{opts.runs}}}:{RUNS_TARGET}",
                        *tls_of(topo.server).get("volumes", [])],
            "healthcheck": _healthcheck(PS_PORT, opts.health_interval_s, hc_id(topo.server)),
            "deploy": _placement("ps"),
        }
    }
    linger = ("--linger-until", ps_addr, "--linger-timeout", str(LINGER_S), "--connect-timeout", str(CONNECT_S))
    for e in topo.edges:
        services[e] = {
            **role,
            "command": RoleCommand("edge", e, connect=where.connect(e), listen=bind(e, EDGE_PORT),
                                   advertise=where.address(e), security=sec, device=opts.device,
                                   extra=linger).args(),
            **tls_of(e),
            "healthcheck": _healthcheck(EDGE_PORT, opts.health_interval_s, hc_id(e)),
            "deploy": _placement("edges"),
        }
    for c in topo.clients:
        peer = where.node(c).port is not None  # a client of the peer graph listens for its peers, as an edge does
        services[c] = {
            **role,
            "command": RoleCommand("client", c, connect=where.connect(c), listen=bind(c, EDGE_PORT) if peer else None,
                                   advertise=where.address(c) if peer else None,
                                   security=sec if opts.tls or peer else (), device=opts.device,
                                   extra=("--health", f"0.0.0.0:{HEALTH_PORT}", *linger)).args(),
            **tls_of(c),  # its health-only port stays plaintext (it tells only whether the client is up)
            "healthcheck": {**_healthcheck(HEALTH_PORT, opts.health_interval_s), "interval": "30s"},
            "deploy": _placement("clients"),
        }
    spec_mount = f"{opts.spec_path}:{SPEC_TARGET}:ro"
    ports = {topo.server: PS_PORT, **dict.fromkeys((*topo.edges, *peer_clients(topo)), EDGE_PORT)}
    for n, sh in shaped.items():
        services[n] = _shaped(services[n], sh, spec_mount, traces, ports.get(n),
                              f"{opts.health_interval_s}s" if n in topo.clients else None)
    base = {
        "version": COMPOSE_VERSION,
        "services": services,
        "networks": {"fl": {}},  # a bridge under Compose, an overlay under docker stack deploy
    }
    override_services: dict[str, Any] = {}
    for n in topo.all_nodes():
        parent = topo.parent.get(n)
        if parent is not None:
            override_services[n] = {"depends_on": {parent: {"condition": "service_healthy"}}}
    override_services["gpu"] = {
        "profiles": ["gpu"],
        "image": opts.gpu_image,
        "build": {"context": ".", "dockerfile": "deploy/Dockerfile",
                  "args": {"TORCH_SPEC": "torch", "TORCH_INDEX_URL": ""}},
        "command": ["launch", SPEC_TARGET, "--device", "auto", "--quiet", *(["--tls", "auto"] if opts.tls else []),
                    "--out", f"{RUNS_TARGET}/${{FEDHOP_RUN:-{spec.name}}}-gpu"],
        "volumes": [f"{opts.spec_path}:{SPEC_TARGET}:ro", f"${{FEDHOP_RUNS:-{opts.runs}}}:{RUNS_TARGET}"],
        "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}},
    }
    override = {"version": COMPOSE_VERSION, "services": override_services}
    return base, override


HEADER = """\
# Generated by `fedhop compose {spec}` for the run {name!r}: {n} nodes, one service each.
#   docker compose up --exit-code-from ps        (Compose v2; `docker-compose up --exit-code-from ps` for 1.29)
# ends when the PS ends and returns its exit code; results land in ${{FEDHOP_RUNS:-{runs}}}/<run name>.
# Swarm: docker stack deploy -c <this file> fedhop   (see the README's containers section).
"""
OVERRIDE_HEADER = """\
# Read by `docker compose` / `docker-compose` beside the base file, ignored by `docker stack deploy`:
# start order (a child starts when its parent is healthy) and the gpu profile (one container, all GPUs:
#   docker compose --profile gpu up gpu).
"""


class _Dumper(yaml.SafeDumper):
    """Writes shared sub-documents out in full (no ``&id001`` anchors) and lists of scalars in flow style."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(doc: dict[str, Any], header: str = "") -> str:
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=120)


def write_compose(spec: RunSpec, spec_path: str, out_dir: Path, **kw: Any) -> tuple[Path, Path]:
    """Write ``docker-compose.yml`` and ``docker-compose.override.yml`` for ``spec`` into ``out_dir``."""
    opts = ComposeOptions(spec_path=spec_path, **{"base_dir": str(out_dir), **kw})
    base, override = compose_files(spec, opts)
    topo = build_topology(spec.topology, spec.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    a, b = out_dir / "docker-compose.yml", out_dir / "docker-compose.override.yml"
    a.write_text(dump(base, HEADER.format(spec=spec_path, name=spec.name, n=len(topo.all_nodes()), runs=opts.runs)))
    b.write_text(dump(override, OVERRIDE_HEADER))
    return a, b
