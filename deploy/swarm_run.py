"""``fedhop stack-run``: ``docker stack deploy`` of a generated compose file with wire bytes per link (root, on a
Swarm manager).

Where the bytes are counted. A Swarm overlay network gets, on every machine with one of its tasks, its own network
namespace, ``/var/run/docker/netns/<epoch>-<network id[:10]>``, holding a bridge ``br0`` whose ports are one veth
per local task container and the VXLAN device ``vxlan0`` to the other machines. Every IPv4 packet a local task
sends to, or receives from, another task crosses that bridge, so the same
:class:`~fedhop.deploy.wire.PairCounters` that ``compose-run`` puts on the compose bridge (an nftables table of
the ``bridge`` family, hook ``forward``, one counter per (source, destination) address) is put on ``br0``, inside
that namespace. The ``bridge`` family sees bridged frames whatever ``br_netfilter`` is set to; an ``inet``
table's ``forward`` hook would see them only where ``br_netfilter`` is loaded with ``bridge-nf-call-iptables=1``
(it is on the machine the tests run on, not on every host). Counting in each task container's own namespace
(``nsenter --net=/proc/<pid>/ns/net``, hooks ``output`` / ``input``) gives the same bytes but needs one table per
container, installed after the container exists and before its process talks, which Swarm gives no moment for;
the overlay's namespace exists from the first local task's attachment, before any process in it has started.

Measured on a single-node swarm (Docker 20.10, kernel 6.18, nftables 1.0.6): one task sending 10,000,000 bytes
over TCP to another read 10,008,900 bytes for that direction in the ``bridge`` table of the overlay's namespace,
in an ``inet`` ``forward`` table there and in the sender's own ``output`` hook alike, so neither the family nor
the namespace was why an earlier attempt read zeros; timing was. The namespace appears only when the first local
task attaches, after ``docker stack deploy`` has returned, so :class:`OverlayCounters` watches for it every 50 ms;
but Docker mounts it first and only then moves the VXLAN device in, renames it ``vxlan0`` and makes it a port of
``br0``, and a table put in before that never sees a packet (a plain ``counter`` rule at the top of its chain
stays at 0 while a table put into the same namespace afterwards counts every packet; the kernel-side reason was
not pinned down). So the counters go in once ``vxlan0`` is a port of ``br0``, which Docker does while it attaches
the first local task, before that task's process runs (a Fed-CHS run on the single-node swarm: every link's wire
bytes at or above its message bytes, ``tests/testbed/test_compose.py``).

Docker deletes the namespace when the last local task leaves, which would take the counters with it; each
namespace is therefore held open by a file descriptor of this process from the moment its counters are installed
(nftables tables live as long as their namespace), the counters are read after every task has ended, complete,
and the descriptor is closed afterwards (the emptied namespace goes with it). If Docker makes a new namespace for
the network during the run (a new epoch), it is counted as well and the readings are summed.

Addresses are mapped to node ids as compose-run does (the Swarm service name without the stack prefix), from
every task of the stack Swarm knows of (``docker network inspect --verbose``, on the manager) and every local
container on the network. On several machines only the traffic that crosses *this* machine's bridge is counted:
links with an end here. A link between two other machines shows no wire bytes; place the PS, or the nodes whose
links you measure, on the machine that runs ``stack-run``.

The counters are read through :class:`~fedhop.deploy.wire.BridgeCounters` (the attribution compose-run uses) and
written as ``wire.csv`` and ``link_bytes.csv`` (:func:`fedhop.deploy.contract.collect`); :class:`StackTestbed`
implements the testbed contract (start / wait / wire / stop).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedhop.deploy import contract
from fedhop.deploy.compose_run import NETWORK, AddressBook, ComposeRun, network_subnet
from fedhop.deploy.wire import BridgeCounters, PairBytes, PairCounters, WireReading, sum_pairs

DOCKER_NETNS = Path("/var/run/docker/netns")
COMPOSE_FILE = "docker-compose.yml"
PS_SERVICE = "ps"
ENDED = {"complete", "failed", "rejected", "shutdown", "orphaned", "remove"}  # a Swarm task that will not run again
_STACK = re.compile(r"^[a-z0-9][a-z0-9_-]{0,40}$")
_LABEL = re.compile(r"^node\.labels\.([A-Za-z0-9_.-]+)\s*==\s*true$")


class SwarmError(RuntimeError):
    """The swarm is not in a state a stack can run in (not a manager, missing labels, stack already there)."""


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)
    except FileNotFoundError as e:
        raise SwarmError("docker not found: stack-run needs the Docker engine and its CLI") from e


def check_manager() -> None:
    """Raise :class:`SwarmError` unless the local engine answers and is an active Swarm manager."""
    proc = _docker("info", "--format", "{{.Swarm.LocalNodeState}} {{.Swarm.ControlAvailable}}", check=False)
    if proc.returncode != 0:
        raise SwarmError(f"the Docker engine does not answer ({proc.stderr.strip() or 'docker info failed'})")
    state, _, manager = proc.stdout.strip().partition(" ")
    if state != "active":
        raise SwarmError(f"this Docker engine is in no swarm (state {state!r}): `docker swarm init` on the manager, "
                         "`docker swarm join ...` on the other machines")
    if manager != "true":
        raise SwarmError("this machine is a swarm worker: run stack-run on a manager (`docker node ls` there)")


def placement_labels(compose_file: Path) -> set[str]:
    """The node labels the file's placement constraints require (``node.labels.X == true`` gives ``X``)."""
    doc = yaml.safe_load(compose_file.read_text()) or {}
    labels: set[str] = set()
    for svc in (doc.get("services") or {}).values():
        for c in (((svc or {}).get("deploy") or {}).get("placement") or {}).get("constraints") or []:
            m = _LABEL.match(str(c).strip())
            if m:
                labels.add(m.group(1))
    return labels


def missing_labels(labels: set[str]) -> list[str]:
    """Those of ``labels`` that no swarm node carries with the value ``true`` (their tasks would never start)."""
    nodes = _docker("node", "ls", "-q").stdout.split()
    have: set[str] = set()
    if nodes:
        for n in json.loads(_docker("node", "inspect", *nodes).stdout):
            have |= {k for k, v in ((n.get("Spec") or {}).get("Labels") or {}).items() if v == "true"}
    return sorted(labels - have)


def check_stack(stack: str, compose_file: Path) -> None:
    """Everything :func:`run_stack` needs before it deploys, each failure a :class:`SwarmError` saying what to do."""
    if not _STACK.match(stack):
        raise SwarmError(f"stack name must be lower-case letters, digits, - and _ (got {stack!r})")
    if not compose_file.is_file():
        raise SwarmError(f"no {compose_file} (write one with `fedhop compose SPEC --out-dir DIR`)")
    for tool, package in (("nft", "nftables"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            raise SwarmError(f"{tool} not found: wire counters need it (apt-get install {package})")
    check_manager()
    if stack in _docker("stack", "ls", "--format", "{{.Name}}").stdout.split():
        raise SwarmError(f"a stack {stack!r} is deployed already: `docker stack rm {stack}` or pick --stack")
    missing = missing_labels(placement_labels(compose_file))
    if missing:
        adds = " ".join(f"--label-add {lab}=true" for lab in missing)
        raise SwarmError(f"no swarm node is labelled {', '.join(f'{lab}=true' for lab in missing)}, so those "
                         f"services would never start: `docker node update {adds} NODE`")


def overlay_namespaces(net_id: str) -> list[Path]:
    """The namespace files of overlay network ``net_id`` on this machine (none until a local task attaches)."""
    return sorted(DOCKER_NETNS.glob(f"*-{net_id[:10]}")) if net_id and DOCKER_NETNS.is_dir() else []


def _bridge_ready(netns: Path) -> bool:
    """Whether Docker has finished setting up the overlay's namespace: its VXLAN device is a port of ``br0``."""
    proc = subprocess.run(["nsenter", f"--net={netns}", "ip", "-o", "link", "show", "master", "br0"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip())
    return any(" vxlan" in line.split(":", 2)[1] for line in proc.stdout.splitlines() if line.count(":") >= 2)


@dataclass
class _Held:
    fd: int
    counters: PairCounters


class OverlayCounters:
    """:class:`PairCounters` on the bridge of every namespace ``network`` gets on this machine, each namespace held
    open until :meth:`close` (see the module docstring). Use as a context manager around the whole run, or as the
    pair source of a :class:`~fedhop.deploy.wire.BridgeCounters` (``install`` / ``read`` / ``remove``)."""

    def __init__(self, network: str, table: str, period_s: float = 0.05) -> None:
        self.network = network
        self.table = table
        self.period_s = period_s
        self.error: str | None = None
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="overlay-counters", daemon=True)

    def _watch(self) -> None:
        net_id = subnet = ""
        while not self._stop.is_set():
            try:
                if not net_id:
                    proc = _docker("network", "inspect", self.network, "--format", "{{.Id}}", check=False)
                    net_id = proc.stdout.strip() if proc.returncode == 0 else ""
                    subnet = network_subnet(self.network) if net_id else ""
                for ns in overlay_namespaces(net_id):
                    if ns.name not in self._held:
                        self._hold(ns, subnet)
            except Exception as e:  # reported by read(): the caller decides
                self.error = f"{type(e).__name__}: {e}"
                return
            self._stop.wait(self.period_s)

    def _hold(self, ns: Path, subnet: str) -> None:
        try:
            fd = os.open(ns, os.O_RDONLY)
        except FileNotFoundError:  # gone again
            return
        netns = Path(f"/proc/{os.getpid()}/fd/{fd}")
        counters = PairCounters(self.table, subnet, netns=netns)
        try:
            if not _bridge_ready(netns):  # see the module docstring: a table put in earlier never counts
                os.close(fd)
                return
            counters.install()
        except RuntimeError:  # the file exists a moment before Docker mounts the namespace on it: next round
            os.close(fd)
            return
        with self._lock:
            self._held[ns.name] = _Held(fd, counters)

    def install(self) -> None:
        """Start watching for the overlay's namespaces."""
        self._thread.start()

    def __enter__(self) -> OverlayCounters:
        self.install()
        return self

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def read(self) -> dict[tuple[str, str], PairBytes]:
        """Bytes per (source, destination) address, summed over the namespaces held; raises if none was."""
        with self._lock:
            held = list(self._held.values())
        if not held:
            raise RuntimeError(f"no counters on overlay network {self.network}: "
                               f"{self.error or 'no task of it ran on this machine'}")
        return sum_pairs(h.counters.read() for h in held)

    def close(self) -> None:
        """Delete the tables (a namespace Docker still uses keeps nothing of ours) and let the namespaces go."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            for h in self._held.values():
                h.counters.remove()
                os.close(h.fd)
            self._held.clear()

    def remove(self) -> None:
        self.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


def stack_addresses(network: str, stack: str) -> dict[str, str]:
    """IPv4 address -> node id of every task of ``stack`` on ``network`` Swarm knows of, here or elsewhere."""
    proc = _docker("network", "inspect", "--verbose", network, check=False)
    if proc.returncode != 0:
        return {}
    out: dict[str, str] = {}
    for svc, info in (json.loads(proc.stdout)[0].get("Services") or {}).items():
        if svc.startswith(f"{stack}_"):
            for task in info.get("Tasks") or []:
                ip = (task.get("EndpointIP") or "").split("/")[0]
                if ip:
                    out[ip] = svc[len(stack) + 1:]
    return out


class StackAddressBook(AddressBook):
    """compose-run's address book (local containers) plus every task Swarm lists on the network."""

    def __init__(self, network: str, stack: str, period_s: float = 0.5) -> None:
        super().__init__(network, period_s)
        self.stack = stack

    def poll(self) -> None:
        super().poll()
        with contextlib.suppress(json.JSONDecodeError, IndexError):
            self.book.update(stack_addresses(self.network, self.stack))


@dataclass(frozen=True)
class TaskState:
    state: str  # Swarm's task state, lower case: running, complete, failed, ...
    exit_code: int | None
    error: str


def tasks(service: str | None = None, stack: str | None = None) -> list[TaskState]:
    """The tasks of one service (``docker service ps``) or of a whole stack (``docker stack ps``)."""
    args = ["service", "ps", service] if service else ["stack", "ps", str(stack)]
    proc = _docker(*args, "-q", "--no-trunc", check=False)
    ids = proc.stdout.split() if proc.returncode == 0 else []
    if not ids:
        return []
    out = []
    for t in json.loads(_docker("inspect", *ids).stdout):
        st = t.get("Status") or {}
        code = (st.get("ContainerStatus") or {}).get("ExitCode")
        out.append(TaskState(str(st.get("State", "")).lower(), None if code is None else int(code), st.get("Err", "")))
    return out


def wait_until(ok, timeout_s: float, period_s: float = 1.0) -> bool:
    """Poll ``ok()`` until it is true (True) or ``timeout_s`` passes (False)."""
    end = time.monotonic() + timeout_s
    while True:
        if ok():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(period_s)


@dataclass
class StackTestbed:
    """``docker stack deploy -c workdir/docker-compose.yml stack`` with wire counters on the overlay's bridge
    (:class:`fedhop.deploy.contract.Testbed`); results in ``runs/run_name``, service logs and notes in
    ``log_path`` (written by ``stop``). ``stop`` leaves the stack in place (the caller runs :func:`remove_stack`).
    ``settle_s``: how long ``wait`` gives the other tasks to end after the PS's."""

    stack: str
    workdir: Path
    runs: Path
    run_name: str
    settle_s: float = 120.0
    log_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.runs = self.runs.resolve()  # Swarm takes absolute bind-mount sources only
        self.out = self.runs / self.run_name
        self.log_path = self.log_path or self.runs / f"{self.run_name}.stack.log"
        self.network = f"{self.stack}_{NETWORK}"
        self.book = StackAddressBook(self.network, self.stack)
        self.overlay = OverlayCounters(self.network, f"fedhop_{self.stack.replace('-', '_')}")
        self.counters = BridgeCounters(self.overlay, lambda: self.book.book, backend="overlay")
        self._deployed = self._counting = self._recording = False
        self._t0 = 0.0

    def start(self) -> None:
        """Check the swarm (:class:`SwarmError` before anything is deployed), then counters, then deploy."""
        check_stack(self.stack, self.workdir / COMPOSE_FILE)
        self.runs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "FEDHOP_RUNS": str(self.runs), "FEDHOP_RUN": self.run_name}
        self.counters.install()
        self._counting = True
        self.book.start()
        self._recording = True
        self._t0 = time.monotonic()
        subprocess.run(["docker", "stack", "deploy", "-c", COMPOSE_FILE, self.stack], cwd=self.workdir, env=env,
                       check=True, capture_output=True, text=True)
        self._deployed = True

    def wait(self, timeout_s: float | None = None) -> int:
        """The PS task's exit code (124 when it still runs after ``timeout_s``), after up to ``settle_s`` for every
        other task to end."""
        ps = f"{self.stack}_{PS_SERVICE}"

        def ps_ended() -> bool:
            ts = tasks(service=ps)
            return bool(ts) and all(t.state in ENDED for t in ts)

        limit = float("inf") if timeout_s is None else timeout_s
        if wait_until(ps_ended, limit):
            last = tasks(service=ps)[0]
            rc = last.exit_code if last.exit_code is not None else 1
            self.notes.append(f"PS task {last.state}, exit code {last.exit_code}"
                              f"{': ' + last.error if last.error else ''}")
        else:
            rc = 124
            self.notes.append(f"PS task still running after {limit:g}s")
        if not wait_until(lambda: all(t.state in ENDED for t in tasks(stack=self.stack)), self.settle_s):
            self.notes.append(f"tasks still running {self.settle_s:g}s after the PS ended: their last bytes may be "
                              "missing")
        return rc

    def wire(self) -> WireReading:
        """The counters of every overlay namespace held (raises RuntimeError if none was)."""
        self.notes.append(f"stack ran {time.monotonic() - self._t0:.1f}s; counters in overlay namespaces "
                          f"{', '.join(self.overlay.namespaces()) or 'none'}")
        if self._recording:  # every address recorded before the counters are attributed
            self.book.stop()
            self._recording = False
        reading = self.counters.read()
        self.notes.extend(reading.notes)
        return reading

    def stop(self) -> None:
        """Stop recording addresses, delete the counters (letting the namespaces go); write the service logs."""
        if self._recording:
            self.book.stop()
            self._recording = False
        if self._counting:
            self.counters.remove()
            self._counting = False
        if not self._deployed:
            return
        assert self.log_path is not None
        services = _docker("stack", "services", self.stack, "--format", "{{.Name}}", check=False).stdout.split()
        with self.log_path.open("w") as logf:
            for svc in sorted(services):
                logs = _docker("service", "logs", "--no-task-ids", svc, check=False)
                logf.write(logs.stdout + logs.stderr)
            logf.writelines(f"[fedhop stack-run] {n}\n" for n in self.notes)


def run_stack(stack: str, workdir: Path, runs: Path, run_name: str, *, timeout_s: float = 3600.0,
              settle_s: float = 120.0, log_path: Path | None = None) -> ComposeRun:
    """Run a :class:`StackTestbed` to its end (:func:`fedhop.deploy.contract.run`): waits until the PS's task has
    ended (its exit code is the run's; 124 after ``timeout_s``) and then up to ``settle_s`` for every other task to
    end; results in ``runs/run_name``, service logs in ``log_path``. Leaves the stack in place (the caller runs
    :func:`remove_stack`). Raises :class:`SwarmError` before deploying anything if the swarm cannot run it."""
    bed = StackTestbed(stack, workdir, runs, run_name, settle_s=settle_s, log_path=log_path)
    outcome = contract.run(bed, timeout_s)
    assert bed.log_path is not None
    return ComposeRun(rc=outcome.rc, run_dir=outcome.out, links=outcome.links or [],
                      log=bed.log_path.read_text(errors="replace"))


def remove_stack(stack: str, timeout_s: float = 120.0) -> None:
    """``docker stack rm`` and wait until its network is gone (Swarm removes it after the tasks' containers)."""
    _docker("stack", "rm", stack, check=False)
    gone = wait_until(lambda: _docker("network", "inspect", f"{stack}_{NETWORK}", check=False).returncode != 0,
                      timeout_s, period_s=0.5)
    if not gone:
        raise SwarmError(f"network {stack}_{NETWORK} still there {timeout_s:g}s after `docker stack rm {stack}`")
