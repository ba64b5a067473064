"""The run's topology, seen from the engine: :mod:`fedhop.common.topology` (torch-free, read at spec time too).

Kept so that ``fedhop.common.engine.topology`` keeps naming the same objects for the modules that import it
from here; new code imports :mod:`fedhop.common.topology`.
"""

from fedhop.common.topology import (
    SERVER,
    Topology,
    build_topology,
    client_id,
    edge_graph,
    edge_id,
    is_connected,
)

__all__ = ["SERVER", "Topology", "build_topology", "client_id", "edge_graph", "edge_id", "is_connected"]
