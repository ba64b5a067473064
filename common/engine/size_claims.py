"""A reply's claimed data size (its ``n`` scalar) against the size its node reported when it joined (Ready).

FedAvg-style averages weight a reply by its ``n``: a client that could claim any ``n`` could make the global
model its own. Sizes are fixed at Ready, so a reply is usable only if its ``n`` agrees with them: a client's
``n`` must equal the size it reported; an edge's (the weight of the clients that answered it) may not exceed
its cluster's total.
"""

from __future__ import annotations

from collections.abc import Mapping

from fedhop.common.engine.api import NodeId, Scalar
from fedhop.common.topology import Topology

SIZE_KEY = "n"


def size_claim_error(topology: Topology, node: NodeId, scalars: Mapping[str, Scalar],
                     sizes: Mapping[NodeId, int] | None) -> str | None:
    """Why ``node``'s reply claims a data size that its Ready did not (None: no claim, or a consistent one)."""
    if SIZE_KEY not in scalars or sizes is None or node not in sizes:
        return None
    claimed, known = scalars[SIZE_KEY], sizes[node]
    if isinstance(claimed, bool) or not isinstance(claimed, int | float) or claimed != int(claimed):
        return f"{node} claims n = {claimed!r}, not a whole number of samples"
    if topology.role(node) == "client":
        if int(claimed) != known:
            return f"{node} claims n = {int(claimed)} samples, but reported {known} when it joined"
    elif not 0 <= int(claimed) <= known:
        return f"{node} claims n = {int(claimed)} samples, but its cluster reported {known} in all"
    return None
