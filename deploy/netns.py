"""Network namespaces for the testbed: one namespace per process, each with one veth onto a bridge.

Layout of one testbed (``tag`` is unique per run, e.g. ``fh3fa9c1``)::

    <tag>-br        the bridge namespace: bridge ``br0`` and one veth end ``v<i>`` per node
    <tag>-ps        the PS:      veth ``eth0``, address .1 of the subnet
    <tag>-edge-0    an edge:     veth ``eth0``, the next address ...
    <tag>-client-3  a client

Nothing is created in the root namespace, so two testbeds (or the leftovers of a crashed one) never collide:
each has its own bridge and its own address space. Every namespace created is recorded in a state file
(``/run/fedhop/testbed-<tag>.json``, with the owner's pid) so ``fedhop testbed clean`` can remove what a
killed owner left behind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedhop.browse import process_alive

log = logging.getLogger("fedhop.testbed")

STATE_DIR = Path("/run/fedhop")
TAG_PREFIX = "fh"


class TestbedError(RuntimeError):
    """A testbed step failed; the message names the command and the kernel's answer."""

    __test__ = False


def ip(*args: str, ns: str | None = None, check: bool = True) -> str:
    """Run ``ip [-n ns] args``; raises TestbedError with ip's stderr."""
    return run_cmd(["ip", *(["-n", ns] if ns else []), *args], check=check)


def run_cmd(cmd: list[str], check: bool = True, input_text: str | None = None) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, input=input_text)
    if check and p.returncode != 0:
        raise TestbedError(f"`{' '.join(cmd)}` failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def in_ns(ns: str, cmd: list[str]) -> list[str]:
    """``cmd`` run inside namespace ``ns``."""
    return ["ip", "netns", "exec", ns, *cmd]


@dataclass(frozen=True)
class NodeNet:
    """One process's place on the testbed network."""

    node: str
    role: str  # client | edge | server
    ns: str
    address: str  # IPv4, no prefix
    bridge_port: str  # the veth end in the bridge namespace
    dev: str = "eth0"  # the veth end in the node's namespace


@dataclass
class Network:
    """The namespaces, bridge and veths of one testbed; ``create`` builds them, ``destroy`` removes them all."""

    tag: str
    subnet: ipaddress.IPv4Network
    nodes: dict[str, NodeNet]
    mtu: int = 1500
    offloads: bool = False
    tcp_timestamps: bool = True
    created: list[str] = field(default_factory=list)  # namespaces, in creation order

    @property
    def bridge_ns(self) -> str:
        return f"{self.tag}-br"

    @property
    def state_file(self) -> Path:
        return STATE_DIR / f"testbed-{self.tag}.json"

    def by_address(self) -> dict[str, str]:
        return {n.address: n.node for n in self.nodes.values()}

    def namespaces(self) -> list[str]:
        return [self.bridge_ns, *(n.ns for n in self.nodes.values())]

    # -- building -------------------------------------------------------------------------------------------
    def _add_ns(self, name: str) -> None:
        ip("netns", "add", name)
        self.created.append(name)
        self._save_state()
        ip("link", "set", "lo", "up", ns=name)
        # IPv4 only: no IPv6 neighbour discovery or MLD chatter in the counters
        for key in ("all", "default"):
            run_cmd(in_ns(name, ["sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"]))
        if not self.tcp_timestamps:  # a per-namespace setting
            run_cmd(in_ns(name, ["sysctl", "-qw", "net.ipv4.tcp_timestamps=0"]))

    def create(self) -> None:
        """Bridge namespace, then one namespace + veth pair per node; on failure the caller destroys."""
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self._add_ns(self.bridge_ns)
        ip("link", "add", "br0", "mtu", str(self.mtu), "type", "bridge", ns=self.bridge_ns)
        ip("link", "set", "br0", "up", ns=self.bridge_ns)
        for n in self.nodes.values():
            self._add_ns(n.ns)
            ip("link", "add", n.bridge_port, "mtu", str(self.mtu), "type", "veth", "peer", "name", n.dev,
               "mtu", str(self.mtu), "netns", n.ns, ns=self.bridge_ns)
            ip("link", "set", n.bridge_port, "master", "br0", ns=self.bridge_ns)
            if not self.offloads:
                for ns, dev in ((self.bridge_ns, n.bridge_port), (n.ns, n.dev)):
                    disable_offloads(ns, dev)
            ip("link", "set", n.bridge_port, "up", ns=self.bridge_ns)
            ip("addr", "add", f"{n.address}/{self.subnet.prefixlen}", "dev", n.dev, ns=n.ns)
            ip("link", "set", n.dev, "up", ns=n.ns)

    def _save_state(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"owner_pid": os.getpid(), "namespaces": self.created}))
        tmp.replace(self.state_file)

    # -- tearing down ---------------------------------------------------------------------------------------
    def destroy(self) -> list[str]:
        """Kill every process left in our namespaces, delete them (their veths go with them) and the state
        file. Never raises; returns what could not be removed."""
        ours = [n for n in list_namespaces() if n.startswith(f"{self.tag}-") and n not in self.created]
        left = destroy_namespaces([*reversed(self.created), *ours])
        if not left:
            self.state_file.unlink(missing_ok=True)
        self.created = left
        return left


def offload_commands(dev: str) -> list[tuple[list[str], bool]]:
    """(``ip`` argv, must succeed) that turn off segmentation offloads on ``dev`` (:func:`disable_offloads`)."""
    return [(["ip", "link", "set", "dev", dev, "gso_max_segs", "1"], True),
            (["ip", "link", "set", "dev", dev, "gso_max_size", "1500"], False)]


def disable_offloads(ns: str, dev: str) -> None:
    """No segmentation offloads on ``dev``: TCP then hands the kernel MTU-sized packets, so the counters see
    every packet with its own headers (with TSO/GSO a veth carries 64 KiB super-packets, one header each), a loss
    rule drops one segment at a time and htb paces segments."""
    for cmd, check in offload_commands(dev):
        ip(*cmd[1:], ns=ns, check=check)


def ns_pids(ns: str) -> list[int]:
    out = run_cmd(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in out.split()]


def destroy_namespaces(names: list[str]) -> list[str]:
    """SIGTERM, then SIGKILL, every process inside ``names``; delete the namespaces; return those left."""
    existing = set(list_namespaces())
    names = [n for n in names if n in existing]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [p for n in names for p in ns_pids(n)]
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        end = time.monotonic() + 5.0
        while pids and time.monotonic() < end:
            pids = [p for n in names for p in ns_pids(n)]
            if pids:
                time.sleep(0.05)
        if not pids:
            break
    left = []
    for n in names:
        try:
            ip("netns", "del", n)
        except TestbedError as e:
            log.error("cannot delete namespace %s: %s", n, e)
            left.append(n)
    return left


def list_namespaces() -> list[str]:
    out = run_cmd(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def clean_stale() -> list[str]:
    """Remove the namespaces of testbeds whose owner process is gone; returns the namespaces removed."""
    removed: list[str] = []
    for f in sorted(STATE_DIR.glob("testbed-*.json")) if STATE_DIR.is_dir() else []:
        try:
            state = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if process_alive(int(state.get("owner_pid", 0)), None):
            continue
        names = list(reversed(state.get("namespaces", [])))
        left = destroy_namespaces(names)
        removed += [n for n in names if n not in left]
        if not left:
            f.unlink(missing_ok=True)
    return removed


def plan_network(nodes: list[tuple[str, str]], subnet: str, *, mtu: int = 1500, offloads: bool = False,
                 tcp_timestamps: bool = True, tag: str | None = None) -> Network:
    """Addresses and names for ``nodes`` ((node id, role), the PS first) on ``subnet``."""
    net = ipaddress.IPv4Network(subnet)
    hosts = net.hosts()
    tag = tag or f"{TAG_PREFIX}{secrets.token_hex(3)}"
    out: dict[str, NodeNet] = {}
    for i, (node, role) in enumerate(nodes):
        try:
            addr = next(hosts)
        except StopIteration:
            raise TestbedError(f"testbed.subnet {subnet} has too few addresses for {len(nodes)} nodes") from None
        out[node] = NodeNet(node=node, role=role, ns=f"{tag}-{node}", address=str(addr), bridge_port=f"v{i}")
    return Network(tag=tag, subnet=net, nodes=out, mtu=mtu, offloads=offloads, tcp_timestamps=tcp_timestamps)
