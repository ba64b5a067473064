"""Wire bytes per link under Docker Swarm (``docker stack deploy``), on the machine this runs on.

A Swarm overlay network has, on every machine with a task on it, its own network namespace
(``/var/run/docker/netns/<n>-<network id[:10]>``) holding a bridge ``br0`` with one port per local container and
the VXLAN device to other machines. The same :class:`~fedhop.deploy.wire.PairCounters` that compose-run puts on
the compose bridge is put on that bridge, as soon as the namespace appears (when the first local task
attaches, before its process has started talking), and container addresses are mapped to node ids as compose-run
does (the Swarm service name without the stack prefix). Docker removes that namespace when the last local task
exits, taking the counters with it, so they are read every :attr:`SwarmWire.period_s` while the run goes on and
the last reading is kept (counters only grow; what the last tasks send in their final fraction of a second, after
the PS has written its results, can be missed). On several machines, run it on each: every packet a local
container sends or receives crosses its local bridge.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from fedhop.deploy.compose_run import AddressBook, link_table, network_subnet, write_wire_csv
from fedhop.deploy.wire import PairCounters, by_node

DOCKER_NETNS = Path("/var/run/docker/netns")


def network_id(network: str) -> str:
    return subprocess.run(["docker", "network", "inspect", network, "--format", "{{.Id}}"], capture_output=True,
                          text=True, check=True).stdout.strip()


def overlay_namespace(net_id: str) -> Path | None:
    """The namespace file of overlay network ``net_id`` on this machine (None until a local task attaches)."""
    found = sorted(DOCKER_NETNS.glob(f"*-{net_id[:10]}")) if DOCKER_NETNS.is_dir() else []
    return found[0] if found else None


class SwarmWire:
    """Counters on a stack's overlay network from the moment it exists here until :meth:`collect`."""

    def __init__(self, network: str, table: str, timeout_s: float = 300.0, period_s: float = 0.05,
                 read_period_s: float = 0.25) -> None:
        self.network = network
        self.table = table
        self.timeout_s = timeout_s
        self.period_s = period_s
        self.counters: PairCounters | None = None
        self.read_period_s = read_period_s
        self.last: dict = {}
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="swarm-wire-read", daemon=True)
        self.error: str | None = None
        self.book = AddressBook(network)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._install, name="swarm-wire", daemon=True)

    def _install(self) -> None:
        end = time.monotonic() + self.timeout_s
        try:
            while time.monotonic() < end:
                try:
                    nid = network_id(self.network)
                except subprocess.CalledProcessError:
                    nid = ""
                ns = overlay_namespace(nid) if nid else None
                if ns is not None:
                    counters = PairCounters(self.table, network_subnet(self.network), netns=ns)
                    try:
                        counters.install()
                    except RuntimeError:  # the file is there before docker has mounted the namespace on it
                        time.sleep(self.period_s)
                        continue
                    self.counters = counters
                    self._reader.start()
                    return
                time.sleep(self.period_s)
            self.error = f"no namespace of overlay network {self.network} appeared within {self.timeout_s:g}s"
        except Exception as e:  # reported by collect(): the caller decides
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self._ready.set()

    def start(self) -> SwarmWire:
        """Call right after ``docker stack deploy`` returns (the network exists, tasks are being scheduled)."""
        self._thread.start()
        self.book.__enter__()
        return self

    def _read_loop(self) -> None:
        assert self.counters is not None
        while not self._stop.is_set():
            try:
                self.last = self.counters.read()
            except RuntimeError:
                return  # the namespace is gone: the last reading stands
            self._stop.wait(self.read_period_s)

    def wait_installed(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s) and self.counters is not None

    def collect(self, run_dir: Path) -> list[dict]:
        """Read the counters, attribute them to links, write ``run_dir/wire.csv``; returns its rows."""
        self._ready.wait(self.timeout_s)
        self.book.__exit__(None, None, None)
        if self.counters is None:
            raise RuntimeError(f"swarm wire counters: {self.error or 'not installed'}")
        try:
            pairs = self.counters.read()
        except RuntimeError:
            pairs = self.last
        self._stop.set()
        rows = link_table(run_dir, by_node(pairs, self.book.book))
        write_wire_csv(run_dir, rows)
        return rows

    def remove(self) -> None:
        self._stop.set()
        if self.counters is not None:
            self.counters.remove()
