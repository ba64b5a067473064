"""Always-on light timing: where each round's time went, per node and link (issue 17, section 3).

Each node measures its own phases with ``time.perf_counter()`` deltas (never wall-clock stamps, never in the
math) into its :class:`Timeline` and sends the rows it has not sent yet to its parent with each Report (and its
Bye); a parent merges them into its own, so the PS holds every node's. The in-process engine measures the same
points for its nodes. What is recorded (raw phases, seconds summed per round, node and peer):

    busy     node      its task handlers ran (the PS: its round step; hand-offs and waits inside)
    wait     node      it waited in scatters for its children's replies (inside ``busy``)
    encode   node      it encoded bundles (a parent's requests, inside ``wait``; a child's result, after ``busy``)
    served   node      from a task's arrival to its result, encoded, ready to send (a child has one parent)
    rtt      parent    from a request sent to child ``peer``'s whole reply held
    transfer src       a hand-off to edge ``peer`` (sent until acknowledged)
    round    PS        the round's duration (the driver's)
    p_round, p_compute, p_transfer    the same, predicted from the ``[network]`` profile (common/virtual_clock.py)

:func:`derive` turns them into the four phases of ``timeline.csv``: ``compute`` (busy - wait - hand-offs), ``wait``
(wait - the requests' encode), ``encode``, ``transfer`` (per link: rtt - the child's served time, i.e. the
messages' time on the wire and in queues, both directions), plus the ``round`` reference row. A run with a
``[network]`` table also has a ``predicted_s`` column: what the profile predicts for that row (the ``p_*`` rows).
"""

from __future__ import annotations

import csv
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PHASES = ("compute", "encode", "transfer", "wait")
RAW_PHASES = ("busy", "wait", "encode", "encode_req", "served", "rtt", "transfer", "round",
              "p_round", "p_compute", "p_transfer")
PREDICTED = {"p_round": "round", "p_compute": "compute", "p_transfer": "transfer"}  # raw -> the row it predicts
COLUMNS = ["round", "node", "peer", "phase", "seconds", "predicted_s"]

Key = tuple[int, str, str, str]  # (round, node, peer, phase)


class Timeline:
    """One node's timing rows (its own, and those its children reported), summed per (round, node, peer,
    phase); thread-safe. :meth:`unreported` gives what was added since its last call (a Report's share).

    ``keep``: keep every round's sums for :meth:`rows` (the PS, the in-process engine: they report to no
    one); a child's timeline (``keep=False``) holds only what it has not reported yet (:meth:`unreported`), so
    a long run grows neither."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._rounds: dict[int, defaultdict[tuple[str, str, str], float]] = {}
        self._pending: defaultdict[Key, float] = defaultdict(float)

    def add(self, round_idx: int, node: str, phase: str, seconds: float, peer: str = "") -> None:
        seconds = max(0.0, seconds)
        with self._lock:
            self._add(int(round_idx), node, peer, phase, seconds)

    def _add(self, rnd: int, node: str, peer: str, phase: str, seconds: float) -> None:
        if self.keep:
            self._rounds.setdefault(rnd, defaultdict(float))[(node, peer, phase)] += seconds
        else:
            self._pending[(rnd, node, peer, phase)] += seconds

    def merge(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Add rows (e.g. a child's Report) to this timeline."""
        with self._lock:
            for r in rows:
                self._add(int(r["round"]), str(r["node"]), str(r.get("peer", "")), str(r["phase"]),
                          float(r["seconds"]))

    def rows(self, round_idx: int | None = None) -> list[dict[str, Any]]:
        """Every row kept (``keep``), or those of round ``round_idx``."""
        with self._lock:
            rounds = sorted(self._rounds) if round_idx is None else [round_idx]
            items = [((rnd, *k), v) for rnd in rounds for k, v in self._rounds.get(rnd, {}).items()]
        return [_row(k, v) for k, v in sorted(items)]  # type: ignore[arg-type]

    def unreported(self) -> list[dict[str, Any]]:
        """The rows (as increments) added since the last call (a child's timeline, ``keep=False``)."""
        if self.keep:
            raise ValueError("a timeline that keeps its rows reports to no one: use rows()")
        with self._lock:
            pending, self._pending = self._pending, defaultdict(float)
        return [_row(k, v) for k, v in sorted(pending.items())]


def _row(k: Key, seconds: float, predicted: float | None = None) -> dict[str, Any]:
    row = {"round": k[0], "node": k[1], "peer": k[2], "phase": k[3], "seconds": seconds}
    if predicted is not None:
        row["predicted_s"] = predicted
    return row


# -- one timeline per node of this process ---------------------------------------------------------------
_registry: dict[str, Timeline] = {}
_registry_lock = threading.Lock()


def recorder(node: str) -> Timeline:
    """Node ``node``'s timeline in this process (made on first use: a child's, keeping only what it has not
    reported; the PS's Run makes its own with :func:`reset`)."""
    with _registry_lock:
        t = _registry.get(node)
        if t is None:
            t = _registry[node] = Timeline(keep=False)
        return t


def reset(node: str, keep: bool = True) -> Timeline:
    """A fresh timeline for ``node`` (the PS's, for a new run: it keeps every row)."""
    with _registry_lock:
        t = _registry[node] = Timeline(keep)
        return t


# -- what timeline.csv holds -------------------------------------------------------------------------------
def derive(raw: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``timeline.csv`` from raw rows: per round, ``compute`` / ``encode`` / ``wait`` per node,
    ``transfer`` per link (``node`` the sender of the request or hand-off, ``peer`` the other end) and the
    PS's ``round`` duration. Every value is >= 0 (a difference of two clocks is clipped at 0). A row that has a
    prediction (``p_*`` raw rows) carries it as ``predicted_s``."""
    s: defaultdict[Key, float] = defaultdict(float)
    for r in raw:
        s[(int(r["round"]), str(r["node"]), str(r.get("peer", "")), str(r["phase"]))] += float(r["seconds"])
    out: dict[Key, float] = {}
    served: defaultdict[tuple[int, str], float] = defaultdict(float)  # (round, child)
    handoffs: defaultdict[tuple[int, str], float] = defaultdict(float)  # (round, sender): inside its busy time
    for (rnd, node, _peer, phase), v in s.items():
        if phase == "served":
            served[(rnd, node)] += v
        elif phase == "transfer":
            handoffs[(rnd, node)] += v
    for (rnd, node, peer, phase), v in s.items():
        if phase == "busy":
            out[(rnd, node, "", "compute")] = max(0.0, v - s.get((rnd, node, "", "wait"), 0.0) - handoffs[(rnd, node)])
        elif phase == "wait":
            out[(rnd, node, "", "wait")] = max(0.0, v - s.get((rnd, node, "", "encode_req"), 0.0))
            out.setdefault((rnd, node, "", "compute"), 0.0)
        elif phase in ("encode", "encode_req"):
            out[(rnd, node, "", "encode")] = out.get((rnd, node, "", "encode"), 0.0) + v
        elif phase == "rtt":
            out[(rnd, node, peer, "transfer")] = out.get((rnd, node, peer, "transfer"), 0.0) + \
                max(0.0, v - served.get((rnd, peer), 0.0))
        elif phase in ("transfer", "round"):
            out[(rnd, node, peer, phase)] = out.get((rnd, node, peer, phase), 0.0) + v
    pred: dict[Key, float] = {}
    for (rnd, node, peer, phase), v in s.items():
        if phase in PREDICTED:
            k = (rnd, node, peer, PREDICTED[phase])
            pred[k] = pred.get(k, 0.0) + v
            out.setdefault(k, 0.0)
    return [_row(k, v, pred.get(k)) for k, v in sorted(out.items())]


@dataclass(frozen=True)
class Slowest:
    """The run's slowest link (most transfer time) and slowest node (most compute time), with their totals."""

    link: tuple[str, str] | None
    link_s: float
    node: str | None
    node_s: float


def slowest(rows: Iterable[Mapping[str, Any]]) -> Slowest:
    """Over derived rows (:func:`derive`): the link with the most ``transfer`` seconds and the node with the
    most ``compute`` seconds, summed over the run's rounds."""
    links: defaultdict[tuple[str, str], float] = defaultdict(float)
    nodes: defaultdict[str, float] = defaultdict(float)
    for r in rows:
        if r["phase"] == "transfer":
            links[(str(r["node"]), str(r["peer"]))] += float(r["seconds"])
        elif r["phase"] == "compute":
            nodes[str(r["node"])] += float(r["seconds"])
    link = max(sorted(links), key=lambda k: links[k]) if links else None
    node = max(sorted(nodes), key=lambda k: nodes[k]) if nodes else None
    return Slowest(link, links[link] if link else 0.0, node, nodes[node] if node else 0.0)


def per_round(rows: Iterable[Mapping[str, Any]], first: int = 0) -> dict[int, dict[str, float]]:
    """Seconds per round and phase, summed over nodes and links, for the rounds >= ``first`` (derived rows:
    0 skips the set-up step; rows read from ``timeline.csv`` are 1-based: pass 1)."""
    out: dict[int, dict[str, float]] = {}
    for r in rows:
        rnd = int(r["round"])
        if rnd >= first and r["phase"] in PHASES:
            d = out.setdefault(rnd, dict.fromkeys(PHASES, 0.0))
            d[r["phase"]] += float(r["seconds"])
    return dict(sorted(out.items()))


def write_csv(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """``timeline.csv`` from derived rows: round (as in every file of the run folder, 1-based; 0 = set-up and
    tear-down), node, peer, phase, seconds; and ``predicted_s`` (empty where a row has none) when any row has a
    prediction (a run with a ``[network]`` table)."""
    rows = list(rows)
    predicted = any(r.get("predicted_s") is not None for r in rows)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS if predicted else COLUMNS[:-1])
        w.writeheader()
        for r in rows:
            out = {"round": int(r["round"]) + 1, "node": r["node"], "peer": r.get("peer", ""), "phase": r["phase"],
                   "seconds": f"{float(r['seconds']):.6f}"}
            if predicted:
                out["predicted_s"] = "" if r.get("predicted_s") is None else f"{float(r['predicted_s']):.6f}"
            w.writerow(out)


def read_csv(path: Path) -> list[dict[str, Any]]:
    """``timeline.csv``'s rows (the file's 1-based rounds); ``predicted_s`` where the file has one."""
    with path.open(newline="") as f:
        return [{"round": int(r["round"]), "node": r["node"], "peer": r["peer"], "phase": r["phase"],
                 "seconds": float(r["seconds"]),
                 **({"predicted_s": float(r["predicted_s"])} if r.get("predicted_s") else {})}
                for r in csv.DictReader(f)]
