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

Resolution of a directed link a -> b: the class value for that direction (its ``up`` / ``down`` table, else the
class's own fields); a node override (a's ``send`` or own fields, b's ``receive`` or own fields) replaces it;
where both ends override, the smaller value wins. Only the table's shape is checked here; node ids are checked
against the run's topology by whoever applies it (``NetworkSpec.check_nodes``).

The old ``[testbed.mbit]`` / ``[testbed.delay_ms]`` / ``[testbed.nodes]`` keys are still read
(:func:`from_testbed`), with one deprecation line in the log saying what to write instead.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _merge(base: Direction, over: Direction | None) -> Direction:
    if over is None:
        return Direction(**{f: getattr(base, f) for f in _FIELDS})
    return Direction(**{f: getattr(over, f) if getattr(over, f) is not None else getattr(base, f) for f in _FIELDS})


def _rank(node: str) -> tuple[int, int]:
    role, _, k = node.partition("-")
    return {"client": 0, "edge": 1, "ps": 2}[role], int(k or 0)


def directed_shape(net: NetworkSpec, cls: str, src: str, dst: str) -> Shape:
    """The shape of the direction ``src`` -> ``dst`` of a link of class ``cls`` (node ids ps / edge-N /
    client-N)."""
    if cls not in LINK_CLASSES:
        raise ValueError(f"unknown link class {cls!r} (known: {', '.join(LINK_CLASSES)})")
    base = getattr(net, cls).direction(up=_rank(src) < _rank(dst))
    ns, nd = net.nodes.get(src), net.nodes.get(dst)
    sides = [_merge(ns, ns.send) if ns else None, _merge(nd, nd.receive) if nd else None]
    out: dict[str, float | None] = {}
    for f in _FIELDS:
        overrides = [getattr(s, f) for s in sides if s is not None and getattr(s, f) is not None]
        out[f] = min(overrides) if overrides else getattr(base, f)
    jitter = out["jitter_ms"] or 0.0
    delay = out["delay_ms"] or 0.0
    if jitter > delay:
        raise ValueError(f"network: link {src} -> {dst} resolves to jitter_ms {jitter:g} > delay_ms {delay:g}")
    return Shape(mbit=out["mbit"], delay_ms=delay, jitter_ms=jitter, loss=out["loss"] or 0.0)


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
