"""The testbed contract (deploy/contract.py): the plan, the one role command line, the one per-link table and
the counters' file and the start / wait / wire / stop protocol, with no process (the supervisor and compose-run
driven through stand-ins for ``docker`` and ``nft`` are in tests/integration/test_testbed_contract.py)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from fedhop.common.spec import TopologySpec
from fedhop.common.topology import build_topology
from fedhop.deploy import contract, link_table
from fedhop.deploy.contract import Plan, PlannedNode, RoleCommand, fixed_ports, plan
from fedhop.deploy.link_table import LinkBytes, Meter
from fedhop.deploy.wire import (
    OTHER,
    PairBytes,
    WireCount,
    WireReading,
    attribute_pairs,
    read_wire_csv,
    sum_pairs,
    write_wire_csv,
)
from fedhop.launch import role_cmd

HIER = build_topology(TopologySpec(clients=4, edges=2, edge_graph="ring"), 0)
FLAT = build_topology(TopologySpec(clients=2, edges=0), 0)


# -- the plan -----------------------------------------------------------------------------------------------------
def test_plan_gives_every_node_its_address_and_its_parents() -> None:
    hosts = {n: f"10.0.0.{i}" for i, n in enumerate(HIER.all_nodes(), start=1)}
    p = plan(HIER, hosts, fixed_ports(HIER, 50051, 50061))
    assert p.order == tuple(HIER.all_nodes()) and p.server == "ps"
    assert p.address("ps") == "10.0.0.1:50051" and p.address("edge-1") == "10.0.0.3:50061"
    assert p.connect("edge-0") == "10.0.0.1:50051"
    assert {c: p.connect(c) for c in HIER.clients} == {c: p.address(HIER.parent[c]) for c in HIER.clients}
    assert p.of_role("edge") == ["edge-0", "edge-1"] and p.hosts() == hosts
    with pytest.raises(ValueError, match="client-0 does not listen"):
        p.address("client-0")
    with pytest.raises(ValueError, match="ps is the PS: it dials nobody"):
        p.connect("ps")
    with pytest.raises(KeyError, match="edge-9"):
        p.node("edge-9")


def test_flat_plan_sends_clients_to_the_ps_and_service_names_are_hosts() -> None:
    p = plan(FLAT, {n: n for n in FLAT.all_nodes()}, fixed_ports(FLAT, 50051, 50061))
    assert [p.connect(c) for c in FLAT.clients] == ["ps:50051", "ps:50051"]
    assert p.node("client-1") == PlannedNode("client-1", "client", "client-1", None, "ps")


@pytest.mark.parametrize("nodes, message", [
    ((PlannedNode("ps", "server", "h", 1), PlannedNode("ps", "client", "h", None, "ps")), "names each node once"),
    ((PlannedNode("c", "client", "h", None, None),), "exactly one server"),
    ((PlannedNode("ps", "server", "h", None),), "ps: a server listens"),
    ((PlannedNode("ps", "server", "h", 1), PlannedNode("e", "edge", "h", 2, "gone")), "parent 'gone'"),
    ((PlannedNode("ps", "server", "h", 1), PlannedNode("r", "router", "h", 2, "ps")), "unknown role 'router'"),
])
def test_a_plan_that_cannot_be_is_refused(nodes: tuple[PlannedNode, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Plan(nodes)


# -- the role command line ----------------------------------------------------------------------------------------
def test_role_command_lines() -> None:
    edge = RoleCommand("edge", "edge-0", connect="ps:50051", listen="0.0.0.0:50061", advertise="edge-0:50061",
                       security=("--insecure",), device="cpu", extra=("--linger-until", "ps:50051"))
    assert edge.args() == ["edge", "--id", "edge-0", "--connect", "ps:50051", "--listen", "0.0.0.0:50061",
                           "--insecure", "--advertise", "edge-0:50061", "--device", "cpu", "--linger-until",
                           "ps:50051"]
    assert edge.argv() == [sys.executable, "-m", "fedhop", *edge.args()]
    server = RoleCommand("server", "spec.toml", listen="10.0.0.1:50051", security=("--tls", "/t"),
                         extra=("--out", "run"))
    assert server.args() == ["server", "spec.toml", "--listen", "10.0.0.1:50051", "--tls", "/t", "--out", "run"]
    host = RoleCommand("clients", "client-0..client-3", connect="127.0.0.1:5", state_dir="/s", data_path="/d")
    assert host.args() == ["clients", "--ids", "client-0..client-3", "--connect", "127.0.0.1:5", "--state-dir", "/s",
                           "--data-path", "/d"]
    assert contract.link_security(None) == ("--insecure",)  # testbed addresses are not loopback
    assert contract.link_security("/t") == ("--tls", "/t")
    with pytest.raises(ValueError, match="a client needs an address"):
        RoleCommand("client", "client-0")
    with pytest.raises(ValueError, match="unknown role 'router'"):
        RoleCommand("router", "r", connect="x:1")


def test_launch_builds_its_children_with_the_same_builder() -> None:
    assert role_cmd("edge", "edge-1", "127.0.0.1:7", listen="127.0.0.1:8", device="cpu", state_dir=Path("/st"),
                    extra=["--tls", "/t"]) == RoleCommand(
        "edge", "edge-1", connect="127.0.0.1:7", listen="127.0.0.1:8", device="cpu", state_dir="/st",
        extra=("--tls", "/t")).argv()


# -- the per-link table and the counters' file --------------------------------------------------------------------
def test_link_table_round_trip_keeps_unknown_wire_bytes_apart_from_zero(tmp_path: Path) -> None:
    rows = [LinkBytes("ps", "edge-0", 1000, 1100, 1500, 4), LinkBytes("edge-0", "client-1", 10, 30, None, 1),
            LinkBytes("client-1", "edge-0", 0, 0, 0, 0)]
    path = link_table.write_link_table(rows, tmp_path / link_table.FILE)
    assert path.read_text().splitlines()[1:] == ["ps,edge-0,4,1000,1100,1500,1.1000,1.5000,400",
                                                 "edge-0,client-1,1,10,30,,3.0000,,", "client-1,edge-0,0,0,0,0,,,0"]
    assert link_table.read_link_table(path) == rows
    table = link_table.format_table(rows)
    assert table.splitlines()[-1].split()[:4] == ["total", "1,010", "1,130", "n/a"]  # one link unknown: no total


def test_reconcile_orders_by_the_plan_and_fills_missing_links_as_the_counters_say() -> None:
    meters = {("client-0", "edge-0"): Meter(1, 5, 9), ("ps", "edge-0"): Meter(2, 50, 60)}
    wire = {("ps", "edge-0"): 90, ("edge-0", "ps"): 40}
    rows = link_table.reconcile(meters, wire, order=["ps", "edge-0", "client-0"])
    assert [(r.src, r.dst, r.wire) for r in rows] == [("ps", "edge-0", 90), ("edge-0", "ps", 40),
                                                      ("client-0", "edge-0", None)]
    by_name = link_table.reconcile(meters, wire, complete=True)
    assert [(r.src, r.dst, r.wire) for r in by_name] == [("client-0", "edge-0", 0), ("edge-0", "ps", 40),
                                                         ("ps", "edge-0", 90)]


def test_meters_sum_kinds_phases_and_rounds(tmp_path: Path) -> None:
    with (tmp_path / "links.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["src", "dst", "kind", "phase", "round", "messages", "payload_bytes", "message_bytes"])
        w.writerow(["ps", "edge-0", "model", "down", "1", "1", "100", "120"])
        w.writerow(["ps", "edge-0", "bye", "end", "0", "1", "0", "10"])
    assert link_table.read_meters(tmp_path / "links.csv") == {("ps", "edge-0"): Meter(2, 100, 130)}


def test_run_summary_is_the_same_table_with_the_runs_own_wire_level() -> None:
    from fedhop.report import link_table as summary
    from fedhop.report import per_link

    meter = {"kind": "model", "phase": "down", "round": 1}
    rows = [{**meter, "src": "ps", "dst": "edge-0", "messages": 1, "payload_bytes": 100, "message_bytes": 120,
             "wire_bytes": ""},  # links.csv's blank wire cell on a meter row
            {**meter, "src": "ps", "dst": "edge-0", "kind": "wire", "phase": "tcp", "messages": 0,
             "payload_bytes": 0, "message_bytes": 0, "wire_bytes": 150},
            {**meter, "src": "edge-0", "dst": "ps", "messages": 1, "payload_bytes": 300, "message_bytes": 330}]
    assert per_link(rows) == [LinkBytes("edge-0", "ps", 300, 330, None, 1), LinkBytes("ps", "edge-0", 100, 120, 150, 1)]
    lines = summary(rows).splitlines()
    assert lines[0].split() == ["link", "messages", "payload", "B", "message", "B", "wire", "B"]
    assert [ln.split()[4:] for ln in lines[2:]] == [["300", "330"], ["100", "120", "150"]]  # no wire: blank
    assert summary(rows, top=1).splitlines()[-1].split() == ["...", "1", "more", "links", "1", "100", "120", "150"]


def test_wire_csv_round_trip_and_pair_attribution(tmp_path: Path) -> None:
    rows = [WireCount("ps", "edge-0", 3, 300, 300, "nft"), WireCount("edge-0", OTHER, 1, 60, None, "nft")]
    assert read_wire_csv(write_wire_csv(rows, tmp_path / "wire.csv")) == rows
    reading = WireReading(tuple(rows), "nft", complete=False)
    assert reading.by_link() == {("ps", "edge-0"): 300}
    pairs = sum_pairs([{("a", "b"): PairBytes(1, 10)}, {("a", "b"): PairBytes(2, 5), ("b", "a"): PairBytes(1, 7)},
                       {("a", "z"): PairBytes(1, 3)}])
    assert pairs == {("a", "b"): PairBytes(3, 15), ("b", "a"): PairBytes(1, 7), ("a", "z"): PairBytes(1, 3)}
    attributed, stray = attribute_pairs(pairs, {"a": "ps", "b": "edge-0"}, "overlay")
    assert attributed == [WireCount("edge-0", "ps", 1, 7, None, "overlay"), WireCount("ps", "edge-0", 3, 15, None,
                                                                                       "overlay")]
    assert stray == 3


# -- the protocol -------------------------------------------------------------------------------------------------
class Scripted:
    """A testbed whose PS "wrote" links.csv; records the calls; ``fail`` names the step that raises."""

    def __init__(self, out: Path, fail: str = "") -> None:
        self.out = out
        self.fail = fail
        self.calls: list[str] = []

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail:
            raise RuntimeError(f"{name} failed")

    def start(self) -> None:
        self._step("start")
        self.out.mkdir()
        (self.out / "links.csv").write_text("src,dst,messages,payload_bytes,message_bytes\nps,c,1,10,20\n")

    def wait(self, timeout_s: float | None = None) -> int:
        self._step("wait")
        return 0

    def wire(self) -> WireReading:
        self._step("wire")
        return WireReading((WireCount("ps", "c", 1, 70, None, "test"),), "test", complete=False, notes=("n",))

    def stop(self) -> None:
        self.calls.append("stop")


def test_run_drives_the_protocol_and_collects_both_files(tmp_path: Path) -> None:
    bed = Scripted(tmp_path / "run")
    outcome = contract.run(bed, timeout_s=5)
    assert bed.calls == ["start", "wait", "wire", "stop"]
    assert outcome == contract.Outcome(0, bed.out, [LinkBytes("ps", "c", 10, 20, 70, 1)], ("n",))
    assert link_table.read_link_table(bed.out / "link_bytes.csv") == outcome.links
    assert read_wire_csv(bed.out / "wire.csv") == [WireCount("ps", "c", 1, 70, None, "test")]


@pytest.mark.parametrize("fail", ["start", "wait", "wire"])
def test_run_stops_the_testbed_whatever_step_fails(tmp_path: Path, fail: str) -> None:
    bed = Scripted(tmp_path / "run", fail=fail)
    with pytest.raises(RuntimeError, match=f"{fail} failed"):
        contract.run(bed)
    assert bed.calls[-1] == "stop" and bed.calls.count("stop") == 1
