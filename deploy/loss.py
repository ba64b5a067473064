"""Per-link packet loss with an nftables rule (this kernel has no ``netem``).

A link a -> b with loss ``p`` gets, in b's namespace, a rule in the table ``inet fedhop_loss`` on the input hook
(priority -10, before the wire counters of deploy/kernel_bytes.py)::

    ip saddr A numgen random mod 1000000 < P*1000000 counter drop

so a packet is lost after it crossed the wire (a's output counter counts it, b's input counter does not) and
the sender's TCP finds out the way it would on a real link: no acknowledgement, a retransmission. The rule's
counter is the number of packets dropped (``loss.json`` in the run folder).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from fedhop.deploy.netns import Network, in_ns, run_cmd

TABLE = "fedhop_loss"
SCALE = 1_000_000


@dataclass(frozen=True)
class LinkLoss:
    """Packets from ``src`` to ``dst`` are dropped with probability ``loss``."""

    src: str
    dst: str
    loss: float


def ruleset(drops: list[tuple[str, str, float]]) -> str:
    """The nft script of one namespace: ``drops`` lists (peer node, peer address, loss) of its inbound links."""
    rules = [f"        ip saddr {addr} numgen random mod {SCALE} < {round(p * SCALE)} counter drop "
             f'comment "loss:{peer}"' for peer, addr, p in drops]
    return "\n".join([
        f"table inet {TABLE} {{",
        "    chain in {",
        "        type filter hook input priority -10; policy accept;",
        *rules,
        "    }",
        "}",
    ]) + "\n"


def plan_loss(net: Network, losses: list[LinkLoss]) -> dict[str, str]:
    """Namespace -> nft script for every lossy link (receiver's namespace)."""
    by_dst: dict[str, list[tuple[str, str, float]]] = {}
    for lk in losses:
        if lk.loss > 0:
            by_dst.setdefault(lk.dst, []).append((lk.src, net.nodes[lk.src].address, lk.loss))
    return {net.nodes[dst].ns: ruleset(drops) for dst, drops in by_dst.items()}


def apply_loss(net: Network, losses: list[LinkLoss]) -> None:
    for ns, script in plan_loss(net, losses).items():
        run_cmd(in_ns(ns, ["nft", "-f", "-"]), input_text=script)


_PEER = re.compile(r"loss:(\S+)")


def drop_counts(net: Network, losses: list[LinkLoss]) -> list[dict[str, Any]]:
    """One record per lossy link: configured loss, packets dropped by its rule."""
    rows = []
    for dst in sorted({lk.dst for lk in losses if lk.loss > 0}):
        text = run_cmd(in_ns(net.nodes[dst].ns, ["nft", "-j", "list", "table", "inet", TABLE]), check=False)
        counts: dict[str, int] = {}
        for item in (json.loads(text).get("nftables", []) if text.strip() else []):
            rule = item.get("rule")
            if not rule or not (m := _PEER.fullmatch(rule.get("comment", ""))):
                continue
            counts[m[1]] = next((e["counter"]["packets"] for e in rule["expr"] if "counter" in e), 0)
        for lk in losses:
            if lk.dst == dst and lk.loss > 0:
                rows.append({"src": lk.src, "dst": dst, "loss": lk.loss, "dropped_packets": counts.get(lk.src, 0)})
    return rows
