"""Wire bytes from the kernel: what a run's traffic really cost, IP headers, TCP, HTTP/2 and gRPC framing included.

Two readers, both root-only, both usable by any testbed whose nodes have their own network namespace:

- :func:`interface_bytes` reads one interface's totals inside a process's network namespace
  (``/proc/<pid>/net/dev``, no ``nsenter`` needed). Per node, not per link; gone once the process exits.
- :class:`PairCounters` counts bytes per (source address, destination address) of the IPv4 traffic a Linux
  bridge forwards between its ports, with one nftables table in the host namespace (a dynamic set whose
  elements carry counters). Per link, and it outlives the containers. Install it before the traffic starts::

      with PairCounters("fedhop_run1", "172.20.0.0/16") as pc:
          ...                                 # run the job
          counts = pc.read()                  # {("172.20.0.2", "172.20.0.5"): PairBytes(packets, bytes)}

  Bytes are IP packet lengths (IP header included, Ethernet header not); only traffic crossing the bridge
  is seen (node to node, not a node talking to itself).

:func:`by_node` turns address pairs into node pairs given who holds which address.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,60}$")


@dataclass(frozen=True)
class InterfaceBytes:
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int


def interface_bytes(pid: int, iface: str = "eth0") -> InterfaceBytes:
    """Counters of ``iface`` in the network namespace of process ``pid`` (``/proc/<pid>/net/dev``)."""
    path = Path(f"/proc/{pid}/net/dev")
    for line in path.read_text().splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == iface:
            f = [int(x) for x in rest.split()]
            return InterfaceBytes(rx_bytes=f[0], rx_packets=f[1], tx_bytes=f[8], tx_packets=f[9])
    raise KeyError(f"no interface {iface!r} in the network namespace of pid {pid} ({path})")


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


def by_node(pairs: Mapping[tuple[str, str], PairBytes], node_of: Mapping[str, str]) -> dict[tuple[str, str], int]:
    """Wire bytes per (source node, destination node); addresses nobody in ``node_of`` holds are left out."""
    out: dict[tuple[str, str], int] = {}
    for (src, dst), c in pairs.items():
        if src in node_of and dst in node_of:
            key = (node_of[src], node_of[dst])
            out[key] = out.get(key, 0) + c.bytes
    return out


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
