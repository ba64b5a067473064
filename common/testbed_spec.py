"""The ``[testbed]`` table of a RunSpec: link shaping for ``fedhop testbed up`` (network namespaces).

Every link between two processes belongs to one class, named by its two ends' roles::

    [testbed.mbit]          # bandwidth of each link in Mbit/s, each direction on its own; absent: unlimited
    client_edge = 100
    edge_edge = 10
    edge_ps = 100
    client_ps = 50          # flat topologies (no edges): client <-> PS

    [testbed.delay_ms]      # one-way delay added per direction by a proxy (see deploy/delay_proxy.py)
    edge_edge = 20

    [testbed.nodes.edge-0]  # overrides for every link touching one node
    mbit = 5
    delay_ms = 0

A node override replaces the class value on every link touching that node; where both ends override, the
smaller value wins. Only the table's shape is checked here; node ids are checked against the run's topology
by the testbed before anything starts (``TestbedSpec.check_nodes``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

LINK_CLASSES = ("client_edge", "edge_edge", "edge_ps", "client_ps")
_NODE_ID = re.compile(r"ps|edge-\d+|client-\d+")


def check_node_ids(nodes: dict[str, Any]) -> dict[str, Any]:
    """A table keyed by node id (``[testbed.nodes]``, ``[network.nodes]``): every key is ps, edge-N or client-N."""
    bad = [k for k in nodes if not _NODE_ID.fullmatch(k)]
    if bad:
        raise ValueError(f"node ids must be ps, edge-N or client-N, got {bad}")
    return nodes


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LinkRates(_Strict):
    """Mbit/s per link class (each direction limited on its own); None: unlimited."""

    client_edge: float | None = Field(None, gt=0, description="client <-> its edge server")
    edge_edge: float | None = Field(None, gt=0, description="edge server <-> neighbour edge server (hand-offs)")
    edge_ps: float | None = Field(None, gt=0, description="edge server <-> parameter server")
    client_ps: float | None = Field(None, gt=0, description="client <-> parameter server (no edges)")


class LinkDelays(_Strict):
    """One-way delay in milliseconds per link class, added in each direction; None or 0: none."""

    client_edge: float | None = Field(None, ge=0, le=60_000)
    edge_edge: float | None = Field(None, ge=0, le=60_000)
    edge_ps: float | None = Field(None, ge=0, le=60_000)
    client_ps: float | None = Field(None, ge=0, le=60_000)


class NodeOverride(_Strict):
    mbit: float | None = Field(None, gt=0, description="bandwidth of every link touching this node")
    delay_ms: float | None = Field(None, ge=0, le=60_000, description="one-way delay of every link touching it")


class TestbedSpec(_Strict):
    """Shaping of the namespace testbed's links; the defaults leave every link unshaped."""

    __test__ = False  # not a pytest class

    mbit: LinkRates = Field(default_factory=LinkRates)
    delay_ms: LinkDelays = Field(default_factory=LinkDelays)
    nodes: dict[str, NodeOverride] = Field(default_factory=dict)
    subnet: str = Field("10.231.0.0/16", description="IPv4 subnet of the testbed's bridge (one address per node)")
    mtu: int = Field(1500, ge=576, le=9000, description="MTU of every veth and of the bridge")
    offloads: bool = Field(False, description="keep segmentation offloads (TSO/GSO) on; off by default so the "
                           "kernel counters see real MTU-sized packets with their headers")
    tcp_timestamps: bool = Field(True, description="TCP timestamps (RFC 7323) in every namespace, Linux's default; "
                                 "false saves their 12 bytes per packet (IP+TCP headers 40 instead of 52)")

    @field_validator("nodes")
    @classmethod
    def _node_ids(cls, v: dict[str, NodeOverride]) -> dict[str, NodeOverride]:
        return check_node_ids(v)

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, v: str) -> str:
        try:
            net = ipaddress.IPv4Network(v)
        except ValueError as e:
            raise ValueError(f"not an IPv4 subnet: {e}") from None
        if net.prefixlen > 28:
            raise ValueError(f"{v} is too small for a testbed (prefix length at most 28)")
        return str(net)

    def check_nodes(self, nodes: list[str]) -> None:
        """Every overridden node must exist in the run (``nodes``); raises ValueError naming the field."""
        unknown = sorted(set(self.nodes) - set(nodes))
        if unknown:
            raise ValueError(f"testbed.nodes: {unknown} are not nodes of this run (it has ps, "
                             f"{sum(n.startswith('edge-') for n in nodes)} edges and "
                             f"{sum(n.startswith('client-') for n in nodes)} clients)")

    def needs_delay(self) -> bool:
        return any(getattr(self.delay_ms, c) for c in LINK_CLASSES) or any(o.delay_ms for o in self.nodes.values())


def link_class(a_role: str, b_role: str) -> str:
    """The class of the link between roles ``a_role`` and ``b_role`` (client / edge / server)."""
    short = {"client": "client", "edge": "edge", "server": "ps"}
    pair = sorted((short[a_role], short[b_role]), key=("client", "edge", "ps").index)
    name = "_".join(pair)
    if name not in LINK_CLASSES:
        raise ValueError(f"no link class joins a {a_role} and a {b_role}")
    return name


def _pick(class_value: float | None, a: float | None, b: float | None) -> float | None:
    overrides = [x for x in (a, b) if x is not None]
    return min(overrides) if overrides else class_value


def link_rate(spec: TestbedSpec, cls: str, a: str, b: str) -> float | None:
    """Mbit/s of the link between nodes ``a`` and ``b`` of class ``cls`` (None: unlimited)."""
    na, nb = spec.nodes.get(a), spec.nodes.get(b)
    return _pick(getattr(spec.mbit, cls), na.mbit if na else None, nb.mbit if nb else None)


def link_delay(spec: TestbedSpec, cls: str, a: str, b: str) -> float:
    """One-way delay in ms of the link between ``a`` and ``b`` (0: none)."""
    na, nb = spec.nodes.get(a), spec.nodes.get(b)
    return _pick(getattr(spec.delay_ms, cls), na.delay_ms if na else None, nb.delay_ms if nb else None) or 0.0
