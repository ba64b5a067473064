"""The ``[network]`` table (common/network_spec.py): validation naming the field, per-direction resolution,
the deprecated ``[testbed.*]`` keys, and what the namespace testbed makes of it (proxy holds, loss rules)."""

from __future__ import annotations

import logging
import random
import re
import tomllib

import pytest

from fedhop.common.network_spec import NetworkSpec, Shape, directed_shape
from fedhop.common.spec import RunSpec, SpecError, TopologySpec
from fedhop.common.topology import build_topology
from fedhop.deploy import loss
from fedhop.deploy.delay_proxy import Hold, due_times
from fedhop.deploy.netns import plan_network
from fedhop.deploy.profile import run_links
from tests.specs import spec_dict

BASE = spec_dict("fedchs", clients=4, edges=2, edge_graph="ring", device=None)


def with_network(network: dict) -> RunSpec:
    return RunSpec.parse({**BASE, "network": network})


@pytest.mark.parametrize("table, field", [
    ({"client_edge": {"loss": 1.0}}, "network.client_edge.loss"),
    ({"client_edge": {"loss": -0.1}}, "network.client_edge.loss"),
    ({"edge_edge": {"mbit": 0}}, "network.edge_edge.mbit"),
    ({"edge_ps": {"delay_ms": -1}}, "network.edge_ps.delay_ms"),
    ({"edge_ps": {"delay_ms": 5, "jitter_ms": 6}}, "network.edge_ps"),
    ({"edge_ps": {"up": {"jitter_ms": -1}}}, "network.edge_ps.up.jitter_ms"),
    ({"edge_cloud": {"mbit": 1}}, "network.edge_cloud"),
    ({"nodes": {"client-0": {"compute": 0}}}, "network.nodes.client-0.compute"),
    ({"nodes": {"client-0": {"compute": 2}}}, "network.nodes.client-0.compute"),
    ({"nodes": {"client-0": {"send": {"loss": 2}}}}, "network.nodes.client-0.send.loss"),
    ({"nodes": {"router-1": {"mbit": 2}}}, "network.nodes"),
    ({"nodes": {"client-9": {"compute": 0.5}}}, r"network.nodes: ['client-9'] are not nodes of this run"),
])
def test_bad_table_names_the_field(table: dict, field: str) -> None:
    with pytest.raises(SpecError, match=re.escape(field)):
        with_network(table)


def test_directions_and_node_overrides_resolve() -> None:
    net = with_network({
        "client_edge": {"mbit": 100, "delay_ms": 20, "jitter_ms": 5, "loss": 0.01, "up": {"mbit": 10}},
        "nodes": {"client-1": {"send": {"loss": 0.05}, "compute": 0.25}, "edge-0": {"receive": {"mbit": 50}}},
    }).network
    assert net is not None
    # towards the PS the up table's rate, but a node override replaces the class value (edge-0 receives at 50)
    assert directed_shape(net, "client_edge", "client-0", "edge-0") == Shape(50, 20, 5, 0.01)
    assert directed_shape(net, "client_edge", "edge-0", "client-0") == Shape(100, 20, 5, 0.01)
    assert directed_shape(net, "client_edge", "client-1", "edge-0").loss == 0.05  # client-1 sends lossier
    assert directed_shape(net, "client_edge", "edge-0", "client-1").loss == 0.01
    assert directed_shape(net, "client_edge", "client-2", "edge-1") == Shape(10, 20, 5, 0.01)
    assert net.compute("client-1") == 0.25 and net.compute("client-0") == 1.0
    topo = build_topology(TopologySpec(clients=4, edges=2, edge_graph="ring"), 0)
    links = {(lk.a, lk.b): lk for lk in run_links(topo, net)}
    assert links[("edge-0", "client-1")].ba.loss == 0.05 and links[("edge-0", "client-1")].ab.loss == 0.01
    assert links[("ps", "edge-1")].ab == links[("ps", "edge-1")].ba == Shape()  # edge_ps: unshaped
    assert links[("ps", "edge-0")].ab.mbit == 50 and links[("ps", "edge-0")].ba.mbit is None


def test_old_testbed_keys_become_the_network_table_with_one_deprecation_line(
        caplog: pytest.LogCaptureFixture) -> None:
    old = {"mbit": {"edge_edge": 10}, "delay_ms": {"client_edge": 30}, "nodes": {"edge-1": {"mbit": 5}}}
    with caplog.at_level(logging.WARNING, logger="fedhop.spec"):
        spec = RunSpec.parse({**BASE, "testbed": {**old, "mtu": 1400}})
        RunSpec.parse({**BASE, "testbed": old})  # the same line is not repeated
    lines = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(lines) == 1
    assert "[network.edge_edge] mbit = 10" in lines[0] and "[network.client_edge] delay_ms = 30" in lines[0]
    assert "[network.nodes.edge-1] mbit = 5" in lines[0]
    assert spec.network is not None and spec.network.edge_edge.mbit == 10 and spec.network.nodes["edge-1"].mbit == 5
    assert spec.testbed is not None and spec.testbed.mtu == 1400 and spec.testbed.mbit.edge_edge is None
    again = RunSpec.from_toml(spec.to_toml())  # the written spec carries [network], not the old keys
    assert again.network == spec.network
    assert tomllib.loads(spec.to_toml())["testbed"].get("mbit", {}) == {}
    with pytest.raises(SpecError, match="both"):
        RunSpec.parse({**BASE, "testbed": old, "network": {"edge_ps": {"mbit": 1}}})


def test_jitter_keeps_the_stream_in_order_within_its_bounds() -> None:
    arrivals = [i * 0.001 for i in range(200)]
    hold = Hold(delay_ms=20, jitter_ms=15)
    due = due_times(arrivals, hold, random.Random(3))
    assert due == sorted(due)  # never overtakes the chunk ahead
    assert all(t + 0.005 - 1e-9 <= d for t, d in zip(arrivals, due, strict=True))
    assert max(d - t for t, d in zip(arrivals, due, strict=True)) <= 0.035 + 1e-9
    assert len({round(d - t, 6) for t, d in zip(arrivals, due, strict=True)}) > 50  # it does vary
    assert due == due_times(arrivals, hold, random.Random(3))  # seeded: the same draws
    assert due_times(arrivals, Hold(20), random.Random(3)) == [t + 0.02 for t in arrivals]


def test_loss_rule_drops_a_random_fraction_on_the_receiver() -> None:
    net = plan_network([("ps", "server"), ("client-0", "client")], "10.9.0.0/24", tag="fhx")
    plans = loss.plan_loss(net, [loss.LinkLoss("client-0", "ps", 0.01), loss.LinkLoss("ps", "client-0", 0.0)])
    assert list(plans) == ["fhx-ps"]  # the receiver's namespace; a lossless direction gets no rule
    assert (f"ip saddr {net.nodes['client-0'].address} numgen random mod 1000000 < 10000 counter drop "
            '"loss:client-0"'.replace(' "', ' comment "')) in plans["fhx-ps"]
    assert "hook input priority -10" in plans["fhx-ps"]


def test_an_empty_profile_shapes_nothing() -> None:
    net = NetworkSpec()
    assert directed_shape(net, "edge_edge", "edge-0", "edge-1") == Shape()
    assert RunSpec.parse(BASE).network_profile() == net
