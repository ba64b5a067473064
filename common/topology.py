"""Who is connected to whom: node ids, the client -> edge -> PS tree and the edge-to-edge graph."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fedhop.common.seeds import derive_seed
from fedhop.common.spec import TopologySpec

SERVER = "ps"


def client_id(i: int) -> str:
    return f"client-{i}"


def edge_id(m: int) -> str:
    return f"edge-{m}"


@dataclass(frozen=True)
class Topology:
    """The run's fixed structure. Canonical node order is ps, edges by index, clients by index."""

    edges: tuple[str, ...]
    clients: tuple[str, ...]
    parent: dict[str, str]  # client -> edge (or ps); edge -> ps
    neighbours: dict[str, tuple[str, ...]]  # edge -> adjacent edges; client -> peer clients (sorted canonically)

    @property
    def server(self) -> str:
        return SERVER

    def children(self, node: str) -> tuple[str, ...]:
        return tuple(n for n in (*self.edges, *self.clients) if self.parent.get(n) == node)

    def cluster(self, edge: str) -> tuple[str, ...]:
        """The clients attached to an edge."""
        return tuple(c for c in self.clients if self.parent[c] == edge)

    def ordinal(self, node: str) -> int:
        """Index of a client or edge: client-7 -> 7."""
        role, _, idx = node.rpartition("-")
        if role not in ("client", "edge") or not idx.isdigit():
            raise ValueError(f"not a client or edge id: {node!r}")
        return int(idx)

    def role(self, node: str) -> str:
        if node == SERVER:
            return "server"
        if node in self.parent:
            return "edge" if node.startswith("edge-") else "client"
        raise KeyError(f"unknown node {node!r}")

    def sort(self, nodes: Iterable[str]) -> list[str]:
        """Canonical order, the order every engine aggregates in."""
        def key(n: str) -> tuple[int, int]:
            if n == SERVER:
                return (0, 0)
            return (1 if n.startswith("edge-") else 2, self.ordinal(n))

        return sorted(nodes, key=key)

    def subtree_sizes(self, client_sizes: dict[str, int]) -> dict[str, int]:
        """Data sizes of every node from its clients': a client its own, an edge its cluster's, the PS all
        (a client absent from ``client_sizes`` counts 0)."""
        sizes = dict(client_sizes)
        for e in self.edges:
            sizes[e] = sum(client_sizes.get(c, 0) for c in self.cluster(e))
        sizes[SERVER] = sum(client_sizes.values())
        return sizes

    def all_nodes(self) -> list[str]:
        return [SERVER, *self.edges, *self.clients]


def build_topology(spec: TopologySpec, seed: int) -> Topology:
    clients = tuple(client_id(i) for i in range(spec.clients))
    edges = tuple(edge_id(m) for m in range(spec.edges))
    parent: dict[str, str] = {}
    if not edges:
        parent = {c: SERVER for c in clients}
    else:
        sizes = spec.clients_per_edge or _even_split(spec.clients, spec.edges)
        i = 0
        for m, size in enumerate(sizes):
            for _ in range(size):
                parent[clients[i]] = edges[m]
                i += 1
        parent.update({e: SERVER for e in edges})
    graph = edge_graph(len(edges), spec.edge_graph, spec.edge_max_degree, seed)
    neighbours = {edges[m]: tuple(edges[j] for j in sorted(graph[m])) for m in range(len(edges))}
    neighbours.update(peer_links(spec, clients, seed))
    return Topology(edges=edges, clients=clients, parent=parent, neighbours=neighbours)


PEER_GRAPH_STREAM = "wrwgd.graph"  # the seed stream of the random peer graph (the name WRWGD's walk graph had
# when it was WRWGD's own: kept, so that a WRWGD run keeps the graph it walked before the peer graph existed)


def peer_links(spec: TopologySpec, clients: tuple[str, ...], seed: int) -> dict[str, tuple[str, ...]]:
    """Client -> its peer clients on ``spec.peer_graph`` (none: no client has peers)."""
    kind = spec.peer_graph or "none"
    if kind == "none":
        return {}
    graph = peer_graph(len(clients), kind, spec.peer_max_degree, seed)
    return {clients[i]: tuple(clients[j] for j in sorted(graph[i])) for i in range(len(clients))}


def peer_graph(n: int, kind: str, max_degree: int, seed: int) -> list[set[int]]:
    """Adjacency sets of the client peer graph (the edge graph's generator on its own seed stream)."""
    return edge_graph(n, kind, max_degree, derive_seed(seed, PEER_GRAPH_STREAM))


def _even_split(n: int, k: int) -> list[int]:
    return [n // k + (1 if m < n % k else 0) for m in range(k)]


def edge_graph(m: int, kind: str, max_degree: int, seed: int) -> list[set[int]]:
    """Adjacency sets of the edge-server graph; always connected, never self-loops.

    ``random`` (Fed-CHS App. B: "connected with at most three other ES nodes", generator [UNSPECIFIED]):
    a random spanning tree grown under the degree cap, then random extra links while the cap allows.
    """
    adj: list[set[int]] = [set() for _ in range(m)]
    if m <= 1:
        return adj
    if kind == "complete":
        return [set(range(m)) - {i} for i in range(m)]
    if kind == "ring":
        for i in range(m):
            adj[i].add((i + 1) % m)
            adj[(i + 1) % m].add(i)
        return adj
    if max_degree < 2 and m > 2:
        raise ValueError(f"a connected graph of {m} edges needs edge_max_degree >= 2, got {max_degree}")
    rng = np.random.default_rng([seed, 0xED9E])
    order = [int(x) for x in rng.permutation(m)]
    for k in range(1, m):
        open_nodes = [j for j in order[:k] if len(adj[j]) < max_degree]
        j = open_nodes[int(rng.integers(len(open_nodes)))]
        adj[order[k]].add(j)
        adj[j].add(order[k])
    candidates = [(a, b) for a in range(m) for b in range(a + 1, m) if b not in adj[a]]
    for idx in rng.permutation(len(candidates)):
        a, b = candidates[int(idx)]
        if len(adj[a]) < max_degree and len(adj[b]) < max_degree and rng.random() < 0.5:
            adj[a].add(b)
            adj[b].add(a)
    return adj


def is_connected(adj: Sequence[set[int]]) -> bool:
    if not adj:
        return True
    seen, stack = {0}, [0]
    while stack:
        for j in adj[stack.pop()]:
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return len(seen) == len(adj)
