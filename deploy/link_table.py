"""The per-link table of every testbed: payload, message and wire bytes per directed link, in one file format.

Three byte levels per directed link src -> dst:

- **payload**: tensor bytes, **message**: serialized frames (both from the run's meters, ``links.csv``, summed
  over kinds, phases and rounds; ``messages`` beside them);
- **wire**: what the kernel counted (:mod:`fedhop.deploy.wire`): IP + TCP + TLS/HTTP/2 + gRPC + protobuf.

payload <= message <= wire wherever messages flowed. Every testbed (namespaces, compose, swarm) writes the table
as ``link_bytes.csv`` with :func:`write_link_table` and prints it with :func:`format_table`;
:func:`read_link_table` reads it back (a blank ``wire_bytes``: the link had no counter, not zero bytes).

The same row (:class:`LinkBytes`) and formatter serve the run summary every run prints (fedhop/report.py
``link_table``, with :data:`SUMMARY_COLUMNS`): there the wire level is the run's own (links.csv's ``wire`` rows,
:func:`from_meter_rows`), blank for the in-process engine, which has none.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def from_meter_rows(rows: Iterable[Mapping[str, Any]]) -> list[LinkBytes]:
    """One row per directed link of the run's meter rows (``links.csv``'s rows, ``results.json``'s ``links`` or
    :attr:`RunResult.links`), summed over kinds, phases and rounds, in the order links first appear. ``wire``: the
    sum of the link's wire rows (those with a ``wire_bytes`` value: kind ``wire``); None where the link has none
    (the in-process engine has no wire level)."""
    counts: dict[tuple[str, str], list[int]] = {}  # messages, payload, message
    wire: dict[tuple[str, str], int] = {}
    for r in rows:
        key = (r["src"], r["dst"])
        c = counts.setdefault(key, [0, 0, 0])
        c[0] += int(r["messages"])
        c[1] += int(r["payload_bytes"])
        c[2] += int(r["message_bytes"])
        w = r.get("wire_bytes")
        if w is not None and w != "":
            wire[key] = wire.get(key, 0) + int(w)
    return [LinkBytes(s, d, c[1], c[2], wire.get((s, d)), c[0]) for (s, d), c in counts.items()]


def read_meters(path: Path) -> dict[tuple[str, str], Meter]:
    """(src, dst) -> the run's meter of that link (``links.csv``), summed over kinds, phases and rounds."""
    with path.open() as f:
        return {(r.src, r.dst): Meter(r.messages, r.payload, r.message) for r in from_meter_rows(csv.DictReader(f))}


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


@dataclass(frozen=True)
class Column:
    """One column of a printed per-link table: its title, width and cell."""

    title: str
    width: int
    cell: Callable[[LinkBytes], str]


def _na(v: int | None) -> str:
    return "n/a" if v is None else format(v, ",d")


# a testbed's table: the three levels with their ratios; "n/a": no counter saw the link
TESTBED_COLUMNS: tuple[Column, ...] = (
    Column("payload B", 13, lambda r: format(r.payload, ",d")),
    Column("message B", 13, lambda r: format(r.message, ",d")),
    Column("wire B", 13, lambda r: _na(r.wire)),
    Column("msg/pay", 8, lambda r: _ratio(r.message_ratio) or "-"),
    Column("wire/pay", 9, lambda r: _ratio(r.wire_ratio) or "-"),
    Column("wire-msg B", 11, lambda r: _na(r.unmetered)),
)
# a run's summary: messages and the levels the run metered itself; wire blank where it has none (simulate)
SUMMARY_COLUMNS: tuple[Column, ...] = (
    Column("messages", 9, lambda r: format(r.messages, ",d")),
    Column("payload B", 14, lambda r: format(r.payload, ",d")),
    Column("message B", 14, lambda r: format(r.message, ",d")),
    Column("wire B", 14, lambda r: "" if r.wire is None else format(r.wire, ",d")),
)


def summed(rows: Sequence[LinkBytes], src: str = "", dst: str = "") -> LinkBytes:
    """The rows added up; wire None unless every row has it (one unknown link: no total)."""
    seen = [r.wire for r in rows if r.wire is not None]
    return LinkBytes(src, dst, sum(r.payload for r in rows), sum(r.message for r in rows),
                     sum(seen) if len(seen) == len(rows) else None, sum(r.messages for r in rows))


def format_table(rows: Sequence[LinkBytes], columns: Sequence[Column] = TESTBED_COLUMNS, *, top: int | None = None,
                 total: bool = True) -> str:
    """The one per-link table: one line per row (at most ``top``, the rest summed in one line), then a total
    line (``total``). A testbed prints it at its end with :data:`TESTBED_COLUMNS`; a run's summary
    (fedhop/report.py) with :data:`SUMMARY_COLUMNS`, largest links first, the top 20, no total."""
    head = f"{'link':28s}" + "".join(f" {c.title:>{c.width}s}" for c in columns)
    lines = [head, "-" * len(head)]
    shown, rest = (rows, ()) if top is None else (rows[:top], rows[top:])
    lines += [_line(f"{r.src} -> {r.dst}", r, columns) for r in shown]
    if rest:
        lines.append(_line(f"... {len(rest)} more links", summed(rest), columns))
    if total and rows:
        lines.append(_line("total", summed(rows), columns))
    return "\n".join(lines)


def _line(name: str, r: LinkBytes, columns: Sequence[Column]) -> str:
    return (f"{name:28s}" + "".join(f" {c.cell(r):>{c.width}s}" for c in columns)).rstrip()
