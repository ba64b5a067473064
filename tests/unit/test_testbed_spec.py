"""The [testbed] table, link shapes, tc and nft scripts, and the byte-level table: no root needed."""

from __future__ import annotations

import pytest

from fedhop.common.spec import RunSpec, SpecError, TopologySpec
from fedhop.common.testbed_spec import TestbedSpec, link_class
from fedhop.common.topology import build_topology
from fedhop.deploy import kernel_bytes, link_table, shaping
from fedhop.deploy.netns import TestbedError, plan_network
from fedhop.deploy.profile import peers_of, run_links
from fedhop.deploy.testbed import Testbed
from fedhop.deploy.wire import WireCount, WireReading
from tests.specs import spec_dict

BASE = spec_dict("fedchs", clients=4, edges=2, edge_graph="ring", device=None)


def spec_with(testbed: dict) -> RunSpec:
    return RunSpec.parse({**BASE, "testbed": testbed})


def test_no_testbed_table_is_fine() -> None:
    assert RunSpec.parse(BASE).testbed is None


@pytest.mark.parametrize("table, field", [
    ({"mbit": {"edge_cloud": 10}}, "testbed.mbit.edge_cloud"),
    ({"mbit": {"edge_edge": -1}}, "testbed.mbit.edge_edge"),
    ({"mbit": {"client_edge": 0}}, "testbed.mbit.client_edge"),
    ({"delay_ms": {"edge_ps": -5}}, "testbed.delay_ms.edge_ps"),
    ({"nodes": {"edge-0": {"mbit": -2}}}, "testbed.nodes.edge-0.mbit"),
    ({"nodes": {"router-1": {"mbit": 2}}}, "testbed.nodes"),
    ({"subnet": "10.0.0.0/30"}, "testbed.subnet"),
    ({"bandwidth": 3}, "testbed.bandwidth"),
])
def test_bad_table_names_the_field(table: dict, field: str) -> None:
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        spec_with(table)


def test_override_of_an_absent_node_fails_before_anything_starts(tmp_path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(RunSpec.parse(BASE).to_toml() + '\n[testbed.nodes.edge-7]\nmbit = 1\n')
    with pytest.raises(SpecError, match=r"network\.nodes: \['edge-7'\] are not nodes of this run"):
        Testbed(path, tmp_path / "out")  # the spec is refused as it is read, for every deployment
    assert not (tmp_path / "out").exists()


def test_link_classes_and_overrides() -> None:
    assert link_class("client", "edge") == link_class("edge", "client") == "client_edge"
    assert link_class("server", "edge") == "edge_ps"
    assert link_class("client", "server") == "client_ps"
    with pytest.raises(ValueError, match="no link class"):
        link_class("client", "client")
    old = {"mbit": {"client_edge": 100, "edge_edge": 10}, "delay_ms": {"edge_ps": 7},
           "nodes": {"client-1": {"mbit": 300}, "edge-0": {"mbit": 50, "delay_ms": 2}}}
    TestbedSpec.model_validate(old)  # the deprecated keys still validate
    tb = spec_with(old).network  # ... and become the [network] profile
    topo = build_topology(TopologySpec(clients=4, edges=2, edge_graph="ring"), 0)
    links = {(lk.a, lk.b): lk for lk in run_links(topo, tb)}
    assert set(links) == {("ps", "edge-0"), ("ps", "edge-1"), ("edge-0", "client-0"), ("edge-0", "client-1"),
                          ("edge-1", "client-2"), ("edge-1", "client-3"), ("edge-0", "edge-1")}
    assert links[("edge-1", "client-2")].mbit == 100  # the class value
    assert links[("edge-0", "client-0")].mbit == 50  # edge-0's override replaces the class value
    assert links[("edge-0", "client-1")].mbit == 50  # both ends override: the smaller
    assert links[("ps", "edge-1")].mbit is None and links[("ps", "edge-1")].delay_ms == 7
    assert links[("ps", "edge-0")].delay_ms == 2
    assert links[("edge-0", "edge-1")].mbit == 50 and links[("edge-0", "edge-1")].cls == "edge_edge"
    assert peers_of(list(links.values()))["edge-0"] == ["ps", "client-0", "client-1", "edge-1"]


def test_network_plan_names_and_addresses() -> None:
    net = plan_network([("ps", "server"), ("edge-0", "edge"), ("client-0", "client")], "10.9.0.0/24", tag="fhabc123")
    assert [n.address for n in net.nodes.values()] == ["10.9.0.1", "10.9.0.2", "10.9.0.3"]
    assert [n.ns for n in net.nodes.values()] == ["fhabc123-ps", "fhabc123-edge-0", "fhabc123-client-0"]
    assert len({n.bridge_port for n in net.nodes.values()}) == 3
    assert all(len(n.bridge_port) <= 15 for n in net.nodes.values())  # Linux interface-name limit
    with pytest.raises(TestbedError, match="too few addresses"):
        plan_network([(f"client-{i}", "client") for i in range(20)], "10.9.0.0/28")
    assert plan_network([("ps", "server")], "10.9.0.0/24").tag != plan_network([("ps", "server")], "10.9.0.0/24").tag


def test_htb_commands_limit_both_directions() -> None:
    net = plan_network([("ps", "server"), ("edge-0", "edge"), ("edge-1", "edge")], "10.9.0.0/24", tag="fhx")
    one_way = shaping.plan_shaping(net, [shaping.LinkShape("edge-0", "edge-1", 10.0)])
    assert {(ns, c[4]) for ns, c in one_way if c[:3] == ["tc", "filter", "add"]} == {("fhx-edge-0", "eth0"),
                                                                                     ("fhx-br", "v2")}
    cmds = shaping.plan_shaping(net, [shaping.LinkShape("edge-0", "edge-1", 10.0),
                                      shaping.LinkShape("edge-1", "edge-0", 10.0)])
    text = [(ns, " ".join(c)) for ns, c in cmds]
    classes = [t for ns, t in text if " class add " in t and "10000kbit" in t]
    assert len(classes) == 4  # each end's eth0 (egress) and bridge port (ingress)
    filters = {(ns, t.split(" dev ")[1].split()[0], t.split("match ip ")[1].split()[:2][0],
                t.split("match ip ")[1].split()[1]) for ns, t in text if " filter " in t}
    assert filters == {("fhx-edge-0", "eth0", "dst", "10.9.0.3/32"), ("fhx-br", "v1", "src", "10.9.0.3/32"),
                       ("fhx-edge-1", "eth0", "dst", "10.9.0.2/32"), ("fhx-br", "v2", "src", "10.9.0.2/32")}
    assert not [ns for ns, _ in cmds if ns == "fhx-ps"]  # unshaped nodes get no qdisc


def test_nft_ruleset_counts_each_peer_then_the_rest() -> None:
    text = kernel_bytes.ruleset({"ps": "10.9.0.1", "client-0": "10.9.0.3"})
    assert 'ip daddr 10.9.0.1 counter accept comment "out:ps"' in text
    assert 'ip saddr 10.9.0.3 counter accept comment "in:client-0"' in text
    assert text.index('"out:client-0"') < text.index('"out:other"')


def test_reconcile_and_table() -> None:
    meters = {("ps", "client-0"): link_table.Meter(2, 1000, 1100), ("client-0", "ps"): link_table.Meter(1, 0, 40)}
    wire = WireReading((WireCount("ps", "client-0", 3, 1300, 1300, "nft"),
                        WireCount("client-0", "ps", 2, 200, 200, "nft"),
                        WireCount("client-0", "other", 0, 0, None, "nft")), "nft", complete=False)
    rows = link_table.reconcile(meters, wire.by_link(), order=["ps", "client-0"])
    assert [(r.src, r.dst, r.payload, r.message, r.wire) for r in rows] == [
        ("ps", "client-0", 1000, 1100, 1300), ("client-0", "ps", 0, 40, 200)]
    assert rows[0].wire_ratio == pytest.approx(1.3) and rows[0].unmetered == 200
    assert rows[1].wire_ratio is None
    table = link_table.format_table(rows)
    assert "ps -> client-0" in table and "1.3000" in table and "1,300" in table
