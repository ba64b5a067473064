"""``fedhop compose-run``: ``docker compose up --exit-code-from ps`` with wire bytes per link (root).

The containers of a compose project share one bridge network. Before any container starts
(``up --no-start`` creates the network and the containers), a :class:`~fedhop.deploy.wire.PairCounters` is put
on that network's subnet; while the run goes on, each container's address is recorded (an exited container
loses it); afterwards the counters are read, attributed to node pairs (the service name is the node id) and
written as ``wire.csv`` into the run folder, next to the payload and message bytes of ``links.csv``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fedhop.deploy.wire import PairBytes, PairCounters, by_node

NETWORK = "fl"  # the network name in generated compose files


@dataclass
class ComposeRun:
    """What one run gave (``compose up`` here, ``docker stack deploy`` in :mod:`fedhop.deploy.swarm_run`): the
    PS's exit code, the run folder and the per-link bytes."""

    rc: int
    run_dir: Path
    links: list[dict] = field(default_factory=list)  # src, dst, payload_bytes, message_bytes, wire_bytes
    log: str = ""


def _docker_json(*args: str) -> list[dict]:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def network_subnet(network: str) -> str:
    info = _docker_json("network", "inspect", network)[0]
    configs = info.get("IPAM", {}).get("Config") or []
    for c in configs:
        if "." in c.get("Subnet", ""):
            return c["Subnet"]
    raise RuntimeError(f"network {network} has no IPv4 subnet ({configs})")


def addresses(network: str) -> dict[str, str]:
    """IPv4 address -> compose service name of every container attached to ``network`` now."""
    info = _docker_json("network", "inspect", network)[0]
    out: dict[str, str] = {}
    ids = list((info.get("Containers") or {}).items())
    if not ids:
        return out
    # a Swarm overlay network also lists its load balancer endpoint ("lb-<network>"), which is no container
    names = {c["Id"]: service_of(c) for c in _docker_json("inspect", *[i for i, _ in ids if not i.startswith("lb-")])}
    for cid, c in ids:
        ip = c.get("IPv4Address", "").split("/")[0]
        if ip and cid in names:
            out[ip] = names[cid]
    return out


def service_of(container: dict) -> str:
    """The node id a container runs: its Compose service, or its Swarm service without the stack prefix."""
    labels = container["Config"]["Labels"] or {}
    if "com.docker.compose.service" in labels:
        return labels["com.docker.compose.service"]
    swarm, stack = labels.get("com.docker.swarm.service.name"), labels.get("com.docker.stack.namespace")
    if swarm and stack and swarm.startswith(f"{stack}_"):
        return swarm[len(stack) + 1:]
    return container["Name"].lstrip("/")


class AddressBook:
    """Records every address a container of ``network`` holds while the run goes on (polled in a thread)."""

    def __init__(self, network: str, period_s: float = 0.5) -> None:
        self.network = network
        self.period_s = period_s
        self.book: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="addresses", daemon=True)

    def poll(self) -> None:
        """Add the addresses held now."""
        self.book.update(addresses(self.network))

    def _loop(self) -> None:
        while not self._stop.is_set():
            # the network goes away at the end of the run: a failed look-up then is expected
            with contextlib.suppress(subprocess.CalledProcessError, json.JSONDecodeError, IndexError):
                self.poll()
            self._stop.wait(self.period_s)

    def __enter__(self) -> AddressBook:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def link_table(run_dir: Path, wire: dict[tuple[str, str], int]) -> list[dict]:
    """payload, message and wire bytes per directed link (src -> dst), from links.csv and the counters."""
    acc: dict[tuple[str, str], dict] = {}
    with (run_dir / "links.csv").open() as f:
        for r in csv.DictReader(f):
            row = acc.setdefault((r["src"], r["dst"]), {"payload_bytes": 0, "message_bytes": 0, "messages": 0})
            for k in ("payload_bytes", "message_bytes", "messages"):
                row[k] += int(r[k])
    keys = sorted(set(acc) | set(wire))
    return [{"src": s, "dst": d, **acc.get((s, d), {"payload_bytes": 0, "message_bytes": 0, "messages": 0}),
             "wire_bytes": wire.get((s, d), 0)} for s, d in keys]


def write_wire_csv(run_dir: Path, rows: list[dict]) -> Path:
    path = run_dir / "wire.csv"
    cols = ["src", "dst", "messages", "payload_bytes", "message_bytes", "wire_bytes"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows({k: r[k] for k in cols} for r in rows)
    return path


def attribute(run_dir: Path, pairs: Mapping[tuple[str, str], PairBytes], node_of: Mapping[str, str]) -> list[dict]:
    """Counters per address pair -> wire bytes per node pair, beside links.csv's payload and message bytes, written
    to ``run_dir/wire.csv``; the rows (none when the run left no links.csv)."""
    if not (run_dir / "links.csv").exists():
        return []
    rows = link_table(run_dir, by_node(pairs, node_of))
    write_wire_csv(run_dir, rows)
    return rows


def format_table(rows: list[dict]) -> str:
    """The per-link table: payload, message and wire bytes with the ratios."""
    head = f"{'link':28s} {'payload B':>12s} {'message B':>12s} {'wire B':>12s} {'msg/pay':>8s} {'wire/pay':>8s}"
    lines = [head, "-" * len(head)]

    def ratio(a: int, b: int) -> str:
        return f"{a / b:8.3f}" if b else f"{'-':>8s}"

    tot = {"payload_bytes": 0, "message_bytes": 0, "wire_bytes": 0}
    for r in rows:
        lines.append(f"{r['src'] + ' -> ' + r['dst']:28s} {r['payload_bytes']:12,d} {r['message_bytes']:12,d} "
                     f"{r['wire_bytes']:12,d} {ratio(r['message_bytes'], r['payload_bytes'])} "
                     f"{ratio(r['wire_bytes'], r['payload_bytes'])}")
        for k in tot:
            tot[k] += r[k]
    pay = tot["payload_bytes"]
    lines.append(f"{'total':28s} {pay:12,d} {tot['message_bytes']:12,d} {tot['wire_bytes']:12,d} "
                 f"{ratio(tot['message_bytes'], pay)} {ratio(tot['wire_bytes'], pay)}")
    return "\n".join(lines)


def run_compose(compose: list[str], project: str, workdir: Path, runs: Path, run_name: str, *,
                timeout_s: float = 1800.0, log_path: Path | None = None) -> ComposeRun:
    """``compose -p project up --exit-code-from ps`` in ``workdir`` with wire counters; results in
    ``runs/run_name``. ``compose`` is ``["docker", "compose"]`` (v2) or ``["docker-compose"]`` (1.29).
    Leaves the containers and network in place (the caller runs ``down``)."""
    if not project.replace("_", "").replace("-", "").isalnum() or project != project.lower():
        raise ValueError(f"project name must be lower-case letters, digits, - and _ (got {project!r})")
    runs = runs.resolve()
    runs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FEDHOP_RUNS": str(runs), "FEDHOP_RUN": run_name}
    base = [*compose, "-p", project]
    subprocess.run([*base, "up", "--no-start"], cwd=workdir, env=env, check=True, capture_output=True, text=True)
    network = f"{project}_{NETWORK}"
    counters = PairCounters(f"fedhop_{project.replace('-', '_')}", network_subnet(network))
    log_path = log_path or runs / f"{run_name}.compose.log"
    with counters, AddressBook(network) as book, log_path.open("w") as logf:
        t0 = time.monotonic()
        try:
            proc = subprocess.run([*base, "up", "--exit-code-from", "ps"], cwd=workdir, env=env,
                                  stdout=logf, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = 124
        logf.write(f"\n[fedhop compose-run] compose up ended with {rc} after {time.monotonic() - t0:.1f}s\n")
        pairs = counters.read()
    run_dir = runs / run_name
    return ComposeRun(rc=rc, run_dir=run_dir, links=attribute(run_dir, pairs, book.book),
                      log=log_path.read_text(errors="replace"))
