"""Per-link bandwidth with ``tc`` htb on the testbed's veths.

Each direction is shaped on its own: the direction a -> b limited to R Mbit/s gets one htb class of rate R
(ceil R) in two places:

- on a's ``eth0`` (egress a -> anyone), matching ``ip dst b``: where it leaves its sender;
- on b's bridge port (egress bridge -> b), matching ``ip src a``: where it enters its receiver.

Traffic matching no class (ARP, unshaped peers) goes to a default class that is effectively
unlimited. A node with no shaped link gets no qdisc at all.
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
    mbit: float


def _quantum(mbit: float) -> int:
    """htb's quantum (bytes a class may send per turn): rate / 10, kept within what htb accepts quietly."""
    return int(min(max(mbit * 1e6 / 8 / 10, 1514), 200_000))


def _rate(mbit: float) -> str:
    return f"{mbit * 1000:.0f}kbit"


def device_commands(dev: str, peers: list[tuple[str, float]], match: str) -> list[list[str]]:
    """``tc`` argv lists that put htb on ``dev`` with one class per (peer address, Mbit/s); ``match`` is
    ``dst`` (the node's own eth0) or ``src`` (its bridge port)."""
    if not peers:
        return []
    cmds = [
        ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", f"{DEFAULT_CLASS:x}"],
        ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", f"1:{DEFAULT_CLASS:x}", "htb",
         "rate", UNLIMITED, "quantum", "200000"],
    ]
    for k, (addr, mbit) in enumerate(peers, start=1):
        cmds.append(["tc", "class", "add", "dev", dev, "parent", "1:", "classid", f"1:{k:x}", "htb",
                     "rate", _rate(mbit), "ceil", _rate(mbit), "quantum", str(_quantum(mbit))])
        cmds.append(["tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                     "match", "ip", match, f"{addr}/32", "flowid", f"1:{k:x}"])
    return cmds


def _devices(net: Network, shapes: list[LinkShape]) -> list[tuple[str, str, str, str, list[tuple[str, str, float]]]]:
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


_CLASS = re.compile(r"class htb (\S+) .*?\n\s*Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)")


def class_stats(net: Network, shapes: list[LinkShape]) -> list[dict[str, Any]]:
    """One record per shaped (device, peer): what htb let through and how often the rate held traffic back
    (``overlimits``). ``direction`` is ``out`` (node -> peer, on the node's eth0) or ``in`` (peer -> node)."""
    rows = []
    for node, ns, dev, match, peers in _devices(net, shapes):
        text = run_cmd(["ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", dev], check=False)
        stats = {m[0]: m[1:] for m in _CLASS.findall(text)}
        for k, (peer, _, mbit) in enumerate(peers, start=1):
            sent, pkts, drops, over = (int(x) for x in stats.get(f"1:{k:x}", ("0", "0", "0", "0")))
            rows.append({"node": node, "peer": peer, "direction": "out" if match == "dst" else "in", "device": dev,
                         "mbit": mbit, "bytes": sent, "packets": pkts, "drops": drops, "overlimits": over})
    return rows
