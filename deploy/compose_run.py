"""``fedhop compose-run``: ``docker compose up --exit-code-from ps`` with wire bytes per link (root).

The containers of a compose project share one bridge network. Before any container starts
(``up --no-start`` creates the network and the containers), a :class:`~fedhop.deploy.wire.PairCounters` is put
on that network's subnet; while the run goes on, each container's address is recorded (an exited container
loses it); afterwards the counters are read, attributed to node pairs (the service name is the node id) and
written as ``wire.csv`` into the run folder, and beside the payload and message bytes of ``links.csv`` as the
per-link table ``link_bytes.csv`` (deploy/contract.py :func:`~fedhop.deploy.contract.collect`, as every testbed).
:class:`ComposeTestbed` implements the testbed contract (start / wait / wire / stop).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fedhop.deploy import contract
from fedhop.deploy.link_table import LinkBytes, format_table
from fedhop.deploy.wire import BridgeCounters, PairCounters, WireReading

NETWORK = "fl"  # the network name in generated compose files


@dataclass
class ComposeRun:
    """What one run gave (``compose up`` here, ``docker stack deploy`` in :mod:`fedhop.deploy.swarm_run`): the
    PS's exit code, the run folder and the per-link bytes."""

    rc: int
    run_dir: Path
    links: list[LinkBytes] = field(default_factory=list)  # the per-link table (link_bytes.csv)
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

    def _poll_quietly(self) -> None:
        # the network goes away at the end of the run: a failed look-up then is expected
        with contextlib.suppress(subprocess.CalledProcessError, json.JSONDecodeError, IndexError):
            self.poll()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._poll_quietly()
            self._stop.wait(self.period_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop polling, after one last look (nothing to do when it never started, or stopped already)."""
        if self._stop.is_set() or not self._thread.is_alive():
            self._stop.set()
            return
        self._stop.set()
        self._thread.join()
        self._poll_quietly()

    def __enter__(self) -> AddressBook:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ComposeTestbed:
    """``compose -p project up --exit-code-from ps`` in ``workdir`` with wire counters on the project's network;
    results in ``runs/run_name`` (:class:`fedhop.deploy.contract.Testbed`). ``compose`` is
    ``["docker", "compose"]`` (v2) or ``["docker-compose"]`` (1.29). ``stop`` leaves the containers and network
    in place (the caller runs ``down``)."""

    def __init__(self, compose: list[str], project: str, workdir: Path, runs: Path, run_name: str, *,
                 log_path: Path | None = None) -> None:
        if not project.replace("_", "").replace("-", "").isalnum() or project != project.lower():
            raise ValueError(f"project name must be lower-case letters, digits, - and _ (got {project!r})")
        self.project = project
        self.workdir = workdir
        self.runs = runs.resolve()
        self.out = self.runs / run_name
        self.env = {**os.environ, "FEDHOP_RUNS": str(self.runs), "FEDHOP_RUN": run_name}
        self.base = [*compose, "-p", project]
        self.network = f"{project}_{NETWORK}"
        self.log_path = log_path or self.runs / f"{run_name}.compose.log"
        self.book = AddressBook(self.network)
        self.counters: BridgeCounters | None = None
        self._proc: subprocess.Popen | None = None
        self._log: IO[str] | None = None
        self._t0 = 0.0

    def start(self) -> None:
        """``up --no-start`` (the network and the containers), the counters on the network, then ``up``."""
        self.runs.mkdir(parents=True, exist_ok=True)
        subprocess.run([*self.base, "up", "--no-start"], cwd=self.workdir, env=self.env, check=True,
                       capture_output=True, text=True)
        counters = BridgeCounters(PairCounters(f"fedhop_{self.project.replace('-', '_')}",
                                               network_subnet(self.network)), lambda: self.book.book)
        counters.install()
        self.counters = counters
        self.book.start()
        self._log = self.log_path.open("w")
        self._t0 = time.monotonic()
        self._proc = subprocess.Popen([*self.base, "up", "--exit-code-from", "ps"], cwd=self.workdir, env=self.env,
                                      stdout=self._log, stderr=subprocess.STDOUT)

    def wait(self, timeout_s: float | None = None) -> int:
        """``up``'s exit code (the PS's); 124 when ``timeout_s`` passed first (``up`` is then killed)."""
        assert self._proc is not None and self._log is not None, "start() first"
        try:
            rc = self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            rc = 124
        self._log.write(f"\n[fedhop compose-run] compose up ended with {rc} after {time.monotonic() - self._t0:.1f}s\n")
        return rc

    def wire(self) -> WireReading:
        """The counters, attributed with every address the book recorded (it stops recording first)."""
        assert self.counters is not None, "start() first"
        self.book.stop()
        return self.counters.read()

    def stop(self) -> None:
        """Close the log, stop recording addresses, delete the counters' table."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._log is not None:
            self._log.close()
        self.book.stop()
        if self.counters is not None:
            self.counters.remove()


def run_compose(compose: list[str], project: str, workdir: Path, runs: Path, run_name: str, *,
                timeout_s: float = 1800.0, log_path: Path | None = None) -> ComposeRun:
    """Run a :class:`ComposeTestbed` to its end (deploy/contract.py :func:`~fedhop.deploy.contract.run`): the
    PS's exit code, the run folder, the per-link table and the compose log. Leaves the containers and network in
    place (the caller runs ``down``)."""
    bed = ComposeTestbed(compose, project, workdir, runs, run_name, log_path=log_path)
    outcome = contract.run(bed, timeout_s)
    return ComposeRun(rc=outcome.rc, run_dir=outcome.out, links=outcome.links or [],
                      log=bed.log_path.read_text(errors="replace"))


__all__ = ["NETWORK", "AddressBook", "ComposeRun", "ComposeTestbed", "addresses", "format_table", "network_subnet",
           "run_compose", "service_of"]
