"""RunStatus: what the live page, the JSON API and /metrics show, kept up to date from a run's events.

Subscribe it to a :class:`~fedhop.common.engine.events.RunEvents` (``events.subscribe(status)``); it is called
in the emitting thread, holds its lock only to update plain Python data, and reads are snapshots taken
under the same lock, so the HTTP server's thread never sees a half-applied event.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fedhop.common.spec import RunSpec
from fedhop.common.topology import SERVER, Topology, build_topology

PHASES = ("waiting", "joining", "running", "finished", "failed")
LINK_KEY = ("src", "dst", "kind", "phase")
COUNTS = ("messages", "payload_bytes", "message_bytes")


@dataclass(frozen=True)
class RoundInfo:
    """One ended round: its 0-based index (-1 = the set-up step), what it reported, how long it took."""

    index: int
    record: dict[str, Any]
    duration_s: float
    elapsed_s: float  # since run_started, when the round ended


@dataclass(frozen=True)
class RouteStep:
    """Where the model went in one round: Fed-CHS's active edge, FedCluster's visiting order."""

    round: int  # 1-based, as in the round records
    edges: tuple[str, ...]
    redo: str | None = None  # Fed-CHS: "edge-2 failed" when the round was redone elsewhere


@dataclass
class _State:
    run_id: str | None = None
    spec: dict[str, Any] | None = None
    rounds_total: int = 0
    topology: Topology | None = None
    expected: list[str] = field(default_factory=list)
    roles: dict[str, str] = field(default_factory=dict)
    joined: set[str] = field(default_factory=set)
    lost: dict[str, str] = field(default_factory=dict)
    resumed_at: int = 0
    phase: str = "waiting"
    current: int | None = None  # 0-based index of the round being trained
    started: float | None = None
    finished: float | None = None
    wall_s: float | None = None
    error: str | None = None
    setup: RoundInfo | None = None
    rounds: list[RoundInfo] = field(default_factory=list)
    route: list[RouteStep] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    missing: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # timeline.csv's rows so far (round_timeline)
    links_version: int = 0  # bumped by every links event
    links_changed: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # rounds replaced since the
    # link tables were last brought up to date (each links event's ``rounds``), every row of each
    links_whole: bool = True  # the tables must be rebuilt from every row (the first event, one without rounds)
    nodes_version: int = 0  # bumped when the topology or a node's state changes


class RunStatus:
    """The state of one run as seen through its events. Call it as a listener: ``status(kind, data)``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._s = _State()
        self._version = 0
        self._watchers: list[Callable[[int], None]] = []
        self._tables: _LinkTables | None = None  # derived from the link rows, rebuilt after a links event
        self._sums = _LinkSums()  # what the tables are built from, brought up to date by the rounds that changed
        self._build = threading.Lock()  # one reader brings the sums up to date at a time

    # -- the listener -----------------------------------------------------------------------------------------
    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        handler = getattr(self, f"_on_{kind}", None)
        if handler is None:
            raise ValueError(f"RunStatus got an unknown event kind {kind!r}")
        with self._lock:
            handler(self._s, data)
            self._version += 1
            version, watchers = self._version, list(self._watchers)
        for w in watchers:
            w(version)

    def watch(self, fn: Callable[[int], None]) -> Callable[[], None]:
        """Call ``fn(version)`` after every event (in the emitting thread; keep it quick). Returns an
        unsubscribe function."""
        with self._lock:
            self._watchers.append(fn)

        def remove() -> None:
            with self._lock:
                if fn in self._watchers:
                    self._watchers.remove(fn)
        return remove

    @property
    def version(self) -> int:
        """Bumped by every event: a reader that saw version v has seen everything up to event v."""
        with self._lock:
            return self._version

    def _on_run_started(self, s: _State, d: dict[str, Any]) -> None:
        spec = d["spec"] if isinstance(d["spec"], RunSpec) else RunSpec.model_validate(d["spec"])
        topo = build_topology(spec.topology, spec.seed)
        nodes = list(d.get("nodes") or topo.all_nodes())
        s.run_id = str(d["run_id"])
        s.spec = spec.model_dump(mode="json")
        s.rounds_total = spec.rounds
        s.topology = topo
        s.expected = [n for n in nodes if n != SERVER]
        s.roles = {n: topo.role(n) for n in topo.all_nodes()}
        s.resumed_at = int(d.get("resumed_at") or 0)
        s.phase = "joining"
        s.started = self._clock()
        s.nodes_version += 1

    def _on_node_joined(self, s: _State, d: dict[str, Any]) -> None:
        node = str(d["node"])
        s.joined.add(node)
        s.lost.pop(node, None)
        if d.get("role"):
            s.roles[node] = str(d["role"])
        s.nodes_version += 1

    def _on_node_ready(self, s: _State, d: dict[str, Any]) -> None:
        node = str(d["node"])  # ready implies joined (its node_joined came first; this one changes nothing else)
        if node not in s.joined:
            s.joined.add(node)
            s.lost.pop(node, None)
            s.nodes_version += 1

    def _on_node_lost(self, s: _State, d: dict[str, Any]) -> None:
        node = str(d["node"])
        s.joined.discard(node)
        s.lost[node] = str(d.get("reason") or "lost")
        s.nodes_version += 1

    def _on_round_started(self, s: _State, d: dict[str, Any]) -> None:
        s.current = int(d["round"])
        if s.phase in ("waiting", "joining"):
            s.phase = "running"

    def _on_round_ended(self, s: _State, d: dict[str, Any]) -> None:
        t = int(d["round"])
        record = dict(d.get("record") or {})
        info = RoundInfo(t, record, float(d["duration_s"]), self._elapsed(s))
        if t < 0:
            s.setup = info
            return
        s.rounds.append(info)
        step = _route_step(t, record)
        if step is not None:
            s.route.append(step)

    def _on_links(self, s: _State, d: dict[str, Any]) -> None:
        s.links = list(d["rows"])  # a fresh list of rows no one changes (ByteMeter.rows()): not copied row by row
        s.links_version += 1
        rounds = d.get("rounds")  # the rounds changed since the last links event (common/engine/run.py)
        if rounds is None:  # rows alone (a finished run's folder): the tables are built from every row
            s.links_whole, s.links_changed = True, {}
        elif not s.links_whole:
            s.links_changed.update((int(r), list(rows)) for r, rows in rounds.items())

    def _on_missing(self, s: _State, d: dict[str, Any]) -> None:
        s.missing.append(dict(d["entry"]))

    def _on_round_timeline(self, s: _State, d: dict[str, Any]) -> None:
        t = int(d["round"])  # a redone or resumed round replaces what an earlier try said of it
        s.timeline = [r for r in s.timeline if int(r["round"]) != t] + [dict(r) for r in d["rows"]]

    def _on_run_finished(self, s: _State, d: dict[str, Any]) -> None:
        s.phase = "finished" if d.get("ok", True) else "failed"
        s.error = d.get("error") or None
        s.wall_s = float(d["wall_s"]) if d.get("wall_s") is not None else None
        s.finished = self._clock()
        s.current = None

    def _elapsed(self, s: _State) -> float:
        if s.started is None:
            return 0.0
        return (s.finished if s.finished is not None else self._clock()) - s.started

    # -- reads (each a consistent snapshot) ---------------------------------------------------------------------
    def timeline(self, since: int = -1) -> dict[str, Any]:
        """Where each round's time went (``timeline.csv``'s rows: round, node, peer, phase, seconds, and
        ``predicted_s`` with a ``[network]`` table) for the rounds >= ``since`` (-1: the set-up step too), the
        slowest link and node so far, and ``chart``: the last round's Gantt rows and per-link achieved vs
        configured rate (server/web/gantt.py)."""
        from fedhop.common.timeline import slowest
        from fedhop.server.web.gantt import round_chart

        with self._lock:
            rows = [dict(r) for r in self._s.timeline if int(r["round"]) >= since]
            everything = list(self._s.timeline)
            links = list(self._s.links)
            network = (self._s.spec or {}).get("network")
        slow = slowest(rows)
        return {"rows": rows, "chart": round_chart(everything, links, network),
                "slowest_link": {"src": slow.link[0], "dst": slow.link[1], "transfer_s": slow.link_s}
                if slow.link else None,
                "slowest_node": {"node": slow.node, "compute_s": slow.node_s} if slow.node else None}

    def status(self) -> dict[str, Any]:
        """Run id, spec, phase, round, elapsed, ETA, nodes, the last reported metrics."""
        with self._lock:
            s = self._s
            done = s.resumed_at + len(s.rounds)
            durations = [r.duration_s for r in s.rounds]
            mean = sum(durations) / len(durations) if durations else None
            eta = None
            if s.phase == "running" and mean is not None:
                eta = mean * max(0, s.rounds_total - done)
            elif s.phase in ("finished", "failed"):
                eta = 0.0
            last: dict[str, Any] = {}
            for r in s.rounds:
                last.update({k: v for k, v in r.record.items() if k in ("accuracy", "loss")})
            waiting = [n for n in s.expected if n not in s.joined and n not in s.lost]
            return {
                "run_id": s.run_id,
                "name": s.spec["name"] if s.spec else None,
                "algorithm": s.spec["algorithm"]["name"] if s.spec else None,
                "phase": s.phase,
                "round": s.current + 1 if s.current is not None else None,
                "rounds_completed": done,
                "rounds_total": s.rounds_total,
                "resumed_at": s.resumed_at,
                "elapsed_s": self._elapsed(s),
                "mean_round_s": mean,
                "eta_s": eta,
                "wall_s": s.wall_s,
                "error": s.error,
                "last": last,
                "nodes": {
                    "expected": len(s.expected),
                    "joined": len([n for n in s.expected if n in s.joined]),
                    "lost": dict(sorted(s.lost.items())),
                    "waiting": waiting,
                },
                "spec": s.spec,
                "version": self._version,
            }

    def rounds(self, since: int = 0) -> list[dict[str, Any]]:
        """Round records from the ``since``-th on: metrics, duration, elapsed, cumulative bytes so far."""
        with self._lock:
            infos = self._s.rounds[since:]
        tables = self._tables_now()  # read after the rounds: never older than the rounds it is applied to
        out = []
        for i in infos:
            rec = {**i.record, "round": i.record.get("round", i.index + 1)}
            out.append({**rec, **tables.cumulative(rec["round"] - 1), "duration_s": i.duration_s,
                        "elapsed_s": i.elapsed_s})
        return out

    def cumulative_bytes(self) -> list[tuple[int, int]]:
        """(payload, message) bytes sent up to and including each ended round, in round order."""
        with self._lock:
            idx = [i.record.get("round", i.index + 1) - 1 for i in self._s.rounds]
        tables = self._tables_now()
        return [(c["payload_bytes"], c["message_bytes"]) for c in map(tables.cumulative, idx)]

    def _tables_now(self) -> _LinkTables:
        """The tables of the current link rows, built outside the run's lock (a long run's rows take a while) so
        the run's thread never waits for a reader: from the rounds changed since the last build
        (:class:`_LinkSums`), or from every row after the first event, one without ``rounds`` or a rollback."""
        with self._lock:
            if self._tables is not None and self._tables.version == self._s.links_version:
                return self._tables
        with self._build:
            with self._lock:
                s = self._s
                if self._tables is not None and self._tables.version == s.links_version:
                    return self._tables
                rows, version, whole, changed = s.links, s.links_version, s.links_whole, s.links_changed
                s.links_whole, s.links_changed = False, {}
            try:
                if whole or not self._sums.replace(changed):
                    self._sums = _LinkSums.of(rows)
                built = self._sums.tables(version)
            except Exception:  # half-applied sums (a malformed row): the next read builds from every row again
                self._sums = _LinkSums()
                with self._lock:
                    self._s.links_whole, self._s.links_changed = True, {}
                raise
            with self._lock:
                if self._s.links_version == version:
                    self._tables = built
            return built

    def setup_round(self) -> dict[str, Any] | None:
        with self._lock:
            s = self._s.setup
        return None if s is None else {"duration_s": s.duration_s, "elapsed_s": s.elapsed_s, **s.record}

    def link_rows(self) -> list[dict[str, Any]]:
        """The live meter rows as the engine sent them (per link, kind, phase and round)."""
        with self._lock:
            return [dict(r) for r in self._s.links]

    def links(self) -> dict[str, Any]:
        """Bytes per (src, dst, kind, phase) and per directed link (src, dst), largest links first."""
        return self._tables_now().summary

    def topology(self) -> dict[str, Any]:
        """PS, edges, clients, parents, the edge graph, every node's state, and the model's route so far."""
        with self._lock:
            s = self._s
            topo = s.topology
            missing_nodes = sorted({str(e["node"]) for e in s.missing if e.get("node")})
            route = [_route_json(r) for r in s.route]
            if topo is None:
                return {"server": SERVER, "edges": [], "clients": [], "parent": {}, "edge_graph": [],
                        "nodes": {}, "route": route, "missing_nodes": missing_nodes}
            nodes = {}
            for n in topo.all_nodes():
                state = "joined" if n in s.joined or n == SERVER else "lost" if n in s.lost else "waiting"
                nodes[n] = {"role": s.roles.get(n, topo.role(n)), "state": state,
                            **({"reason": s.lost[n]} if n in s.lost else {})}
            graph = sorted({tuple(sorted((a, b), key=topo.ordinal)) for a, nb in topo.neighbours.items()
                            for b in nb}, key=lambda p: (topo.ordinal(p[0]), topo.ordinal(p[1])))
            return {"server": SERVER, "edges": list(topo.edges), "clients": list(topo.clients),
                    "parent": dict(topo.parent), "edge_graph": [list(p) for p in graph], "nodes": nodes,
                    "route": route, "missing_nodes": missing_nodes}

    def missing(self, since: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._s.missing[since:]]

    def counts(self) -> dict[str, int]:
        """How many rounds and missing entries there are (for incremental readers)."""
        with self._lock:
            return {"rounds": len(self._s.rounds), "missing": len(self._s.missing)}

    def versions(self) -> dict[str, int]:
        """Change counters: any event, link rows, topology/node states; and the rounds and missing entries."""
        with self._lock:
            s = self._s
            return {"all": self._version, "links": s.links_version, "nodes": s.nodes_version,
                    "rounds": len(s.rounds), "missing": len(s.missing), "route": len(s.route)}

    def route(self, since: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            return [_route_json(r) for r in self._s.route[since:]]

    def round_durations(self) -> list[float]:
        with self._lock:
            return [r.duration_s for r in self._s.rounds]


def _route_step(t: int, record: dict[str, Any]) -> RouteStep | None:
    redo = str(record["redo"]) if record.get("redo") else None
    if record.get("edge"):
        return RouteStep(t + 1, (str(record["edge"]),), redo)
    if "order" in record:
        return RouteStep(t + 1, tuple(e for e in str(record["order"]).split(",") if e), redo)
    return None


def _route_json(r: RouteStep) -> dict[str, Any]:
    return {"round": r.round, "edges": list(r.edges), **({"redo": r.redo} if r.redo else {})}


@dataclass(frozen=True)
class _LinkTables:
    """What the link rows say, computed once per links event (:meth:`_LinkSums.tables`): the per-link summary and
    bytes by round."""

    summary: dict[str, Any]
    version: int  # links_version of the rows it was built from
    rounds: tuple[int, ...]  # sorted driver rounds that have rows
    prefix: tuple[tuple[int, int], ...]  # (payload, message) of every row with round <= rounds[i]

    def cumulative(self, upto: int) -> dict[str, int]:
        """Bytes of every message of a driver round <= ``upto`` (set-up messages, round -1, included)."""
        i = bisect.bisect_right(self.rounds, upto)
        p, m = self.prefix[i - 1] if i else (0, 0)
        return {"payload_bytes": p, "message_bytes": m}


class _LinkSums:
    """Running sums of the link rows per (src, dst, kind, phase) and per round, from which :class:`_LinkTables`
    is built: :meth:`replace` takes the rounds a links event changed (their every row) and subtracts each round's
    old rows before adding its new ones, so a page request after a round costs that round's rows and the
    summary's keys, not every row of a long run (issue 19: 0.7 s at 500,000 rows in the live page's process).
    Counts are integers: subtracting gives exactly what summing afresh gives (tests/unit/test_web_tables.py)."""

    def __init__(self) -> None:
        self.by_round: dict[int, list[dict[str, Any]]] = {}  # every row, per round (the rows are shared)
        self.acc: dict[tuple[str, str, str, str], list[int]] = {}  # messages, payload, message, wire, last round,
        # rows summed
        self.per_round: dict[int, list[int]] = {}  # payload, message bytes of each round
        self.wire_rows = 0  # rows with wire_bytes (the summary shows wire bytes while there is one)

    @classmethod
    def of(cls, rows: list[dict[str, Any]]) -> _LinkSums:
        sums = cls()
        by_round: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            by_round.setdefault(r["round"], []).append(r)
        sums.replace(by_round)
        return sums

    def replace(self, rounds: dict[int, list[dict[str, Any]]]) -> bool:
        """Put each round's rows in place of what it had. False (the sums are then unusable: build them afresh
        with :meth:`of`) when a key that is left in other rounds lost its last round (a rollback's relabelling):
        its last round is not known without looking at every round."""
        acc = self.acc
        for t, rows in rounds.items():
            old = self.by_round.pop(t, [])
            gone = set()
            for r in old:
                k = (r["src"], r["dst"], r["kind"], r["phase"])
                a = acc[k]
                a[0] -= r["messages"]
                a[1] -= r["payload_bytes"]
                a[2] -= r["message_bytes"]
                if "wire_bytes" in r:
                    self.wire_rows -= 1
                    a[3] -= r["wire_bytes"] or 0
                a[5] -= 1
                gone.add(k)
            self.per_round.pop(t, None)
            for r in rows:
                k = (r["src"], r["dst"], r["kind"], r["phase"])
                a = acc.get(k)
                if a is None:
                    a = acc[k] = [0, 0, 0, 0, t, 0]
                pay, msg = r["payload_bytes"], r["message_bytes"]
                a[0] += r["messages"]
                a[1] += pay
                a[2] += msg
                if "wire_bytes" in r:
                    self.wire_rows += 1
                    a[3] += r["wire_bytes"] or 0
                if t > a[4]:
                    a[4] = t
                a[5] += 1
                gone.discard(k)
                pr = self.per_round.get(t)
                if pr is None:
                    self.per_round[t] = [pay, msg]
                else:
                    pr[0] += pay
                    pr[1] += msg
            if rows:
                self.by_round[t] = list(rows)
            for k in gone:  # in the round before, not now
                if acc[k][5] == 0:
                    del acc[k]
                elif acc[k][4] == t:
                    return False
        return True

    def tables(self, version: int) -> _LinkTables:
        has_wire = self.wire_rows > 0
        by_kind, by_link = [], {}
        for k in sorted(self.acc):
            a = self.acc[k]
            row = {"src": k[0], "dst": k[1], "kind": k[2], "phase": k[3], "messages": a[0], "payload_bytes": a[1],
                   "message_bytes": a[2], "last_round": a[4], **({"wire_bytes": a[3]} if has_wire else {})}
            by_kind.append(row)
            b = by_link.get(k[:2])
            if b is None:
                b = by_link[k[:2]] = {"src": k[0], "dst": k[1], **dict.fromkeys(COUNTS, 0), "kinds": [],
                                      **({"wire_bytes": 0} if has_wire else {})}
            for c in (*COUNTS, *(("wire_bytes",) if has_wire else ())):
                b[c] += row[c]
            if k[2] not in b["kinds"]:
                b["kinds"].append(k[2])
        per_link = sorted(by_link.values(), key=lambda x: (-x["payload_bytes"], -x["message_bytes"], x["src"],
                                                           x["dst"]))
        totals = {c: sum(x[c] for x in per_link) for c in COUNTS}
        if has_wire:
            totals["wire_bytes"] = sum(x["wire_bytes"] for x in per_link)
        summary = {"links": per_link, "by_kind": by_kind, "totals": totals}
        rounds = tuple(sorted(self.per_round))
        prefix, p, m = [], 0, 0
        for t in rounds:
            p += self.per_round[t][0]
            m += self.per_round[t][1]
            prefix.append((p, m))
        return _LinkTables(summary, version, rounds, tuple(prefix))
