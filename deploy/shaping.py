"""Per-link bandwidth with ``tc`` htb on the testbed's veths.

A link a <-> b limited to R Mbit/s gets one htb class of rate R (ceil R) in each direction:

- on a's ``eth0`` (egress a -> anyone), matching ``ip dst b``: limits a -> b;
- on a's bridge port (egress bridge -> a), matching ``ip src b``: limits b -> a.

b's side gets the mirror classes, so each direction is limited where it leaves its sender and again where it
enters its receiver (both at R). Traffic matching no class (ARP, unshaped peers) goes to a default class that
is effectively unlimited. A node with no shaped link gets no qdisc at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedhop.deploy.netns import Network, ip, run_cmd

UNLIMITED = "10gbit"
DEFAULT_CLASS = 0xFFFF


@dataclass(frozen=True)
class LinkShape:
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


def plan_shaping(net: Network, shapes: list[LinkShape]) -> list[tuple[str, list[str]]]:
    """(namespace, tc argv) for every shaped link of ``net``."""
    out: list[tuple[str, list[str]]] = []
    for node in net.nodes.values():
        peers = [(net.nodes[s.b if s.a == node.node else s.a].address, s.mbit)
                 for s in shapes if node.node in (s.a, s.b)]
        out += [(node.ns, c) for c in device_commands(node.dev, peers, "dst")]
        out += [(net.bridge_ns, c) for c in device_commands(node.bridge_port, peers, "src")]
    return out


def apply_shaping(net: Network, shapes: list[LinkShape]) -> None:
    for ns, cmd in plan_shaping(net, shapes):
        run_cmd(["ip", "netns", "exec", ns, *cmd])


def describe(net: Network) -> str:
    """``tc -s class show`` of every shaped device (for the run folder)."""
    parts = []
    for node in net.nodes.values():
        for ns, dev in ((node.ns, node.dev), (net.bridge_ns, node.bridge_port)):
            text = run_cmd(["ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", dev], check=False)
            if text.strip():
                parts.append(f"# {node.node}: {dev} in {ns}\n{text}")
    return "\n".join(parts)


__all__ = ["LinkShape", "apply_shaping", "describe", "device_commands", "ip", "plan_shaping"]
