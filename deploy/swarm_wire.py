"""Wire bytes per link under Docker Swarm (``docker stack deploy``), on the machine this runs on.

A Swarm overlay network has, on every machine with a task on it, its own network namespace
(``/var/run/docker/netns/<n>-<network id[:10]>``) holding a bridge ``br0`` with one port per local container and
the VXLAN device to other machines. The same :class:`~fedhop.deploy.wire.PairCounters` that compose-run puts on
the compose bridge is put on that bridge, as soon as the namespace appears (when the first local task
attaches, before its process has started talking), and container addresses are mapped to node ids as compose-run
does (the Swarm service name without the stack prefix). Docker removes that namespace when the last local task
exits, so an open descriptor of it is held until the counters are read (a namespace lives as long as something
refers to it). On several machines, run it on each: every packet a local container sends or receives crosses its
local bridge.
"""

from __future__ import annotations

import os
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

    def __init__(self, network: str, table: str, timeout_s: float = 300.0, period_s: float = 0.05) -> None:
        self.network = network
        self.table = table
        self.timeout_s = timeout_s
        self.period_s = period_s
        self.counters: PairCounters | None = None
        self._ns_fd: int | None = None
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
                    self._ns_fd = os.open(ns, os.O_RDONLY)
                    held = Path(f"/proc/{os.getpid()}/fd/{self._ns_fd}")
                    self.counters = PairCounters(self.table, network_subnet(self.network), netns=held)
                    self.counters.install()
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

    def wait_installed(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s) and self.counters is not None

    def collect(self, run_dir: Path) -> list[dict]:
        """Read the counters, attribute them to links, write ``run_dir/wire.csv``; returns its rows."""
        self._ready.wait(self.timeout_s)
        self.book.__exit__(None, None, None)
        if self.counters is None:
            raise RuntimeError(f"swarm wire counters: {self.error or 'not installed'}")
        pairs = self.counters.read()
        rows = link_table(run_dir, by_node(pairs, self.book.book))
        write_wire_csv(run_dir, rows)
        return rows

    def remove(self) -> None:
        if self.counters is not None:
            self.counters.remove()
        if self._ns_fd is not None:
            os.close(self._ns_fd)
            self._ns_fd = None
