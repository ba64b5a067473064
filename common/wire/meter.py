"""Byte meters: every message counted per link (src -> dst), per message kind and per phase.

Two levels are counted here: ``payload`` (raw tensor bytes, what the papers count) and ``message``
(serialized protobuf bytes on the gRPC stream). The third level, ``wire`` (kernel interface counters),
is read by the testbed in ``deploy/``.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class LinkKey:
    src: str
    dst: str
    kind: str  # the task or message kind, e.g. "fedavg.train", "handoff", "describe"
    phase: str  # "request" (src asked dst) or "reply"
    round: int = -1  # driver round the message belongs to; -1 = set-up / tear-down


@dataclass
class LinkCount:
    messages: int = 0
    payload_bytes: int = 0
    message_bytes: int = 0


@dataclass
class ByteMeter:
    """Thread-safe counters keyed by :class:`LinkKey`."""

    counts: dict[LinkKey, LinkCount] = field(default_factory=lambda: defaultdict(LinkCount))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, src: str, dst: str, kind: str, phase: str, payload: int, message: int,
               round: int = -1) -> None:
        with self._lock:
            c = self.counts[LinkKey(src, dst, kind, phase, round)]
            c.messages += 1
            c.payload_bytes += payload
            c.message_bytes += message

    def merge(self, rows: list[dict]) -> None:
        """Add rows produced by :meth:`rows` (e.g. a remote process's snapshot)."""
        with self._lock:
            for r in rows:
                c = self.counts[LinkKey(r["src"], r["dst"], r["kind"], r["phase"], int(r["round"]))]
                c.messages += int(r["messages"])
                c.payload_bytes += int(r["payload_bytes"])
                c.message_bytes += int(r["message_bytes"])

    def relabel_from(self, round_idx: int, phase: str = "redo") -> int:
        """Count every row of round >= ``round_idx`` under ``phase`` instead (a node rolled back before that
        round: its traffic since is reported apart, as redone work). Returns the rows moved."""
        with self._lock:
            moved = [k for k in self.counts if k.round >= round_idx and k.phase != phase]
            for k in moved:
                c = self.counts.pop(k)
                t = self.counts[LinkKey(k.src, k.dst, k.kind, phase, k.round)]
                t.messages += c.messages
                t.payload_bytes += c.payload_bytes
                t.message_bytes += c.message_bytes
        return len(moved)

    def rows(self) -> list[dict]:
        """One dict per (src, dst, kind, phase, round), sorted."""
        with self._lock:
            items = sorted(self.counts.items())
        return [
            {"src": k.src, "dst": k.dst, "kind": k.kind, "phase": k.phase, "round": k.round,
             "messages": c.messages,
             "payload_bytes": c.payload_bytes, "message_bytes": c.message_bytes}
            for k, c in items
        ]

    def totals(self) -> LinkCount:
        with self._lock:
            out = LinkCount()
            for c in self.counts.values():
                out.messages += c.messages
                out.payload_bytes += c.payload_bytes
                out.message_bytes += c.message_bytes
        return out

    def per_link(self, level: str = "payload_bytes") -> dict[tuple[str, str], int]:
        """Bytes per directed link (src, dst), summed over kinds and phases."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for r in self.rows():
            out[(r["src"], r["dst"])] += r[level]
        return dict(out)
