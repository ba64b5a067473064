"""Per-link bandwidth with ``tc`` htb on the testbed's veths.

Each direction is shaped on its own: the direction a -> b limited to R Mbit/s gets one htb class of rate R
(ceil R) in two places:

- on a's ``eth0`` (egress a -> anyone), matching ``ip dst b``: where it leaves its sender;
- on b's bridge port (egress bridge -> b), matching ``ip src a``: where it enters its receiver.

Traffic matching no class (ARP, unshaped peers) goes to a default class that is effectively
unlimited. A node with no shaped link gets no qdisc at all.

A container shapes only its own egress (deploy/container_net.py): the same commands on its own interface, each
class's filter added once the peer's address is known (:func:`qdisc_commands`, :func:`class_command`,
:func:`filter_command`). A trace changes a class's rate in place (``tc class change``, :func:`rate_changes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fedhop.deploy.netns import Network, run_cmd

UNLIMITED = "10gbit"
DEFAULT_CLASS = 0xFFFF


@dataclass(frozen=True)
class LinkShape:
    """The direction ``a`` -> ``b`` limited to ``mbit``."""

    a: str
    b: str
    mbit: float | None  # None: not limited now (a trace limits it later)


def _quantum(mbit: float) -> int:
    """htb's quantum (bytes a class may send per turn): rate / 10, kept within what htb accepts quietly."""
    return int(min(max(mbit * 1e6 / 8 / 10, 1514), 200_000))


def _rate(mbit: float | None) -> str:
    return UNLIMITED if mbit is None else f"{mbit * 1000:.0f}kbit"


def qdisc_commands(dev: str) -> list[list[str]]:
    """The htb root of ``dev`` and its default class (effectively unlimited)."""
    return [
        ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", f"{DEFAULT_CLASS:x}"],
        ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", f"1:{DEFAULT_CLASS:x}", "htb",
         "rate", UNLIMITED, "quantum", "200000"],
    ]


def class_command(dev: str, k: int, mbit: float | None, verb: str = "add") -> list[str]:
    """Class ``1:k`` of ``dev`` at ``mbit`` (None: unlimited); ``verb`` ``change`` re-rates an existing one."""
    return ["tc", "class", verb, "dev", dev, "parent", "1:", "classid", f"1:{k:x}", "htb",
            "rate", _rate(mbit), "ceil", _rate(mbit), "quantum", str(_quantum(mbit if mbit is not None else 1e4))]


def filter_command(dev: str, k: int, addr: str, match: str) -> list[str]:
    """Packets to (``match`` ``dst``) or from (``src``) ``addr`` go to class ``1:k`` of ``dev``."""
    return ["tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
            "match", "ip", match, f"{addr}/32", "flowid", f"1:{k:x}"]


def device_commands(dev: str, peers: list[tuple[str, float | None]], match: str) -> list[list[str]]:
    """``tc`` argv lists that put htb on ``dev`` with one class per (peer address, Mbit/s); ``match`` is
    ``dst`` (the node's own eth0) or ``src`` (its bridge port)."""
    if not peers:
        return []
    cmds = qdisc_commands(dev)
    for k, (addr, mbit) in enumerate(peers, start=1):
        cmds += [class_command(dev, k, mbit), filter_command(dev, k, addr, match)]
    return cmds


def _devices(net: Network,
             shapes: list[LinkShape]) -> list[tuple[str, str, str, str, list[tuple[str, str, float | None]]]]:
    """(node, namespace, device, match, [(peer node, peer address, Mbit/s)]) for every device to shape."""
    out = []
    for node in net.nodes.values():
        sends = [(s.b, net.nodes[s.b].address, s.mbit) for s in shapes if s.a == node.node]
        receives = [(s.a, net.nodes[s.a].address, s.mbit) for s in shapes if s.b == node.node]
        if sends:
            out.append((node.node, node.ns, node.dev, "dst", sends))
        if receives:
            out.append((node.node, net.bridge_ns, node.bridge_port, "src", receives))
    return out


def plan_shaping(net: Network, shapes: list[LinkShape]) -> list[tuple[str, list[str]]]:
    """(namespace, tc argv) for every shaped link of ``net``."""
    return [(ns, c) for _, ns, dev, match, peers in _devices(net, shapes)
            for c in device_commands(dev, [(addr, mbit) for _, addr, mbit in peers], match)]


def apply_shaping(net: Network, shapes: list[LinkShape]) -> None:
    for ns, cmd in plan_shaping(net, shapes):
        run_cmd(["ip", "netns", "exec", ns, *cmd])


def rate_changes(net: Network, shapes: list[LinkShape], a: str, b: str,
                 mbit: float | None) -> list[tuple[str, list[str]]]:
    """(namespace, tc argv) that re-rate the direction ``a`` -> ``b`` (one of ``shapes``, as installed by
    :func:`apply_shaping`) to ``mbit``, on both devices it is shaped on."""
    out = []
    for _, ns, dev, _, peers in _devices(net, shapes):
        for k, (peer, _, _) in enumerate(peers, start=1):
            if (dev == net.nodes[a].dev and ns == net.nodes[a].ns and peer == b) or \
                    (dev == net.nodes[b].bridge_port and ns == net.bridge_ns and peer == a):
                out.append((ns, class_command(dev, k, mbit, "change")))
    return out


_CLASS = re.compile(r"class htb (\S+) .*?\n\s*Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)")


def parse_class_stats(text: str) -> dict[str, tuple[int, int, int, int]]:
    """Class id -> (bytes, packets, drops, overlimits) from ``tc -s class show``."""
    return {m[0]: (int(m[1]), int(m[2]), int(m[3]), int(m[4])) for m in _CLASS.findall(text)}


def class_stats(net: Network, shapes: list[LinkShape]) -> list[dict[str, Any]]:
    """One record per shaped (device, peer): what htb let through and how often the rate held traffic back
    (``overlimits``). ``direction`` is ``out`` (node -> peer, on the node's eth0) or ``in`` (peer -> node)."""
    rows = []
    for node, ns, dev, match, peers in _devices(net, shapes):
        text = run_cmd(["ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", dev], check=False)
        stats = parse_class_stats(text)
        for k, (peer, _, mbit) in enumerate(peers, start=1):
            sent, pkts, drops, over = stats.get(f"1:{k:x}", (0, 0, 0, 0))
            rows.append({"node": node, "peer": peer, "direction": "out" if match == "dst" else "in", "device": dev,
                         "mbit": mbit, "bytes": sent, "packets": pkts, "drops": drops, "overlimits": over})
    return rows
