"""The namespace testbed's kernel counters (a :class:`~fedhop.deploy.wire.KernelCounters` backend), per directed
link, and its nodes' TCP statistics.

Counting: every node namespace gets an nftables table ``inet fedhop_wire`` with one counter rule per
(peer address, direction): ``output`` rules match ``ip daddr PEER``, ``input`` rules ``ip saddr PEER``; a last
rule per direction counts traffic to or from anyone else (``other``), so unexpected traffic shows up instead of
vanishing. Counters see IP packets (IP + TCP headers + TLS/HTTP/2 + gRPC + protobuf), not Ethernet framing.
The link src -> dst is the output counter of src for dst; dst's input counter for src is kept beside it.

Without ``nft`` a namespace with exactly one peer (a client) falls back to its veth's interface counters
(Ethernet frames: 14 bytes more per packet, ARP included); links of multi-peer namespaces then have no wire
count, and the table says so.

The readings become ``wire.csv`` and, beside the run's meters, ``link_bytes.csv`` (deploy/wire.py,
deploy/link_table.py), as in every testbed.
"""

from __future__ import annotations

import json
import shutil

from fedhop.deploy.netns import Network, in_ns, run_cmd
from fedhop.deploy.wire import OTHER, WireCount, WireReading, interface_bytes

TABLE = "fedhop_wire"


def nft_available() -> bool:
    return shutil.which("nft") is not None


def ruleset(peers: dict[str, str]) -> str:
    """The nft script of one namespace: ``peers`` maps peer node id -> address."""
    out_rules = [f'        ip daddr {a} counter accept comment "out:{n}"' for n, a in peers.items()]
    in_rules = [f'        ip saddr {a} counter accept comment "in:{n}"' for n, a in peers.items()]
    return "\n".join([
        f"table inet {TABLE} {{",
        "    chain out {",
        "        type filter hook output priority 0; policy accept;",
        *out_rules,
        '        oifname != "lo" counter comment "out:other"',
        "    }",
        "    chain in {",
        "        type filter hook input priority 0; policy accept;",
        *in_rules,
        '        iifname != "lo" counter comment "in:other"',
        "    }",
        "}",
    ]) + "\n"


class NamespaceCounters:
    """Installs and reads the counters of one namespace testbed (nft, else veth interface counters)."""

    def __init__(self, net: Network, peers: dict[str, list[str]]) -> None:
        self.net = net
        self.peers = peers  # node -> the nodes it talks to
        self.backend = "nft" if nft_available() else "veth"
        self.notes: list[str] = []

    def install(self) -> None:
        if self.backend == "nft":
            for node, nn in self.net.nodes.items():
                peers = {p: self.net.nodes[p].address for p in self.peers.get(node, [])}
                run_cmd(in_ns(nn.ns, ["nft", "-f", "-"]), input_text=ruleset(peers))
            return
        multi = [n for n, ps in self.peers.items() if len(ps) > 1]
        self.notes.append("nft not found (apt-get install -y nftables): wire bytes come from veth interface "
                          "counters (Ethernet frames, ARP included), only for namespaces with one peer; "
                          f"no wire count for links of {multi}")

    def read(self) -> WireReading:
        rows = self._read_nft() if self.backend == "nft" else self._read_veth()
        return WireReading(tuple(rows), self.backend, complete=False, notes=tuple(self.notes))

    def remove(self) -> None:
        """Nothing to do: the tables go with their namespaces."""

    def _read_nft(self) -> list[WireCount]:
        out: dict[tuple[str, str], tuple[int, int]] = {}
        inbound: dict[tuple[str, str], int] = {}
        for node, nn in self.net.nodes.items():
            data = json.loads(run_cmd(in_ns(nn.ns, ["nft", "-j", "list", "table", "inet", TABLE])))
            for item in data.get("nftables", []):
                rule = item.get("rule")
                if not rule or "comment" not in rule:
                    continue
                direction, _, peer = rule["comment"].partition(":")
                counter = next((e["counter"] for e in rule["expr"] if "counter" in e), None)
                if counter is None:
                    continue
                if direction == "out":
                    out[(node, peer)] = (int(counter["packets"]), int(counter["bytes"]))
                else:
                    inbound[(peer, node)] = int(counter["bytes"])
        rows = []
        for (src, dst), (pk, by) in sorted(out.items()):
            if dst == OTHER and pk == 0:
                continue
            rows.append(WireCount(src, dst, pk, by, inbound.get((src, dst)), "nft"))
        for (src, dst), by in sorted(inbound.items()):
            if src == OTHER and by:
                self.notes.append(f"{dst} received {by} B from addresses outside its links")
        return rows

    def _read_veth(self) -> list[WireCount]:
        rows = []
        for node, nn in self.net.nodes.items():
            peers = self.peers.get(node, [])
            if len(peers) != 1:
                continue
            c = interface_bytes(nn.ns, nn.dev)
            rows.append(WireCount(node, peers[0], c.tx_packets, c.tx_bytes, None, "veth"))
            rows.append(WireCount(peers[0], node, c.rx_packets, c.rx_bytes, None, "veth"))
        return rows


def tcp_stats(net: Network) -> dict[str, dict[str, int]]:
    """Per node: the kernel's TCP segment counters (``/proc/net/snmp`` of its namespace): OutSegs, RetransSegs.
    Retransmitted segments are on the wire and in the counters, so they raise wire/payload."""
    out = {}
    for node, nn in net.nodes.items():
        lines = [ln.split() for ln in run_cmd(in_ns(nn.ns, ["cat", "/proc/net/snmp"])).splitlines()
                 if ln.startswith("Tcp:")]
        if len(lines) >= 2:
            stats = dict(zip(lines[0][1:], lines[1][1:], strict=False))
            out[node] = {k: int(stats.get(k, 0)) for k in ("OutSegs", "RetransSegs")}
    return out


__all__ = ["NamespaceCounters", "nft_available", "ruleset", "tcp_stats"]
