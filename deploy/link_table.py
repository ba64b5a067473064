"""The per-link table of every testbed: payload, message and wire bytes per directed link, in one file format.

Three byte levels per directed link src -> dst:

- **payload**: tensor bytes, **message**: serialized frames (both from the run's meters, ``links.csv``, summed
  over kinds, phases and rounds; ``messages`` beside them);
- **wire**: what the kernel counted (:mod:`fedhop.deploy.wire`): IP + TCP + TLS/HTTP/2 + gRPC + protobuf.

payload <= message <= wire wherever messages flowed. Every testbed (namespaces, compose, swarm) writes the table
as ``link_bytes.csv`` with :func:`write_link_table` and prints it with :func:`format_table`;
:func:`read_link_table` reads it back (a blank ``wire_bytes``: the link had no counter, not zero bytes).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

FILE = "link_bytes.csv"  # the table's name in a run folder
METERS_FILE = "links.csv"  # the run's own meters (written by the PS)
COLUMNS = ("src", "dst", "messages", "payload_bytes", "message_bytes", "wire_bytes", "message_per_payload",
           "wire_per_payload", "wire_minus_message")


@dataclass(frozen=True)
class Meter:
    """The run's own count of one directed link: messages, payload and message bytes."""

    messages: int = 0
    payload: int = 0
    message: int = 0


@dataclass(frozen=True)
class LinkBytes:
    """The three byte levels of one directed link; ``wire`` None: no kernel counter saw this link."""

    src: str
    dst: str
    payload: int
    message: int
    wire: int | None
    messages: int = 0

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

    def record(self) -> dict[str, str]:
        """The row of ``link_bytes.csv``."""
        return {"src": self.src, "dst": self.dst, "messages": str(self.messages), "payload_bytes": str(self.payload),
                "message_bytes": str(self.message), "wire_bytes": _blank(self.wire),
                "message_per_payload": _ratio(self.message_ratio), "wire_per_payload": _ratio(self.wire_ratio),
                "wire_minus_message": _blank(self.unmetered)}


def read_meters(path: Path) -> dict[tuple[str, str], Meter]:
    """(src, dst) -> the run's meter of that link (``links.csv``), summed over kinds, phases and rounds."""
    sums: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    with path.open() as f:
        for r in csv.DictReader(f):
            s = sums[(r["src"], r["dst"])]
            s[0] += int(r["messages"])
            s[1] += int(r["payload_bytes"])
            s[2] += int(r["message_bytes"])
    return {k: Meter(*v) for k, v in sums.items()}


def reconcile(meters: Mapping[tuple[str, str], Meter], wire: Mapping[tuple[str, str], int], *,
              order: Sequence[str] | None = None, complete: bool = False) -> list[LinkBytes]:
    """One row per directed link seen by a meter or a counter: in the node order ``order`` (canonical: PS, edges,
    clients; nodes outside it last), else sorted by name. ``complete``: the counters saw every packet between the
    nodes, so a link without a count carried 0 bytes (else its wire bytes are unknown: None)."""
    if order is None:
        keys = sorted(set(meters) | set(wire))
    else:
        rank = {n: i for i, n in enumerate(order)}
        keys = sorted(set(meters) | set(wire), key=lambda k: (rank.get(k[0], len(rank)), rank.get(k[1], len(rank))))
    absent = 0 if complete else None
    out = []
    for s, d in keys:
        m = meters.get((s, d), Meter())
        out.append(LinkBytes(s, d, m.payload, m.message, wire.get((s, d), absent), m.messages))
    return out


def write_link_table(rows: Iterable[LinkBytes], path: Path) -> Path:
    """The one writer of ``link_bytes.csv``."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        w.writerows(r.record() for r in rows)
    return path


def read_link_table(path: Path) -> list[LinkBytes]:
    """The one reader of ``link_bytes.csv`` (the ratios are derived, not read)."""
    with path.open() as f:
        return [LinkBytes(r["src"], r["dst"], int(r["payload_bytes"]), int(r["message_bytes"]),
                          int(r["wire_bytes"]) if r["wire_bytes"] != "" else None, int(r["messages"]))
                for r in csv.DictReader(f)]


def _blank(v: int | None) -> str:
    return "" if v is None else str(v)


def _ratio(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def format_table(rows: Sequence[LinkBytes]) -> str:
    """The per-link table a testbed prints at its end, with a total row."""
    head = f"{'link':28s} {'payload B':>13s} {'message B':>13s} {'wire B':>13s} {'msg/pay':>8s} {'wire/pay':>9s}" \
           f" {'wire-msg B':>11s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(_line(f"{r.src} -> {r.dst}", r))
    if rows:
        seen = [r.wire for r in rows if r.wire is not None]
        total = LinkBytes("", "", sum(r.payload for r in rows), sum(r.message for r in rows),
                          sum(seen) if len(seen) == len(rows) else None, sum(r.messages for r in rows))
        lines.append(_line("total", total))
    return "\n".join(lines)


def _line(name: str, r: LinkBytes) -> str:
    return (f"{name:28s} {r.payload:13,d} {r.message:13,d} {'n/a' if r.wire is None else format(r.wire, ',d'):>13s} "
            f"{_ratio(r.message_ratio) or '-':>8s} {_ratio(r.wire_ratio) or '-':>9s} "
            f"{'n/a' if r.unmetered is None else format(r.unmetered, ',d'):>11s}")
