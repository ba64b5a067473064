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
from collections.abc import Callable
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


Runner = Callable[[list[str], str | None], str]  # (argv, stdin) -> stdout, run inside one namespace


def in_namespace(ns: str) -> Runner:
    """A :data:`Runner` for the testbed namespace ``ns``."""
    return lambda cmd, stdin=None: run_cmd(in_ns(ns, cmd), input_text=stdin)


_PEER = re.compile(r"loss:(\S+)")


def parse_counts(text: str) -> dict[str, int]:
    """Peer -> packets dropped, from ``nft -j list table inet fedhop_loss``."""
    counts: dict[str, int] = {}
    for item in (json.loads(text).get("nftables", []) if text.strip() else []):
        rule = item.get("rule")
        if not rule or not (m := _PEER.fullmatch(rule.get("comment", ""))):
            continue
        counts[m[1]] = next((e["counter"]["packets"] for e in rule["expr"] if "counter" in e), 0)
    return counts


class LossTable:
    """The loss rules of one namespace (what it receives), set whole and replaced whole when they change (a
    trace): the table is deleted and written again in one ``nft -f`` transaction, and the drops counted so far
    are carried over, so :meth:`counts` covers the whole run."""

    def __init__(self, run: Runner) -> None:
        self.run = run
        self.carried: dict[str, int] = {}
        self.installed = False
        self.rules: tuple[tuple[str, str, float], ...] = ()

    def _now(self) -> dict[str, int]:
        if not self.installed:
            return {}
        return parse_counts(self.run(["nft", "-j", "list", "table", "inet", TABLE], None))

    def set(self, drops: list[tuple[str, str, float]]) -> None:
        """Make the rules ``drops`` ((peer node, peer address, loss); loss 0: no rule) the namespace's."""
        drops = sorted((p, a, x) for p, a, x in drops if x > 0)
        if tuple(drops) == self.rules and (self.installed or not drops):
            return
        for peer, n in self._now().items():
            self.carried[peer] = self.carried.get(peer, 0) + n
        script = (f"table inet {TABLE} {{}}\ndelete table inet {TABLE}\n" if self.installed else "") + ruleset(drops)
        self.run(["nft", "-f", "-"], script)
        self.installed = True
        self.rules = tuple(drops)

    def counts(self) -> dict[str, int]:
        """Peer -> packets dropped since the first :meth:`set`."""
        out = dict(self.carried)
        for peer, n in self._now().items():
            out[peer] = out.get(peer, 0) + n
        return out


def plan_loss(net: Network, losses: list[LinkLoss]) -> dict[str, str]:
    """Namespace -> nft script for every lossy link (receiver's namespace)."""
    return {net.nodes[dst].ns: ruleset(drops) for dst, drops in _by_dst(net, losses).items()}


def _by_dst(net: Network, losses: list[LinkLoss]) -> dict[str, list[tuple[str, str, float]]]:
    by_dst: dict[str, list[tuple[str, str, float]]] = {}
    for lk in losses:
        if lk.loss > 0:
            by_dst.setdefault(lk.dst, []).append((lk.src, net.nodes[lk.src].address, lk.loss))
    return by_dst


def apply_loss(net: Network, losses: list[LinkLoss],
               tables: dict[str, LossTable] | None = None) -> dict[str, LossTable]:
    """Install the rules of ``losses``; returns (or updates) the receiver -> :class:`LossTable` map. A receiver
    in ``tables`` whose links are no longer lossy gets an empty table."""
    tables = {} if tables is None else tables
    by_dst = _by_dst(net, losses)
    for dst in sorted(set(by_dst) | set(tables)):
        table = tables.setdefault(dst, LossTable(in_namespace(net.nodes[dst].ns)))
        table.set(by_dst.get(dst, []))
    return tables


def drop_counts(losses: list[LinkLoss], tables: dict[str, LossTable]) -> list[dict[str, Any]]:
    """One record per link direction that was lossy (``losses``: each direction once, its configured loss):
    packets dropped by its rule over the run."""
    rows = []
    for dst in sorted({lk.dst for lk in losses}):
        counts = tables[dst].counts() if dst in tables else {}
        rows += [{"src": lk.src, "dst": dst, "loss": lk.loss, "dropped_packets": counts.get(lk.src, 0)}
                 for lk in losses if lk.dst == dst]
    return rows
