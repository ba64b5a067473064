"""Wire bytes from the kernel, per directed link, and the three byte levels reconciled.

Counting: every node namespace gets an nftables table ``inet fedhop_wire`` with one counter rule per
(peer address, direction): ``output`` rules match ``ip daddr PEER``, ``input`` rules ``ip saddr PEER``; a last
rule per direction counts traffic to or from anyone else (``other``), so unexpected traffic shows up instead of
vanishing. Counters see IP packets (IP + TCP headers + TLS/HTTP/2 + gRPC + protobuf), not Ethernet framing.
The link src -> dst is the output counter of src for dst; dst's input counter for src is kept beside it.

Without ``nft`` a namespace with exactly one peer (a client) falls back to its veth's interface counters
(Ethernet frames: 14 bytes more per packet, ARP included); links of multi-peer namespaces then have no wire
count, and the table says so.

Levels per link (``links.csv`` has the first two, summed over kinds, phases and rounds):
payload (tensor bytes) <= message (serialized frames) <= wire (kernel).
"""

from __future__ import annotations

import csv
import json
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from fedhop.deploy.netns import Network, TestbedError, in_ns, run_cmd

TABLE = "fedhop_wire"
OTHER = "other"


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


@dataclass(frozen=True)
class WireCount:
    src: str
    dst: str
    packets: int
    bytes: int
    bytes_at_dst: int | None  # the receiver's input counter (nft only)
    source: str  # nft | veth


class WireCounters:
    """Installs and reads the counters of one testbed."""

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

    def read(self) -> list[WireCount]:
        return self._read_nft() if self.backend == "nft" else self._read_veth()

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
            info = json.loads(run_cmd(["ip", "-n", nn.ns, "-s", "-j", "link", "show", "dev", nn.dev]))[0]
            st = info["stats64"]
            rows.append(WireCount(node, peers[0], int(st["tx"]["packets"]), int(st["tx"]["bytes"]), None, "veth"))
            rows.append(WireCount(peers[0], node, int(st["rx"]["packets"]), int(st["rx"]["bytes"]), None, "veth"))
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


def write_wire_csv(rows: list[WireCount], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["src", "dst", "packets", "wire_bytes", "wire_bytes_at_dst", "source"])
        for r in rows:
            w.writerow([r.src, r.dst, r.packets, r.bytes, "" if r.bytes_at_dst is None else r.bytes_at_dst,
                        r.source])


@dataclass(frozen=True)
class LinkLevels:
    """The three byte levels of one directed link."""

    src: str
    dst: str
    payload: int
    message: int
    wire: int | None

    @property
    def message_ratio(self) -> float | None:
        return self.message / self.payload if self.payload else None

    @property
    def wire_ratio(self) -> float | None:
        return self.wire / self.payload if self.payload and self.wire is not None else None

    @property
    def unmetered(self) -> int | None:
        """Wire bytes no meter accounts for: TCP/IP and HTTP/2 overhead plus unmetered control messages."""
        return self.wire - self.message if self.wire is not None else None


def read_links_csv(path: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """(src, dst) -> (payload, message) bytes summed over kinds, phases and rounds."""
    sums: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    with path.open() as f:
        for r in csv.DictReader(f):
            s = sums[(r["src"], r["dst"])]
            s[0] += int(r["payload_bytes"])
            s[1] += int(r["message_bytes"])
    return {k: (v[0], v[1]) for k, v in sums.items()}


def reconcile(meters: dict[tuple[str, str], tuple[int, int]], wire: list[WireCount],
              order: list[str]) -> list[LinkLevels]:
    """One row per directed link seen by a meter or a counter, in canonical node order."""
    w = {(r.src, r.dst): r.bytes for r in wire if r.dst != OTHER}
    rank = {n: i for i, n in enumerate(order)}
    keys = sorted(set(meters) | set(w), key=lambda k: (rank.get(k[0], len(rank)), rank.get(k[1], len(rank))))
    return [LinkLevels(s, d, *meters.get((s, d), (0, 0)), w.get((s, d))) for s, d in keys]


def write_levels_csv(rows: list[LinkLevels], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["src", "dst", "payload_bytes", "message_bytes", "wire_bytes", "message_per_payload",
                    "wire_per_payload", "wire_minus_message"])
        for r in rows:
            w.writerow([r.src, r.dst, r.payload, r.message, _blank(r.wire), _ratio(r.message_ratio),
                        _ratio(r.wire_ratio), _blank(r.unmetered)])


def _blank(v: int | None) -> str:
    return "" if v is None else str(v)


def _ratio(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def format_table(rows: list[LinkLevels]) -> str:
    """The per-link table printed at the end of ``fedhop testbed up``."""
    head = f"{'link':24s} {'payload B':>13s} {'message B':>13s} {'wire B':>13s} {'msg/pay':>8s} {'wire/pay':>9s}" \
           f" {'wire-msg B':>11s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.src + ' -> ' + r.dst:24s} {r.payload:13,d} {r.message:13,d} "
                     f"{'n/a' if r.wire is None else format(r.wire, ',d'):>13s} "
                     f"{_ratio(r.message_ratio) or '-':>8s} {_ratio(r.wire_ratio) or '-':>9s} "
                     f"{'n/a' if r.unmetered is None else format(r.unmetered, ',d'):>11s}")
    return "\n".join(lines)


__all__ = ["LinkLevels", "TestbedError", "WireCount", "WireCounters", "format_table", "read_links_csv",
           "reconcile", "write_levels_csv", "write_wire_csv"]
