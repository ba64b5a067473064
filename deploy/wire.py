"""Wire bytes from the kernel: what a run's traffic really cost, IP headers, TCP, HTTP/2 and gRPC framing included.

One abstraction, :class:`KernelCounters` (install / read / remove), with three backends that share the counting
and attribution code here:

- nftables counters inside each node's own network namespace, or its veth's interface counters without ``nft``
  (the namespace testbed: :class:`fedhop.deploy.kernel_bytes.NamespaceCounters`);
- :class:`PairCounters` on a Linux bridge (the compose network: :class:`BridgeCounters`), which counts bytes
  per (source address, destination address) of the IPv4 traffic the bridge forwards between its ports, with one
  nftables table (a dynamic set whose elements carry counters). Per link, and it outlives the containers::

      with PairCounters("fedhop_run1", "172.20.0.0/16") as pc:
          ...                                 # run the job
          counts = pc.read()                  # {("172.20.0.2", "172.20.0.5"): PairBytes(packets, bytes)}

  Bytes are IP packet lengths (IP header included, Ethernet header not); only traffic crossing the bridge
  is seen (node to node, not a node talking to itself);
- the same pair counters on a Swarm overlay's bridge, in every namespace the overlay gets on this machine
  (:class:`fedhop.deploy.swarm_run.OverlayCounters`, also attributed by :class:`BridgeCounters`).

Every backend's :meth:`~KernelCounters.read` gives a :class:`WireReading`: one :class:`WireCount` per directed
link (``src -> dst`` as node ids; ``other`` for traffic to or from anyone outside the run), written as
``wire.csv`` by :func:`write_wire_csv` (the one writer; :func:`read_wire_csv` reads it back).
:func:`attribute_pairs` turns address pairs into node pairs given who holds which address;
:func:`interface_bytes` reads one interface's totals inside a network namespace.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

from fedhop.deploy.netns import run_cmd

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,60}$")

FILE = "wire.csv"  # the kernel's counts in a run folder
OTHER = "other"  # the peer of traffic to or from anyone outside the run's links
COLUMNS = ("src", "dst", "packets", "wire_bytes", "wire_bytes_at_dst", "source")


@dataclass(frozen=True)
class WireCount:
    """What the kernel counted on one directed link."""

    src: str
    dst: str
    packets: int
    bytes: int
    bytes_at_dst: int | None  # the receiver's own input counter, where the backend has one
    source: str  # the backend: nft | veth | bridge | overlay


@dataclass(frozen=True)
class WireReading:
    """One reading of a testbed's counters. ``complete``: the counters saw every packet between the run's
    nodes, so a link without a count carried nothing (else its bytes are unknown)."""

    rows: tuple[WireCount, ...]
    backend: str
    complete: bool
    notes: tuple[str, ...] = ()

    def by_link(self) -> dict[tuple[str, str], int]:
        """Wire bytes per (source node, destination node), traffic with outsiders left out."""
        return {(r.src, r.dst): r.bytes for r in self.rows if OTHER not in (r.src, r.dst)}


class KernelCounters(Protocol):
    """The kernel's byte counters of one testbed: ``install`` before any role starts, ``read`` after the run,
    ``remove`` at the end (also on failure)."""

    backend: str

    def install(self) -> None: ...

    def read(self) -> WireReading: ...

    def remove(self) -> None: ...


def write_wire_csv(rows: Iterable[WireCount], path: Path) -> Path:
    """The one writer of ``wire.csv``."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.src, r.dst, r.packets, r.bytes, "" if r.bytes_at_dst is None else r.bytes_at_dst,
                        r.source])
    return path


def read_wire_csv(path: Path) -> list[WireCount]:
    """The one reader of ``wire.csv``."""
    with path.open() as f:
        return [WireCount(r["src"], r["dst"], int(r["packets"]), int(r["wire_bytes"]),
                          int(r["wire_bytes_at_dst"]) if r["wire_bytes_at_dst"] != "" else None, r["source"])
                for r in csv.DictReader(f)]


@dataclass(frozen=True)
class InterfaceBytes:
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int


def interface_bytes(ns: str, dev: str = "eth0") -> InterfaceBytes:
    """Counters of interface ``dev`` in network namespace ``ns`` (``ip -n NS -s -j link show dev DEV``: Ethernet
    frames, ARP included); raises TestbedError with ip's answer."""
    st = json.loads(run_cmd(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev]))[0]["stats64"]
    return InterfaceBytes(rx_bytes=int(st["rx"]["bytes"]), tx_bytes=int(st["tx"]["bytes"]),
                          rx_packets=int(st["rx"]["packets"]), tx_packets=int(st["tx"]["packets"]))


@dataclass(frozen=True)
class PairBytes:
    packets: int
    bytes: int


class PairCounters:
    """Per address-pair byte counters on bridged IPv4 traffic within ``subnet`` (nftables, host namespace)."""

    def __init__(self, table: str, subnet: str, netns: Path | None = None) -> None:
        """``netns``: a network namespace file (e.g. a Swarm overlay network's, under /var/run/docker/netns)
        whose bridge to count on, instead of the host's."""
        if not _NAME.match(table):
            raise ValueError(f"nftables table name must be letters, digits and _ (got {table!r})")
        if not re.match(r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$", subnet):
            raise ValueError(f"subnet must be an IPv4 CIDR such as 172.20.0.0/16 (got {subnet!r})")
        self.table = table
        self.subnet = subnet
        self.netns = netns

    def install(self) -> None:
        ruleset = f"""
table bridge {self.table} {{
  set pairs {{
    type ipv4_addr . ipv4_addr
    flags dynamic
    counter
    size 65536
  }}
  chain links {{
    type filter hook forward priority 0; policy accept;
    ip saddr {self.subnet} ip daddr {self.subnet} update @pairs {{ ip saddr . ip daddr }}
  }}
}}
"""
        self.remove()
        _nft(["-f", "-"], ruleset, self.netns)

    def read(self) -> dict[tuple[str, str], PairBytes]:
        """Bytes and packets per (source, destination) address seen so far."""
        doc = json.loads(_nft(["-j", "list", "set", "bridge", self.table, "pairs"], netns=self.netns))
        out: dict[tuple[str, str], PairBytes] = {}
        for item in doc.get("nftables", []):
            for elem in item.get("set", {}).get("elem", []):
                e = elem["elem"]
                src, dst = e["val"]["concat"]
                c = e["counter"]
                out[(src, dst)] = PairBytes(packets=int(c["packets"]), bytes=int(c["bytes"]))
        return out

    def remove(self) -> None:
        subprocess.run([*_in(self.netns), "nft", "delete", "table", "bridge", self.table], capture_output=True,
                       check=False)

    def __enter__(self) -> PairCounters:
        self.install()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()


def sum_pairs(readings: Iterable[Mapping[tuple[str, str], PairBytes]]) -> dict[tuple[str, str], PairBytes]:
    """Several readings of pair counters (e.g. one per namespace of an overlay) added up per address pair."""
    out: dict[tuple[str, str], PairBytes] = {}
    for reading in readings:
        for k, c in reading.items():
            prev = out.get(k, PairBytes(0, 0))
            out[k] = PairBytes(prev.packets + c.packets, prev.bytes + c.bytes)
    return out


def attribute_pairs(pairs: Mapping[tuple[str, str], PairBytes], node_of: Mapping[str, str],
                    source: str) -> tuple[list[WireCount], int]:
    """Counts per address pair -> one :class:`WireCount` per (source node, destination node), in name order, and
    the bytes between addresses nobody in ``node_of`` holds (left out)."""
    acc: dict[tuple[str, str], list[int]] = {}
    stray = 0
    for (src, dst), c in pairs.items():
        if src in node_of and dst in node_of:
            a = acc.setdefault((node_of[src], node_of[dst]), [0, 0])
            a[0] += c.packets
            a[1] += c.bytes
        else:
            stray += c.bytes
    rows = [WireCount(s, d, pk, by, None, source) for (s, d), (pk, by) in sorted(acc.items())]
    return rows, stray


class PairSource(Protocol):
    """Counters per (source address, destination address): :class:`PairCounters`, or an overlay's."""

    def install(self) -> None: ...

    def read(self) -> dict[tuple[str, str], PairBytes]: ...

    def remove(self) -> None: ...


@dataclass
class BridgeCounters:
    """A :class:`KernelCounters` from pair counters on a bridge (compose's network, a Swarm overlay's): the
    addresses are attributed to nodes with ``node_of()`` (who held which address during the run) when read. A
    bridge sees every packet between its ports, so the reading is complete."""

    pairs: PairSource
    node_of: Callable[[], Mapping[str, str]]
    backend: str = "bridge"
    notes: list[str] = field(default_factory=list)

    def install(self) -> None:
        self.pairs.install()

    def read(self) -> WireReading:
        pairs = self.pairs.read()
        rows, stray = attribute_pairs(pairs, self.node_of(), self.backend)
        notes = [*self.notes]
        if not pairs:
            notes.append("the wire counters saw no packet: wire bytes are missing, not zero")
        if stray:
            notes.append(f"{stray} B between addresses no node of the run held (left out)")
        return WireReading(tuple(rows), self.backend, complete=True, notes=tuple(notes))

    def remove(self) -> None:
        self.pairs.remove()


def _in(netns: Path | None) -> list[str]:
    return ["nsenter", f"--net={netns}"] if netns else []


def _nft(args: list[str], stdin: str | None = None, netns: Path | None = None) -> str:
    try:
        proc = subprocess.run([*_in(netns), "nft", *args], input=stdin, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise RuntimeError("nft not found: wire counters need nftables (apt-get install nftables) and root") from e
    if proc.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout
