"""A container shapes its own links, then runs its role: the ``[network]`` profile under compose and swarm.

The generated compose file (deploy/compose.py) makes this the entrypoint of every service with a shaped link and
gives it ``NET_ADMIN`` (its own network namespace only)::

    python -m fedhop.deploy.container_net --node edge-0 --spec /etc/fedhop/spec.toml [--proxy-port 50061] \\
        -- edge --id edge-0 --connect ps:50051 --listen 127.0.0.1:50061 ...

It resolves the profile for its node exactly as the namespace testbed does (deploy/profile.py) and applies, in its
own namespace, what concerns it:

- **rate** of what it sends: htb on the interface that leads to each peer, one class per peer (deploy/shaping.py's
  commands, matching ``ip dst PEER``). Each direction is limited by its sender, so both ends of a link together
  shape both directions.
- **loss** of what it receives: the nftables rule of deploy/loss.py (``ip saddr PEER numgen random ...``); the
  sender of a lossy direction runs this entrypoint too and turns its segmentation offloads off (as the namespace
  testbed does), so the rule drops single segments, not 64 KiB GSO super-packets.
- **delay and jitter** of what it receives: held in the kernel (deploy/kernel_delay.py, an NFQUEUE rule per
  delayed peer, a child process following a control file), as in the namespace testbed; the role then listens on
  the network (its ``--listen 127.0.0.1:P`` becomes ``0.0.0.0:P``). Where the kernel delay is unavailable (no
  ``iptables`` in the image, no NFQUEUE; the log says so), a listening node (PS, edge) runs the delay proxy
  (deploy/delay_proxy.py) on its own address and port in front of its role, which listens on 127.0.0.1
  (``--proxy-port``), holding each chunk per connecting peer.

Peers are known by their service names (the node ids); a name resolves once its container runs (under Swarm: once
its task is healthy), so a thread resolves them every 0.2 s and adds each peer's filter, rule and hold as its
address appears (a child's container starts, and under Swarm reports healthy, before its process has imported
torch and dials; until then nothing flows to it). A trace (``trace = "file.csv"``) is replayed by
a :class:`~fedhop.deploy.profile.Replay` thread, its time 0 when this process starts; the compute column of the
node's own table by the role itself (its environment names the file and the time 0). The role runs as a child
process (signals are passed on); its exit code is this process's. At the end one line ``[fedhop-net] {...}`` on
stderr gives, per peer, the configured rate and what htb let through (bytes, overlimits) and the packets dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fedhop.common.network_spec import compute_trace_env, load_traces
from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.deploy import kernel_delay, profile, shaping
from fedhop.deploy.loss import LossTable
from fedhop.deploy.netns import TestbedError, offload_commands, run_cmd
from fedhop.deploy.profile import Link, Replay

log = logging.getLogger("fedhop.container_net")

RESOLVE_S = 0.2
CONTROL = Path("/tmp/fedhop-delays.json")
KCONTROL = Path("/tmp/fedhop-kernel-delays.json")
STATS_PREFIX = "[fedhop-net] "


def _local(cmd: list[str], stdin: str | None = None) -> str:
    return run_cmd(cmd, input_text=stdin)


def route_device(addr: str) -> str:
    """The interface this namespace sends to ``addr`` through."""
    words = run_cmd(["ip", "-o", "route", "get", addr]).split()
    return words[words.index("dev") + 1]


def resolve(name: str) -> str | None:
    """``name``'s IPv4 address now, or None (its container does not run yet)."""
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


class SelfShaper:
    """The shaping of one node's own namespace, from the links of the run at each time (:func:`profile.timeline`):
    rate classes per peer, the loss table, the proxy's holds; peers added as their addresses resolve."""

    def __init__(self, node: str, steps: list[tuple[float, list[Link]]]) -> None:
        self.node = node
        self.steps = dict(steps)
        self.links = steps[0][1]
        self.rated, self.lossy, self.delayed = profile.ever(node, steps)
        self.held = profile.ever_held(node, steps)  # peers whose packets into this node are delayed
        self.peers = sorted({p for lk in self.links for p in (lk.a, lk.b) if node in (lk.a, lk.b)} - {node})
        self.classes = {p: k for k, p in enumerate(sorted(self.rated), start=1)}  # class 1:k per rated peer
        self.addresses: dict[str, str] = {}
        self.devices: set[str] = set()  # interfaces with our htb
        self.offloaded: set[str] = set()  # interfaces whose segmentation offloads are off
        self.loss = LossTable(_local)
        self.control: Path | None = None  # the delay proxy's control file (its fallback)
        self.kcontrol: Path | None = None  # the kernel delay's control file
        self.delay_mode: str | None = None  # kernel | proxy, where this node holds or forwards delayed traffic
        self.lock = threading.Lock()

    def needed(self) -> bool:
        return bool(self.rated or self.lossy or self.delayed or self.held)

    # -- each change under the lock -----------------------------------------------------------------------
    def _offloads_off(self, dev: str) -> None:
        """MTU-sized segments on ``dev``, as in the namespace testbed: the peer's loss rule then drops single
        segments, not 64 KiB GSO super-packets (which a veth passes on whole), and htb paces segments."""
        if dev in self.offloaded:
            return
        for cmd, check in offload_commands(dev):
            try:
                _local(cmd)
            except TestbedError:
                if check:
                    raise
        self.offloaded.add(dev)

    def _device(self, dev: str) -> None:
        if dev in self.devices:
            return
        rates = profile.egress(self.node, self.links)
        for cmd in shaping.qdisc_commands(dev):
            _local(cmd)
        for peer, k in self.classes.items():
            _local(shaping.class_command(dev, k, rates.get(peer)))
        self.devices.add(dev)

    def add_peer(self, peer: str, addr: str) -> None:
        """``peer`` resolved to ``addr``: its class's filter, its loss rule, its hold."""
        with self.lock:
            self.addresses[peer] = addr
            dev = route_device(addr)
            self._offloads_off(dev)
            if peer in self.classes:
                self._device(dev)
                _local(shaping.filter_command(dev, self.classes[peer], addr, "dst"))
            self._apply_loss_and_holds()
        log.info("%s: peer %s at %s shaped", self.node, peer, addr)

    def _apply_loss_and_holds(self) -> None:
        loss = profile.ingress_loss(self.node, self.links)
        self.loss.set([(p, a, loss[p]) for p, a in self.addresses.items() if p in self.lossy])
        if self.kcontrol is not None:
            inbound = profile.inbound_holds(self.node, self.links)
            kernel_delay.write_control(self.kcontrol, {a: inbound[p] for p, a in self.addresses.items()
                                                       if p in self.held})
        if self.control is not None:
            holds = profile.proxy_holds(self.node, self.links)
            profile.write_holds(self.control, {a: holds[p] for p, a in self.addresses.items() if p in holds})

    def step(self, t: float) -> None:
        """A trace step at ``t``: re-rate the classes, rewrite the loss rules and the holds."""
        with self.lock:
            self.links = self.steps[t]
            rates = profile.egress(self.node, self.links)
            for dev in sorted(self.devices):
                for peer, k in self.classes.items():
                    _local(shaping.class_command(dev, k, rates.get(peer), "change"))
            self._apply_loss_and_holds()
        log.info("%s: trace step at %gs applied", self.node, t)

    def stats(self) -> dict[str, Any]:
        """What was configured at the end and what the kernel counted, per peer."""
        with self.lock:
            rates = profile.egress(self.node, self.links)
            sent: dict[str, list[int]] = {}
            for dev in sorted(self.devices):
                got = shaping.parse_class_stats(run_cmd(["tc", "-s", "class", "show", "dev", dev], check=False))
                for peer, k in self.classes.items():
                    b, pk, _, over = got.get(f"1:{k:x}", (0, 0, 0, 0))
                    acc = sent.setdefault(peer, [0, 0, 0])
                    acc[0] += b
                    acc[1] += pk
                    acc[2] += over
            drops = self.loss.counts() if self.lossy else {}
        return {"node": self.node, "addresses": self.addresses, "delay": self.delay_mode,
                "rate": [{"peer": p, "mbit": rates.get(p), "bytes": sent.get(p, [0])[0],
                          "packets": sent.get(p, [0, 0])[1], "overlimits": sent.get(p, [0, 0, 0])[2]}
                         for p in sorted(self.classes)],
                "loss": [{"peer": p, "loss": profile.ingress_loss(self.node, self.links)[p],
                          "dropped_packets": drops.get(p, 0)} for p in sorted(self.lossy)]}


class Resolver:
    """A thread that resolves the peers' names every 0.2 s and hands each new address to the shaper."""

    def __init__(self, shaper: SelfShaper) -> None:
        self.shaper = shaper
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resolver", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for peer in self.shaper.peers:
                addr = resolve(peer)
                if addr is not None and self.shaper.addresses.get(peer) != addr:
                    try:
                        self.shaper.add_peer(peer, addr)
                    except Exception as e:  # noqa: BLE001  (reported at the end, the role runs on)
                        self.errors.append(f"{peer} {addr}: {e}")
                        log.error("cannot shape the link to %s (%s): %s", peer, addr, e)
                        self.shaper.addresses[peer] = addr  # not again
            if len(self.shaper.addresses) == len(self.shaper.peers):
                return
            self._stop.wait(RESOLVE_S)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def own_addresses() -> list[str]:
    """This container's IPv4 addresses (scope global: its networks', not loopback). Not its service name's: Swarm
    lists a task in its DNS only once the task is healthy, which a role behind a proxy not yet up never is."""
    out = []
    for line in run_cmd(["ip", "-o", "-4", "addr", "show", "scope", "global"]).splitlines():
        words = line.split()
        out.append(words[words.index("inet") + 1].split("/")[0])
    return out


def listen_openly(role: list[str], port: int) -> list[str]:
    """The role's arguments with ``--listen 127.0.0.1:PORT`` (behind a proxy) made ``0.0.0.0:PORT``."""
    out = list(role)
    for i, w in enumerate(out[:-1]):
        if w == "--listen" and out[i + 1] == f"127.0.0.1:{port}":
            out[i + 1] = f"0.0.0.0:{port}"
    return out


def plan(node: str, spec_path: Path) -> tuple[RunSpec, SelfShaper]:
    """The spec and the shaper of ``node`` (traces read from the spec's folder)."""
    spec = RunSpec.load(spec_path)
    net = spec.network_profile()
    traces = load_traces(net, spec_path.parent)
    steps = profile.timeline(build_topology(spec.topology, spec.seed), net, traces)
    return spec, SelfShaper(node, steps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedhop.deploy.container_net", description=__doc__.split("\n")[0])
    p.add_argument("--node", required=True, help="this container's node id (its service name)")
    p.add_argument("--spec", type=Path, required=True, help="the run's spec file")
    p.add_argument("--proxy-port", type=int, help="run the delay proxy on this port of the container's address, "
                   "in front of the role listening on 127.0.0.1:PORT")
    p.add_argument("role", nargs=argparse.REMAINDER, help="-- then the fedhop role's arguments")
    a = p.parse_args(argv)
    role = a.role[1:] if a.role[:1] == ["--"] else a.role
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    spec, shaper = plan(a.node, a.spec)
    missing = [t for t, need in (("tc", shaper.rated), ("nft", shaper.lossy)) if need and shutil.which(t) is None]
    if missing:
        print(f"container_net: {missing} missing in the image (iproute2, nftables)", file=sys.stderr)
        return 2
    held = None
    if shaper.held:
        why = kernel_delay.probe()
        if why is None:
            shaper.kcontrol = KCONTROL
            shaper.delay_mode = "kernel"
            kernel_delay.write_control(KCONTROL, {})
            held = subprocess.Popen([sys.executable, "-m", "fedhop.deploy.kernel_delay", "--control", str(KCONTROL),
                                     "--seed", str(spec.seed)])
            if a.proxy_port is not None:
                role = listen_openly(role, a.proxy_port)
        else:
            log.warning("kernel delay unavailable (%s): delay and jitter by the userspace proxy instead, which the "
                        "kernel's TCP does not feel", why)
    proxy = None
    if held is None and shaper.delayed and a.proxy_port is not None:
        shaper.delay_mode = "proxy"
        shaper.control = CONTROL
        profile.write_holds(CONTROL, {})
        listen = [x for addr in own_addresses() for x in ("--listen", f"{addr}:{a.proxy_port}")]
        proxy = subprocess.Popen([sys.executable, "-m", "fedhop.deploy.delay_proxy", *listen,
                                  "--target", f"127.0.0.1:{a.proxy_port}", "--control", str(CONTROL),
                                  "--seed", str(spec.seed)])
    resolver = Resolver(shaper)
    replay = Replay(list(shaper.steps), shaper.step)
    replay.start()
    env = {**os.environ, **compute_trace_env(spec.network_profile(), a.node, a.spec.parent, time.time_ns())}
    resolver.start()
    child = subprocess.Popen(["fedhop", *role], env=env)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    rc = child.wait()
    # the role is gone: its port closes now (its children take that as the end of the run, and compose may stop
    # this container any moment after), so report and leave at once, a stop signal no longer interrupting
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    for p in (proxy, held):
        if p is not None:
            p.kill()
            p.wait()
    replay.stop()
    resolver.stop()
    stats = shaper.stats()
    stats["steps"] = [{"t": t, "late_s": round(late, 4)} for t, late in replay.applied]
    stats["errors"] = resolver.errors + replay.errors
    print(STATS_PREFIX + json.dumps(stats), file=sys.stderr, flush=True)
    return rc


def read_stats(log_text: str) -> dict[str, dict[str, Any]]:
    """Node -> the ``[fedhop-net]`` line of each container in a log (compose's or swarm's service logs)."""
    out = {}
    for line in log_text.splitlines():
        i = line.find(STATS_PREFIX)
        if i >= 0:
            with contextlib.suppress(ValueError):
                d = json.loads(line[i + len(STATS_PREFIX):])
                out[d["node"]] = d
    return out


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if code >= 0 else 128 - code)  # no slow interpreter shutdown: the container ends with the role
