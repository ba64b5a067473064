"""Byte meters: every message counted per link (src -> dst), per message kind and per phase.

Two levels are counted per message: ``payload`` (raw tensor bytes, what the papers count) and ``message``
(serialized protobuf bytes on the gRPC stream). The third level, ``wire``, is the kernel's TCP counters of the
link's connection, read by the networked engine once per round (``transport/tcp_counters.py``) and kept in rows
of their own kind, :data:`WIRE_KIND` (phase :data:`WIRE_PHASE`, no messages, no payload or message bytes), since
a connection's bytes belong to no single message kind. The in-process engine has no wire rows. (The testbeds in
``deploy/`` also read interface counters, ``wire.csv``.)
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from fedhop.common.wire.meter_rows import RowCache

WIRE_KIND = "wire"  # the kind of wire-level rows: a link's TCP counters in one round
WIRE_PHASE = "tcp"
WIRE_COUNTS = ("wire_bytes", "wire_segments", "wire_retrans")


@dataclass(frozen=True, order=True, slots=True)
class LinkKey:
    src: str
    dst: str
    kind: str  # the task or message kind, e.g. "fedavg.train", "handoff", "describe"
    phase: str  # "request" (src asked dst) or "reply"
    round: int = -1  # driver round the message belongs to; -1 = set-up / tear-down


@dataclass(slots=True)
class LinkCount:
    messages: int = 0
    payload_bytes: int = 0
    message_bytes: int = 0
    wire_bytes: int = 0  # wire rows only (WIRE_KIND): TCP stream bytes delivered on the link
    wire_segments: int = 0
    wire_retrans: int = 0

    def add(self, other: LinkCount) -> None:
        self.messages += other.messages
        self.payload_bytes += other.payload_bytes
        self.message_bytes += other.message_bytes
        self.wire_bytes += other.wire_bytes
        self.wire_segments += other.wire_segments
        self.wire_retrans += other.wire_retrans


@dataclass(frozen=True)
class MeterView:
    """One consistent read of a :class:`ByteMeter` (:meth:`ByteMeter.view`)."""

    rows: list[dict]  # every row, in the meter's order (shared dicts: read, never change)
    changed: dict[int, tuple[int, list[dict]]]  # per round changed since the caller's versions: its version, rows
    totals: LinkCount  # every row's counts summed


@dataclass
class ByteMeter:
    """Thread-safe counters keyed by :class:`LinkKey`.

    Every change goes through the methods below, which note the keys they touch: :meth:`rows` rebuilds the row
    dicts of those keys only and keeps the rest from its last call (:class:`~fedhop.common.wire.meter_rows.RowCache`),
    so the PS's commit after each round costs what the round changed, not every row of the run so far (issue 19:
    10,000 clients make ~5 rows each per round). ``counts`` is therefore read-only to everyone else."""

    counts: dict[LinkKey, LinkCount] = field(default_factory=lambda: defaultdict(LinkCount))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _dirty: set[LinkKey] = field(default_factory=set, repr=False, compare=False)  # changed since the cache was read
    _cache: RowCache = field(default_factory=RowCache, repr=False, compare=False)
    _total: LinkCount = field(default_factory=LinkCount, repr=False, compare=False)  # every count summed, kept as
    # they change: :meth:`totals` in O(1), however many rows a long run with many clients has made

    def record(self, src: str, dst: str, kind: str, phase: str, payload: int, message: int,
               round: int = -1) -> None:
        key = LinkKey(src, dst, kind, phase, round)
        with self._lock:
            c = self.counts[key]
            c.messages += 1
            c.payload_bytes += payload
            c.message_bytes += message
            self._dirty.add(key)
            t = self._total
            t.messages += 1
            t.payload_bytes += payload
            t.message_bytes += message

    def record_wire(self, src: str, dst: str, round: int, wire_bytes: int, segments: int, retrans: int) -> None:
        """A wire-level row: what the kernel counted on the src -> dst connection(s) in ``round``."""
        key = LinkKey(src, dst, WIRE_KIND, WIRE_PHASE, round)
        with self._lock:
            c = self.counts[key]
            self._dirty.add(key)
            added = LinkCount(wire_bytes=wire_bytes, wire_segments=segments, wire_retrans=retrans)
            c.add(added)
            self._total.add(added)

    def merge(self, rows: list[dict]) -> None:
        """Add rows produced by :meth:`rows` (e.g. a remote process's snapshot)."""
        with self._lock:
            for r in rows:
                key = LinkKey(r["src"], r["dst"], r["kind"], r["phase"], int(r["round"]))
                self._dirty.add(key)
                added = LinkCount(int(r["messages"]), int(r["payload_bytes"]), int(r["message_bytes"]),
                                  int(r.get("wire_bytes", 0)), int(r.get("wire_segments", 0)),
                                  int(r.get("wire_retrans", 0)))
                self.counts[key].add(added)
                self._total.add(added)

    def relabel_from(self, round_idx: int, phase: str = "redo") -> int:
        """Count every row of round >= ``round_idx`` under ``phase`` instead (a node rolled back before that
        round: its traffic since is reported apart, as redone work). Returns the rows moved."""
        with self._lock:
            moved = [k for k in self.counts if k.round >= round_idx and k.phase != phase]
            for k in moved:
                c = self.counts.pop(k)
                to = LinkKey(k.src, k.dst, k.kind, phase, k.round)
                self.counts[to].add(c)
                self._dirty.update((k, to))
        return len(moved)

    def rows(self) -> list[dict]:
        """One dict per (src, dst, kind, phase, round), sorted; wire rows (:data:`WIRE_KIND`) also carry
        ``wire_bytes``, ``wire_segments`` and ``wire_retrans``.

        The list is new; its dicts are shared with the meter's cache and with earlier calls' lists (a row not
        changed since is the same dict): callers read them and never change them (copy one to change it)."""
        with self._lock:
            self._refresh()
            return self._cache.rows()

    def rows_of_round(self, round: int) -> list[dict]:
        """Round ``round``'s rows, in :meth:`rows`' order (the same shared dicts)."""
        with self._lock:
            self._refresh()
            return self._cache.rows_of_round(round)

    def view(self, known: Mapping[int, int]) -> MeterView:
        """:meth:`rows`, :meth:`changed_rounds` (``known``) and :meth:`totals` in one consistent view: what the
        ``links`` event carries (common/engine/run.py)."""
        with self._lock:
            self._refresh()
            total = LinkCount()
            total.add(self._total)
            return MeterView(self._cache.rows(), self._cache.changed_rounds(known), total)

    def changed_rounds(self, known: Mapping[int, int]) -> dict[int, tuple[int, list[dict]]]:
        """The rounds whose rows changed since the caller saw them: ``known`` maps a round to the version it has
        (from an earlier call); returned per round not at that version (new rounds included): its version now
        and its rows (empty: the round has none left). One consistent view, taken under the meter's lock."""
        with self._lock:
            self._refresh()
            return self._cache.changed_rounds(known)

    def _refresh(self) -> None:
        """Bring the row cache up to date with the keys changed since (the lock is held)."""
        if self._dirty:
            dirty, self._dirty = self._dirty, set()
            self._cache.update(self.counts, dirty, WIRE_KIND)

    def totals(self) -> LinkCount:
        """Every row's counts summed (a copy)."""
        with self._lock:
            out = LinkCount()
            out.add(self._total)
        return out

    def per_link(self, level: str = "payload_bytes") -> dict[tuple[str, str], int]:
        """Bytes per directed link (src, dst), summed over kinds and phases."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for r in self.rows():
            out[(r["src"], r["dst"])] += r.get(level, 0)
        return dict(out)


class RoundRows:
    """A copy of another process's meter rows, kept from the rounds each ``links`` event says changed (its
    ``rounds``: {round: every row of it}): :meth:`apply` gives every row in the meter's order, the rows as they
    came, at the cost of the changed rounds (the live page's process, server/web/proc.py: a long run's event no
    longer carries every row so far)."""

    def __init__(self) -> None:
        self._cache = RowCache()

    def apply(self, rounds: Mapping[int, list[dict]]) -> list[dict]:
        for r, rows in rounds.items():
            self._cache.replace_round(int(r), rows)
        return self._cache.rows()
