"""``trace = "file.csv"`` in the ``[network]`` table (common/network_spec.py): the file checked with errors naming
table, row and column; the values it sets at each time; and what a trace step changes in the tc / nft / proxy
settings of the namespace testbed and of a container shaping itself (deploy/profile.py, deploy/shaping.py,
deploy/loss.py, deploy/container_net.py; commands captured, nothing run)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from fedhop.common.network_spec import (
    NetworkSpec,
    Shape,
    TraceError,
    compute_at,
    compute_speed,
    compute_trace_env,
    directed_shape,
    load_traces,
    parse_trace,
)
from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.deploy import container_net, profile, shaping
from fedhop.deploy.delay_proxy import Hold, PeerDelay, read_control
from fedhop.deploy.loss import TABLE, LossTable
from fedhop.deploy.netns import offload_commands, plan_network
from tests.specs import spec_dict

BASE = spec_dict("fedavg", clients=2, edges=0, device=None)


def test_a_trace_sets_values_from_each_rows_time_on() -> None:
    tr = parse_trace("time_s,mbit,delay_ms,loss\n0,100,,\n10,5,20,\n30,,,0.01\n", "t.csv")
    assert tr.times() == [0.0, 10.0, 30.0]
    assert tr.at(-1) == {} and tr.at(0) == {"mbit": 100.0}
    assert tr.at(12.5) == {"mbit": 5.0, "delay_ms": 20.0}  # an empty cell keeps the value before
    assert tr.at(99) == {"mbit": 5.0, "delay_ms": 20.0, "loss": 0.01}
    assert parse_trace("time_s,compute\n0,1\n5,0.25\n", "c.csv", compute=True).at(6) == {"compute": 0.25}


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("mbit\n10\n", "row 1: no time_s column"),
    ("time_s,rate\n0,1\n", "row 1, column 'rate': unknown column"),
    ("time_s,compute\n0,0.5\n", "compute is allowed in a node's own table only"),
    ("time_s\n0\n", "no value column"),
    ("time_s,mbit\n", "no rows after the header"),
    ("time_s,mbit\n0,10\n1,fast\n", "row 3, column mbit: 'fast' is not a number"),
    ("time_s,mbit\n0,10\n1,0\n", "row 3, column mbit: 0 is outside (0, inf)"),
    ("time_s,loss\n0,1\n", "row 2, column loss: 1 is outside [0, 1)"),
    ("time_s,delay_ms\n0,70000\n", "row 2, column delay_ms: 70000 is outside [0, 60000]"),
    ("time_s,mbit\n5,10\n5,20\n", "row 3, column time_s: 5 is not after the row before (5)"),
    ("time_s,mbit\n-1,10\n", "row 2, column time_s: -1 < 0"),
    ("time_s,mbit\n0,10,3\n", "row 2: 3 cells, the header has 2"),
    ("time_s,delay_ms,jitter_ms\n0,5,6\n", "row 2: jitter_ms 6 > delay_ms 5"),
    ("time_s,mbit\n0,nan\n", "row 2, column mbit: 'nan' is not a finite number"),
])
def test_a_bad_trace_names_the_row_and_column(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=re.escape(message)) as e:
        parse_trace(text, "t.csv")
    assert str(e.value).startswith("trace t.csv")


def test_traces_are_read_from_the_specs_folder_and_errors_name_the_table(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "up.csv").write_text("time_s,mbit\n0,50\n20,2\n")
    (tmp_path / "slow.csv").write_text("time_s,compute,loss\n0,1,0\n30,0.5,0.02\n")
    spec = RunSpec.parse({**BASE, "network": {"client_ps": {"up": {"trace": "traces/up.csv"}, "mbit": 80},
                                              "nodes": {"client-1": {"trace": "slow.csv"}}}})
    net = spec.network
    assert net is not None
    traces = load_traces(net, tmp_path)
    assert sorted(traces) == ["client_ps.up", "nodes.client-1"]
    # the up direction follows its trace, the down one keeps the class value; a node's trace overrides both
    assert directed_shape(net, "client_ps", "client-0", "ps", traces, 5).mbit == 50
    assert directed_shape(net, "client_ps", "client-0", "ps", traces, 25).mbit == 2
    assert directed_shape(net, "client_ps", "ps", "client-0", traces, 25) == Shape(mbit=80)
    assert directed_shape(net, "client_ps", "ps", "client-1", traces, 31).loss == 0.02
    assert directed_shape(net, "client_ps", "ps", "client-1", traces, 29).loss == 0.0
    assert directed_shape(net, "client_ps", "client-0", "ps") == Shape(mbit=80)  # no traces: the static table
    assert compute_at(net, "client-1", traces, 31) == 0.5 and compute_at(net, "client-1", traces, 1) == 1.0
    assert compute_at(net, "client-0", traces, 31) == 1.0

    (tmp_path / "slow.csv").write_text("time_s,compute\n0,1\n30,2\n")
    with pytest.raises(TraceError, match=re.escape("network.nodes.client-1.trace: trace slow.csv, row 3, column "
                                                   "compute: 2 is outside (0, 1]")):
        load_traces(net, tmp_path)
    with pytest.raises(TraceError, match=r"network.client_ps.up.trace: cannot read .*nowhere/traces/up.csv"):
        load_traces(net, tmp_path / "nowhere")


def test_the_timeline_checks_every_step_and_replays_what_changed(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("time_s,delay_ms,jitter_ms\n0,20,5\n10,2,\n")
    net = NetworkSpec.model_validate({"client_ps": {"trace": "d.csv"}})
    topo = build_topology(RunSpec.parse(BASE).topology, 0)
    with pytest.raises(ValueError, match=re.escape("resolves to jitter_ms 5 > delay_ms 2 at 10 s")):
        profile.timeline(topo, net, load_traces(net, tmp_path))
    (tmp_path / "d.csv").write_text("time_s,delay_ms,jitter_ms,mbit\n0,20,5,\n10,40,0,3\n")
    steps = profile.timeline(topo, net, load_traces(net, tmp_path))
    assert [t for t, _ in steps] == [0.0, 10.0]
    assert profile.proxy_holds("ps", steps[0][1])["client-0"] == PeerDelay(Hold(20, 5), Hold(20, 5))
    assert profile.proxy_holds("ps", steps[1][1])["client-1"] == PeerDelay(Hold(40, 0), Hold(40, 0))
    assert profile.egress("ps", steps[0][1]) == {"client-0": None, "client-1": None}
    assert profile.ever("client-0", steps) == ({"ps"}, set(), True)  # rated after 10 s, delayed throughout

    # the namespace testbed re-rates a traced direction in place, on both devices it is shaped on
    net_ns = plan_network([("ps", "server"), ("client-0", "client"), ("client-1", "client")], "10.9.0.0/24",
                          tag="fhx")
    shapes = [shaping.LinkShape("ps", "client-0", None), shaping.LinkShape("client-0", "ps", None)]
    installed = shaping.plan_shaping(net_ns, shapes)
    assert ["tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit", "ceil",
            "10gbit", "quantum", "200000"] in [c for _, c in installed]
    changes = shaping.rate_changes(net_ns, shapes, "client-0", "ps", 3.0)
    assert sorted(changes) == [("fhx-br", shaping.class_command("v0", 1, 3.0, "change")),  # into ps, its bridge port
                               ("fhx-client-0", shaping.class_command("eth0", 1, 3.0, "change"))]  # out of client-0
    assert changes[0][1][2] == "change" and changes[0][1][changes[0][1].index("rate") + 1] == "3000kbit"


def test_the_proxy_control_file_replaces_its_table(tmp_path: Path) -> None:
    control = tmp_path / "delays.json"
    profile.write_holds(control, {"10.0.0.3": PeerDelay(Hold(40, 10), Hold(5, 0))})
    assert json.loads(control.read_text()) == {"10.0.0.3": "40~10,5~0"}
    assert read_control(control) == {"10.0.0.3": PeerDelay(Hold(40, 10), Hold(5, 0))}
    control.write_text('{"10.0.0.3": "4~9"}')
    with pytest.raises(ValueError, match="jitter must not exceed the delay"):
        read_control(control)


class FakeNft:
    """Stands in for ``nft`` in one namespace: remembers the scripts, answers listings with set counters."""

    def __init__(self) -> None:
        self.scripts: list[str] = []
        self.counters: dict[str, int] = {}

    def __call__(self, cmd: list[str], stdin: str | None = None) -> str:
        if cmd[:2] == ["nft", "-f"]:
            self.scripts.append(stdin or "")
            return ""
        rules = [{"rule": {"comment": f"loss:{p}", "expr": [{"counter": {"packets": n, "bytes": 0}}]}}
                 for p, n in self.counters.items()]
        return json.dumps({"nftables": rules})


def test_a_loss_step_rewrites_the_table_and_keeps_the_drops_counted() -> None:
    nft = FakeNft()
    table = LossTable(nft)
    table.set([("client-0", "10.0.0.3", 0.0)])
    assert nft.scripts == []  # nothing lossy yet: no table
    table.set([("client-0", "10.0.0.3", 0.01)])
    assert "< 10000 counter drop" in nft.scripts[-1] and "delete table" not in nft.scripts[-1]
    table.set([("client-0", "10.0.0.3", 0.01)])
    assert len(nft.scripts) == 1  # unchanged: not rewritten
    nft.counters = {"client-0": 7}
    table.set([("client-0", "10.0.0.3", 0.05)])
    assert nft.scripts[-1].startswith(f"table inet {TABLE} {{}}\ndelete table inet {TABLE}\n")
    assert "< 50000 counter drop" in nft.scripts[-1]
    nft.counters = {"client-0": 3}  # the new rule's counter
    assert table.counts() == {"client-0": 10}


def test_a_container_shapes_its_own_egress_as_peers_resolve_and_at_trace_steps(tmp_path: Path,
                                                                               monkeypatch) -> None:
    (tmp_path / "spec.toml").write_text(RunSpec.parse({**BASE, "network": {
        "client_ps": {"mbit": 20, "loss": 0.01, "delay_ms": 30, "trace": "r.csv"}}}).to_toml())
    (tmp_path / "r.csv").write_text("time_s,mbit,loss\n0,20,0.01\n15,4,0\n")
    ran: list[list[str]] = []
    nft = FakeNft()

    def local(cmd: list[str], stdin: str | None = None) -> str:
        ran.append(cmd)
        return nft(cmd, stdin) if cmd[0] == "nft" else ""

    monkeypatch.setattr(container_net, "_local", local)
    monkeypatch.setattr(container_net, "route_device", lambda addr: "eth0")
    _, ps = container_net.plan("ps", tmp_path / "spec.toml")
    ps.loss.run = local
    ps.control = tmp_path / "delays.json"
    assert ps.needed() and ps.peers == ["client-0", "client-1"] and ps.delayed
    ps.add_peer("client-1", "10.0.0.4")
    assert ran[:2] == [cmd for cmd, _ in offload_commands("eth0")]  # MTU-sized segments, as in the netns testbed
    assert ran[2:6] == [*shaping.qdisc_commands("eth0"), shaping.class_command("eth0", 1, 20.0),
                        shaping.class_command("eth0", 2, 20.0)]
    assert ran[6] == shaping.filter_command("eth0", 2, "10.0.0.4", "dst")  # client-1's class, sent to it
    assert "ip saddr 10.0.0.4 numgen random mod 1000000 < 10000" in nft.scripts[-1]
    assert json.loads(ps.control.read_text()) == {"10.0.0.4": "30~0,30~0"}
    ps.add_peer("client-0", "10.0.0.3")
    assert shaping.filter_command("eth0", 1, "10.0.0.3", "dst") in ran and "10.0.0.3" in nft.scripts[-1]
    ran.clear()
    ps.step(15.0)
    assert ran[:2] == [shaping.class_command("eth0", 1, 4.0, "change"), shaping.class_command("eth0", 2, 4.0, "change")]
    assert "numgen" not in nft.scripts[-1]  # the loss went to 0: no rule left
    _, client = container_net.plan("client-0", tmp_path / "spec.toml")
    assert client.rated == {"ps"} and client.lossy == {"ps"}


def test_a_node_replays_its_own_compute_column_from_the_environment_its_testbed_gives(tmp_path: Path) -> None:
    """The testbed names the node's trace and the traces' time 0 in its role's environment; the role's speed then
    follows the trace's compute column (its table's compute before the first row, and after a row without it)."""
    (tmp_path / "slow.csv").write_text("time_s,compute,mbit\n0,1,\n20,0.25,\n40,,5\n")
    net = NetworkSpec.model_validate({"nodes": {"client-1": {"compute": 0.5, "trace": "slow.csv"},
                                                "client-0": {"compute": 0.8}}})
    assert compute_trace_env(net, "client-0", tmp_path, 7) == {}
    assert compute_speed(net, "client-0", {})() == 0.8
    t0 = time.time_ns()
    env = compute_trace_env(net, "client-1", tmp_path, t0)
    assert env == {"FEDHOP_COMPUTE_TRACE": str((tmp_path / "slow.csv").resolve()), "FEDHOP_TRACE_T0_NS": str(t0)}
    assert compute_speed(net, "client-1", env)() == 1.0  # at 0 s: the first row
    assert compute_speed(net, "client-1", {**env, "FEDHOP_TRACE_T0_NS": str(t0 - 25 * 10**9)})() == 0.25
    assert compute_speed(net, "client-1", {**env, "FEDHOP_TRACE_T0_NS": str(t0 + 60 * 10**9)})() == 0.5  # before
    assert compute_speed(net, "client-1", {})() == 0.5  # no trace given: the table's own value
    with pytest.raises(TraceError, match="FEDHOP_COMPUTE_TRACE: cannot read"):
        compute_speed(net, "client-1", {"FEDHOP_COMPUTE_TRACE": str(tmp_path / "gone.csv")})
