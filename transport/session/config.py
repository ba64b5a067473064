"""What a parent hub is built from: one frozen :class:`HubConfig`, and one :class:`HubListener` for its news."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from fedhop.common.engine.api import NodeId, Scalar
from fedhop.common.spec import RunSpec, TransportSpec
from fedhop.common.topology import Topology
from fedhop.transport.credentials import PLAINTEXT, Security


@dataclass(frozen=True, eq=False)
class HubConfig:
    """A parent's run, fixed before its first child is admitted: the node, the run it serves, what its Welcome
    carries besides the spec, and how peers prove who they are."""

    node: NodeId  # the PS or an edge
    spec: RunSpec
    topology: Topology
    run_id: str
    welcome_info: Mapping[str, Scalar] = field(default_factory=dict)  # sent in every Welcome (resume_round, ...)
    security: Security = PLAINTEXT  # plaintext: Hellos are taken at their word

    @property
    def transport(self) -> TransportSpec:
        return self.spec.transport

    @cached_property
    def children(self) -> tuple[NodeId, ...]:
        """This node's children in canonical order (computed once: a scan of the topology, which every Hello
        asked for: O(n^2) over a join of n children)."""
        return self.topology.children(self.node)

    @cached_property
    def child_set(self) -> frozenset[NodeId]:
        return frozenset(self.children)

    @cached_property
    def spec_json(self) -> str:
        """The spec as every Welcome carries it."""
        return self.spec.model_dump_json()


class HubListener(Protocol):
    """What a hub tells its node about its children; every method is a no-op unless overridden (subclass this
    and override what you need). Called on the session's thread, outside the hub's lock."""

    def child_joined(self, node: NodeId, role: str) -> None:
        """``node`` was welcomed (joined, joined late or re-joined) as a ``role``."""

    def child_ready(self, node: NodeId, sizes: dict[NodeId, int]) -> None:
        """``node`` said Ready with its clients' data sizes (a client: its own; an edge: its cluster's)."""

    def sizes_changed(self) -> None:
        """After the start, a child's Ready (a late one, or an update) changed the data sizes (an edge tells its
        parent)."""

    def child_lost(self, node: NodeId, why: str) -> None:
        """``node``'s session ended without its Bye, or was dropped for silence."""


class Quiet(HubListener):
    """The listener that hears nothing."""


QUIET = Quiet()
