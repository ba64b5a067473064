"""One child node's configuration (an edge's or a client's), made once at the edge of the CLI
(``fedhop/cli/roles.py``) and passed whole to :func:`~fedhop.edge.node.run_edge`,
:func:`~fedhop.client.main.run_client` and the client host (:func:`~fedhop.client.host.run_clients`).

Frozen and checked when it is made: a role never receives a half-filled configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from fedhop.transport.credentials import PLAINTEXT, Security


class NodeConfigError(ValueError):
    """A :class:`NodeConfig` that cannot be used; the message names the field."""


@dataclass(frozen=True)
class NodeConfig:
    """Who a child node is, where it dials and listens, and how it runs.

    ``connect``: its parent's HOST:PORT (the PS for an edge). ``listen``: where an edge serves its clients and
    neighbour edges, and where a client of a run with client peer links (``topology.peer_graph``) serves its
    peers (other clients listen on nothing: None). ``advertise``: the address neighbour edges dial
    (default: the listen address, 127.0.0.1 for a wildcard host). ``device`` / ``data_path``: override the
    spec's. ``state_dir``: where the node saves its state after every task (None: in memory only).
    ``connect_timeout_s``: how long it keeps retrying its parent. ``linger_until`` / ``linger_timeout_s``: after
    a clean end, stay up until the health service at that address stops serving (:func:`fedhop.lifecycle.
    linger`). ``security``: the credentials of every link it makes (never None: :data:`PLAINTEXT` by default).
    """

    node_id: str
    connect: str
    listen: str | None = None
    advertise: str | None = None
    device: str | None = None
    data_path: str | None = None
    state_dir: Path | None = None
    connect_timeout_s: float = 60.0
    linger_until: str | None = None
    linger_timeout_s: float = 300.0
    security: Security = PLAINTEXT

    def __post_init__(self) -> None:
        if not self.node_id:
            raise NodeConfigError("node_id: empty (every node needs an id, e.g. edge-0 or client-3)")
        if not self.connect:
            raise NodeConfigError(f"{self.node_id}: connect: empty (the parent's HOST:PORT)")
        if self.listen is not None and not self.listen:
            raise NodeConfigError(f"{self.node_id}: listen: empty (HOST:PORT, or None for a node that does not "
                                  f"listen)")
        for name in ("connect_timeout_s", "linger_timeout_s"):
            value = getattr(self, name)
            if not value >= 0:  # 0: one attempt, no waiting
                raise NodeConfigError(f"{self.node_id}: {name}: {value!r} (must be a number of seconds, >= 0)")
        if not isinstance(self.security, Security):
            raise NodeConfigError(f"{self.node_id}: security: {self.security!r} is not a Security (plaintext: "
                                  f"PLAINTEXT)")

    def for_node(self, node_id: str, security: Security) -> NodeConfig:
        """The same configuration for another id (a client host's ids share everything but id and credentials)."""
        return replace(self, node_id=node_id, security=security)
