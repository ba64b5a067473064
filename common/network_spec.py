"""The ``[network]`` table of a RunSpec: one link profile (rate, delay, jitter, loss) and per-node compute speed.

Every link between two processes belongs to one class, named by its two ends' roles (``client_edge``,
``edge_edge``, ``edge_ps``, ``client_ps``). A class, and a node, take the same four link fields::

    [network.client_edge]       # every client <-> edge link, both directions
    mbit = 100                  # rate in Mbit/s; absent: unlimited
    delay_ms = 20               # one-way delay added in each direction
    jitter_ms = 5               # each chunk delayed by delay_ms +- a seeded random jitter (order kept)
    loss = 0.01                 # fraction of packets dropped (0 .. 1)

    [network.client_edge.up]    # one direction only: up = towards the PS (client -> edge, edge -> PS,
    mbit = 10                   # client -> PS; on edge_edge: from the lower-numbered edge to the higher)
    [network.client_edge.down]
    mbit = 50

    [network.nodes.client-3]    # every link touching one node
    mbit = 5
    compute = 0.25              # a quarter of the speed: every task handler takes 4x its own compute time
    [network.nodes.client-3.send]     # what the node sends   (its outgoing direction)
    loss = 0.02
    [network.nodes.client-3.receive]  # what the node receives

    [network.edge_ps]
    trace = "traces/uplink.csv" # time_s -> mbit / delay_ms / jitter_ms / loss (and compute on a node), replayed

A trace is a CSV file with a ``time_s`` column and any of ``mbit``, ``delay_ms``, ``jitter_ms``, ``loss`` (and
``compute`` on a node's own table): from each row's time on (seconds since the testbed started shaping), its
non-empty cells replace the table's own values; before the first row the table's own values hold. A relative path
is read from the spec's folder. :func:`load_traces` reads and checks every trace of a profile (errors name the
file, row and column); the testbeds replay them (deploy/profile.py).

Resolution of a directed link a -> b: the class value for that direction (its ``up`` / ``down`` table, else the
class's own fields); a node override (a's ``send`` or own fields, b's ``receive`` or own fields) replaces it;
where both ends override, the smaller value wins. Only the table's shape is checked here; node ids are checked
against the run's topology by whoever applies it (``NetworkSpec.check_nodes``).

The old ``[testbed.mbit]`` / ``[testbed.delay_ms]`` / ``[testbed.nodes]`` keys are still read
(:func:`from_testbed`), with one deprecation line in the log saying what to write instead.
"""

from __future__ import annotations

import csv
import io
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fedhop.common.testbed_spec import LINK_CLASSES, check_node_ids

MAX_DELAY_MS = 60_000.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Direction(_Strict):
    """One direction's shape; an absent field: not set here (the class or node above decides)."""

    mbit: float | None = Field(None, gt=0, description="rate in Mbit/s")
    delay_ms: float | None = Field(None, ge=0, le=MAX_DELAY_MS, description="one-way delay in ms")
    jitter_ms: float | None = Field(None, ge=0, le=MAX_DELAY_MS, description="+- random jitter around the delay")
    loss: float | None = Field(None, ge=0, lt=1, description="fraction of packets dropped, 0 <= loss < 1")
    trace: str | None = Field(None, min_length=1, description="CSV file: time_s -> mbit / delay_ms / jitter_ms / "
                              "loss (and compute on a node), replayed during the run; relative to the spec's folder")

    @model_validator(mode="after")
    def _jitter_within_delay(self) -> Direction:
        if self.jitter_ms and self.delay_ms is not None and self.jitter_ms > self.delay_ms:
            raise ValueError(f"jitter_ms ({self.jitter_ms:g}) must not exceed delay_ms ({self.delay_ms:g}): "
                             "a chunk cannot be delivered before it was sent")
        return self


class LinkProfile(Direction):
    """A link class's shape, both directions, with optional per-direction tables."""

    up: Direction | None = Field(None, description="towards the PS (on edge_edge: lower-numbered edge -> higher)")
    down: Direction | None = Field(None, description="away from the PS")

    def direction(self, up: bool) -> Direction:
        return _merge(self, self.up if up else self.down)


class NodeProfile(Direction):
    """Every link touching one node, and the node's compute speed."""

    compute: float | None = Field(None, gt=0, le=1, description="speed as a fraction of the host's: every task "
                                  "handler takes its own compute time / compute (0.25: 4x as long)")
    send: Direction | None = Field(None, description="what the node sends")
    receive: Direction | None = Field(None, description="what the node receives")


class NetworkSpec(_Strict):
    """The run's network profile; the defaults leave every link unshaped and every node at full speed."""

    client_edge: LinkProfile = Field(default_factory=LinkProfile)
    edge_edge: LinkProfile = Field(default_factory=LinkProfile)
    edge_ps: LinkProfile = Field(default_factory=LinkProfile)
    client_ps: LinkProfile = Field(default_factory=LinkProfile)
    nodes: dict[str, NodeProfile] = Field(default_factory=dict)

    @field_validator("nodes")
    @classmethod
    def _node_ids(cls, v: dict[str, NodeProfile]) -> dict[str, NodeProfile]:
        return check_node_ids(v)

    def check_nodes(self, nodes: list[str]) -> None:
        """Every overridden node must exist in the run (``nodes``); raises ValueError naming the field."""
        unknown = sorted(set(self.nodes) - set(nodes))
        if unknown:
            raise ValueError(f"network.nodes: {unknown} are not nodes of this run (it has ps, "
                             f"{sum(n.startswith('edge-') for n in nodes)} edges and "
                             f"{sum(n.startswith('client-') for n in nodes)} clients)")

    def compute(self, node: str) -> float:
        """``node``'s compute speed (1.0: full speed)."""
        prof = self.nodes.get(node)
        return prof.compute if prof is not None and prof.compute is not None else 1.0


@dataclass(frozen=True)
class Shape:
    """The resolved shape of one direction of one link (None / 0: not shaped)."""

    mbit: float | None = None
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0


_FIELDS = ("mbit", "delay_ms", "jitter_ms", "loss")
TRACE_TIME = "time_s"
TRACE_FIELDS = (*_FIELDS, "compute")
_BOUNDS: dict[str, tuple[float, bool, float, bool]] = {  # (low, low included, high, high included)
    "mbit": (0.0, False, math.inf, False),
    "delay_ms": (0.0, True, MAX_DELAY_MS, True),
    "jitter_ms": (0.0, True, MAX_DELAY_MS, True),
    "loss": (0.0, True, 1.0, False),
    "compute": (0.0, False, 1.0, True),
}


@dataclass(frozen=True)
class TracePoint:
    """From ``time_s`` on, the fields of ``values`` take these values."""

    time_s: float
    values: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Trace:
    """A trace file, read and checked (:func:`parse_trace`): its points in time order."""

    path: str
    points: tuple[TracePoint, ...]

    def at(self, t: float) -> dict[str, float]:
        """The values set at ``t`` seconds: each field's value in the last row at or before ``t`` that sets it."""
        out: dict[str, float] = {}
        for p in self.points:
            if p.time_s > t:
                break
            out.update(p.values)
        return out

    def times(self) -> list[float]:
        return [p.time_s for p in self.points]


Traces = Mapping[str, Trace]  # a table's place in [network] ("client_edge", "client_edge.up", "nodes.ps.send") ->


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the table, the file, the row and the column."""


def _number(text: str, where: str, col: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise TraceError(f"{where}, column {col}: {text!r} is not a number") from None
    if not math.isfinite(v):
        raise TraceError(f"{where}, column {col}: {text!r} is not a finite number")
    return v


def parse_trace(text: str, path: str, *, compute: bool = False) -> Trace:
    """The trace in ``text`` (CSV with a header; ``path`` names it in errors). ``compute``: a node's own table,
    where a ``compute`` column is allowed. Rows: ``time_s`` >= 0, strictly increasing; an empty cell leaves that
    field as it was; every value within the bounds of the spec's own field; jitter_ms <= delay_ms where a row
    sets both."""
    rows = list(csv.reader(io.StringIO(text)))
    rows = [r for r in rows if any(c.strip() for c in r)]
    if not rows:
        raise TraceError(f"trace {path}: empty (expected a header: {TRACE_TIME},{','.join(TRACE_FIELDS)})")
    header = [c.strip() for c in rows[0]]
    allowed = TRACE_FIELDS if compute else _FIELDS
    if TRACE_TIME not in header:
        raise TraceError(f"trace {path}, row 1: no {TRACE_TIME} column (header {header})")
    for col in header:
        if col not in (TRACE_TIME, *allowed):
            extra = " (compute is allowed in a node's own table only)" if col == "compute" else ""
            raise TraceError(f"trace {path}, row 1, column {col!r}: unknown column; known: "
                             f"{', '.join((TRACE_TIME, *allowed))}{extra}")
    if len(set(header)) != len(header):
        raise TraceError(f"trace {path}, row 1: a column is named twice ({header})")
    if len(header) < 2:
        raise TraceError(f"trace {path}, row 1: no value column besides {TRACE_TIME} (any of {', '.join(allowed)})")
    points: list[TracePoint] = []
    for n, row in enumerate(rows[1:], start=2):
        where = f"trace {path}, row {n}"
        if len(row) != len(header):
            raise TraceError(f"{where}: {len(row)} cells, the header has {len(header)}")
        cells = dict(zip(header, (c.strip() for c in row), strict=True))
        t = _number(cells[TRACE_TIME], where, TRACE_TIME)
        if t < 0:
            raise TraceError(f"{where}, column {TRACE_TIME}: {t:g} < 0")
        if points and t <= points[-1].time_s:
            raise TraceError(f"{where}, column {TRACE_TIME}: {t:g} is not after the row before ({points[-1].time_s:g})")
        values: dict[str, float] = {}
        for col in (h for h in header if h != TRACE_TIME):
            if cells[col] == "":
                continue
            v = _number(cells[col], where, col)
            lo, lo_in, hi, hi_in = _BOUNDS[col]
            if v < lo or (v == lo and not lo_in) or v > hi or (v == hi and not hi_in):
                rng = f"{'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"
                raise TraceError(f"{where}, column {col}: {v:g} is outside {rng}")
            values[col] = v
        if values.get("jitter_ms", 0.0) > values.get("delay_ms", math.inf):
            raise TraceError(f"{where}: jitter_ms {values['jitter_ms']:g} > delay_ms {values['delay_ms']:g}")
        points.append(TracePoint(t, tuple(sorted(values.items()))))
    if not points:
        raise TraceError(f"trace {path}: no rows after the header")
    return Trace(path, tuple(points))


def _tables(net: NetworkSpec) -> list[tuple[str, Direction, bool]]:
    """Every table of ``net`` that may carry a trace: (place, table, compute allowed)."""
    out: list[tuple[str, Direction, bool]] = []
    for c in LINK_CLASSES:
        lp: LinkProfile = getattr(net, c)
        out += [(c, lp, False), *((f"{c}.{d}", getattr(lp, d), False) for d in ("up", "down")
                                  if getattr(lp, d) is not None)]
    for n, np_ in net.nodes.items():
        out += [(f"nodes.{n}", np_, True), *((f"nodes.{n}.{d}", getattr(np_, d), False) for d in ("send", "receive")
                                              if getattr(np_, d) is not None)]
    return out


def trace_path(trace: str, spec_dir: Path | None) -> Path:
    """Where ``trace`` is: absolute as it is, relative to the spec's folder (the working folder without one)."""
    p = Path(trace)
    return p if p.is_absolute() or spec_dir is None else spec_dir / p


def load_traces(net: NetworkSpec, spec_dir: Path | None) -> dict[str, Trace]:
    """Every trace of ``net`` read and checked (:func:`parse_trace`), by its table's place; raises TraceError
    naming ``network.<place>.trace``, the file, the row and the column."""
    out: dict[str, Trace] = {}
    for place, table, compute in _tables(net):
        if table.trace is None:
            continue
        path = trace_path(table.trace, spec_dir)
        try:
            text = path.read_text()
        except OSError as e:
            raise TraceError(f"network.{place}.trace: cannot read {path} ({e.strerror or e})") from None
        try:
            out[place] = parse_trace(text, str(table.trace), compute=compute)
        except TraceError as e:
            raise TraceError(f"network.{place}.trace: {e}") from None
    return out


def trace_files(net: NetworkSpec) -> list[str]:
    """The trace paths ``net`` names, as written, each once."""
    return sorted({t.trace for _, t, _ in _tables(net) if t.trace is not None})


def change_times(traces: Traces) -> list[float]:
    """Every time (seconds) at which some trace sets a value, in order."""
    return sorted({t for tr in traces.values() for t in tr.times()})


def _level(d: Direction | None, place: str, traces: Traces | None, t: float) -> dict[str, float | None]:
    """A table's own values at time ``t``: its fields, replaced by its trace's values at ``t``."""
    if d is None:
        return dict.fromkeys(_FIELDS)
    out: dict[str, float | None] = {f: getattr(d, f) for f in _FIELDS}
    tr = traces.get(place) if traces is not None else None
    if tr is not None:
        out.update({k: v for k, v in tr.at(t).items() if k in _FIELDS})
    return out


def _over(base: dict[str, float | None], over: dict[str, float | None]) -> dict[str, float | None]:
    return {f: over[f] if over[f] is not None else base[f] for f in _FIELDS}


def _merge(base: Direction, over: Direction | None) -> Direction:
    if over is None:
        return Direction(**{f: getattr(base, f) for f in _FIELDS})
    return Direction(**{f: getattr(over, f) if getattr(over, f) is not None else getattr(base, f) for f in _FIELDS})


def _rank(node: str) -> tuple[int, int]:
    role, _, k = node.partition("-")
    return {"client": 0, "edge": 1, "ps": 2}[role], int(k or 0)


def directed_shape(net: NetworkSpec, cls: str, src: str, dst: str, traces: Traces | None = None,
                   t: float = 0.0) -> Shape:
    """The shape of the direction ``src`` -> ``dst`` of a link of class ``cls`` (node ids ps / edge-N /
    client-N), at ``t`` seconds into the run where ``traces`` (:func:`load_traces`) are given."""
    if cls not in LINK_CLASSES:
        raise ValueError(f"unknown link class {cls!r} (known: {', '.join(LINK_CLASSES)})")
    lp: LinkProfile = getattr(net, cls)
    d = "up" if _rank(src) < _rank(dst) else "down"
    base = _over(_level(lp, cls, traces, t), _level(getattr(lp, d), f"{cls}.{d}", traces, t))
    sides = []
    for node, way in ((src, "send"), (dst, "receive")):
        np_ = net.nodes.get(node)
        if np_ is not None:
            sides.append(_over(_level(np_, f"nodes.{node}", traces, t),
                               _level(getattr(np_, way), f"nodes.{node}.{way}", traces, t)))
    out: dict[str, float | None] = {}
    for f in _FIELDS:
        overrides = [v for s in sides if (v := s[f]) is not None]
        out[f] = min(overrides) if overrides else base[f]
    jitter = out["jitter_ms"] or 0.0
    delay = out["delay_ms"] or 0.0
    if jitter > delay:
        when = f" at {t:g} s" if traces else ""
        raise ValueError(f"network: link {src} -> {dst} resolves to jitter_ms {jitter:g} > delay_ms {delay:g}{when}")
    return Shape(mbit=out["mbit"], delay_ms=delay, jitter_ms=jitter, loss=out["loss"] or 0.0)


def compute_at(net: NetworkSpec, node: str, traces: Traces | None = None, t: float = 0.0) -> float:
    """``node``'s compute speed at ``t`` seconds (its table's ``compute``, replaced by its trace's)."""
    base = net.compute(node)
    tr = traces.get(f"nodes.{node}") if traces is not None else None
    return tr.at(t).get("compute", base) if tr is not None else base


def from_testbed(mbit: dict[str, float | None], delay_ms: dict[str, float | None],
                 nodes: dict[str, dict[str, float | None]]) -> NetworkSpec:
    """The ``[network]`` table equal to the deprecated ``[testbed.mbit]`` / ``[testbed.delay_ms]`` /
    ``[testbed.nodes]`` keys."""
    classes = {c: {k: v for k, v in (("mbit", mbit.get(c)), ("delay_ms", delay_ms.get(c))) if v is not None}
               for c in LINK_CLASSES}
    return NetworkSpec.model_validate({
        **{c: v for c, v in classes.items() if v},
        "nodes": {n: {k: v for k, v in o.items() if v is not None} for n, o in nodes.items()},
    })


def to_toml_hint(net: NetworkSpec) -> str:
    """The ``[network]`` tables equal to ``net`` (for the deprecation line), in one line."""
    parts = []
    for c in LINK_CLASSES:
        fields = {f: getattr(getattr(net, c), f) for f in _FIELDS if getattr(getattr(net, c), f) is not None}
        if fields:
            parts.append(f"[network.{c}] " + ", ".join(f"{k} = {v:g}" for k, v in fields.items()))
    for n, o in net.nodes.items():
        fields = {f: getattr(o, f) for f in _FIELDS if getattr(o, f) is not None}
        if fields:
            parts.append(f"[network.nodes.{n}] " + ", ".join(f"{k} = {v:g}" for k, v in fields.items()))
    return "; ".join(parts)


# -- a node's compute speed over time, in its own process -------------------------------------------------------
COMPUTE_TRACE_ENV = "FEDHOP_COMPUTE_TRACE"  # the node's own table's trace file (its compute column is replayed)
TRACE_T0_ENV = "FEDHOP_TRACE_T0_NS"  # the traces' time 0, as time.time_ns() (the testbed's replay start)


def compute_trace_env(net: NetworkSpec, node: str, spec_dir: Path | None, t0_ns: int) -> dict[str, str]:
    """The environment a testbed gives ``node``'s role so that it replays its own table's ``compute`` column
    (:func:`compute_speed`): the trace file and the traces' time 0. Empty where the node's table has no trace.
    (The role gets the spec from its parent without the trace files, so the testbed that has them names it.)"""
    prof = net.nodes.get(node)
    if prof is None or prof.trace is None:
        return {}
    return {COMPUTE_TRACE_ENV: str(trace_path(prof.trace, spec_dir).resolve()), TRACE_T0_ENV: str(t0_ns)}


def compute_speed(net: NetworkSpec, node: str, environ: Mapping[str, str] | None = None) -> Callable[[], float]:
    """``node``'s compute speed now, as a function: its table's ``compute``, replaced from each row's time on by
    its trace's ``compute`` column where the process was given the trace (:func:`compute_trace_env`); raises
    TraceError for a trace that cannot be read."""
    base = net.compute(node)
    env = os.environ if environ is None else environ
    path = env.get(COMPUTE_TRACE_ENV)
    if not path:
        return lambda: base
    try:
        trace = parse_trace(Path(path).read_text(), path, compute=True)
    except OSError as e:
        raise TraceError(f"{COMPUTE_TRACE_ENV}: cannot read {path} ({e.strerror or e})") from None
    t0 = int(env.get(TRACE_T0_ENV) or time.time_ns())
    return lambda: trace.at((time.time_ns() - t0) / 1e9).get("compute", base)
