"""A reply's claimed data size against the size its node reported at Ready."""

from __future__ import annotations

from fedhop.common.engine.size_claims import size_claim_error
from fedhop.common.spec import TopologySpec
from fedhop.common.topology import build_topology

TOPO = build_topology(TopologySpec(clients=4, edges=2), 0)
SIZES = {"client-0": 10, "client-1": 20, "edge-0": 30}


def test_a_client_must_claim_exactly_its_ready_size() -> None:
    assert size_claim_error(TOPO, "client-0", {"n": 10}, SIZES) is None
    assert size_claim_error(TOPO, "client-0", {"n": 10**12}, SIZES) == \
        "client-0 claims n = 1000000000000 samples, but reported 10 when it joined"
    assert "reported 10" in size_claim_error(TOPO, "client-0", {"n": 9}, SIZES)


def test_an_edge_may_claim_up_to_its_cluster() -> None:
    assert size_claim_error(TOPO, "edge-0", {"n": 0}, SIZES) is None
    assert size_claim_error(TOPO, "edge-0", {"n": 30}, SIZES) is None
    assert "its cluster reported 30" in size_claim_error(TOPO, "edge-0", {"n": 31}, SIZES)
    assert "its cluster reported 30" in size_claim_error(TOPO, "edge-0", {"n": -1}, SIZES)


def test_odd_claims() -> None:
    assert "not a whole number" in size_claim_error(TOPO, "client-1", {"n": 2.5}, SIZES)
    assert "not a whole number" in size_claim_error(TOPO, "client-1", {"n": "20"}, SIZES)
    assert size_claim_error(TOPO, "client-1", {"n": 20.0}, SIZES) is None
    assert size_claim_error(TOPO, "client-1", {"loss": 1.0}, SIZES) is None  # no claim
    assert size_claim_error(TOPO, "client-3", {"n": 5}, SIZES) is None  # size unknown: scatter drops it anyway
